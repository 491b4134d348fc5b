// warmpool's TypeScript client: the RLM sandbox's createSandbox on four
// backends, and BashKit's Sandbox on warmpool (warmpool/bashkit).
import { DaemonClientSandbox, isDaemonAvailable } from "./backends/daemon.js";
import { findPython, NativePythonSandbox } from "./backends/native.js";
import { PyodideSandbox } from "./backends/pyodide.js";
import { WarmpoolSandbox } from "./backends/warmpool.js";
import { allowedIndexURLHosts, validatePyodideURL } from "./indexurl.js";
import { notInitialized, SandboxError, type CodeExecution, type Sandbox, type SandboxBridges, type SandboxConfig } from "./types.js";

export type { CodeExecution, Moved, REPLConfig, Sandbox, SandboxBackend, SandboxBridges, SandboxConfig, WarmpoolTarget } from "./types.js";
export { NotRunError, Result, SandboxError } from "./types.js";
export { HTTPError } from "./http.js";
export { StreamCutError } from "./stream.js";
export { DaemonClientSandbox, daemonSocket, isDaemonAvailable, WINDOWS_PIPE } from "./backends/daemon.js";
export { findPython, NativePythonSandbox, pythonVersion } from "./backends/native.js";
export { detectWorkerSupport, PyodideSandbox } from "./backends/pyodide.js";
export { WarmpoolSandbox } from "./backends/warmpool.js";
export { truncate } from "./run.js";
export { allowedIndexURLHosts, validatePyodideURL } from "./indexurl.js";
export { readManifest, SNAPSHOT_MEDIA_TYPE, type SnapshotManifest } from "./snapshot.js";

const DEFAULTS = { timeout: 30_000, maxOutputLength: 50_000 };

/** Whether a warmpool daemon answers at `socketPath` (default: the seed's ~/.rlm/daemon.sock). */
export async function isDaemonRunning(socketPath?: string): Promise<boolean> {
  return isDaemonAvailable(socketPath);
}

/** Whether a python3 ≥ 3.8 runs at `pythonPath` (default: python3, else python). */
export async function isNativeAvailable(pythonPath?: string): Promise<boolean> {
  return findPython(pythonPath) !== undefined;
}

/** The checks `detectBestBackend` makes, each replaceable (tests give their own). */
export interface DetectOptions {
  pythonPath?: string;
  socketPath?: string;
  isDaemonRunning?: (socketPath?: string) => Promise<boolean>;
  isNativeAvailable?: (pythonPath?: string) => Promise<boolean>;
}

/**
 * The backend `auto` picks, asked in this order: a daemon that answers, else
 * a python3 ≥ 3.8, else Pyodide. Never warmpool: that one needs a cluster
 * named in the config.
 */
export async function detectBestBackend(opts: DetectOptions = {}): Promise<"daemon" | "native" | "pyodide"> {
  if (await (opts.isDaemonRunning ?? isDaemonRunning)(opts.socketPath)) return "daemon";
  if (await (opts.isNativeAvailable ?? isNativeAvailable)(opts.pythonPath)) return "native";
  return "pyodide";
}

/** The backend `auto` picks for this config (detectBestBackend). */
export async function selectBackend(config: Partial<SandboxConfig> = {}): Promise<"daemon" | "native" | "pyodide"> {
  return detectBestBackend({ pythonPath: config.pythonPath, socketPath: config.socketPath });
}

type Concrete = NativePythonSandbox | DaemonClientSandbox | PyodideSandbox | WarmpoolSandbox;

function make(backend: string, config: SandboxConfig, bridges: SandboxBridges): Concrete {
  switch (backend) {
    case "native":
      return new NativePythonSandbox(config, bridges);
    case "daemon":
      return new DaemonClientSandbox(config, bridges);
    case "pyodide":
      return new PyodideSandbox(config, bridges);
    case "warmpool":
      return new WarmpoolSandbox(config, bridges);
  }
  throw new SandboxError(`unknown backend ${JSON.stringify(backend)}: pyodide, native, daemon, warmpool or auto`);
}

/**
 * `backend: 'auto'`: the choice is made at the first call (it needs to ask
 * the daemon), so createSandbox stays synchronous as the interface has it.
 */
class AutoSandbox implements Sandbox {
  private chosen?: Promise<Concrete>;
  private destroyed = false;
  private initialized = false;

  constructor(private readonly config: SandboxConfig, private readonly bridges: SandboxBridges) {}

  /** The backend in use once the first call chose it. */
  backend?: "daemon" | "native" | "pyodide";

  private sandbox(): Promise<Concrete> {
    if (this.destroyed) return Promise.reject(new SandboxError("the sandbox was destroyed"));
    this.chosen ??= selectBackend(this.config).then((b) => {
      this.backend = b;
      return make(b, this.config, this.bridges);
    });
    return this.chosen;
  }

  async initialize(context: string): Promise<void> {
    validatePyodideURL(this.config.indexURL, allowedIndexURLHosts(this.config)); // before choosing: nothing is started
    await (await this.sandbox()).initialize(context);
    this.initialized = true;
  }

  async execute(code: string): Promise<CodeExecution> {
    if (!this.destroyed && !this.initialized) return notInitialized(); // before choosing: nothing is started
    return (await this.sandbox()).execute(code);
  }

  async getVariable(name: string): Promise<unknown> {
    if (!this.destroyed && !this.initialized) return notInitialized();
    return (await this.sandbox()).getVariable(name);
  }

  async cancel(): Promise<void> {
    if (this.chosen) return (await this.chosen).cancel();
  }

  async destroy(): Promise<void> {
    this.destroyed = true;
    if (this.chosen) return (await this.chosen.catch(() => undefined))?.destroy();
  }
}

/**
 * A Python sandbox. `backend`: 'pyodide', 'native' (a local python3),
 * 'daemon' (the warmpool agent on this machine), 'warmpool' (a Session of
 * `pool` on a cluster) or 'auto' (the default: daemon, native, pyodide, the
 * first available). The same code runs on each; only the config changes.
 */
export function createSandbox(config: Partial<SandboxConfig> & { backend?: SandboxConfig["backend"] }, bridges: SandboxBridges): Sandbox & { backend?: string } {
  const full = { ...DEFAULTS, ...config } as SandboxConfig;
  const backend = full.backend ?? "auto";
  return backend === "auto" ? new AutoSandbox(full, bridges) : make(backend, full, bridges);
}
