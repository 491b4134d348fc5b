"""One-shot runs. By default one request to the data plane: it leases a warm
interpreter for a temporary Session, runs the code and closes the Session
(``via="session"``). The declarative path, ``via="execution"``, makes one
Execution object, waits for it and reads it: slower (API writes and an
object in etcd per run), but every run is a record ``kubectl get
executions`` shows."""

import json
import uuid

import urllib3

import kubernetes
from kubernetes.client.exceptions import ApiException

from . import _api, errors, recovery
from .execution import Execution, ExecutionError
from .sandbox import Sandbox

_DONE = {"Succeeded": "succeeded", "Failed": "failed", "TimedOut": "timed_out", "Cancelled": "interrupted"}


def run(code, pool, namespace=None, *, timeout=None, context=None, envs=None, session=None, name="run-",
        request_timeout=300, kubeconfig=None, kube_context=None, api_client=None, via="auto", on_stdout=None,
        on_stderr=None, on_llm_query=None, on_rlm_query=None):
    """Run ``code`` once in a warm interpreter of ``pool`` and return an
    Execution. ``timeout`` is the run's, in seconds; ``context`` becomes the
    variable ``context`` and ``envs`` os.environ for it.

    ``via="auto"`` (the default) makes one request to the data plane when the
    cluster serves it (``via="session"``): a temporary Session, owned by the
    caller, is leased, runs the code (streaming to ``on_stdout``/``on_stderr``,
    with ``llm_query`` answered by ``on_llm_query``) and is closed; ``id`` is
    the run's ID. Should the answer be lost on the way, the run is looked up
    by its ID: its result comes back if it ran, ``NotRunError`` if it did not,
    and it is never sent twice. ``via="execution"``, or ``session`` (a Session
    Executions share, created on first use), makes an Execution object
    instead; ``id`` is its name and it stays for its TTL."""
    if via not in ("auto", "session", "execution"):
        raise ValueError(f"via is auto, session or execution, not {via!r}")
    api, default_ns = (api_client, "default") if api_client is not None else _api.load(kubeconfig, kube_context)
    namespace = namespace or default_ns
    if session is None and (via == "session" or (via == "auto" and _api.has_data_plane(api))):
        return _run_once(api, namespace, code, pool, timeout=timeout, context=context, envs=envs, name=name,
                         wait=request_timeout, on_stdout=on_stdout, on_stderr=on_stderr, on_llm_query=on_llm_query,
                         on_rlm_query=on_rlm_query)
    spec = {"poolRef": _api.pool_ref(pool), "code": code}
    if timeout is not None:
        spec["timeout"] = f"{timeout}s"
    if context is not None:
        if isinstance(context, str):
            spec["context"] = context
        else:
            spec["context"], spec["contextFormat"] = json.dumps(context), "json"
    if envs:
        spec["env"] = [{"name": k, "value": str(v)} for k, v in envs.items()]
    if session:
        spec["session"] = session
    me = _api.owner(api)  # who created it, and what a Session bound to its owner checks
    if me:
        spec["owner"] = me
    meta = {"generateName": name} if name.endswith("-") else {"name": name}
    objects = kubernetes.client.CustomObjectsApi(api)
    try:
        obj = objects.create_namespaced_custom_object(_api.GROUP, _api.VERSION, namespace, "executions",
                                                      {"apiVersion": f"{_api.GROUP}/{_api.VERSION}", "kind": "Execution",
                                                       "metadata": meta, "spec": spec})
    except ApiException as e:
        raise _api.api_error(e) from None
    obj_name = obj["metadata"]["name"]
    if (obj.get("status") or {}).get("phase") in _DONE:
        return _execution(obj)
    w = kubernetes.watch.Watch()
    try:
        for ev in w.stream(objects.list_namespaced_custom_object, _api.GROUP, _api.VERSION, namespace, "executions",
                           field_selector=f"metadata.name={obj_name}", resource_version=obj["metadata"]["resourceVersion"],
                           timeout_seconds=int(request_timeout)):
            if ev["type"] == "DELETED":
                raise errors.WarmpoolError(f"Execution {obj_name} was deleted before it finished")
            obj = ev["object"]
            if (obj.get("status") or {}).get("phase") in _DONE:
                return _execution(obj)
    except ApiException as e:
        raise _api.api_error(e) from None
    finally:
        w.stop()
    raise errors.TimeoutError(f"Execution {obj_name} did not finish within {request_timeout}s "
                              f"(kubectl get execution {obj_name} -n {namespace} says where it is)")


def _execution(obj):
    st = obj.get("status") or {}
    err = st.get("error")
    return Execution(
        id=obj["metadata"]["name"], status=_DONE[st["phase"]], stdout=st.get("stdout", ""), stderr=st.get("stderr", ""),
        text=st.get("result") or None, duration=float(st.get("durationMillis") or 0) / 1000,
        stdout_truncated=bool(st.get("stdoutTruncated")), stderr_truncated=bool(st.get("stderrTruncated")), raw=obj,
        error=ExecutionError(err.get("type", ""), err.get("message", ""), err.get("traceback", "")) if err else None,
    )


def _run_once(api, namespace, code, pool, *, timeout, context, envs, name, wait, on_stdout, on_stderr, on_llm_query,
              on_rlm_query):
    # Named here, so that a lost answer can still be asked about.
    session = name + uuid.uuid4().hex[:10] if name.endswith("-") else name
    req = {"id": uuid.uuid4().hex, "pool": pool, "code": code, "stream": True,
           "bridge": on_llm_query is not None or on_rlm_query is not None, "waitMillis": int(wait * 1000)}
    if timeout is not None:
        req["timeoutMillis"] = int(timeout * 1000)
    if context is not None:
        req["context"] = context
    if envs:
        req["env"] = {k: str(v) for k, v in envs.items()}
    sb = Sandbox(api, namespace, session)
    handlers = (on_stdout, on_stderr, on_llm_query, on_rlm_query)
    try:
        resp = _api.request(api, "POST", f"/apis/{_api.DATA_GROUP}/{_api.VERSION}/namespaces/{namespace}/runs/{session}/exec",
                            body=req, accept="application/x-ndjson")
    except errors.APIError as e:
        if e.status == 502:  # the agent call failed: it may have reached the agent
            ex = _recover(sb, req, handlers, e)
            ex.id = req["id"]
            return ex
        if e.status == 403:
            raise
        if e.status == 404 and "SandboxPool" in e.message:
            raise errors.PoolNotFoundError(e.message) from None
        raise errors.NotRunError(session, e) from None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        ex = _recover(sb, req, handlers, e)
        ex.id = req["id"]
        return ex
    try:
        ex = sb._read_stream(resp, req["id"], *handlers)
    except (errors.StreamCutError, urllib3.exceptions.HTTPError, OSError) as e:
        ex = _recover(sb, req, handlers, e)
    ex.id = req["id"]
    return ex


def _recover(sb, req, handlers, cause):
    """Find out what became of a run whose answer was lost, then close its Session."""
    try:
        return recovery.lookup(sb, req, handlers, cause)
    finally:
        _close(sb)


def _close(sb):
    """End the Session (spec.close), or delete it if the caller may not patch it."""
    try:
        sb._objects.patch_namespaced_custom_object(_api.GROUP, _api.VERSION, sb.namespace, "sessions", sb.name,
                                                   {"spec": {"close": True}})
    except ApiException as e:
        if e.status == 403:
            sb.close()
        elif e.status != 404:
            raise _api.api_error(e) from None
