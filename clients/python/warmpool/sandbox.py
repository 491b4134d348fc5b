"""Sandbox: a Session of a warmpool SandboxPool, one warm stateful Python
interpreter leased for as long as the caller needs it."""

import concurrent.futures
import datetime
import json
import re
import threading
import time
import uuid

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from . import _api, errors, recovery
from .execution import Execution, Result
from .snapshot import MEDIA_TYPE, Snapshot


def _seconds(d):
    return None if d is None else f"{int(d)}s"


class EntryInfo(dict):
    """An entry of ``Files.list``, with the attributes of E2B's ``EntryInfo``:
    ``name``, ``path`` (from the workspace's root, ``/in/data.txt``),
    ``type`` (``"file"`` or ``"dir"``), ``size`` (bytes), ``mode``
    (``"-rw-r--r--"``), ``modified_time`` (a datetime). It is still the dict
    the agent sent (``entry["name"]``, ``entry["modTime"]``), as before."""

    name = property(lambda self: self.get("name", ""))
    path = property(lambda self: self.get("path", ""))
    size = property(lambda self: self.get("size", 0))
    dir = property(lambda self: bool(self.get("dir")))
    type = property(lambda self: "dir" if self.get("dir") else "file")
    mode = property(lambda self: self.get("mode", ""))

    @property
    def modified_time(self):
        t = self.get("modTime")
        if not t:
            return None
        # Go writes RFC 3339 with up to nanoseconds and a "Z", which
        # fromisoformat reads only from Python 3.11 on.
        m = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", t)
        if m is None:
            return None
        frac = f".{m.group(2)[:6]:0<6}" if m.group(2) else ""
        zone = "+00:00" if m.group(3) == "Z" else m.group(3)
        return datetime.datetime.fromisoformat(m.group(1) + frac + zone)

    def __repr__(self):
        return f"EntryInfo(name={self.name!r}, type={self.type!r}, path={self.path!r}, size={self.size})"


class Files:
    """The Session's workspace (its working directory): read, write, list."""

    def __init__(self, sandbox):
        self._s = sandbox

    def read(self, path, format="text"):
        """The file's content: ``str`` (``format="text"``) or ``bytes`` (``"bytes"``)."""
        resp = _api.request(self._s._api, "GET", self._s._path("files"), query={"path": path}, accept="*/*")
        data = resp.data
        return data if format == "bytes" else data.decode()

    def write(self, path, data):
        """Write ``data`` (``str`` or ``bytes``) to ``path``, creating directories."""
        if isinstance(data, str):
            data = data.encode()
        _api.request(self._s._api, "PUT", self._s._path("files"), query={"path": path}, body=data,
                     content_type="application/octet-stream")

    def list(self, path="."):
        """Entries of a directory, as EntryInfo: ``entry.name``, ``entry.type``, ``entry.size``..."""
        entries = _api.request_json(self._s._api, "GET", self._s._path("files"), query={"path": path, "list": "true"})
        return [EntryInfo(e) for e in entries or []]


class Sandbox:
    """A lease on one warm Python interpreter of a pool: state survives between
    ``run_code`` calls until ``close()`` (or the idle timeout). Use it as a
    context manager to close it at the end."""

    def __init__(self, api, namespace, name):
        self._api, self.namespace, self.name = api, namespace, name
        self._objects = kubernetes.client.CustomObjectsApi(api)
        self._run = None  # ID of the run under way, for interrupt()
        self._lock = threading.Lock()
        self.files = Files(self)

    # -- lifecycle --------------------------------------------------------

    @classmethod
    def create(cls, pool, namespace=None, *, name=None, timeout=None, max_lifetime=None, context=None,
               context_json=False, envs=None, owner_only=False, snapshot=None, suspend_after=None, checkpoint=None, request_timeout=60, kubeconfig=None,
               kube_context=None, api_client=None):
        """Lease a warm interpreter of ``pool`` ("name", or "namespace/name" for a
        shared pool) and wait until it is Ready.

        ``timeout``: seconds without a run after which the Session closes (its
        idle timeout; default the pool's). ``max_lifetime``: seconds after
        which it closes however busy. ``context``: a string set once as the
        variable ``context`` (parsed as JSON when ``context_json``); ``envs``:
        environment variables set once. ``name``: the Session's name, or a
        prefix ending in ``-`` (default ``sandbox-``). ``owner_only``: bind
        the Session to the caller, so that nobody else in the namespace can run
        code in it or read its variables and files (spec.access Owner). The
        caller is recorded as the Session's owner whenever kube-apiserver says
        who it is. ``suspend_after``: seconds idle after which the Session is
        suspended (its state saved, its pod freed; its next run resumes it);
        default the pool's, 0 never. ``checkpoint``: makes the Session durable:
        its state is checkpointed at most every that many seconds (0: after
        every run), and it resumes from its last checkpoint when its pod or
        node is lost (the next run's ``moved`` says which run its state is
        from); default the pool's. ``snapshot``: a ``Snapshot`` (or its bytes) from
        ``sb.snapshot()`` whose state the new Session starts with; no code runs
        in it before that state is there.
        """
        if snapshot is not None and not isinstance(snapshot, Snapshot):
            snapshot = Snapshot(snapshot)
        api, default_ns = (api_client, "default") if api_client is not None else _api.load(kubeconfig, kube_context)
        namespace = namespace or default_ns
        name = name or "sandbox-"
        meta = {"generateName": name} if name.endswith("-") else {"name": name}
        spec = {"poolRef": _api.pool_ref(pool)}
        me = _api.whoami(api) if owner_only else _api.owner(api)
        if me:
            spec["owner"] = me
        if owner_only:
            spec["access"] = "Owner"
        if timeout is not None:
            spec["idleTimeout"] = _seconds(timeout)
        if max_lifetime is not None:
            spec["maxLifetime"] = _seconds(max_lifetime)
        if suspend_after is not None:
            spec["suspendAfter"] = _seconds(suspend_after)
        if checkpoint is not None:
            spec["checkpoint"] = {"interval": _seconds(checkpoint)}
        if context is not None:
            spec["context"] = context if isinstance(context, str) else json.dumps(context)
            if context_json or not isinstance(context, str):
                spec["contextFormat"] = "json"
        if envs:
            spec["env"] = [{"name": k, "value": str(v)} for k, v in envs.items()]
        if snapshot is not None:
            meta["annotations"] = {RESTORING: "caller"}
        body = {"apiVersion": f"{_api.GROUP}/{_api.VERSION}", "kind": "Session", "metadata": meta, "spec": spec}
        try:
            obj = kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
                _api.GROUP, _api.VERSION, namespace, "sessions", body)
        except ApiException as e:
            raise _api.api_error(e) from None
        sb = cls(api, namespace, obj["metadata"]["name"])
        try:
            sb._wait_ready(obj, request_timeout)
            if snapshot is not None:
                sb.restore(snapshot)
        except BaseException:
            sb.close()
            raise
        return sb

    @classmethod
    def connect(cls, session_name, namespace=None, *, kubeconfig=None, kube_context=None, api_client=None):
        """Attach to an existing Session (its variables are where the last run left them)."""
        api, default_ns = (api_client, "default") if api_client is not None else _api.load(kubeconfig, kube_context)
        sb = cls(api, namespace or default_ns, session_name)
        sb._wait_ready(sb.get(), 0)
        return sb

    def get(self):
        """The Session object, as a dict."""
        try:
            return self._objects.get_namespaced_custom_object(_api.GROUP, _api.VERSION, self.namespace, "sessions", self.name)
        except ApiException as e:
            raise _api.api_error(e) from None

    def close(self):
        """Delete the Session: its pod is freed (deleted, or reset for the next user)."""
        try:
            self._objects.delete_namespaced_custom_object(_api.GROUP, _api.VERSION, self.namespace, "sessions", self.name)
        except ApiException as e:
            if e.status != 404:
                raise _api.api_error(e) from None

    kill = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _wait_ready(self, obj, timeout):
        if self._check(obj):
            return
        if not timeout:
            raise errors.WarmpoolError(f"Session {self.name} is not Ready yet ({_why(obj)})")
        w = kubernetes.watch.Watch()
        try:
            for ev in w.stream(self._objects.list_namespaced_custom_object, _api.GROUP, _api.VERSION, self.namespace,
                               "sessions", field_selector=f"metadata.name={self.name}",
                               resource_version=obj["metadata"].get("resourceVersion"), timeout_seconds=int(timeout)):
                if ev["type"] == "DELETED":
                    raise errors.SessionLostError(self.name, "Deleted", "Deleted", "the Session was deleted before it was Ready")
                obj = ev["object"]
                if self._check(obj):
                    return
        except ApiException as e:
            raise _api.api_error(e) from None
        finally:
            w.stop()
        raise errors.TimeoutError(f"Session {self.name} not Ready after {timeout}s ({_why(obj)})")

    def _check(self, obj):
        status = obj.get("status") or {}
        phase = status.get("phase")
        if phase == "Ready":
            return True
        reason, message = _condition(obj)
        if phase in ("Closed", "Lost"):
            raise errors.SessionLostError(self.name, phase, reason, message)
        if reason == "PoolNotFound":
            raise errors.PoolNotFoundError(message)
        return False

    # -- running code -----------------------------------------------------

    def run_code(self, code, *, context=None, envs=None, timeout=None, language=None, on_stdout=None, on_stderr=None,
                 on_result=None, on_llm_query=None, on_rlm_query=None, on_call=None, max_bridge_calls=None, run_id=None):
        """Run ``code`` in the Session's interpreter and return an Execution.

        ``timeout`` (seconds) interrupts the code with KeyboardInterrupt and
        returns what it printed so far. ``context`` (any JSON value) becomes
        the interpreter's global ``context`` from this run on. ``on_stdout``/``on_stderr`` get output
        as it is printed, ``on_result`` each rich result (a ``Result``: a chart, a table,
        ``display(obj)``) where it comes between them; all are in ``Execution.results`` too. ``on_llm_query(prompt)`` answers the code's
        ``llm_query`` calls and ``on_rlm_query(task, context)`` its
        ``rlm_query`` calls (the sandbox itself has no network); an exception
        raised by a handler reaches the code as an exception. The batched
        forms (``llm_query_batched``, ``rlm_query_batched``) call the same
        handlers, several at a time. ``on_call`` maps memory functions
        (``read_chunk``, ``search_chunks``, ``list_chunks_by_tag``,
        ``get_linked_chunks``) to handlers that take their parameters as
        keywords: the code's calls then reach the caller's own store.
        """
        on_call = dict(on_call or {})
        unknown = sorted(set(on_call) - set(MEMORY_METHODS))
        if unknown:
            raise ValueError(f"on_call answers only the memory functions {', '.join(MEMORY_METHODS)}, not {', '.join(unknown)}")
        bridge = on_llm_query is not None or on_rlm_query is not None or bool(on_call)
        req = {"id": run_id or uuid.uuid4().hex, "code": code, "stream": True, "bridge": bridge}
        if on_call:
            req["bridgeMethods"] = sorted(on_call)
        if envs:
            req["env"] = {k: str(v) for k, v in envs.items()}
        if context is not None:
            req["context"] = context
        if timeout is not None:
            req["timeoutMillis"] = int(timeout * 1000)
        if language:
            req["language"] = language
        if max_bridge_calls:
            req["maxBridgeCalls"] = int(max_bridge_calls)
        handlers = (on_stdout, on_stderr, on_llm_query, on_rlm_query, on_call, on_result)
        with self._lock:
            self._run = req["id"]
        try:
            return self._send_run(req, handlers)
        finally:
            with self._lock:
                self._run = None

    def _send_run(self, req, handlers):
        """Send a run; if its answer is lost (a data-plane replica stopped, the
        connection broke), find out what became of it by its ID: its result, or
        the rest of its stream, or, only if it never arrived, send it again.
        The code never runs twice."""
        # What reached the caller's handlers: an attach gets the run's result,
        # not its live output again, so the rest of its output is handed on
        # from the result.
        streamed = {"stdout": [], "stderr": []}

        def counted(name, on):
            if on is None:
                return None

            def f(data):
                streamed[name].append(data)
                on(data)
            return f
        on_stdout, on_stderr = handlers[0], handlers[1]
        handlers = (counted("stdout", on_stdout), counted("stderr", on_stderr)) + tuple(handlers[2:])

        def hand_on_rest(ex):
            # The output the stream did not bring, from the result: after a
            # lookup, and after a send again too, which attaches (the result
            # alone) when the run had arrived after all (a 503 from a replica
            # that went away after it forwarded the run).
            for name, on, text in (("stdout", on_stdout, ex.stdout), ("stderr", on_stderr, ex.stderr)):
                seen = "".join(streamed[name])
                if on and text and len(text) > len(seen) and text.startswith(seen):
                    on(text[len(seen):])
            return ex
        for resends in range(recovery.MAX_RESENDS + 1):
            try:
                resp = _api.request(self._api, "POST", self._path("exec"), body=req, accept="application/x-ndjson")
            except errors.APIError as e:
                if e.status == 503 and resends < recovery.MAX_RESENDS:
                    # Refused before it was sent on (the API server could not
                    # reach a replica, or it is not ready): it did not run.
                    time.sleep(recovery.RESEND_DELAY * 2 ** resends)
                    continue
                if e.status != 502:  # answered before the run was sent
                    raise
                cause = e
            except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.MaxRetryError) as e:
                if not (isinstance(e, urllib3.exceptions.NewConnectionError)
                        or isinstance(e.reason, urllib3.exceptions.NewConnectionError)):
                    cause = e
                elif resends == recovery.MAX_RESENDS:
                    raise
                else:
                    time.sleep(recovery.RESEND_DELAY * 2 ** resends)  # no connection: it was never sent
                    continue
            except (urllib3.exceptions.HTTPError, OSError) as e:
                cause = e
            else:
                try:
                    return hand_on_rest(self._read_stream(resp, req["id"], *handlers))
                except (errors.StreamCutError, urllib3.exceptions.HTTPError, OSError) as e:
                    cause = e
            try:
                ex = recovery.lookup(self, req, handlers, cause)
            except errors.NotRunError:
                if resends == recovery.MAX_RESENDS:
                    raise
                continue  # never reached the agent: sending it again cannot run it twice
            return hand_on_rest(ex)

    def _read_stream(self, resp, run_id, on_stdout, on_stderr, on_llm_query=None, on_rlm_query=None, on_call=None,
                     on_result=None):
        """Read a run's streamed events to its result, as an Execution."""
        try:
            for line in resp:
                if not line.strip():
                    continue
                try:
                    ev = json.loads(line)
                except ValueError:
                    raise errors.StreamCutError(f"the stream of run {run_id} was cut mid-event") from None
                kind = ev.get("type")
                if kind == "stdout" and on_stdout:
                    on_stdout(ev.get("data", ""))
                elif kind == "stderr" and on_stderr:
                    on_stderr(ev.get("data", ""))
                elif kind == "display" and on_result:
                    on_result(Result.from_display(ev.get("display") or {}))
                elif kind == "bridge":
                    self._answer(run_id, ev.get("call") or {}, on_llm_query, on_rlm_query, on_call or {})
                elif kind == "result":
                    # The stream ends right after its result: reading that
                    # end lets the connection serve the next request. Here,
                    # inside the loop: leaving the loop closes urllib3's
                    # line iterator, which drops a connection not read to
                    # its end (the next run then pays a TLS handshake, 5 ms).
                    resp.drain_conn()
                    return recovery.lost_state(self.name, Execution.from_result(ev.get("result") or {}))
        finally:
            resp.release_conn()
        raise errors.StreamCutError(f"the stream of run {run_id} ended without a result: the Session's pod, "
                                    "or the data plane replica, went away")

    def _answer(self, run_id, call, on_llm_query, on_rlm_query, on_call):
        params = call.get("params") or {}
        method = call.get("method")
        answer = {"id": run_id, "call": call.get("id", "")}
        try:
            if method == "llm_query" and on_llm_query:
                answer["result"] = on_llm_query(_with_context(params.get("prompt", ""), params.get("context")))
            elif method == "rlm_query" and on_rlm_query:
                answer["result"] = on_rlm_query(params.get("task", ""), params.get("context"))
            elif method == "llm_query_batched" and on_llm_query:
                answer["result"] = _concurrently(on_llm_query, [(str(p),) for p in params.get("prompts") or []])
            elif method == "rlm_query_batched" and on_rlm_query:
                answer["result"] = _concurrently(on_rlm_query, [(t.get("task", ""), t.get("context"))
                                                                for t in params.get("tasks") or []])
            elif method in on_call:
                answer["result"] = on_call[method](**params)
            else:
                answer["error"] = f"{method} is not answered by this caller"
        except Exception as e:  # the code sees it as an exception
            answer.pop("result", None)
            answer["error"] = f"{type(e).__name__}: {e}"
        try:
            _api.request(self._api, "POST", self._path("bridge"), body=answer)
        except errors.APIError as e:
            if e.status != 404:
                raise
            # The run ended (its timeout, an interrupt) while the handler
            # thought: nobody waits for this answer, and the run's result
            # follows on the stream.

    def interrupt(self):
        """Interrupt the run under way (KeyboardInterrupt in the code); False when none runs."""
        with self._lock:
            run = self._run
        if run is None:
            return False
        try:
            _api.request(self._api, "POST", self._path("interrupt"), body={"id": run})
        except errors.APIError as e:
            if e.status in (404, 409):  # the run ended meanwhile
                return False
            raise
        return True

    def get_variable(self, name):
        """A global of the interpreter as a JSON value. A value that does not
        serialise to JSON raises ValueError with its repr."""
        v = _api.request_json(self._api, "GET", self._path("variables"), query={"name": name})
        if "json" in v:
            return v["json"]
        r = v.get("repr") or "its repr is empty"  # the agent leaves an empty repr out
        raise ValueError(f"{name} ({v.get('type')}) is not JSON-serialisable: {r}")

    def reset(self):
        """A fresh interpreter: variables are gone, files stay."""
        _api.request(self._api, "POST", self._path("reset"), body={})

    # -- state ------------------------------------------------------------

    def snapshot(self, workspace=False):
        """The Session's state as a ``Snapshot``: its variables, functions,
        classes and the names of imported modules (and, with ``workspace``,
        its files). What cannot be saved is named in ``Snapshot.skipped``."""
        query = {"workspace": "true"} if workspace else None
        resp = _api.request(self._api, "GET", self._path("snapshot"), query=query, accept=MEDIA_TYPE)
        return Snapshot(resp.data)

    def restore(self, snapshot):
        """Replace the Session's state with a snapshot's (names made since are
        gone; files in it are written). Returns what was restored."""
        data = bytes(snapshot)
        resp = _api.request(self._api, "POST", self._path("restore"), body=data, content_type=MEDIA_TYPE)
        return json.loads(resp.data)

    def fork(self, n=1, *, names=None, workspace=False, timeout=50):
        """``n`` new Sandboxes, each with a copy of this one's state, made on
        the server (the state does not pass through here); each goes on
        independently. ``names`` names them instead."""
        body = {"names": list(names)} if names else {"count": int(n)}
        if workspace:
            body["workspace"] = True
        body["waitMillis"] = int(timeout * 1000)
        out = _api.request_json(self._api, "POST", self._path("fork"), body=body, timeout=timeout + 15)
        return [Sandbox(self._api, self.namespace, name) for name in out["sessions"]]

    def _path(self, sub):
        return _api.data_plane_path(self.namespace, self.name, sub)


# Set on a Session that waits for its state from a snapshot (api/v1alpha1 AnnotationRestoring).
RESTORING = "sandbox.warmpool.dev/restoring"

# The memory functions a caller may answer from its own chunk store (pkg/protocol MemoryMethods).
MEMORY_METHODS = ("read_chunk", "search_chunks", "list_chunks_by_tag", "get_linked_chunks")


def _with_context(prompt, context):
    """llm_query(prompt, context): the context goes into the prompt, a string as
    it is and anything else as JSON (as the data plane's model calls do)."""
    if context is None:
        return prompt
    return f"{prompt}\n\nContext:\n{context if isinstance(context, str) else json.dumps(context)}"


def _concurrently(fn, calls, limit=8):
    """fn over each argument tuple, several at a time; answers in order."""
    if len(calls) <= 1:
        return [fn(*c) for c in calls]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(limit, len(calls))) as pool:
        return list(pool.map(lambda c: fn(*c), calls))


def _condition(obj):
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("reason", ""), c.get("message", "")
    return "", ""


def _why(obj):
    reason, message = _condition(obj)
    return f"{reason}: {message}" if reason else "no status yet"
