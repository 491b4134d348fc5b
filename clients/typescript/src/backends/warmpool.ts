// warmpool: a Session of a SandboxPool on a Kubernetes cluster, through the
// data plane (data.warmpool.dev, served by kube-apiserver's aggregation
// layer, so the kubeconfig's credentials and RBAC on the Session decide).
// The first call creates the Session, waits for a warm interpreter and runs
// its code in one request (runs/NAME/exec with keep); the next go to
// sessions/NAME/exec. The code's llm_query/rlm_query come back as events on
// the run's stream and are answered by the caller's bridges: the sandbox
// needs no egress and never sees an API key.
import { randomBytes } from "node:crypto";
import type http from "node:http";

import { HTTPError, json, readAll, type Request } from "../http.js";
import { OutputCollector, type RawOutcome } from "../run.js";
import { outcomeOf, readRun, StreamCutError } from "../stream.js";
import { DATA_GROUP, GROUP, Kube, VERSION } from "../kube.js";
import { SNAPSHOT_MEDIA_TYPE } from "../snapshot.js";
import { NotRunError, SandboxError, type SandboxBridges, type SandboxConfig } from "../types.js";
import { RemoteSandbox, type RunFields } from "./remote.js";

// A lost answer (recover): a run unknown to its agent may still reach it for
// RECOVER_GRACE_MS (a request a gone replica had sent on); the search gives up
// after RECOVER_TIMEOUT_MS; one question waits ASK_TIMEOUT_MS (the API server
// may still send it to the replica that went away, which answers nothing);
// a run that never left is sent again MAX_RESENDS times, after
// RESEND_DELAY_MS, then twice as long each time.
const RECOVER_GRACE_MS = 1_000;
const RECOVER_TIMEOUT_MS = 60_000;
const ASK_TIMEOUT_MS = 5_000;
const MAX_RESENDS = 3;
const RESEND_DELAY_MS = 200;

// A first call that meets the Session of an earlier one of this sandbox,
// ended, deletes it and makes it again at most TAKEOVER_ATTEMPTS times.
const TAKEOVER_ATTEMPTS = 5;
// The annotation the data plane puts on a one-call run's Session: its run's ID.
const RUN_ANNOTATION = "sandbox.warmpool.dev/run";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The fields of a Session this client reads. */
interface SessionObject {
  metadata: { uid: string; annotations?: Record<string, string> };
  status?: { phase?: string };
}

/** The request went nowhere: refused as not ready (503), or no connection. */
function notSent(e: unknown): boolean {
  return (e instanceof HTTPError && e.status === 503) || (e as NodeJS.ErrnoException)?.code === "ECONNREFUSED";
}

/** The request may have reached the agent, and its answer did not come back. */
function lostAnswer(e: unknown): boolean {
  const code = (e as NodeJS.ErrnoException)?.code;
  return e instanceof StreamCutError || (e instanceof HTTPError && e.status === 502) ||
    code === "ECONNRESET" || code === "EPIPE" || code === "ETIMEDOUT" || code === "ECONNABORTED" || code === "ERR_STREAM_PREMATURE_CLOSE";
}

/** A Session name of the client's own making: `ts-` and 10 random characters. */
export function sessionName(prefix = "ts-"): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  return prefix + Array.from(randomBytes(10), (b) => alphabet[b % alphabet.length]).join("");
}

export class WarmpoolSandbox extends RemoteSandbox {
  readonly backend = "warmpool";
  /** The Session's name (set before the first call), e.g. for kubectl get ses. */
  readonly name: string;
  private kube?: Promise<Kube>;
  private leased = false;
  /** The IDs of the first calls sent (runs/NAME/exec): the Session they made carries one. */
  private readonly firstRuns = new Set<string>();

  constructor(config: SandboxConfig, bridges: SandboxBridges, name?: string, leased = false) {
    super(config, bridges);
    if (!config.pool) throw new SandboxError("the warmpool backend needs a pool (config.pool: a SandboxPool's name, or namespace/name for a shared pool)");
    this.name = name ?? sessionName();
    this.leased = leased;
    this.initialized = leased; // a fork or a Session attached to comes with its state
  }

  /** The namespace of the Session (the config's, else the kubeconfig context's). */
  async namespace(): Promise<string> {
    return this.config.namespace ?? (await this.client()).namespace;
  }

  private client(): Promise<Kube> {
    this.kube ??= Kube.load({ kubeconfig: this.config.kubeconfig, kubeContext: this.config.kubeContext });
    return this.kube;
  }

  protected async request(req: Request): Promise<http.IncomingMessage> {
    return (await this.client()).request(req);
  }

  /** The path of a data-plane subresource of this Session. */
  async path(sub: string): Promise<string> {
    const ns = encodeURIComponent(await this.namespace());
    return `/apis/${DATA_GROUP}/${VERSION}/namespaces/${ns}/sessions/${this.name}/${sub}`;
  }

  protected fields(code: string, context?: unknown): RunFields {
    // The pool decides how much output a run keeps (its
    // spec.executionDefaults.maxOutputBytes, 64 KiB unless changed) and
    // refuses a request for more; maxOutputLength cuts what is left.
    const f = super.fields(code, context);
    delete f.maxOutputBytes;
    return f;
  }

  protected async startRun(fields: RunFields): Promise<http.IncomingMessage> {
    if (this.leased) {
      return this.request({ method: "POST", path: await this.path("exec"), body: fields, accept: "application/x-ndjson" });
    }
    // The first call leases: a Session named here, owned by the caller,
    // kept open for the next calls, and its first run, in one round trip.
    const ns = encodeURIComponent(await this.namespace());
    const body: Record<string, unknown> = {
      ...fields, pool: this.config.pool, keep: true, waitMillis: this.config.readyTimeout ?? 60_000,
    };
    if (this.config.idleTimeout) body.idleTimeoutMillis = Math.round(this.config.idleTimeout * 1000);
    this.firstRuns.add(fields.id);
    for (let attempt = 0; ; attempt++) {
      try {
        const res = await this.request({
          method: "POST", path: `/apis/${DATA_GROUP}/${VERSION}/namespaces/${ns}/runs/${this.name}/exec`, body,
          accept: "application/x-ndjson",
        });
        this.leased = true;
        return res;
      } catch (e) {
        if (!(e instanceof HTTPError && e.status === 409 && e.reason === "AlreadyExists")) throw e;
        // The Session of an earlier first call of this sandbox: one that
        // found no pod in time (the data plane closed it), or whose answer
        // was lost. Taken over while it lives; made again once it ended.
        const ses = await this.ownSession(ns);
        if (!ses) {
          if (attempt >= TAKEOVER_ATTEMPTS) throw e;
          continue; // gone meanwhile: create it again
        }
        if (!["Closed", "Lost"].includes(ses.status?.phase ?? "")) {
          this.leased = true;
          return this.request({ method: "POST", path: await this.path("exec"), body: fields, accept: "application/x-ndjson" });
        }
        if (attempt >= TAKEOVER_ATTEMPTS) {
          throw new SandboxError(`Session ${this.name} of this sandbox ended ${ses.status?.phase} and could not be made again: ${String(e)}`);
        }
        await this.request({
          method: "DELETE", path: `/apis/${GROUP}/${VERSION}/namespaces/${ns}/sessions/${this.name}`,
          body: { kind: "DeleteOptions", apiVersion: "v1", preconditions: { uid: ses.metadata.uid } },
        }).then(readAll, (de) => { if (!(de instanceof HTTPError && (de.status === 404 || de.status === 409))) throw de; });
        await sleep(RESEND_DELAY_MS * 2 ** attempt); // a Session being deleted still holds its name
      }
    }
  }

  /**
   * The Session under this sandbox's name if an earlier first call of this
   * sandbox made it (its run annotation names one of those calls), else
   * undefined; someone else's Session under the name is an error.
   */
  private async ownSession(ns: string): Promise<SessionObject | undefined> {
    let ses: SessionObject;
    try {
      ses = await json(await this.request({ method: "GET", path: `/apis/${GROUP}/${VERSION}/namespaces/${ns}/sessions/${this.name}` }));
    } catch (e) {
      if (e instanceof HTTPError && e.status === 404) return undefined;
      throw e;
    }
    if (!this.firstRuns.has(ses?.metadata?.annotations?.[RUN_ANNOTATION] ?? "")) {
      throw new SandboxError(`a Session named ${this.name} exists and is not this sandbox's: choose another name`);
    }
    return ses;
  }

  /**
   * A run whose answer was lost (a data-plane replica stopped, the
   * connection broke): refused or never sent, it is sent again; otherwise
   * the Session's agent is asked about it by its ID, through any replica,
   * and its result taken (the output the stream did not bring comes from
   * it), or the run attached to while it still runs; sent again only if the
   * agent never heard of it. The code never runs twice.
   */
  protected async recover(fields: RunFields, output: OutputCollector, cause: unknown): Promise<RawOutcome> {
    // The output the stream did not bring comes from the result: after a
    // lookup, and after a send again too, which attaches (the result alone)
    // when the run had arrived after all (a 503 from a replica that went
    // away after it forwarded the run).
    const handOnRest = (found: RawOutcome) => {
      const rest = (all: string | undefined, seen: string) =>
        all && all.length > seen.length && all.startsWith(seen) ? all.slice(seen.length) : "";
      output.write("stdout", rest(found.stdout, output.stdout));
      output.write("stderr", rest(found.stderr, output.stderr));
      return found;
    };
    for (let resends = 0; ; resends++) {
      if (notSent(cause)) {
        if (resends >= MAX_RESENDS) throw cause;
        await sleep(RESEND_DELAY_MS * 2 ** resends);
      } else if (lostAnswer(cause)) {
        const found = await this.lookUp(fields, output, cause);
        if (found) {
          this.leased = true;
          return handOnRest(found);
        }
        if (resends >= MAX_RESENDS) throw new NotRunError(this.name, cause);
      } else {
        throw cause;
      }
      try {
        return handOnRest(await this.send(fields, output));
      } catch (e) {
        cause = e;
      }
    }
  }

  /** The outcome of a run whose answer was lost, or undefined if its agent never had it. */
  private async lookUp(fields: RunFields, output: OutputCollector, cause: unknown): Promise<RawOutcome | undefined> {
    const unknownUntil = Date.now() + RECOVER_GRACE_MS;
    const giveUp = Date.now() + RECOVER_TIMEOUT_MS;
    let last: unknown = cause;
    while (Date.now() < giveUp) {
      try {
        const info = await json(await this.request({
          method: "GET", path: `${await this.path("executions")}?id=${encodeURIComponent(fields.id)}`,
          signal: AbortSignal.timeout(ASK_TIMEOUT_MS),
        }));
        if (info?.running) {
          // It runs: the same ID attaches to it, and never runs it again.
          const body = await this.request({ method: "POST", path: await this.path("exec"), body: fields, accept: "application/x-ndjson" });
          return await readRun(body, output, this.bridges, (call, a) => this.answer(fields.id, call, a));
        }
        if (info?.result) return outcomeOf(info.result);
      } catch (e) {
        if (e instanceof HTTPError && e.status === 404 && Date.now() > unknownUntil) return undefined;
        if (e instanceof HTTPError && e.status === 409) {
          throw new SandboxError(`the answer of run ${fields.id} was lost and Session ${this.name} is not Ready: whether the code ran is unknown (${String(cause)})`);
        }
        last = e; // a replica going away, a question that hung: ask again
      }
      await sleep(100);
    }
    throw new SandboxError(`the answer of run ${fields.id} was lost, and asking about it failed for ${RECOVER_TIMEOUT_MS / 1000}s (last: ${String(last)})`);
  }

  /** Leases the Session now (it is leased by the first call otherwise). */
  async lease(): Promise<void> {
    // Decided in the queue: calls that race lease once.
    if (!this.leased) await this.serial(async () => void (this.leased || (await this.run("None"))));
  }

  /** Runs a shell command (/bin/sh -c) in the Session's workspace; a first call leases the Session with it. */
  shell(command: string, opts: { timeout?: number; onStdout?: (l: string) => void; onStderr?: (l: string) => void } = {}):
    Promise<{ stdout: string; stderr: string; exitCode: number; timedOut: boolean; durationMs: number }> {
    return this.serial(async () => {
      // A first call leases with this command (startRun): one round trip.
      const started = performance.now();
      const fields: RunFields = { ...this.fields(command), language: "shell" };
      delete fields.timeoutMillis;
      if (opts.timeout && opts.timeout > 0) fields.timeoutMillis = Math.ceil(opts.timeout);
      const output = new OutputCollector({ onStdout: opts.onStdout, onStderr: opts.onStderr });
      this.running = fields.id;
      try {
        const body = await this.startRun(fields);
        const outcome = await readRun(body, output, this.bridges, (call, a) => this.answer(fields.id, call, a));
        output.end();
        const timedOut = outcome.status === "timed_out" || outcome.status === "interrupted";
        return {
          stdout: output.stdout, stderr: output.stderr, timedOut, durationMs: performance.now() - started,
          exitCode: timedOut ? 124 : outcome.exitCode ?? (outcome.status === "ok" ? 0 : 1),
        };
      } finally {
        this.running = undefined;
      }
    });
  }

  /** A fresh interpreter (and an end to processes earlier runs left); files stay. */
  async reset(): Promise<void> {
    await this.lease();
    await this.serial(async () => {
      await readAll(await this.request({ method: "POST", path: await this.path("reset"), body: {} }));
    });
  }

  /** A file of the Session's workspace (a path from the workspace's root). */
  async readFile(path: string): Promise<Buffer> {
    await this.lease();
    return readAll(await this.request({ method: "GET", path: `${await this.path("files")}?path=${encodeURIComponent(path)}`, accept: "*/*" }));
  }

  /** Writes a file of the workspace, creating its directories. */
  async writeFile(path: string, data: Buffer | string): Promise<void> {
    await this.lease();
    await readAll(await this.request({ method: "PUT", path: `${await this.path("files")}?path=${encodeURIComponent(path)}`, raw: data }));
  }

  /** The entries of a directory of the workspace. */
  async listFiles(path = "."): Promise<{ name: string; path: string; size: number; dir: boolean; mode: string; modTime: string }[]> {
    await this.lease();
    return (await json(await this.request({ method: "GET", path: `${await this.path("files")}?path=${encodeURIComponent(path)}&list=true` }))) ?? [];
  }

  /**
   * The Session's state as a snapshot (its variables, functions, classes and
   * the names of imported modules; with `workspace`, its files): bytes to keep,
   * to restore later (`restore`), or to inspect (`readManifest`).
   */
  async snapshot(opts: { workspace?: boolean } = {}): Promise<Buffer> {
    await this.lease();
    const q = opts.workspace ? "?workspace=true" : "";
    return this.serial(async () =>
      readAll(await this.request({ method: "GET", path: `${await this.path("snapshot")}${q}`, accept: SNAPSHOT_MEDIA_TYPE })));
  }

  /** Replaces the Session's state with a snapshot's; names made since are gone. */
  async restore(snapshot: Buffer): Promise<{ variables: number; modulesFailed?: Record<string, string>; workspaceFiles?: number }> {
    await this.lease();
    const restored = await this.serial(async () => json(await this.request({ method: "POST", path: await this.path("restore"), raw: snapshot })));
    this.initialized = true;
    return restored as { variables: number; modulesFailed?: Record<string, string>; workspaceFiles?: number };
  }

  /**
   * `n` new sandboxes, each with a copy of this one's state, made on the
   * server (the state does not pass through here); each goes on alone.
   */
  async fork(n = 1, opts: { names?: string[]; workspace?: boolean; timeout?: number } = {}): Promise<WarmpoolSandbox[]> {
    await this.lease();
    const body: Record<string, unknown> = opts.names ? { names: opts.names } : { count: n };
    if (opts.workspace) body.workspace = true;
    if (opts.timeout) body.waitMillis = Math.round(opts.timeout * 1000);
    const out = await this.serial(async () =>
      json(await this.request({ method: "POST", path: await this.path("fork"), body })) as Promise<{ sessions: string[] }>);
    return out.sessions.map((name) => new WarmpoolSandbox({ ...this.config, namespace: this.config.namespace }, this.bridges, name, true));
  }

  protected async answer(runId: string, callId: string, answer: { result?: unknown; error?: string }): Promise<void> {
    await readAll(await this.request({ method: "POST", path: await this.path("bridge"), body: { id: runId, call: callId, ...answer } }));
  }

  protected async interrupt(runId: string): Promise<void> {
    await readAll(await this.request({ method: "POST", path: await this.path("interrupt"), body: { id: runId } }));
  }

  protected async variable(name: string): Promise<http.IncomingMessage> {
    return this.request({ method: "GET", path: `${await this.path("variables")}?name=${encodeURIComponent(name)}` });
  }

  /** Closes the Session: its pod is freed at once. */
  async destroy(): Promise<void> {
    if (this.destroyed) return;
    await this.cancel().catch(() => {});
    this.destroyed = true;
    if (this.kube) {
      const kube = await this.kube.catch(() => undefined);
      if (kube) {
        try {
          const ns = encodeURIComponent(await this.namespace());
          await readAll(await kube.request({ method: "DELETE", path: `/apis/${GROUP}/${VERSION}/namespaces/${ns}/sessions/${this.name}` }));
        } catch (e) {
          if (!(e instanceof HTTPError && e.status === 404)) throw e;
        } finally {
          kube.close();
        }
      }
    }
  }
}
