// What every backend shares: output cut and split into lines, the answer to
// the code's bridge calls, and a run's outcome as a CodeExecution.
import { Result, type CodeExecution, type Moved, type REPLConfig, type SandboxBridges } from "./types.js";

/** A run's outcome as the REPL server (or the agent) reports it. */
export interface RawOutcome {
  /** ok | final | error | interrupted, or timed_out when the caller's timeout stopped it. */
  status: string;
  result?: string | null;
  error?: { type: string; message: string; traceback?: string } | null;
  /** The interpreter was replaced: variables of earlier blocks are gone. */
  stateLost?: boolean;
  /** A shell run's exit code. */
  exitCode?: number;
  /** warmpool: the Session was suspended, and resumed for this run. */
  resumed?: boolean;
  /** warmpool: the Session moved off a drained node since its previous run. */
  moved?: Moved;
  /** warmpool: the run's number in its Session. */
  run?: number;
  /** The run's whole output, as its result holds it (the streamed events are what counts). */
  stdout?: string;
  stderr?: string;
}

/** Runs calls one at a time, in the order they came, as an interpreter does. */
export class Serial {
  private queue: Promise<unknown> = Promise.resolve();

  run<T>(f: () => Promise<T>): Promise<T> {
    const next = this.queue.then(f, f);
    this.queue = next.catch(() => {});
    return next;
  }
}

/** Cuts text longer than max the way the seed did. */
export function truncate(text: string, max: number): string {
  if (!(max > 0) || text.length <= max) return text;
  return text.slice(0, max) + `... [truncated, ${text.length - max} chars omitted]`;
}

/** Splits a stream of output chunks into whole lines for onStdout/onStderr. */
export class LineSplitter {
  private rest = "";
  constructor(private readonly emit?: (line: string) => void) {}

  push(chunk: string): void {
    if (!this.emit || !chunk) return;
    const text = this.rest + chunk;
    const lines = text.split("\n");
    this.rest = lines.pop() ?? "";
    for (const line of lines) this.emit(line);
  }

  end(): void {
    if (this.emit && this.rest) this.emit(this.rest);
    this.rest = "";
  }
}

/** Collects one run's stdout, stderr and rich results and hands them to the callbacks. */
export class OutputCollector {
  stdout = "";
  stderr = "";
  results: Result[] = [];
  private readonly out: LineSplitter;
  private readonly err: LineSplitter;
  private readonly onResult?: (r: Result) => void;

  constructor(config: Pick<REPLConfig, "onStdout" | "onStderr" | "onResult">) {
    this.out = new LineSplitter(config.onStdout);
    this.err = new LineSplitter(config.onStderr);
    this.onResult = config.onResult;
  }

  /** A rich result, after the output before it (whose partial line goes out first). */
  display(d: { data?: Record<string, unknown>; main?: boolean; omitted?: string[] }): void {
    const r = Result.fromDisplay(d);
    this.results.push(r);
    if (this.onResult) {
      this.out.end();
      this.onResult(r);
    }
  }

  write(stream: "stdout" | "stderr", chunk: string): void {
    if (stream === "stdout") {
      this.stdout += chunk;
      this.out.push(chunk);
    } else {
      this.stderr += chunk;
      this.err.push(chunk);
    }
  }

  end(): void {
    this.out.end();
    this.err.end();
  }
}

function contextString(ctx: unknown): string | undefined {
  if (ctx === undefined || ctx === null) return undefined;
  return typeof ctx === "string" ? ctx : JSON.stringify(ctx);
}

/**
 * Answers one bridge call of the code with the caller's bridges. Returns the
 * JSON value the code receives; a thrown error reaches the code as
 * RuntimeError with its message.
 */
export async function answerBridge(bridges: SandboxBridges, method: string, params: any): Promise<unknown> {
  params = params ?? {};
  switch (method) {
    case "llm_query": {
      // llm_query(prompt, context): the context goes into the prompt.
      const ctx = contextString(params.context);
      const prompt = String(params.prompt ?? "");
      return String(await bridges.onLLMQuery(ctx === undefined ? prompt : `${prompt}\n\nContext:\n${ctx}`));
    }
    case "rlm_query":
      return String(await bridges.onRLMQuery(String(params.task ?? ""), contextString(params.context)));
    case "llm_query_batched": {
      const prompts: unknown[] = Array.isArray(params.prompts) ? params.prompts : [];
      return Promise.all(prompts.map((p) => eachAnswered(() => bridges.onLLMQuery(String(p)))));
    }
    case "rlm_query_batched": {
      const tasks = (Array.isArray(params.tasks) ? params.tasks : []).map((t: any) => ({
        task: String(t?.task ?? ""),
        context: contextString(t?.context),
      }));
      if (bridges.onBatchRLMQuery) {
        const answers = await bridges.onBatchRLMQuery(tasks);
        if (!Array.isArray(answers) || answers.length !== tasks.length) {
          throw new Error(`onBatchRLMQuery answered ${Array.isArray(answers) ? answers.length : typeof answers} for ${tasks.length} tasks`);
        }
        return answers.map(String);
      }
      return Promise.all(tasks.map((t: { task: string; context?: string }) => eachAnswered(() => bridges.onRLMQuery(t.task, t.context))));
    }
  }
  throw new Error(`${method} is not answered by this sandbox's bridges`);
}

/**
 * One answer of a batch: a failing item answers "[Error: <message>]" in its
 * place, as the RLM sandbox's batch_llm_query does, so one failure does not
 * lose the batch's other answers.
 */
async function eachAnswered(ask: () => Promise<string> | string): Promise<string> {
  try {
    return String(await ask());
  } catch (e) {
    return `[Error: ${e instanceof Error ? e.message : String(e)}]`;
  }
}

/** The message of an error thrown by a bridge, for the code. */
export function bridgeErrorMessage(e: unknown): string {
  if (e instanceof Error) return `${e.name}: ${e.message}`;
  return String(e);
}

/** The CodeExecution of a run: output cut to maxOutputLength, the error as text. */
export function toCodeExecution(code: string, outcome: RawOutcome, output: OutputCollector, startedAt: number,
                                config: Pick<REPLConfig, "maxOutputLength" | "timeout">): CodeExecution {
  output.end();
  const ex: CodeExecution = {
    code,
    stdout: truncate(output.stdout, config.maxOutputLength),
    stderr: truncate(output.stderr, config.maxOutputLength),
    duration: performance.now() - startedAt,
    status: "ok",
  };
  if (output.results.length) ex.results = output.results;
  if (outcome.resumed) ex.resumed = true;
  if (outcome.moved) ex.moved = outcome.moved;
  if (outcome.run) ex.run = outcome.run;
  const err = outcome.error;
  const described = err ? (err.traceback?.trim() || `${err.type}: ${err.message}`) : undefined;
  switch (outcome.status) {
    case "final":
      ex.final = true;
      ex.result = outcome.result ?? "";
      break;
    case "ok":
    case "succeeded":
      if (outcome.result !== undefined && outcome.result !== null) ex.result = outcome.result;
      break;
    case "timed_out":
      ex.status = "timeout";
      ex.error = `TimeoutError: the code ran longer than its timeout of ${config.timeout} ms and was interrupted (KeyboardInterrupt)`;
      break;
    case "interrupted":
      ex.status = "cancelled";
      ex.error = described ?? "KeyboardInterrupt";
      break;
    default:
      ex.status = "error";
      ex.error = described ?? `the run failed (${outcome.status})`;
  }
  if (outcome.stateLost) {
    ex.stateLost = true;
    ex.error = (ex.error ? ex.error + "\n" : "") +
      "The interpreter did not stop and was replaced: variables of earlier code blocks are gone.";
    if (ex.status === "ok") ex.status = "error";
  }
  return ex;
}
