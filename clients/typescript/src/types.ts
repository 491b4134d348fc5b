// The RLM sandbox's interface, as its TypeScript users wrote code against it.
// Names and shapes are kept; fields marked "warmpool" are additions.

/** Answers the code's calls out of the sandbox. */
export interface SandboxBridges {
  /** The code's `llm_query(prompt)`. */
  onLLMQuery: (prompt: string) => Promise<string>;
  /** The code's `rlm_query(task, ctx)`; `context` is the current context when the code gave none. */
  onRLMQuery: (task: string, context?: string) => Promise<string>;
  /** The code's `rlm_query_batched(tasks)`; without it each task goes to onRLMQuery, in parallel. */
  onBatchRLMQuery?: (tasks: { task: string; context?: string }[]) => Promise<string[]>;
}

/** One code block's outcome. */
export interface CodeExecution {
  code: string;
  stdout: string;
  stderr: string;
  /** The exception the code raised (its traceback, ending in `Type: message`), or why the run stopped. */
  error?: string;
  /** Milliseconds from the call to its answer. */
  duration: number;
  /** warmpool: the repr of the block's last expression, or the FINAL() answer. */
  result?: string;
  /** warmpool: true when the code called FINAL / FINAL_VAR. */
  final?: boolean;
  /** warmpool: how the run ended. */
  status?: "ok" | "error" | "timeout" | "cancelled";
  /** warmpool: the rich results (charts, tables, display(obj)), in order. */
  results?: Result[];
  /** warmpool: the Session was suspended while idle, and resumed with its state for this run. */
  resumed?: boolean;
  /** warmpool: the Session moved to another node since its previous run (said once): with its state, off a drained one, or from its last checkpoint after its pod or node was lost (`moved.checkpoint`). */
  moved?: Moved;
  /** warmpool: the run's number in its Session (`moved.run` says which run a restored state is from). */
  run?: number;
  /** warmpool: the interpreter was replaced (it died, or did not stop): variables of earlier code blocks are gone. */
  stateLost?: boolean;
}

/**
 * warmpool: one rich result, with E2B's names: `text` (always), `html`,
 * `markdown`, `svg`, `png` and `jpeg` (base64), `pdf`, `latex`, `json`,
 * `javascript`; `formats()` names those present besides text; `data` is the
 * whole MIME bundle; `omitted` the MIME types a size limit left out.
 */
export class Result {
  constructor(readonly data: Record<string, unknown>, readonly isMainResult = false, readonly omitted: string[] = []) {}

  static fromDisplay(d: { data?: Record<string, unknown>; main?: boolean; omitted?: string[] }): Result {
    return new Result(d.data ?? {}, !!d.main, d.omitted ?? []);
  }

  private get(mime: string): string | undefined {
    const v = this.data[mime];
    return v === undefined ? undefined : typeof v === "string" ? v : JSON.stringify(v);
  }

  get text(): string { return this.get("text/plain") ?? ""; }
  get html(): string | undefined { return this.get("text/html"); }
  get markdown(): string | undefined { return this.get("text/markdown"); }
  get svg(): string | undefined { return this.get("image/svg+xml"); }
  get png(): string | undefined { return this.get("image/png"); }
  get jpeg(): string | undefined { return this.get("image/jpeg"); }
  get pdf(): string | undefined { return this.get("application/pdf"); }
  get latex(): string | undefined { return this.get("text/latex"); }
  get javascript(): string | undefined { return this.get("application/javascript"); }
  get json(): unknown { return this.data["application/json"]; }

  /** The formats present besides text, by E2B's names ("png", "html"...). */
  formats(): string[] {
    const names: [string, string][] = [["html", "text/html"], ["markdown", "text/markdown"], ["svg", "image/svg+xml"],
      ["png", "image/png"], ["jpeg", "image/jpeg"], ["pdf", "application/pdf"], ["latex", "text/latex"],
      ["json", "application/json"], ["javascript", "application/javascript"]];
    return names.filter(([, mime]) => mime in this.data).map(([name]) => name);
  }
}

export interface Sandbox {
  /** Starts the sandbox (when not yet started) and sets `context` in Python. */
  initialize(context: string): Promise<void>;
  execute(code: string): Promise<CodeExecution>;
  /** A Python global as a JS value (JSON's mapping; a value that is not JSON comes back as its repr); undefined when missing. */
  getVariable(name: string): Promise<unknown>;
  /** KeyboardInterrupt in the running code; a no-op when nothing runs. */
  cancel(): Promise<void>;
  /** Everything released; the sandbox cannot be used afterwards. */
  destroy(): Promise<void>;
}

export interface REPLConfig {
  /** Milliseconds per code block: the code gets KeyboardInterrupt, then is stopped. */
  timeout: number;
  /** Longer stdout/stderr is cut with "... [truncated, N chars omitted]". */
  maxOutputLength: number;
  /**
   * Pyodide: where it loads from, a string or a list (the first is used);
   * default: the installed `pyodide` package. A local path or file: URL, or an
   * https URL of a host in allowedIndexURLHosts (or the environment's
   * WARMPOOL_PYODIDE_ALLOWED_HOSTS); anything else is refused at initialize,
   * on every backend.
   */
  indexURL?: string | string[];
  /** The https hosts indexURL may name. */
  allowedIndexURLHosts?: string[];
  fullStdLib?: boolean;
  /** Pyodide packages loaded at start-up (from indexURL). */
  preloadPackages?: string[];
  /** Pyodide: run in a worker thread with a SharedArrayBuffer interrupt (default true). */
  useWorker?: boolean;
  onStdout?: (line: string) => void;
  onStderr?: (line: string) => void;
  /** warmpool: each rich result, as it comes between the output lines. */
  onResult?: (result: Result) => void;
}

export type SandboxBackend = "pyodide" | "native" | "daemon" | "warmpool" | "auto";

/** warmpool: where a `warmpool` sandbox runs. */
export interface WarmpoolTarget {
  /** The SandboxPool whose warm interpreter is leased. */
  pool?: string;
  /** Namespace of the pool; default: the kubeconfig context's, else "default". */
  namespace?: string;
  /** Path of a kubeconfig; default: $KUBECONFIG, ~/.kube/config, or in-cluster credentials. */
  kubeconfig?: string;
  /** A context of the kubeconfig; default: its current context. */
  kubeContext?: string;
  /** Seconds without a run after which the Session closes; default: the pool's. */
  idleTimeout?: number;
  /** Milliseconds to wait for the Session to be Ready (default 60000). */
  readyTimeout?: number;
}

export interface SandboxConfig extends REPLConfig, WarmpoolTarget {
  backend?: SandboxBackend;
  /** native: the python3 to run (default "python3"); auto also checks it. */
  pythonPath?: string;
  /** daemon: its socket (default ~/.rlm/daemon.sock; on Windows the pipe \\.\pipe\rlm-daemon). */
  socketPath?: string;
  /** native and daemon: milliseconds an interrupted run may take to stop before its interpreter is replaced (default 2000). */
  grace?: number;
  /** Calls to llm_query/rlm_query one block may make (default 64). */
  maxBridgeCalls?: number;
}

/** Raised for a sandbox that cannot be used (destroyed, failed to start). */
export class SandboxError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "SandboxError";
  }
}

/**
 * What execute and getVariable answer before initialize has resolved, as the
 * RLM sandbox's interface has it: the code would otherwise run without the
 * context it was written for.
 */
export function notInitialized(): Promise<never> {
  return Promise.reject(new SandboxError("the sandbox is not initialized: call initialize(context) first"));
}

/**
 * warmpool: the code did not run. Its run never reached the Session's agent,
 * as often as it was sent (docs/recovery.md): sending it again cannot run
 * it twice. `cause` is the last failure.
 */
export class NotRunError extends SandboxError {
  readonly cause: unknown;
  constructor(session: string, cause: unknown) {
    super(`the code did not run (Session ${session}): ${String(cause)}`);
    this.name = "NotRunError";
    this.cause = cause;
  }
}

/** warmpool: where a Session moved from, and why (a drained node, a lost pod or node). */
export interface Moved {
  fromNode: string;
  toNode?: string;
  reason?: string;
  /** RFC 3339: when the move began, its running step ended. */
  since: string;
  /** The number of the last run whose state it has: the runs after it are to be redone when `checkpoint` is set. */
  run?: number;
  /** RFC 3339: set when it was restored from its last checkpoint (its pod or node was lost). */
  checkpoint?: string;
}
