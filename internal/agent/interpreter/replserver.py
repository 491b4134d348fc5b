# warmpool REPL server: embedded in the agent binary and run as `python3 -u -c`.
# The TypeScript client runs this same file: its native backend as the agent
# does (python3 -u -c, fds 3 and 4), its Pyodide backend imports it without
# running main() and replaces _send/_recv with the worker's channel (there
# are no fds or signals to set up in WebAssembly).
#
# It talks JSON-RPC 2.0, one message per line, with the agent on two pipes that
# it receives as fd 3 (requests in) and fd 4 (responses and bridge calls out)
# and moves at once to high, close-on-exec fds. fd 0 is /dev/null, so input()
# raises EOFError; fd 1 and 2 are the user's stdout and stderr, which the agent
# reads at the file-descriptor level, so os.write(1, ...), C extensions and
# subprocesses are captured too. The user's output never shares a channel with
# the protocol.
#
# The code runs in this process, so it can always reach the protocol pipe (it is
# in /proc/self/fd) and read this server's state. The agent trusts nothing it
# says (docs/security.md, "The agent supervises code it does not trust"):
#   - every request carries a fresh id and a per-run secret from the agent, and
#     every message of that request (the reply, its bridge calls) carries both
#     back; anything else on the channel (a message for no request, garbage, an
#     unterminated fragment, EOF) is a protocol violation that the agent ends by
#     killing this process and reporting the state lost;
#   - the agent checks, before each request, that no thread or process the code
#     left running could read the request or answer for it (channel.go);
#   - messages are bounded (WARMPOOL_MAX_MESSAGE_BYTES): a reply that would be
#     larger is replaced by an error, a bridge call by an exception in the code.
# What the server itself runs on is bound before any code runs (builtins, os,
# json, io, compile): code that patches a module (os.dup2 = None) breaks its own
# calls, never the server's.
# Before and after each execution the server restores fd 0, 1, 2 and
# sys.stdin/stdout/stderr from copies kept at high fds, and it is a child
# subreaper, so processes the code starts and orphans stay its descendants and
# the agent finds and kills all of them with the interpreter (procs.go).
import _thread
import ast
import builtins
import ctypes
import ctypes.util
import fcntl
import functools
import importlib
import io
import json
import linecache
import os
import re
import signal
import sys
import time
import traceback
import types

try:
    import resource
except ImportError:  # Pyodide
    resource = None

# The server's functions look builtins up in this copy, not in the builtins
# module the code shares and can patch (builtins.repr = ...): a function takes
# its builtins from its module's __builtins__ when it is defined.
__builtins__ = dict(builtins.__dict__)

SERVER_FILE = sys._getframe().f_code.co_filename  # "<string>" with -c, "<exec>" in Pyodide
_SERVER_GLOBALS = globals()
_EXCEPTION_GROUPS = getattr(builtins, "BaseExceptionGroup", ())  # Python 3.11+

_MAX_MESSAGE_BYTES = int(os.environ.pop("WARMPOOL_MAX_MESSAGE_BYTES", "") or 16 << 20)
# Under a memory limit (RLIMIT_AS) each thread's stack is address space: with
# glibc's default of 8 MiB a 512Mi sandbox could start only a few dozen threads.
_THREAD_STACK_BYTES = int(os.environ.pop("WARMPOOL_THREAD_STACK_BYTES", "") or 0)
_LINECACHE_BUDGET = 1 << 20  # characters of earlier executions' source kept for tracebacks


def _fd_floor():
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (AttributeError, OSError, ValueError):
        soft = 1024
    if (resource is not None and soft == resource.RLIM_INFINITY) or soft <= 0:
        soft = 1 << 16
    return max(10, min(soft, 4096) - 64)


# What the server needs, bound before any code runs: code that patches os,
# fcntl, io, json or ast must not break the server's own channel to the agent.
_os_read, _os_write, _getpid, _exit, _dup2, _close = os.read, os.write, os.getpid, os._exit, os.dup2, os.close
_fcntl, _F_DUPFD_CLOEXEC, _F_GETFL, _F_SETFL = fcntl.fcntl, fcntl.F_DUPFD_CLOEXEC, fcntl.F_GETFL, fcntl.F_SETFL
_TextIOWrapper, _BufferedReader, _BufferedWriter, _FileIO = io.TextIOWrapper, io.BufferedReader, io.BufferedWriter, io.FileIO
_PyCF_ONLY_AST, _ast_Expr, _ast_Expression = ast.PyCF_ONLY_AST, ast.Expr, ast.Expression
_allocate_lock = _thread.allocate_lock
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_encode_str = json.encoder.encode_basestring_ascii
_py_encoder = json.JSONEncoder(separators=(",", ":"), default=repr)  # where there is no C encoder
_scan_once = json.JSONDecoder().scan_once
_decoder = json.JSONDecoder()


# os.environ's methods are Python code that looks builtins up in the module
# the code can patch: the run's env is set on the mapping's data and with
# putenv directly.
_environ_data, _putenv, _unsetenv = getattr(os.environ, "_data", None), os.putenv, os.unsetenv


def _env_key(k):
    return k.encode("utf-8", "surrogateescape")


def _getenv(k):
    v = _environ_data.get(_env_key(k)) if _environ_data is not None else os.environ.get(k)
    return v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v


def _setenv(k, v):
    """Sets (v a str) or removes (v None) an environment variable."""
    if _environ_data is None:  # not CPython's os.environ (Pyodide's is the same; kept for safety)
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
        return
    if v is None:
        _environ_data.pop(_env_key(k), None)
        try:
            _unsetenv(k)
        except OSError:
            pass
    else:
        _environ_data[_env_key(k)] = v.encode("utf-8", "surrogateescape")
        _putenv(k, v)


def _dumps(obj):
    """JSON of obj, by encoder functions bound at start-up (JSONEncoder.encode
    looks its C encoder up in json.encoder at each call)."""
    if _c_make_encoder is None:
        return _py_encoder.encode(obj)
    return "".join(_c_make_encoder({}, _repr, _encode_str, None, ":", ",", False, False, True)(obj, 0))


def _repr(o):
    return repr(o)


def _loads(text):
    """Decodes one message of the agent's (compact JSON on one line)."""
    try:
        obj, end = _scan_once(text, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if text[end:].strip():
        raise ValueError("extra data after the JSON value")
    return obj


def _stash_fd(fd):
    """A close-on-exec copy of fd at a high number, out of the way of the code's
    own fds and not inherited by its subprocesses."""
    try:
        return _fcntl(fd, _F_DUPFD_CLOEXEC, _fd_floor())
    except OSError:
        return _fcntl(fd, _F_DUPFD_CLOEXEC, 10)

# A child the code forks without exiting returns into the server loop: it
# must never serve the agent (the next runs would go to a copy).
_SERVER_PID = os.getpid()

_RPC_IN = _RPC_OUT = None
_in_buf = b""

# The standard streams as they were at start-up, restored around every
# execution (empty until _open_transport: nothing to restore in Pyodide).
_STD_FDS, _STD_FLAGS = {}, {}
_STD_STREAMS = {"stdin": sys.stdin, "stdout": sys.stdout, "stderr": sys.stderr}
_STD_TEXT = {name: (getattr(s, "encoding", "utf-8"), getattr(s, "errors", "strict")) for name, s in _STD_STREAMS.items()}

try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    _libc.fflush.argtypes = [ctypes.c_void_p]
except Exception:  # pragma: no cover - no libc (unusual); C stdio is then not flushed
    _libc = None

try:  # PR_SET_CHILD_SUBREAPER: orphans of the code's processes are re-parented here
    _libc.prctl(36, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
except Exception:  # pragma: no cover
    pass

try:  # PR_SET_PDEATHSIG SIGKILL: the interpreter never outlives the agent (set here: see containment.go)
    _libc.prctl(1, ctypes.c_ulong(9), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
except Exception:  # pragma: no cover
    pass


def _write_fd(fd, data):
    view = memoryview(data)
    while view:
        try:
            view = view[_os_write(fd, view):]
        except InterruptedError:
            pass


def _send(msg):
    data = _dumps(msg).encode()
    if len(data) > _MAX_MESSAGE_BYTES and "result" in msg:
        data = _dumps({"jsonrpc": "2.0", "id": msg.get("id"), "secret": msg.get("secret"), "error": {"code": -32603, "message": (
            f"the reply is {len(data)} bytes of JSON, above the agent's limit of {_MAX_MESSAGE_BYTES} bytes")}}).encode()
    # The leading newline ends whatever the code may have left unterminated on the pipe.
    _write_fd(_RPC_OUT, b"\n" + data + b"\n")


def _recv():
    """Reads one message from the agent; None at EOF (the agent went away)."""
    global _in_buf
    while True:
        nl = _in_buf.find(b"\n")
        if nl >= 0:
            line, _in_buf = _in_buf[:nl], _in_buf[nl + 1:]
            if line.strip():
                return _loads(line.decode())
            continue
        chunk = _os_read(_RPC_IN, 1 << 16)
        if not chunk:
            return None
        _in_buf += chunk


def _open_std(name):
    encoding, errors = _STD_TEXT[name]
    if name == "stdin":
        return _TextIOWrapper(_BufferedReader(_FileIO(0, "r", closefd=False)), encoding=encoding, errors=errors)
    fd = 1 if name == "stdout" else 2
    # Line-buffered, as on a terminal: a print is one write, not two (`-u`
    # writes the text and the newline apart, and each write to the agent's
    # pipe is costly under gVisor). The end of each run flushes the rest.
    return _TextIOWrapper(_BufferedWriter(_FileIO(fd, "w", closefd=False)), encoding=encoding,
                          errors=errors, line_buffering=True)


def _open_transport():
    """Takes the agent's pipes (fd 3 in, fd 4 out) and copies of the standard
    streams to high close-on-exec fds, out of the code's way."""
    global _RPC_IN, _RPC_OUT
    _RPC_IN, _RPC_OUT = _stash_fd(3), _stash_fd(4)
    _close(3)
    _close(4)
    for fd in (0, 1, 2):
        _STD_FDS[fd] = _stash_fd(fd)
        _STD_FLAGS[fd] = _fcntl(fd, _F_GETFL)
    _STD_STREAMS["stdout"], _STD_STREAMS["stderr"] = _open_std("stdout"), _open_std("stderr")
    # A process the code forks does not keep the channel: it could read the
    # next request or answer for it (the agent checks that none does, and
    # replaces an interpreter whose channel another process holds). Forks that
    # bypass Python's hooks (a raw syscall) are caught by that check.
    try:
        os.register_at_fork(after_in_child=_drop_channel)
    except AttributeError:  # pragma: no cover
        pass


def _drop_channel():
    for fd in (_RPC_IN, _RPC_OUT):
        try:
            _close(fd)
        except OSError:
            pass


def _restore_std():
    """Puts fd 0, 1, 2 and sys.stdin/stdout/stderr back as they were at start-up,
    whatever the code did to them (closed, dup2'ed over, replaced, set to None)."""
    if not _STD_FDS:
        return
    for fd, saved in _STD_FDS.items():
        try:
            _dup2(saved, fd)
            _fcntl(fd, _F_SETFL, _STD_FLAGS[fd])
        except OSError:
            pass
    for name in ("stdin", "stdout", "stderr"):
        s = _STD_STREAMS[name]
        try:
            closed = s.closed
        except Exception:
            closed = True
        if closed:
            s = _STD_STREAMS[name] = _open_std(name)
        setattr(sys, name, s)
        setattr(sys, f"__{name}__", s)


class _State:
    running = False        # SIGINT raises KeyboardInterrupt only while user code runs
    run_id = None          # the agent's id of the request in flight
    secret = None          # and its per-run secret, which every message of the request carries
    final_called = False   # FINAL may be called once per interpreter (session)
    exec_count = 0
    bridge_calls = 0
    max_bridge_calls = 0
    bridge_enabled = False
    bridge_methods = frozenset()  # memory functions the caller answers from its own store
    bridge_seq = 0
    interrupt_pending = False  # a SIGINT came while no user code ran


_state = _State()


def _on_sigint(signum, frame):
    if _state.running:
        raise KeyboardInterrupt
    # The agent may interrupt a run the moment it sent it, before this process
    # read it or while it compiles: the code stops as soon as it starts. A
    # SIGINT that came too late for the run before is one the agent knows of
    # (that run did not end interrupted): it says so with the next request.
    _state.interrupt_pending = True


signal.signal(signal.SIGINT, _on_sigint)

_signal, _pthread_sigmask, _SIGINT, _SIG_UNBLOCK = signal.signal, signal.pthread_sigmask, signal.SIGINT, signal.SIG_UNBLOCK
_settrace, _setprofile, _getrecursionlimit, _setrecursionlimit = sys.settrace, sys.setprofile, sys.getrecursionlimit, sys.setrecursionlimit
_RECURSION_LIMIT = max(sys.getrecursionlimit(), 1000)

# Remove a trace or profile function the code set, before the server's own
# frames run under it. partial objects, so that calling them starts no Python
# frame a tracer would see (nor a C call a profiler would).
_no_trace, _no_profile = functools.partial(sys.settrace, None), functools.partial(sys.setprofile, None)


def _reclaim():
    """Takes back, before each request, what the server's own work relies on
    and a run may have changed: the SIGINT handler and mask (the agent's
    deadline), no trace or profile function over the server's frames, and a
    recursion limit the server's own calls fit in."""
    for step in (lambda: _signal(_SIGINT, _on_sigint), lambda: _pthread_sigmask(_SIG_UNBLOCK, [_SIGINT]),
                 lambda: _settrace(None), lambda: _setprofile(None)):
        try:
            step()
        except BaseException:
            pass
    try:
        if _getrecursionlimit() < _RECURSION_LIMIT:
            _setrecursionlimit(_RECURSION_LIMIT)
    except BaseException:
        pass


class _Final(BaseException):
    """Raised by FINAL to end the execution; BaseException so `except Exception` in user code does not stop it."""

    def __init__(self, value):
        super().__init__()
        self.value = value


def FINAL(answer):
    """Ends the execution with `answer` as its result. Once per session."""
    if _state.final_called:
        raise RuntimeError("FINAL was already called in this session; it can be called only once")
    _state.final_called = True
    raise _Final(answer)


def _bridge(method, params):
    if not _state.bridge_enabled:
        raise RuntimeError(
            f"{method} is not available: the caller did not offer to answer bridge calls "
            "(use the streaming execute API with bridge enabled)")
    if _state.bridge_calls >= _state.max_bridge_calls:
        raise RuntimeError(f"{method}: limit of {_state.max_bridge_calls} bridge calls per execution exceeded")
    # One call at a time, whichever thread of the code makes it: the agent
    # takes more than one unanswered call as a forgery.
    with _bridge_lock:
        _state.bridge_calls += 1
        _state.bridge_seq += 1
        call_id = f"b{_state.exec_count}-{_state.bridge_seq}"
        msg = {"jsonrpc": "2.0", "id": call_id, "run": _state.run_id, "secret": _state.secret, "method": method, "params": params}
        size = len(_dumps(msg))
        if size > _MAX_MESSAGE_BYTES:
            raise ValueError(f"{method}: the call is {size} bytes of JSON, above the agent's limit of {_MAX_MESSAGE_BYTES} bytes")
        _send(msg)
        while True:
            msg = _recv()
            if msg is None:
                raise RuntimeError(f"{method}: the agent went away")
            if msg.get("id") != call_id or "method" in msg:
                continue  # a stale answer to an interrupted call
            if "error" in msg:
                raise RuntimeError(f"{method} failed: {msg['error'].get('message', msg['error'])}")
            return msg.get("result")


_bridge_lock = _allocate_lock()


def llm_query(prompt, context=None):
    """Asks the caller's language model; returns its answer as a str. A
    `context` given here goes into the prompt (the caller adds it)."""
    params = {"prompt": str(prompt)}
    if context is not None:
        params["context"] = context
    return _bridge("llm_query", params)


def rlm_query(task, ctx=None):
    """Asks the caller to run a recursive sub-task; ctx defaults to the current context."""
    if ctx is None:
        ctx = _globals.get("context")
    return _bridge("rlm_query", {"task": str(task), "context": ctx})


def llm_query_batched(prompts):
    """Asks the caller's language model each prompt, concurrently; returns the answers in order."""
    prompts = [str(p) for p in prompts]
    answers = _bridge("llm_query_batched", {"prompts": prompts})
    return _answers(answers, len(prompts), "llm_query_batched")


def batch_llm_query(prompts):
    """llm_query_batched under the RLM sandbox's name: the answers in order."""
    prompts = list(prompts)
    return llm_query_batched(prompts) if prompts else []


def rlm_query_batched(tasks, ctx=None):
    """Runs recursive sub-tasks concurrently: each a str (with ctx, default the
    current context) or a (task, ctx) pair; returns the answers in order."""
    if ctx is None:
        ctx = _globals.get("context")
    items = []
    for t in tasks:
        task, task_ctx = (t[0], t[1]) if isinstance(t, (tuple, list)) else (t, ctx)
        items.append({"task": str(task), "context": task_ctx})
    answers = _bridge("rlm_query_batched", {"tasks": items})
    return _answers(answers, len(items), "rlm_query_batched")


def _answers(answers, n, method):
    if not isinstance(answers, list) or len(answers) != n:
        raise RuntimeError(f"{method}: the caller answered {type(answers).__name__} instead of a list of {n} answers")
    return answers


def FINAL_VAR(name):
    """Ends the execution with the value of the global `name` as its result."""
    if name not in _globals:
        raise NameError(f"FINAL_VAR: no variable named {name!r}")
    FINAL(_globals[name])


def chunk_text(text, size=2000, overlap=200):
    """Splits text into pieces of `size` characters that overlap by `overlap`."""
    if size <= 0:
        raise ValueError("size must be positive")
    if overlap < 0 or overlap >= size:
        raise ValueError("overlap must be at least 0 and less than size")
    step = size - overlap
    return [text[i:i + size] for i in range(0, max(len(text) - overlap, 1), step)]


def _context_text():
    ctx = _globals.get("context")
    if ctx is None:
        return ""
    if isinstance(ctx, str):
        return ctx
    if isinstance(ctx, list) and all(isinstance(c, dict) and "text" in c for c in ctx):
        return "\n".join(str(c["text"]) for c in ctx)
    return json.dumps(ctx)


def search_context(pattern, window=200, max_results=100):
    """Finds a regex in the context; returns at most `max_results` matches, each
    with `window` characters on each side (`context`, also `snippet`)."""
    text = _context_text()
    out = []
    for m in _pattern(pattern, 0).finditer(text):
        if len(out) >= max_results:
            break
        start, end = max(m.start() - window, 0), min(m.end() + window, len(text))
        around = text[start:end]
        out.append({"start": m.start(), "end": m.end(), "match": m.group(0), "context": around, "snippet": around})
    return out


# Text helpers over the context (the RLM sandbox's seed, repl-sandbox spec).
# Patterns are regular expressions, matched ignoring case unless said; one
# longer than 500 characters or not a valid regex is a ValueError.
_MAX_PATTERN = 500


def _pattern(pattern, flags=re.IGNORECASE):
    if not isinstance(pattern, str):
        raise TypeError(f"the pattern must be a str, not {type(pattern).__name__}")
    if len(pattern) > _MAX_PATTERN:
        raise ValueError(f"the pattern is {len(pattern)} characters, more than {_MAX_PATTERN}")
    try:
        return re.compile(pattern, flags)
    except re.error as e:
        raise ValueError(f"not a valid regular expression: {pattern!r}: {e}") from None


def count_matches(pattern):
    """How many times the pattern occurs in the context."""
    return len(_pattern(pattern).findall(_context_text()))


def extract_json(text):
    """The first JSON object or array in `text` (the longest that parses), or None."""
    text = str(text)
    for opener, closer in (("{", "}"), ("[", "]")):
        starts = [i for i, ch in enumerate(text) if ch == opener]
        ends = [i for i, ch in enumerate(text) if ch == closer]
        for start in starts:
            for end in reversed(ends):
                if end <= start:
                    break
                try:
                    return json.loads(text[start:end + 1])
                except ValueError:
                    continue
    return None


def _sections(regex):
    text = _context_text()
    found = list(regex.finditer(text))
    out = []
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        out.append({"header": m.group(0), "content": text[m.end():end].strip(), "start": m.start()})
    return out


def extract_sections(header_pattern):
    """The context split at each line the pattern matches: [{header, content, start}] (`^`/`$` match at lines)."""
    return _sections(_pattern(header_pattern, re.MULTILINE))


def chunk_by_headers(level=2):
    """The context split at its Markdown headers of `level` (## for 2): [{header, content, start}]."""
    return _sections(re.compile("^" + "#" * int(level) + r" .+$", re.MULTILINE))


def chunk_by_size(chars=50000, overlap=0):
    """The context in pieces of `chars` characters, each starting `overlap` characters before the last ended."""
    if chars <= 0:
        raise ValueError("chars must be positive")
    if overlap < 0 or overlap >= chars:
        raise ValueError("overlap must be at least 0 and less than chars")
    text = _context_text()
    out, start = [], 0
    while start < len(text):
        end = min(start + chars, len(text))
        out.append(text[start:end])
        if end == len(text):
            break
        start = end - overlap
    return out or [""]


def find_line(pattern):
    """The lines of the context the pattern matches: [(line number from 1, line)]."""
    regex = _pattern(pattern)
    return [(i + 1, line) for i, line in enumerate(_context_text().split("\n")) if regex.search(line)]


def count_lines(pattern=None):
    """How many lines the context has, or how many of them the pattern matches."""
    lines = _context_text().split("\n")
    if pattern is None:
        return len(lines)
    regex = _pattern(pattern)
    return sum(1 for line in lines if regex.search(line))


def get_line(n):
    """Line `n` of the context, counting from 1; "" past either end."""
    lines = _context_text().split("\n")
    return lines[n - 1] if 1 <= n <= len(lines) else ""


def quote_match(pattern, max_length=100):
    """The first match of the pattern in the context, cut at `max_length` characters (then "..."), or None."""
    m = _pattern(pattern).search(_context_text())
    if m is None:
        return None
    found = m.group(0)
    return found if len(found) <= max_length else found[:max_length] + "..."


def _chunks():
    ctx = _globals.get("context")
    if not isinstance(ctx, list):
        raise TypeError("the context is not a list of chunks ({id, text, tags, links}) and the caller "
                        "answers no memory functions")
    return [c for c in ctx if isinstance(c, dict)]


def _link(link):
    """A chunk's link: an id, or {"id": ..., "type": ...}."""
    return (link.get("id"), link.get("type")) if isinstance(link, dict) else (link, None)


# The memory functions ask the caller's chunk store when the caller answers
# them (execute's bridge_methods: the store stays with the caller, and the
# sandbox needs no network); else they search `context` as a list of chunks.

def read_chunk(chunk_id):
    """Returns the chunk with this id (a dict), or None."""
    if "read_chunk" in _state.bridge_methods:
        return _bridge("read_chunk", {"chunk_id": str(chunk_id)})
    for c in _chunks():
        if c.get("id") == chunk_id:
            return c
    return None


def search_chunks(query, limit=10):
    """Returns the ids of at most `limit` chunks that match `query` (in
    `context`: a regex over the chunks' text)."""
    if "search_chunks" in _state.bridge_methods:
        return _bridge("search_chunks", {"query": str(query), "limit": int(limit)})
    rx = re.compile(query)
    return [c.get("id") for c in _chunks() if rx.search(str(c.get("text", "")))][:max(int(limit), 0)]


def list_chunks_by_tag(tag):
    """Returns the chunks tagged `tag`."""
    if "list_chunks_by_tag" in _state.bridge_methods:
        return _bridge("list_chunks_by_tag", {"tag": str(tag)})
    return [c for c in _chunks() if tag in (c.get("tags") or [])]


def get_linked_chunks(chunk_id, link_type=None):
    """Returns the chunks the chunk `chunk_id` links to (only links of
    `link_type` when given)."""
    if "get_linked_chunks" in _state.bridge_methods:
        return _bridge("get_linked_chunks", {"chunk_id": str(chunk_id), "link_type": link_type})
    c = read_chunk(chunk_id)
    if c is None:
        return []
    links = {i for i, t in map(_link, c.get("links") or []) if link_type is None or t == link_type}
    return [o for o in _chunks() if o.get("id") in links]


# Rich results. display(obj) and the rich forms of a run's last expression
# (and the matplotlib figures it left open) go to the agent as frames on
# fd 1: the frame start the agent gave for this run, the result as JSON (which
# never holds a raw \x1e), and \x1e. In the output stream, so they keep
# their place between the prints around them.
_REPR_METHODS = (("image/png", "_repr_png_"), ("image/jpeg", "_repr_jpeg_"), ("image/svg+xml", "_repr_svg_"),
                 ("text/html", "_repr_html_"), ("text/markdown", "_repr_markdown_"),
                 ("text/latex", "_repr_latex_"), ("application/json", "_repr_json_"))
_BINARY_MIME = ("image/png", "image/jpeg", "image/gif", "application/pdf")
_MISSING = object()


class _Display:
    start = b""            # the agent's frame start for the run in flight ("" outside a run)
    max_bytes = 4 << 20    # one result's content
    budget = 16 << 20      # what is left for this run
    shown = set()          # ids of the figures this run displayed


def _rich_method(obj, name):
    """obj's _repr_*_ method, unless obj answers every attribute (a mock, a
    proxy), which would make any name look like a rich form."""
    try:
        if isinstance(obj, type) or getattr(obj, "_warmpool_no_such_attribute_", _MISSING) is not _MISSING:
            return None
        m = getattr(obj, name, None)
    except Exception:
        return None
    return m if callable(m) else None


def _figure_png(fig):
    # Not bbox_inches="tight" (as notebooks draw figures): it draws the
    # figure twice, to measure it first, and doubles a chart's cost (102 ->
    # 191 ms for a line plot here).
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _mime_bundle(obj, limit, text=None):
    """The MIME bundle of obj: its _repr_mimebundle_, its _repr_*_ methods, a
    matplotlib figure as PNG, and text/plain (its repr) always. A rich form
    that raises is left out; the exception goes to stderr."""
    data = {}
    forms = [("", "_repr_mimebundle_")] + list(_REPR_METHODS)
    for mime, name in forms:
        if mime in data:
            continue
        m = _rich_method(obj, name)
        if m is None:
            continue
        try:
            v = m()
        except Exception as e:
            print(f"display: {type(obj).__name__}.{name}() raised {type(e).__name__}: {e}", file=sys.stderr)
            continue
        if isinstance(v, tuple) and len(v) == 2:  # (data, metadata)
            v = v[0]
        if v is None:
            continue
        if mime == "":
            if isinstance(v, dict):
                data.update({k: x for k, x in v.items() if isinstance(k, str)})
        else:
            data[mime] = v
    if "image/png" not in data and type(obj).__module__.startswith("matplotlib") and hasattr(obj, "savefig"):
        _Display.shown.add(id(obj))
        data["image/png"] = _figure_png(obj)
    if not isinstance(data.get("text/plain"), str):
        # The repr made already: a slow __repr__ runs once, not twice.
        data["text/plain"] = text if text is not None else _safe_repr(obj, limit)
    return data


def _content(mime, v):
    """A bundle's value as JSON: base64 for binary types, text for the rest,
    any JSON value for application/json."""
    if mime in _BINARY_MIME:
        if isinstance(v, (bytes, bytearray, memoryview)):
            import base64
            return base64.b64encode(bytes(v)).decode()
        return str(v)  # already base64, as Jupyter's bundles carry it
    if mime == "application/json" or mime.endswith("+json"):
        try:
            json.dumps(v)
            return v
        except (TypeError, ValueError):
            return str(v)
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


def _size(n):
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} bytes"


def _emit_frame(payload):
    """Sends one display frame to the agent, after the output printed before it."""
    _flush_output()
    _write_fd(_STD_FDS.get(1, 1), _Display.start + payload + b"\x1e")


def _emit_display(data, main=False):
    """Bounds a bundle (per result and per run) and sends it; the text/plain
    form says what was left out and why."""
    out, omitted, notes = {}, [], []
    text = data.pop("text/plain", "")
    for mime, v in data.items():
        content = _content(mime, v)
        size = len(_dumps(content))
        if size > _Display.max_bytes or size > _Display.budget:
            which = "one result" if size > _Display.max_bytes else "a run (all its results)"
            limit = _Display.max_bytes if size > _Display.max_bytes else _Display.budget
            omitted.append(mime)
            notes.append(f"[{mime} left out: {_size(size)}, over the {_size(limit)} left for {which}]")
            continue
        _Display.budget -= size
        out[mime] = content
    text = _content("text/plain", text)
    if notes:
        text = (text + "\n" if text else "") + "\n".join(notes)
    if len(text) > _Display.max_bytes:
        text = text[:_Display.max_bytes] + f"... [{len(text) - _Display.max_bytes} characters cut]"
    out["text/plain"] = text
    msg = {"data": out}
    if main:
        msg["main"] = True
    if omitted:
        msg["omitted"] = omitted
    if not _Display.start:
        # No channel for rich results (a client that does not take them, or
        # outside a run): display() prints the text, as plain Python's
        # IPython.display does; the last expression's repr is the result.
        if not main:
            print(text)
        return
    _emit_frame(_dumps(msg).encode())


def display(*objs, raw=False):
    """Shows each object as a rich result (an image, HTML, markdown...) in
    the output, where the call is; raw=True takes dicts as MIME bundles."""
    for obj in objs:
        if raw and isinstance(obj, dict):
            data = {k: v for k, v in obj.items() if isinstance(k, str)}
            data.setdefault("text/plain", "")
        else:
            data = _mime_bundle(obj, 65536)
        _emit_display(data)


def _show_figures():
    """Displays the matplotlib figures left open and closes them (the end of
    a run, and plt.show())."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or not _Display.start:
        return
    for num in plt.get_fignums():
        fig = plt.figure(num)
        if id(fig) not in _Display.shown:
            _Display.shown.add(id(fig))
            _emit_display({"image/png": _figure_png(fig), "text/plain": repr(fig)})
    plt.close("all")


class _PyplotHook:
    """An import hook that makes plt.show() display the open figures as
    rich results (the Agg backend draws without a screen)."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        import importlib.util
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real = spec.loader.exec_module

        def exec_module(module):
            real(module)
            module.show = lambda *args, **kwargs: _show_figures()

        spec.loader.exec_module = exec_module
        return spec


_HELPERS = {
    "display": display, "FINAL": FINAL, "FINAL_VAR": FINAL_VAR, "llm_query": llm_query, "rlm_query": rlm_query,
    "llm_query_batched": llm_query_batched, "rlm_query_batched": rlm_query_batched, "chunk_text": chunk_text,
    "search_context": search_context, "count_matches": count_matches, "extract_json": extract_json,
    "extract_sections": extract_sections, "chunk_by_headers": chunk_by_headers, "chunk_by_size": chunk_by_size,
    "find_line": find_line, "count_lines": count_lines, "get_line": get_line, "quote_match": quote_match,
    "batch_llm_query": batch_llm_query, "read_chunk": read_chunk, "search_chunks": search_chunks,
    "list_chunks_by_tag": list_chunks_by_tag, "get_linked_chunks": get_linked_chunks,
}
_globals = {"__name__": "__main__", "__builtins__": builtins, "context": None, **_HELPERS}


def _flush_output():
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass
    if _libc is not None:
        try:
            _libc.fflush(None)  # C extensions' stdio buffers
        except Exception:
            pass


def _server_frame(frame):
    # By its globals as well as its file name: code the user runs with exec()
    # or eval() of a string is "<string>" too, and is the user's.
    return frame.f_globals is _SERVER_GLOBALS and frame.f_code.co_filename == SERVER_FILE


def _user_tb(tb):
    """tb without this server's frames: _execute below the code, helpers such
    as llm_query and _bridge in the middle, _on_sigint on top. A user sees
    their code and the library code it called."""
    kept = []
    while tb is not None:
        if not _server_frame(tb.tb_frame):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _format_exception(exc):
    """The traceback of exc and of the exceptions chained to it (raise ...
    from, during handling, groups), each without the server's frames. The
    exceptions get their own tracebacks back: the code may still hold them."""
    saved, todo = {}, [exc]
    try:
        while todo:
            e = todo.pop()
            if e is None or id(e) in saved:
                continue
            saved[id(e)] = (e, e.__traceback__)
            e.__traceback__ = _user_tb(e.__traceback__)
            todo += [e.__cause__, e.__context__]
            if isinstance(e, _EXCEPTION_GROUPS):
                todo += list(e.exceptions)
        return traceback.format_exception(type(exc), exc, exc.__traceback__)
    finally:
        for e, tb in saved.values():
            e.__traceback__ = tb


def _error(exc, limit=65536):
    # traceback and linecache are shared with the code, which may have patched
    # them: their failure costs the traceback, never the reply.
    try:
        if isinstance(exc, SyntaxError):
            lines = traceback.format_exception_only(type(exc), exc)
        else:
            lines = _format_exception(exc)
    except BaseException as e:
        lines = [f"[the traceback could not be formatted: {type(e).__name__}]\n"]
    try:
        message = str(exc)
    except BaseException as e:  # a broken __str__ must not break the server
        message = f"<str() failed: {type(e).__name__}>"
    tb = "".join(lines)
    if len(tb) > limit:  # the end of a traceback says most
        tb = f"[{len(tb) - limit} characters cut]...\n" + tb[-limit:]
    return {"type": type(exc).__name__, "message": _clip(message, limit), "traceback": tb}


def _clip(s, limit):
    return s if len(s) <= limit else s[:limit] + f"... [{len(s) - limit} characters cut]"


def _safe_repr(value, limit):
    try:
        r = repr(value)
    except BaseException as e:  # a broken __repr__ must not break the server
        r = f"<repr failed: {type(e).__name__}: {e}>"
    return _clip(r, limit)


_sources = []  # (filename, characters) of earlier executions in linecache, oldest first


def _cache_source(filename, code):
    """Puts this execution's source in linecache for its tracebacks, and keeps
    earlier executions' sources, newest first, only within _LINECACHE_BUDGET."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    total, keep = 0, 0
    for i in range(len(_sources) - 1, -1, -1):
        if total + _sources[i][1] > _LINECACHE_BUDGET:
            for name, _ in _sources[:i + 1]:
                linecache.cache.pop(name, None)
            keep = len(_sources) - i - 1
            break
        total += _sources[i][1]
    else:
        keep = len(_sources)
    _sources[:] = _sources[len(_sources) - keep:] + [(filename, len(code))]


def _execute(params):
    code = params["code"]
    if params.get("clear_interrupt"):
        _state.interrupt_pending = False
    _state.exec_count += 1
    filename = f"<exec-{_state.exec_count}>"
    _restore_std()
    _cache_source(filename, code)
    if "context" in params:
        _globals["context"] = params["context"]
    env = params.get("env") or {}
    saved_env = {k: _getenv(k) for k in env}
    for k, v in env.items():
        _setenv(k, str(v))
    _state.bridge_calls = 0
    _state.bridge_enabled = bool(params.get("bridge"))
    _state.bridge_methods = frozenset(params.get("bridge_methods") or ()) if _state.bridge_enabled else frozenset()
    _state.max_bridge_calls = int(params.get("max_bridge_calls", 16))
    result_limit = int(params.get("max_result_chars", 65536))
    _Display.start = (params.get("display") or "").encode()
    _Display.max_bytes = int(params.get("max_display_bytes") or 4 << 20)
    _Display.budget = int(params.get("max_run_display_bytes") or 16 << 20)
    _Display.shown = set()

    status, result, error = "ok", None, None
    try:
        try:
            tree = compile(code, filename, "exec", _PyCF_ONLY_AST)
            last = None
            if tree.body and isinstance(tree.body[-1], _ast_Expr):
                last = _ast_Expression(tree.body.pop().value)
            body = compile(tree, filename, "exec")
            tail = compile(last, filename, "eval") if last is not None else None
            _state.running = True
            try:
                if _state.interrupt_pending:
                    _state.interrupt_pending = False
                    raise KeyboardInterrupt
                exec(body, _globals)
                _no_trace(), _no_profile()
                if tail is not None:
                    value = eval(tail, _globals)
                    _no_trace(), _no_profile()
                    if value is not None:
                        result = _safe_repr(value, result_limit)
                        bundle = _mime_bundle(value, result_limit, text=result)
                        if len(bundle) > 1:  # a rich form besides its repr
                            _emit_display(bundle, main=True)
                _show_figures()
            finally:
                _state.running = False
                _no_trace(), _no_profile()
        except _Final as f:
            result = f.value if isinstance(f.value, str) else _safe_repr(f.value, result_limit)
            if len(result) > result_limit:
                result = result[:result_limit] + f"... [{len(result) - result_limit} characters cut]"
            status = "final"
        except KeyboardInterrupt as e:
            status, error = "interrupted", _error(e, result_limit)
        except SystemExit as e:
            status, error = "error", {"type": "SystemExit", "message": _clip(f"the code called exit({e.code!r})", result_limit),
                                      "traceback": ""}
        except BaseException as e:
            status, error = "error", _error(e, result_limit)
    except KeyboardInterrupt as e:  # SIGINT landed between user code and this frame
        status, error = "interrupted", _error(e, result_limit)
    finally:
        for k, v in saved_env.items():
            _setenv(k, v)
        _state.bridge_enabled = False
        _state.bridge_methods = frozenset()
    if status not in ("ok", "final"):
        # Figures the code left open before it failed or was stopped are
        # still shown (as a notebook does); a failure here is only noted.
        _state.running = True
        try:
            _show_figures()
        except BaseException as e:
            print(f"showing the open figures failed: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            _state.running = False
    _Display.start = b""
    _flush_output()
    _restore_std()  # before the end markers: the code may have closed fd 1 or 2
    return {"status": status, "result": result, "error": error}


def _get_variable(params):
    name = params["name"]
    limit = int(params.get("max_bytes") or 4 << 20)
    if name not in _globals or name in _HELPERS or name.startswith("__"):
        return {"found": False}
    value = _globals[name]
    kind = type(value).__name__
    # The value's own code (__repr__, a JSON hook) runs here: it is the user's
    # code, interrupted by SIGINT like a run.
    _state.running = True
    try:
        try:
            # Encoded piecewise, so a huge value is refused after `limit` bytes
            # instead of being turned into one huge string first.
            parts, size = [], 0
            for part in json.JSONEncoder(allow_nan=False, separators=(",", ":")).iterencode(value):
                size += len(part)
                if size > limit:
                    return {"found": True, "too_large": True, "limit": limit, "type": kind}
                parts.append(part)
            return {"found": True, "json": _decoder.decode("".join(parts)), "type": kind}
        except (TypeError, ValueError, RecursionError):
            return {"found": True, "repr": _safe_repr(value, 65536), "type": kind}
    finally:
        _state.running = False


# Snapshots: the user's namespace by value, so a Session outlives its pod
# (suspend and resume), is copied (fork) or comes back from a caller's bytes
# (restore). cloudpickle, not pickle or dill: functions, lambdas and classes
# defined in the REPL live in a "__main__" that is not importable, and
# cloudpickle saves exactly those by value and everything importable by
# reference (dill would do the same as one more dependency; not measured
# against it). zstandard level 3: as fast as lz4 and smaller (measured on 12 MB
# of arrays and dicts: 31 ms to compress, 17 ms to expand, against zlib's 429
# ms and 100 ms); zlib when the module is missing, named in the manifest.
# A snapshot is unpickled only here, in a sandbox: never by the agent, the
# manager or a client (they read the JSON manifest the agent puts in front).

_SNAPSHOT_MODULE = "warmpool_repl"


def _snapshot_helpers():
    """Makes the helpers and the namespace reachable by reference under one
    importable module, so a user function that calls llm_query or reads a
    global is saved without the server's own code and state."""
    mod = sys.modules.get(_SNAPSHOT_MODULE)
    if mod is None:
        mod = types.ModuleType(_SNAPSHOT_MODULE)
        sys.modules[_SNAPSHOT_MODULE] = mod
    for name, fn in _HELPERS.items():
        try:
            fn.__module__, fn.__qualname__ = _SNAPSHOT_MODULE, name
        except (AttributeError, TypeError):
            continue
        setattr(mod, name, fn)
    mod.namespace = _namespace
    return mod


def _namespace():
    return _globals


class _NamespaceRef:
    """Stands for the REPL's namespace as a function's globals: unpickled, the
    function reads and writes the restored namespace itself, not a copy."""

    def __reduce__(self):
        return (_namespace, ())


_NamespaceRef.__module__ = _SNAPSHOT_MODULE
_namespace.__module__, _namespace.__qualname__ = _SNAPSHOT_MODULE, "namespace"


def _user_names():
    return [k for k in _globals
            if not (k.startswith("__") and k.endswith("__")) and not (k in _HELPERS and _globals[k] is _HELPERS[k])]


def _compressor(level):
    try:
        import zstandard
        return "zstd", lambda f: zstandard.ZstdCompressor(level=level).stream_writer(f, closefd=False)
    except ImportError:
        import zlib

        class _Zlib:
            def __init__(self, f):
                self.f, self.c = f, zlib.compressobj(1)

            def write(self, b):
                self.f.write(self.c.compress(b))
                return len(b)

            def flush(self, *_):
                pass

            def close(self):
                self.f.write(self.c.flush())
        return "zlib", _Zlib


def _decompressed(f, compression):
    if compression == "zstd":
        import zstandard
        return zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
    if compression == "zlib":
        import zlib
        return io.BytesIO(zlib.decompress(f.read()))
    raise ValueError(f"unknown compression {compression!r}")


class _Counted:
    def __init__(self, f, limit):
        self.f, self.n, self.limit = f, 0, limit

    def write(self, b):
        self.n += len(b)
        if self.limit and self.n > self.limit:
            raise _TooLarge(self.n)
        return self.f.write(b)


class _TooLarge(Exception):
    pass


def _snapshot(params):
    import cloudpickle
    _snapshot_helpers()
    path, limit = params["path"], int(params.get("max_bytes") or 0)
    compression, writer = _compressor(int(params.get("level") or 3))

    class Pickler(cloudpickle.CloudPickler):
        def _function_getnewargs(self, func):
            args = super()._function_getnewargs(func)
            if func.__globals__ is _globals:
                args = (args[0], _NamespaceRef()) + tuple(args[2:])
            return args

    names = _user_names()
    modules = {k: _globals[k].__name__ for k in names if isinstance(_globals[k], types.ModuleType)}
    values = {k: _globals[k] for k in names if k not in modules}
    skipped = []

    def dump(ns):
        with open(path, "wb") as f:
            counted = _Counted(f, limit)
            z = writer(counted)
            Pickler(z, protocol=5).dump(ns)
            z.close()
            return counted.n

    # The values' own __reduce__ methods are the user's code: SIGINT stops them as it stops a run.
    _state.running = True
    try:
        try:
            size = dump(values)
        except _TooLarge as e:
            return {"too_large": True, "bytes": e.args[0], "limit": limit}
        except Exception:
            # Find what cannot be saved, name it, and keep the rest: never a
            # silent partial namespace.
            for k in list(values):
                try:
                    Pickler(io.BytesIO(), protocol=5).dump(values[k])
                except Exception as e:
                    skipped.append({"name": k, "type": type(values[k]).__name__,
                                    "reason": _clip(f"{type(e).__name__}: {e}", 500)})
                    del values[k]
            try:
                size = dump(values)
            except _TooLarge as e:
                return {"too_large": True, "bytes": e.args[0], "limit": limit}
    finally:
        _state.running = False
    return {
        "python": sys.version.split()[0],
        "serializer": f"cloudpickle {cloudpickle.__version__}",
        "compression": compression,
        "bytes": size,
        "variables": [{"name": k, "type": type(v).__name__} for k, v in values.items()],
        "modules": modules,
        "skipped": skipped,
    }


def _restore(params):
    """Replaces the namespace with a snapshot's: names the code made since are gone."""
    _snapshot_helpers()
    path, compression = params["path"], params.get("compression") or "zstd"
    # Cleared first: unpickling a function writes the globals it reads into
    # the namespace (its globals are the namespace itself, see _NamespaceRef).
    for k in _user_names():
        del _globals[k]
    _state.running = True
    try:
        with open(path, "rb") as f:
            values = __import__("pickle").load(_decompressed(f, compression))
    finally:
        _state.running = False
    if not isinstance(values, dict):
        raise ValueError("the snapshot's namespace is not a dict")
    failed = {}
    for alias, name in (params.get("modules") or {}).items():
        try:
            _globals[alias] = importlib.import_module(name)
        except Exception as e:
            failed[alias] = _clip(f"{type(e).__name__}: {e}", 500)
    _globals.update({k: v for k, v in values.items() if isinstance(k, str)})
    return {"variables": len(values), "modules_failed": failed}


def _write_marker(marker):
    """Marks the end of one execution's output on fd 1 and fd 2, so the agent
    knows it has read everything the code wrote before the reply."""
    if not marker:
        return
    for fd in (1, 2):
        _write_fd(fd, marker.encode())


def main():
    _open_transport()
    try:
        os.nice(5)  # the agent must stay responsive while user code burns CPU
    except OSError:
        pass
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")  # under memory pressure, the interpreter dies before the agent
    except OSError:
        pass
    if _THREAD_STACK_BYTES:
        import threading
        threading.stack_size(_THREAD_STACK_BYTES)
    # matplotlib draws without a screen, and plt.show() displays (before the
    # preload, which may import pyplot).
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.meta_path.insert(0, _PyplotHook())
    preload = [m for m in os.environ.get("WARMPOOL_PRELOAD", "").split(",") if m]
    loaded, failed = [], {}
    for mod in preload:
        try:
            importlib.import_module(mod)
            top = mod.split(".")[0]
            _globals[top] = sys.modules[top]
            loaded.append(mod)
        except Exception as e:
            failed[mod] = f"{type(e).__name__}: {e}"
    # What a snapshot and a restore import, imported while the pod warms:
    # a resume on a fresh pod would otherwise pay for the imports (tens of
    # milliseconds in a gVisor sandbox). Not in the user's namespace.
    for mod in ("cloudpickle", "zstandard"):
        try:
            importlib.import_module(mod)
        except Exception:
            pass
    _flush_output()
    _send({"jsonrpc": "2.0", "method": "ready", "params": {
        "python": sys.version.split()[0], "pid": os.getpid(), "preloaded": loaded, "failed": failed}})

    handlers = {"execute": _execute, "get_variable": _get_variable, "snapshot": _snapshot, "restore": _restore}
    while True:
        _reclaim()
        try:
            msg = _recv()
        except KeyboardInterrupt:
            continue
        except ValueError as e:
            # Not the agent's: the agent ends this process for it.
            _send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": f"parse error: {e}"}})
            continue
        if msg is None:
            return
        method = msg.get("method")
        if method is None:
            continue  # a stale bridge answer
        rid = _state.run_id = msg.get("id")
        secret = _state.secret = msg.get("secret")
        fn = handlers.get(method)
        if fn is None:
            _send({"jsonrpc": "2.0", "id": rid, "secret": secret, "error": {"code": -32601, "message": f"unknown method {method}"}})
            continue
        try:
            res = fn(msg.get("params") or {})
        except KeyboardInterrupt:
            res = {"status": "interrupted", "result": None, "error": {"type": "KeyboardInterrupt", "message": "", "traceback": ""}}
        except BaseException as e:
            if _getpid() != _SERVER_PID:
                _exit(0)
            try:
                text = f"{type(e).__name__}: {e}"
            except BaseException:
                text = "an error in the REPL server"
            _send({"jsonrpc": "2.0", "id": rid, "secret": secret, "error": {"code": -32603, "message": text}})
            continue
        if _getpid() != _SERVER_PID:
            # A child the code forked came back here: it ends, and only the
            # interpreter answers (with the child's output flushed first).
            _flush_output()
            _exit(0)
        marker = (msg.get("params") or {}).get("marker")
        try:
            _write_marker(marker)
        except KeyboardInterrupt:
            _write_marker(marker)
        except OSError:
            pass  # the code closed fd 1 or 2; the agent stops waiting for the marker
        _send({"jsonrpc": "2.0", "id": rid, "secret": secret, "result": res})


if __name__ == "__main__":
    main()
