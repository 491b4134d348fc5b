// What the daemon and warmpool backends share: both talk to a warmpool agent
// (directly over the daemon's socket, or through the data plane), which runs
// the REPL server and streams a run as NDJSON events.
import { randomUUID } from "node:crypto";
import type http from "node:http";

import { HTTPError, json, type Request } from "../http.js";
import { OutputCollector, toCodeExecution, Serial, type RawOutcome } from "../run.js";
import { readRun } from "../stream.js";
import { allowedIndexURLHosts, validatePyodideURL } from "../indexurl.js";
import { notInitialized, SandboxError, type CodeExecution, type Sandbox, type SandboxBridges, type SandboxConfig } from "../types.js";

/** The fields of a run request both the agent and the data plane take. */
export interface RunFields {
  id: string;
  code: string;
  stream: true;
  bridge: true;
  context?: unknown;
  timeoutMillis?: number;
  graceMillis?: number;
  maxOutputBytes?: number;
  maxBridgeCalls: number;
  language?: "python" | "shell";
}

/** The most output per stream an agent in a pod keeps (api/v1alpha1 MaxOutputBytesLimit). */
export const MAX_OUTPUT_BYTES = 131072;

export abstract class RemoteSandbox implements Sandbox {
  protected running?: string;
  protected destroyed = false;
  /** initialize has resolved (or the sandbox came with its state: a fork, an attach, a restore). */
  protected initialized = false;
  private readonly calls = new Serial();

  constructor(protected readonly config: SandboxConfig, protected readonly bridges: SandboxBridges) {}

  /** Sends a request to the agent or the data plane. */
  protected abstract request(req: Request): Promise<http.IncomingMessage>;
  /** Starts the run (and, on first use, whatever holds the interpreter); answers its stream. */
  protected abstract startRun(fields: RunFields): Promise<http.IncomingMessage>;
  protected abstract answer(runId: string, callId: string, answer: { result?: unknown; error?: string }): Promise<void>;
  protected abstract interrupt(runId: string): Promise<void>;
  protected abstract variable(name: string): Promise<http.IncomingMessage>;
  abstract destroy(): Promise<void>;

  protected serial<T>(f: () => Promise<T>): Promise<T> {
    if (this.destroyed) return Promise.reject(new SandboxError("the sandbox was destroyed"));
    return this.calls.run(f);
  }

  protected fields(code: string, context?: unknown): RunFields {
    const f: RunFields = {
      id: randomUUID(), code, stream: true, bridge: true, maxBridgeCalls: this.config.maxBridgeCalls ?? 64,
      // Room for maxOutputLength characters of UTF-8, within what agents in
      // pods allow (the SandboxPool API's MaxOutputBytesLimit); the cut a
      // caller sees is this client's, unless the agent had to cut first.
      maxOutputBytes: Math.min(Math.max((this.config.maxOutputLength || 0) * 4 + 4096, 64 << 10), MAX_OUTPUT_BYTES),
    };
    if (this.config.timeout > 0) f.timeoutMillis = Math.ceil(this.config.timeout);
    if (this.config.grace) f.graceMillis = this.config.grace;
    if (context !== undefined) f.context = context;
    return f;
  }

  protected async run(code: string, context?: unknown): Promise<CodeExecution> {
    const started = performance.now();
    const fields = this.fields(code, context);
    const output = new OutputCollector(this.config);
    this.running = fields.id;
    try {
      let outcome: RawOutcome;
      try {
        outcome = await this.send(fields, output);
      } catch (e) {
        outcome = await this.recover(fields, output, e);
      }
      return toCodeExecution(code, outcome, output, started, this.config);
    } finally {
      this.running = undefined;
    }
  }

  /** Sends a run and reads it to its outcome. */
  protected async send(fields: RunFields, output: OutputCollector): Promise<RawOutcome> {
    const body = await this.startRun(fields);
    return readRun(body, output, this.bridges, (call, a) => this.answer(fields.id, call, a));
  }

  /**
   * What became of a run whose send failed with cause: a backend that can
   * ask about a run by its ID (warmpool) finds out; this one cannot.
   */
  protected async recover(_fields: RunFields, _output: OutputCollector, cause: unknown): Promise<RawOutcome> {
    throw cause;
  }

  async initialize(context: string): Promise<void> {
    validatePyodideURL(this.config.indexURL, allowedIndexURLHosts(this.config));
    const ex = await this.serial(() => this.run("None", context));
    if (ex.error) throw new SandboxError(`setting the context failed: ${ex.error}`);
    this.initialized = true;
  }

  execute(code: string): Promise<CodeExecution> {
    if (!this.destroyed && !this.initialized) return notInitialized();
    return this.serial(() => this.run(code));
  }

  getVariable(name: string): Promise<unknown> {
    if (!this.destroyed && !this.initialized) return notInitialized();
    return this.serial(async () => {
      let v: any;
      try {
        v = await json(await this.variable(name));
      } catch (e) {
        if (e instanceof HTTPError && e.status === 404 && /no variable/.test(e.message)) return undefined;
        throw e;
      }
      return v && "json" in v ? v.json : v?.repr;
    });
  }

  async cancel(): Promise<void> {
    const id = this.running;
    if (!id) return;
    try {
      await this.interrupt(id);
    } catch (e) {
      // 404/409: the run ended meanwhile.
      if (!(e instanceof HTTPError && (e.status === 404 || e.status === 409))) throw e;
    }
  }
}
