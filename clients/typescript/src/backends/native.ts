// native: a local python3 running the agent's own REPL server
// (python/replserver.py, copied from internal/agent/interpreter), spoken to
// as the agent speaks to it: JSON-RPC 2.0, one message per line, on two pipes
// of their own (fd 3 in, fd 4 out), so that what the code prints on stdout
// and stderr never mixes with the protocol. A timeout or cancel() sends
// SIGINT; code that does not stop within `grace` is killed with its
// interpreter, which is started again (its variables are gone, and the
// CodeExecution says so).
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import readline from "node:readline";
import type { Readable, Writable } from "node:stream";

import { answerBridge, bridgeErrorMessage, OutputCollector, toCodeExecution, type RawOutcome, Serial } from "../run.js";
import { allowedIndexURLHosts, validatePyodideURL } from "../indexurl.js";
import { notInitialized, SandboxError, type CodeExecution, type Sandbox, type SandboxBridges, type SandboxConfig } from "../types.js";

let replServerSource: string | undefined;

/** The REPL server's source, shipped in the package's python/ directory. */
export function replServer(): string {
  replServerSource ??= fs.readFileSync(new URL("../../python/replserver.py", import.meta.url), "utf8");
  return replServerSource;
}

/** The Python version of `python` when it runs and is 3.8 or newer, else undefined. */
export function pythonVersion(python: string): string | undefined {
  const r = spawnSync(python, ["--version"], { encoding: "utf8", timeout: 10_000 });
  if (r.error || r.status !== 0) return undefined;
  const m = /Python (3)\.(\d+)\.?(\d*)/.exec(`${r.stdout}${r.stderr}`);
  if (!m || Number(m[2]) < 8) return undefined;
  return `${m[1]}.${m[2]}${m[3] ? "." + m[3] : ""}`;
}

/** The python3 the native backend runs: config.pythonPath, else python3, else python. */
export function findPython(pythonPath?: string): string | undefined {
  const candidates = pythonPath ? [pythonPath] : ["python3", "python"];
  return candidates.find((p) => pythonVersion(p) !== undefined);
}

/**
 * Splits a stream at the run's end marker, decoding UTF-8 across chunks, and
 * takes the run's display frames (frame start, JSON, \x1e) out of it, where
 * they stood between the output around them.
 */
class MarkedStream {
  private readonly decoder = new TextDecoder();
  private held = "";
  private marker = "";
  private frameStart = "";
  private frame: string | undefined;
  private seen?: () => void;
  sink?: (text: string) => void;
  onFrame?: (json: string) => void;

  expect(marker: string, frameStart = ""): Promise<void> {
    this.marker = marker;
    this.frameStart = frameStart;
    return new Promise((resolve) => (this.seen = resolve));
  }

  feed(chunk: Buffer): void {
    let text = this.held + this.decoder.decode(chunk, { stream: true });
    this.held = "";
    while (text) {
      if (this.frame !== undefined) {
        const end = text.indexOf("\u001e");
        if (end < 0) {
          this.frame += text;
          return;
        }
        const json = this.frame + text.slice(0, end);
        this.frame = undefined;
        text = text.slice(end + 1);
        this.onFrame?.(json);
        continue;
      }
      if (!this.marker) {
        this.sink?.(text);
        return;
      }
      const at = text.indexOf(this.marker);
      const fs = this.frameStart ? text.indexOf(this.frameStart) : -1;
      if (fs >= 0 && (at < 0 || fs < at)) {
        this.sink?.(text.slice(0, fs));
        this.frame = "";
        text = text.slice(fs + this.frameStart.length);
        continue;
      }
      if (at >= 0) {
        this.sink?.(text.slice(0, at));
        const rest = text.slice(at + this.marker.length);
        this.marker = this.frameStart = "";
        const seen = this.seen;
        this.seen = undefined;
        seen?.();
        if (rest) this.sink?.(rest);
        return;
      }
      // Hold back what may be the start of the marker or of a frame.
      const keep = Math.max(heldBack(text, this.marker), heldBack(text, this.frameStart));
      this.held = text.slice(text.length - keep);
      if (text.length > keep) this.sink?.(text.slice(0, text.length - keep));
      return;
    }
  }

  /** The process went away: nothing more will come. */
  close(): void {
    if (this.held) this.sink?.(this.held);
    this.held = "";
    this.frame = undefined;
    const seen = this.seen;
    this.seen = undefined;
    this.marker = this.frameStart = "";
    seen?.();
  }
}

/** How many characters at text's end could be the start of mark. */
function heldBack(text: string, mark: string): number {
  for (let k = Math.min(mark.length - 1, text.length); k > 0; k--) {
    if (mark.startsWith(text.slice(text.length - k))) return k;
  }
  return 0;
}

function killGroup(child: ChildProcess): void {
  try {
    process.kill(-child.pid!, "SIGKILL");
  } catch {
    child.kill("SIGKILL");
  }
}

interface Process {
  child: ChildProcess;
  requests: Writable;
  stdout: MarkedStream;
  stderr: MarkedStream;
  waiters: Map<string, (msg: any) => void>;
  onBridge?: (msg: any) => void;
  exited: Promise<void>;
  alive: boolean;
}

export class NativePythonSandbox implements Sandbox {
  readonly backend = "native";
  private proc?: Process;
  private starting?: Promise<Process>;
  private readonly calls = new Serial();
  private running?: { id: string; interrupt: (reason: "timeout" | "cancel") => void };
  private strayInterrupt = false;
  private destroyed = false;
  private initialized = false;
  private context: unknown = undefined;

  constructor(private readonly config: SandboxConfig, private readonly bridges: SandboxBridges) {}

  private python(): string {
    const p = findPython(this.config.pythonPath);
    if (!p) throw new SandboxError(`no Python 3.8 or newer at ${this.config.pythonPath ?? "python3 or python"}`);
    return p;
  }

  private start(): Promise<Process> {
    if (this.destroyed) return Promise.reject(new SandboxError("the sandbox was destroyed"));
    if (this.proc?.alive) return Promise.resolve(this.proc);
    this.starting ??= this.spawn().finally(() => (this.starting = undefined));
    return this.starting;
  }

  private async spawn(): Promise<Process> {
    const env = { ...process.env };
    for (const k of Object.keys(env)) if (k.startsWith("WARMPOOL_")) delete env[k];
    const child = spawn(this.python(), ["-u", "-c", replServer()], {
      stdio: ["ignore", "pipe", "pipe", "pipe", "pipe"],
      env,
      // A process group of its own, so that destroy() also ends the
      // processes the code started. Should this process die first, the
      // server reads EOF on its request pipe and exits.
      detached: true,
    });
    const p: Process = {
      child,
      requests: child.stdio[3] as Writable,
      stdout: new MarkedStream(),
      stderr: new MarkedStream(),
      waiters: new Map(),
      alive: true,
      exited: new Promise((resolve) => child.once("exit", () => resolve())),
    };
    let early = "";
    const collectEarly = (t: string) => (early += t);
    p.stdout.sink = collectEarly;
    p.stderr.sink = collectEarly;
    child.stdout!.on("data", (b: Buffer) => p.stdout.feed(b));
    child.stderr!.on("data", (b: Buffer) => p.stderr.feed(b));
    p.requests.on("error", () => {}); // EPIPE when the interpreter died; its exit says the rest
    const ready = new Promise<any>((resolve, reject) => {
      p.waiters.set("ready", resolve);
      child.once("error", reject);
      child.once("exit", (code, signal) => reject(new SandboxError(
        `python exited at start-up (${signal ?? `exit ${code}`}): ${early.trim().slice(-2000)}`)));
    });
    readline.createInterface({ input: child.stdio[4] as Readable }).on("line", (line) => {
      if (!line.trim()) return;
      let msg: any;
      try {
        msg = JSON.parse(line);
      } catch {
        return; // not the server's: the code wrote to the protocol pipe
      }
      if (msg.method === "ready") return p.waiters.get("ready")?.(msg);
      if (msg.method) return p.onBridge?.(msg);
      const w = p.waiters.get(msg.id);
      if (w) {
        p.waiters.delete(msg.id);
        w(msg);
      }
    });
    child.once("exit", () => {
      p.alive = false;
      p.stdout.close();
      p.stderr.close();
      for (const w of p.waiters.values()) w({ error: { message: "the interpreter exited" }, exited: true });
      p.waiters.clear();
    });
    const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
    try {
      await ready;
    } finally {
      clearTimeout(timer);
    }
    p.stdout.sink = p.stderr.sink = undefined;
    this.proc = p;
    return p;
  }

  private send(p: Process, msg: object): void {
    p.requests.write(JSON.stringify(msg) + "\n");
  }

  private call(p: Process, method: string, params: object): Promise<any> {
    const id = randomBytes(16).toString("hex");
    const reply = new Promise<any>((resolve) => p.waiters.set(id, resolve));
    this.send(p, { jsonrpc: "2.0", id, method, params });
    return reply;
  }

  async initialize(context: string): Promise<void> {
    validatePyodideURL(this.config.indexURL, allowedIndexURLHosts(this.config));
    this.context = context;
    await this.calls.run(async () => {
      const p = await this.start();
      const reply = await this.call(p, "execute", { code: "", context, marker: "" });
      if (reply.error) throw new SandboxError(`setting the context failed: ${reply.error.message}`);
    });
    this.initialized = true;
  }

  execute(code: string): Promise<CodeExecution> {
    if (!this.destroyed && !this.initialized) return notInitialized();
    const started = performance.now();
    return this.calls.run(async () => {
      const p = await this.start();
      const id = randomBytes(16).toString("hex");
      const marker = `\u001ewarmpool-end-${id}\u001e`;
      const display = `\u001ewarmpool-display-${id}\u001e`;
      const output = new OutputCollector(this.config);
      p.stdout.sink = (t) => output.write("stdout", t);
      p.stderr.sink = (t) => output.write("stderr", t);
      p.stdout.onFrame = (json) => {
        try {
          output.display(JSON.parse(json));
        } catch {
          // not a frame of the server's
        }
      };
      const markers = Promise.all([p.stdout.expect(marker, display), p.stderr.expect(marker)]);
      p.onBridge = (msg) => this.bridge(p, id, msg);

      let stoppedBy: "timeout" | "cancel" | undefined;
      let killTimer: NodeJS.Timeout | undefined;
      const interrupt = (reason: "timeout" | "cancel") => {
        if (stoppedBy || !p.alive) return;
        stoppedBy = reason;
        p.child.kill("SIGINT");
        killTimer = setTimeout(() => killGroup(p.child), this.config.grace ?? 2000);
      };
      this.running = { id, interrupt };
      const timer = this.config.timeout > 0 ? setTimeout(() => interrupt("timeout"), this.config.timeout) : undefined;
      const reply = new Promise<any>((resolve) => p.waiters.set(id, resolve));
      this.send(p, {
        jsonrpc: "2.0", id, method: "execute",
        params: {
          code, marker, bridge: true, max_bridge_calls: this.config.maxBridgeCalls ?? 64,
          max_result_chars: Math.max(this.config.maxOutputLength || 0, 65536), clear_interrupt: this.strayInterrupt,
          display,
        },
      });
      this.strayInterrupt = false;
      let msg: any;
      try {
        msg = await reply;
        if (!msg.exited) {
          // The reply comes after the markers were written: wait for them
          // (briefly: code that closed fd 1 or 2 never lets them through).
          await Promise.race([markers, new Promise((r) => setTimeout(r, 2000))]);
        }
      } finally {
        clearTimeout(timer);
        clearTimeout(killTimer);
        this.running = undefined;
        p.onBridge = undefined;
        p.stdout.sink = p.stderr.sink = undefined;
        p.stdout.onFrame = undefined;
      }
      let outcome: RawOutcome;
      if (msg.exited) {
        await p.exited;
        outcome = stoppedBy
          ? { status: stoppedBy === "timeout" ? "timed_out" : "interrupted", stateLost: true,
              error: { type: "KeyboardInterrupt", message: "the code did not stop when interrupted" } }
          : { status: "error", stateLost: true,
              error: { type: "InterpreterDied", message: `the interpreter exited (${p.child.signalCode ?? `exit ${p.child.exitCode}`})` } };
        if (this.context !== undefined && !this.destroyed) {
          // A new interpreter starts with the context the sandbox was given.
          const np = await this.start();
          await this.call(np, "execute", { code: "", context: this.context, marker: "" });
        }
      } else if (msg.error) {
        outcome = { status: "error", error: { type: "ProtocolError", message: msg.error.message } };
      } else {
        outcome = msg.result as RawOutcome;
        if (stoppedBy && outcome.status !== "interrupted") this.strayInterrupt = true;
        if (stoppedBy === "timeout" && outcome.status === "interrupted") outcome = { ...outcome, status: "timed_out" };
      }
      return toCodeExecution(code, outcome, output, started, this.config);
    });
  }

  private async bridge(p: Process, runId: string, msg: any): Promise<void> {
    if (msg.run !== runId) return; // not from this run's server (a forged line)
    let reply: object;
    try {
      reply = { jsonrpc: "2.0", id: msg.id, result: await answerBridge(this.bridges, msg.method, msg.params) };
    } catch (e) {
      reply = { jsonrpc: "2.0", id: msg.id, error: { code: -32000, message: bridgeErrorMessage(e) } };
    }
    if (p.alive && this.running?.id === runId) this.send(p, reply);
  }

  getVariable(name: string): Promise<unknown> {
    if (!this.destroyed && !this.initialized) return notInitialized();
    return this.calls.run(async () => {
      const p = await this.start();
      const reply = await this.call(p, "get_variable", { name });
      if (reply.error) throw new SandboxError(`reading ${name} failed: ${reply.error.message}`);
      const v = reply.result ?? {};
      if (!v.found) return undefined;
      if (v.too_large) throw new SandboxError(`${name} (${v.type}) is larger than ${v.limit} bytes of JSON`);
      return "json" in v ? v.json : v.repr;
    });
  }

  async cancel(): Promise<void> {
    this.running?.interrupt("cancel");
  }

  async destroy(): Promise<void> {
    this.destroyed = true;
    const p = this.proc;
    this.proc = undefined;
    if (p?.alive) {
      killGroup(p.child);
      await p.exited;
    }
  }
}
