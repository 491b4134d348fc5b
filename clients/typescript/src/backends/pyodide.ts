// pyodide: CPython compiled to WebAssembly, from the installed `pyodide`
// package (no network at run time), running the same REPL server as the
// other backends. By default in a worker thread with a SharedArrayBuffer
// interrupt buffer: a timeout or cancel() raises KeyboardInterrupt in the
// code; code that ignores it (or sits in time.sleep, which Pyodide cannot
// interrupt) is stopped after `grace` by terminating the worker, and a fresh
// one starts without the old variables. With useWorker: false Pyodide runs on
// the caller's thread: cancel() is a no-op, a timeout cannot stop the code
// (the run is reported as past its timeout when it returns), and the code's
// bridge calls fail, because a synchronous llm_query cannot wait for an
// asynchronous callback on the thread it blocks.
import { MessageChannel, Worker } from "node:worker_threads";

import { OutputCollector, answerBridge, bridgeErrorMessage, toCodeExecution, type RawOutcome, Serial } from "../run.js";
import { allowedIndexURLHosts, validatePyodideURL } from "../indexurl.js";
import { notInitialized, SandboxError, type CodeExecution, type Sandbox, type SandboxBridges, type SandboxConfig } from "../types.js";
import { replServer } from "./native.js";
import { loadCore, type Core } from "./pyodide-core.js";

interface Engine {
  call(type: "execute" | "get_variable", params: object, output?: OutputCollector, onBridge?: (msg: any) => void): Promise<any>;
  answer(json: string): void;
  interrupt(): void;
  terminate(): Promise<void>;
}

/** Whether Pyodide can run in a worker thread here, interruptible through a SharedArrayBuffer. */
export function detectWorkerSupport(): boolean {
  return typeof SharedArrayBuffer === "function" && typeof Worker === "function";
}

function indexURL(u?: string | string[]): string | undefined {
  return Array.isArray(u) ? u[0] : u;
}

/**
 * A worker with this process's flags, but --input-type, which Node refuses
 * for a worker started from a file (`node --input-type=module -e ...`); when
 * the remaining flags cannot be given to a worker (--expose-gc...), none.
 */
function newWorker(url: URL): Worker {
  const argv = process.execArgv.filter((a) => !a.startsWith("--input-type"));
  if (argv.length === process.execArgv.length) return new Worker(url);
  try {
    return new Worker(url, { execArgv: argv });
  } catch (e) {
    if ((e as { code?: string }).code !== "ERR_WORKER_INVALID_EXEC_ARGV") throw e;
    return new Worker(url, { execArgv: [] });
  }
}

/** Pyodide in a worker thread. */
async function workerEngine(config: SandboxConfig): Promise<Engine> {
  const interruptSAB = new SharedArrayBuffer(1);
  const interrupt = new Uint8Array(interruptSAB);
  const wakeSAB = new SharedArrayBuffer(4);
  const wake = new Int32Array(wakeSAB);
  const { port1, port2 } = new MessageChannel();
  const worker = newWorker(new URL("./pyodide-worker.js", import.meta.url));
  let seq = 0;
  const pending = new Map<number, { resolve: (v: any) => void; output?: OutputCollector; onBridge?: (m: any) => void }>();
  let current: number | undefined;
  let failure: Error | undefined;
  const ready = new Promise<void>((resolve, reject) => {
    worker.on("message", (m: any) => {
      switch (m.type) {
        case "ready":
          return resolve();
        case "failed":
          return reject(new SandboxError(`Pyodide did not start: ${m.message}`));
        case "output":
          return pending.get(current!)?.output?.write(m.stream, m.data);
        case "bridge":
          return pending.get(current!)?.onBridge?.(JSON.parse(m.json));
        case "display":
          return pending.get(current!)?.output?.display(JSON.parse(m.json));
        case "reply": {
          const p = pending.get(m.id);
          pending.delete(m.id);
          p?.resolve(JSON.parse(m.reply));
        }
      }
    });
    worker.on("error", (e) => {
      failure = e;
      reject(e);
    });
    worker.on("exit", () => {
      failure ??= new SandboxError("the Pyodide worker exited");
      for (const p of pending.values()) p.resolve({ status: "error", exited: true, error: { type: "InterpreterDied", message: failure.message } });
      pending.clear();
      reject(failure);
    });
  });
  worker.postMessage({
    type: "init", interrupt: interruptSAB, wake: wakeSAB, answers: port2, source: replServer(),
    indexURL: indexURL(config.indexURL), fullStdLib: config.fullStdLib, packages: config.preloadPackages,
  }, [port2]);
  await ready;
  const poke = () => {
    Atomics.store(wake, 0, 1);
    Atomics.notify(wake, 0);
  };
  return {
    call(type, params, output, onBridge) {
      if (failure) return Promise.resolve({ status: "error", exited: true, error: { type: "InterpreterDied", message: failure.message } });
      const id = ++seq;
      current = id;
      Atomics.store(interrupt, 0, 0);
      return new Promise((resolve) => {
        pending.set(id, { resolve, output, onBridge });
        worker.postMessage({ type, id, params: JSON.stringify(params) });
      });
    },
    answer(json) {
      port1.postMessage(json);
      poke();
    },
    interrupt() {
      Atomics.store(interrupt, 0, 2);
      poke(); // a run blocked in a bridge call wakes up and sees it
    },
    async terminate() {
      port1.close();
      await worker.terminate();
    },
  };
}

/** Pyodide on the caller's thread (useWorker: false). */
async function directEngine(config: SandboxConfig): Promise<Engine> {
  let output: OutputCollector | undefined;
  let lastCall: string | undefined;
  const core: Core = await loadCore({
    indexURL: indexURL(config.indexURL), fullStdLib: config.fullStdLib, packages: config.preloadPackages, source: replServer(),
    write: (stream, data) => output?.write(stream, data),
    send: (json) => (lastCall = JSON.parse(json).id),
    display: (json) => output?.display(JSON.parse(json)),
    recv: () => JSON.stringify({ jsonrpc: "2.0", id: lastCall, error: { message:
      "bridge calls need the Pyodide worker (useWorker: true): on the caller's thread the code cannot wait for an asynchronous answer" } }),
  });
  return {
    async call(type, params, out) {
      output = out;
      try {
        return JSON.parse(type === "execute" ? core.execute(JSON.stringify(params)) : core.getVariable(JSON.stringify(params)));
      } finally {
        output = undefined;
      }
    },
    answer() {},
    interrupt() {},
    async terminate() {},
  };
}

export class PyodideSandbox implements Sandbox {
  readonly backend = "pyodide";
  readonly worker: boolean;
  private engine?: Promise<Engine>;
  private readonly calls = new Serial();
  private running?: (reason: "timeout" | "cancel") => void;
  private destroyed = false;
  private initialized = false;
  private context: unknown = undefined;

  constructor(private readonly config: SandboxConfig, private readonly bridges: SandboxBridges) {
    this.worker = config.useWorker !== false && detectWorkerSupport();
  }

  private start(): Promise<Engine> {
    if (this.destroyed) return Promise.reject(new SandboxError("the sandbox was destroyed"));
    if (!this.engine) {
      this.engine = this.worker ? workerEngine(this.config) : directEngine(this.config);
      this.engine.catch(() => (this.engine = undefined));
    }
    return this.engine;
  }

  async initialize(context: string): Promise<void> {
    validatePyodideURL(this.config.indexURL, allowedIndexURLHosts(this.config));
    this.context = context;
    await this.calls.run(async () => {
      const reply = await (await this.start()).call("execute", { code: "", context });
      if (reply.status !== "ok") throw new SandboxError(`setting the context failed: ${reply.error?.message}`);
    });
    this.initialized = true;
  }

  execute(code: string): Promise<CodeExecution> {
    if (!this.destroyed && !this.initialized) return notInitialized();
    const started = performance.now();
    return this.calls.run(async () => {
      const engine = await this.start();
      const output = new OutputCollector(this.config);
      let stoppedBy: "timeout" | "cancel" | undefined;
      let killTimer: NodeJS.Timeout | undefined;
      let killed = false;
      this.running = (reason) => {
        if (stoppedBy || !this.worker) return;
        stoppedBy = reason;
        engine.interrupt();
        killTimer = setTimeout(() => {
          killed = true;
          this.engine = undefined;
          void engine.terminate();
        }, this.config.grace ?? 2000);
      };
      const timer = this.config.timeout > 0 && this.worker
        ? setTimeout(() => this.running?.("timeout"), this.config.timeout) : undefined;
      let reply: any;
      try {
        reply = await engine.call("execute", {
          code, marker: "", bridge: true, max_bridge_calls: this.config.maxBridgeCalls ?? 64,
          max_result_chars: Math.max(this.config.maxOutputLength || 0, 65536),
        }, output, (msg) => void this.bridge(engine, msg));
      } finally {
        clearTimeout(timer);
        clearTimeout(killTimer);
        this.running = undefined;
      }
      let outcome: RawOutcome = reply;
      if (reply.exited || killed) {
        outcome = stoppedBy
          ? { status: stoppedBy === "timeout" ? "timed_out" : "interrupted", stateLost: true,
              error: { type: "KeyboardInterrupt", message: "the code did not stop when interrupted" } }
          : { ...reply, stateLost: true };
        this.engine = undefined;
        if (this.context !== undefined && !this.destroyed) {
          // A fresh Pyodide with the context, loading while the caller reads
          // this outcome (seconds): the next call waits for it, not this one.
          const context = this.context;
          const fresh = this.start().then(async (e) => {
            await e.call("execute", { code: "", context });
            return e;
          });
          this.engine = fresh;
          fresh.catch(() => (this.engine = undefined));
        }
      } else if (stoppedBy === "timeout" && reply.status === "interrupted") {
        outcome = { ...reply, status: "timed_out" };
      } else if (!this.worker && this.config.timeout > 0 && performance.now() - started > this.config.timeout) {
        const ex = toCodeExecution(code, reply, output, started, this.config);
        ex.status = "timeout";
        ex.error = (ex.error ? ex.error + "\n" : "") +
          `TimeoutError: the code ran longer than its timeout of ${this.config.timeout} ms (on the caller's thread it cannot be interrupted)`;
        return ex;
      }
      return toCodeExecution(code, outcome, output, started, this.config);
    });
  }

  private async bridge(engine: Engine, msg: any): Promise<void> {
    let reply: object;
    try {
      reply = { jsonrpc: "2.0", id: msg.id, result: await answerBridge(this.bridges, msg.method, msg.params) };
    } catch (e) {
      reply = { jsonrpc: "2.0", id: msg.id, error: { code: -32000, message: bridgeErrorMessage(e) } };
    }
    engine.answer(JSON.stringify(reply));
  }

  getVariable(name: string): Promise<unknown> {
    if (!this.destroyed && !this.initialized) return notInitialized();
    return this.calls.run(async () => {
      const v = await (await this.start()).call("get_variable", { name });
      if (v.exited) throw new SandboxError(`reading ${name} failed: ${v.error?.message}`);
      if (!v.found) return undefined;
      if (v.too_large) throw new SandboxError(`${name} (${v.type}) is larger than ${v.limit} bytes of JSON`);
      return "json" in v ? v.json : v.repr;
    });
  }

  async cancel(): Promise<void> {
    this.running?.("cancel");
  }

  async destroy(): Promise<void> {
    this.destroyed = true;
    const engine = this.engine;
    this.engine = undefined;
    if (engine) await (await engine.catch(() => undefined))?.terminate();
  }
}
