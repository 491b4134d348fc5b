// The worker thread of the pyodide backend: Pyodide and the REPL server run
// here, so that a runaway loop blocks this thread, not the caller's, and
// destroy() gets the WebAssembly memory back by terminating the thread.
// Bridge calls block this thread (the code's llm_query is synchronous) until
// the main thread posts the answer on `answers` and wakes it through `wake`.
import { parentPort, receiveMessageOnPort, type MessagePort } from "node:worker_threads";

import { loadCore, type Core } from "./pyodide-core.js";

let core: Core | undefined;

parentPort!.on("message", async (m: any) => {
  if (m.type === "init") {
    const interrupt = new Uint8Array(m.interrupt as SharedArrayBuffer);
    const wake = new Int32Array(m.wake as SharedArrayBuffer);
    const answers = m.answers as MessagePort;
    try {
      core = await loadCore({
        indexURL: m.indexURL, fullStdLib: m.fullStdLib, packages: m.packages, source: m.source, interruptBuffer: interrupt,
        write: (stream, data) => parentPort!.postMessage({ type: "output", stream, data }),
        send: (json) => parentPort!.postMessage({ type: "bridge", json }),
        display: (json) => parentPort!.postMessage({ type: "display", json }),
        recv: () => {
          for (;;) {
            Atomics.wait(wake, 0, 0);
            Atomics.store(wake, 0, 0);
            const got = receiveMessageOnPort(answers);
            if (got) return got.message as string;
            if (Atomics.load(interrupt, 0) === 2) {
              Atomics.store(interrupt, 0, 0);
              return null;
            }
          }
        },
      });
      parentPort!.postMessage({ type: "ready", version: core.version });
    } catch (e) {
      parentPort!.postMessage({ type: "failed", message: e instanceof Error ? e.message : String(e) });
    }
    return;
  }
  if (!core) return;
  let reply: string;
  try {
    reply = m.type === "execute" ? core.execute(m.params) : core.getVariable(m.params);
  } catch (e) {
    // A KeyboardInterrupt outside the code (between two of the server's steps).
    const message = e instanceof Error ? e.message : String(e);
    reply = JSON.stringify(/KeyboardInterrupt/.test(message)
      ? { status: "interrupted", error: { type: "KeyboardInterrupt", message: "" } }
      : { status: "error", error: { type: "InternalError", message } });
  }
  parentPort!.postMessage({ type: "reply", id: m.id, reply });
});
