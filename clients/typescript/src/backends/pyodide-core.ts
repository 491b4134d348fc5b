// The REPL server (python/replserver.py, the agent's own) inside Pyodide. It
// runs in the worker thread (pyodide-worker.ts) or, with useWorker: false,
// on the caller's thread. Pyodide has no fds or signals: the server's
// transport (_send/_recv) is replaced by the functions given here, and an
// interrupt comes through Pyodide's interrupt buffer, which raises
// KeyboardInterrupt through the same SIGINT handler the agent's SIGINT does.
import { createRequire } from "node:module";
import { dirname, sep } from "node:path";

export interface CoreOptions {
  indexURL?: string;
  fullStdLib?: boolean;
  packages?: string[];
  source: string;
  /** Output of the code, as it is written. */
  write: (stream: "stdout" | "stderr", text: string) => void;
  /** A message of the server to the host (a bridge call). */
  send: (json: string) => void;
  /** A rich result of the run, as JSON, after the output before it. */
  display: (json: string) => void;
  /** The host's answer to the last bridge call, as JSON, or null when the run was interrupted. */
  recv: () => string | null;
  interruptBuffer?: Uint8Array;
}

export interface Core {
  /** Runs the server's execute; returns its reply's result as JSON. */
  execute(paramsJSON: string): string;
  getVariable(paramsJSON: string): string;
  version: string;
}

/**
 * The installed pyodide package's directory, the default indexURL. Pyodide
 * finds it from its own module URL, which a test runner or bundler that
 * rewrites module URLs (vitest) points elsewhere: given, it holds everywhere.
 */
function installedPyodide(): string | undefined {
  try {
    return dirname(createRequire(import.meta.url).resolve("pyodide")) + sep;
  } catch {
    return undefined; // let Pyodide find itself
  }
}

export async function loadCore(o: CoreOptions): Promise<Core> {
  const { loadPyodide } = await import("pyodide");
  const indexURL = o.indexURL ?? installedPyodide();
  const decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
  const writer = (stream: "stdout" | "stderr") => ({
    write: (buf: Uint8Array) => {
      o.write(stream, decoders[stream].decode(buf, { stream: true }));
      return buf.length;
    },
  });
  const py = await loadPyodide({
    ...(indexURL ? { indexURL } : {}),
    fullStdLib: o.fullStdLib ?? false,
    stdout: undefined,
    stderr: undefined,
  });
  py.setStdout(writer("stdout"));
  py.setStderr(writer("stderr"));
  if (o.packages?.length) await py.loadPackage(o.packages);
  if (o.interruptBuffer) py.setInterruptBuffer(o.interruptBuffer);
  const ns = py.globals.get("dict")();
  ns.set("__name__", "warmpool_repl");
  py.runPython(o.source, { globals: ns });
  ns.set("_js_send", o.send);
  ns.set("_js_recv", o.recv);
  ns.set("_js_display", o.display);
  py.runPython(`
def _send(msg):
    _js_send(_dumps(msg))


def _recv():
    s = _js_recv()
    if s is None:
        raise KeyboardInterrupt
    return _loads(s)


def _emit_frame(payload):
    _flush_output()
    _js_display(payload.decode())


def _js_execute(s):
    params = _loads(s)
    params["display"] = "pyodide"  # rich results go through _emit_frame above
    return _dumps(_execute(params))


def _js_get_variable(s):
    return _dumps(_get_variable(_loads(s)))
`, { globals: ns });
  const execute = ns.get("_js_execute");
  const getVariable = ns.get("_js_get_variable");
  const version = py.runPython("import sys; sys.version.split()[0]") as string;
  return { execute: (p) => execute(p), getVariable: (p) => getVariable(p), version };
}
