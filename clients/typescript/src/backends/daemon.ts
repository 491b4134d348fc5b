// daemon: the warmpool agent running on this machine
// (`agent serve --socket ~/.rlm/daemon.sock`), spoken to over its Unix
// socket (a named pipe on Windows) with the agent API /v1. Each sandbox is a
// session of the daemon, bound to one of its interpreters until destroy()
// resets it.
import { randomUUID } from "node:crypto";
import http from "node:http";
import os from "node:os";
import path from "node:path";

import { check, readAll, send, type Request } from "../http.js";
import type { SandboxBridges, SandboxConfig } from "../types.js";
import { RemoteSandbox, type RunFields } from "./remote.js";

export const WINDOWS_PIPE = "\\\\.\\pipe\\rlm-daemon";

/** The daemon's socket: config.socketPath, else ~/.rlm/daemon.sock (\\.\pipe\rlm-daemon on Windows). */
export function daemonSocket(socketPath?: string): string {
  if (socketPath) return socketPath;
  return process.platform === "win32" ? WINDOWS_PIPE : path.join(os.homedir(), ".rlm", "daemon.sock");
}

/** Whether a daemon answers on the socket (its /v1/healthz, within timeoutMs). */
export async function isDaemonAvailable(socketPath?: string, timeoutMs = 1000): Promise<boolean> {
  const agent = new http.Agent({ keepAlive: false });
  try {
    const res = await send({ socketPath: daemonSocket(socketPath), agent },
      { method: "GET", path: "/v1/healthz", signal: AbortSignal.timeout(timeoutMs) }, false);
    await readAll(res);
    return res.statusCode === 200;
  } catch {
    return false;
  } finally {
    agent.destroy();
  }
}

export class DaemonClientSandbox extends RemoteSandbox {
  readonly backend = "daemon";
  readonly session = `ts-${randomUUID()}`;
  private readonly agent = new http.Agent({ keepAlive: true });
  private readonly socketPath: string;

  constructor(config: SandboxConfig, bridges: SandboxBridges) {
    super(config, bridges);
    this.socketPath = daemonSocket(config.socketPath);
  }

  protected async request(req: Request): Promise<http.IncomingMessage> {
    return check(await send({ socketPath: this.socketPath, agent: this.agent }, req, false));
  }

  protected startRun(fields: RunFields): Promise<http.IncomingMessage> {
    return this.request({ method: "POST", path: "/v1/execute", body: { ...fields, session: this.session }, accept: "application/x-ndjson" });
  }

  protected async answer(runId: string, callId: string, answer: { result?: unknown; error?: string }): Promise<void> {
    await readAll(await this.request({
      method: "POST", path: `/v1/executions/${encodeURIComponent(runId)}/bridge/${encodeURIComponent(callId)}`, body: answer,
    }));
  }

  protected async interrupt(runId: string): Promise<void> {
    await readAll(await this.request({ method: "POST", path: `/v1/executions/${encodeURIComponent(runId)}/interrupt` }));
  }

  protected variable(name: string): Promise<http.IncomingMessage> {
    return this.request({ method: "GET", path: `/v1/variables/${encodeURIComponent(name)}?session=${encodeURIComponent(this.session)}` });
  }

  async destroy(): Promise<void> {
    if (this.destroyed) return;
    await this.serial(async () => {
      // The session's interpreter gets a fresh start and is free for others.
      try {
        await readAll(await this.request({ method: "POST", path: `/v1/reset?session=${encodeURIComponent(this.session)}` }));
      } catch {
        // the daemon went away: nothing left to release there
      }
    }).catch(() => {});
    this.destroyed = true;
    this.agent.destroy();
  }
}
