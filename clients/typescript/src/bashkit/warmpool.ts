// BashKit's Sandbox ("bring your own sandbox") on a warmpool Session: its
// tools (Bash, Read, Write, Edit, Glob, Grep) depend only on this interface.
// Like BashKit's remote sandboxes it is created at once and leases lazily:
// the Session is created at the first call, once, however many calls race
// for it.
//
//   import { createWarmpoolSandbox } from "warmpool/bashkit";
//   const sandbox = await createWarmpoolSandbox({ pool: "python" });
//   await sandbox.exec("ls -la");
import { WarmpoolSandbox } from "../backends/warmpool.js";
import { HTTPError } from "../http.js";
import type { WarmpoolTarget } from "../types.js";

export interface ExecOptions {
  /** Milliseconds; past it the command is interrupted and exitCode is 124. */
  timeout?: number;
  /** Directory to run in (default: the Session's workspace). */
  cwd?: string;
  /** A fresh shell environment first: the Session's interpreter and the processes earlier commands left are replaced (files stay). */
  restart?: boolean;
}

export interface ExecResult {
  stdout: string;
  stderr: string;
  exitCode: number;
  durationMs: number;
  interrupted: boolean;
}

export interface Sandbox {
  exec(command: string, options?: ExecOptions): Promise<ExecResult>;
  readFile(path: string): Promise<string>;
  writeFile(path: string, content: string): Promise<void>;
  readDir(path: string): Promise<string[]>;
  fileExists(path: string): Promise<boolean>;
  isDirectory(path: string): Promise<boolean>;
  deleteFile?(path: string): Promise<void>;
  rename?(oldPath: string, newPath: string): Promise<void>;
  destroy(): Promise<void>;
  readonly id?: string;
  rgPath?: string;
}

export interface WarmpoolSandboxConfig extends WarmpoolTarget {
  pool: string;
  /** Default timeout of exec, in milliseconds (default 120000). */
  timeout?: number;
}

/** A shell word: the string in single quotes. */
export function quote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

class WarmpoolBashSandbox implements Sandbox {
  private readonly session: WarmpoolSandbox;
  private ready?: Promise<void>;
  private workspace = "";
  private leased = false;
  rgPath?: string;

  constructor(private readonly config: WarmpoolSandboxConfig) {
    this.session = new WarmpoolSandbox({ ...config, timeout: config.timeout ?? 120_000, maxOutputLength: 1 << 20 },
      { onLLMQuery: async () => { throw new Error("no model here"); }, onRLMQuery: async () => { throw new Error("no model here"); } });
  }

  /** The Session's name, once the first call leased it. */
  get id(): string | undefined {
    return this.leased ? this.session.name : undefined;
  }

  /** The first call leases the Session and learns the workspace and ripgrep, once. */
  private start(): Promise<void> {
    this.ready ??= (async () => {
      const r = await this.session.shell("pwd; command -v rg || true", { timeout: 30_000 });
      this.leased = true;
      if (r.exitCode !== 0) throw new Error(`the sandbox's shell does not run: ${r.stderr.trim() || `exit ${r.exitCode}`}`);
      const [pwd, rg] = r.stdout.split("\n");
      this.workspace = pwd.trim();
      if (rg?.trim()) this.rgPath = rg.trim();
    })().catch((e) => {
      this.ready = undefined;
      throw e;
    });
    return this.ready;
  }

  /** The path from the workspace's root when `path` is inside the workspace (the files API's paths), else undefined. */
  private inWorkspace(path: string): string | undefined {
    if (!path.startsWith("/")) return path.split("/").includes("..") ? undefined : path;
    const ws = this.workspace.replace(/\/$/, "");
    if (path === ws) return ".";
    if (ws && path.startsWith(ws + "/") && !path.slice(ws.length).split("/").includes("..")) return path.slice(ws.length + 1);
    return undefined;
  }

  async exec(command: string, options: ExecOptions = {}): Promise<ExecResult> {
    await this.start();
    if (options.restart) await this.session.reset();
    let script = `exec bash -c ${quote(command)}`;
    if (options.cwd) script = `cd -- ${quote(options.cwd)} && ${script}`;
    const r = await this.session.shell(script, { timeout: options.timeout ?? this.config.timeout ?? 120_000 });
    return { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode, durationMs: r.durationMs, interrupted: r.timedOut };
  }

  /** Runs a helper command; a non-zero exit is an error with its stderr (prefixed by `what`, if given). */
  private async sh(script: string, what?: string): Promise<string> {
    const r = await this.session.shell(script, { timeout: 60_000 });
    if (r.exitCode !== 0) {
      const why = r.stderr.trim() || `exit ${r.exitCode}`;
      throw new Error(what ? `${what}: ${why}` : why);
    }
    return r.stdout;
  }

  // A missing path is "File not found: <path>" or "Directory not found:
  // <path>", as BashKit's own sandboxes say and its tools and tests match.
  async readFile(path: string): Promise<string> {
    await this.start();
    const rel = this.inWorkspace(path);
    if (rel === undefined) {
      return this.sh(`[ -e ${quote(path)} ] || { echo "File not found: "${quote(path)} >&2; exit 1; }; cat -- ${quote(path)}`);
    }
    try {
      return (await this.session.readFile(rel)).toString("utf8");
    } catch (e) {
      if (e instanceof HTTPError && e.status === 404) throw new Error(`File not found: ${path}`);
      throw e;
    }
  }

  async writeFile(path: string, content: string): Promise<void> {
    await this.start();
    const rel = this.inWorkspace(path);
    if (rel !== undefined) return this.session.writeFile(rel, content);
    const dir = path.replace(/\/[^/]*$/, "") || "/";
    await this.sh(`mkdir -p -- ${quote(dir)} && printf %s ${quote(Buffer.from(content).toString("base64"))} | base64 -d > ${quote(path)}`,
      `write ${path}`);
  }

  async readDir(path: string): Promise<string[]> {
    await this.start();
    const out = await this.sh(`[ -d ${quote(path)} ] || { echo "Directory not found: "${quote(path)} >&2; exit 1; }; ls -A1 -- ${quote(path)}`);
    return out.split("\n").filter(Boolean);
  }

  async fileExists(path: string): Promise<boolean> {
    await this.start();
    return (await this.session.shell(`test -e ${quote(path)}`)).exitCode === 0;
  }

  async isDirectory(path: string): Promise<boolean> {
    await this.start();
    return (await this.session.shell(`test -d ${quote(path)}`)).exitCode === 0;
  }

  async deleteFile(path: string): Promise<void> {
    await this.start();
    await this.sh(`rm -f -- ${quote(path)}`, `delete ${path}`);
  }

  async rename(oldPath: string, newPath: string): Promise<void> {
    await this.start();
    await this.sh(`mv -- ${quote(oldPath)} ${quote(newPath)}`, `rename ${oldPath}`);
  }

  async destroy(): Promise<void> {
    await this.session.destroy();
  }
}

/** BashKit's Sandbox on a Session of `config.pool`, leased at the first call. */
export async function createWarmpoolSandbox(config: WarmpoolSandboxConfig): Promise<Sandbox> {
  return new WarmpoolBashSandbox(config);
}
