// A run streamed by the agent (daemon backend) or by the data plane
// (warmpool backend): NDJSON events of pkg/protocol, read to the result.
import readline from "node:readline";
import type { Readable } from "node:stream";

import { answerBridge, bridgeErrorMessage, type OutputCollector, type RawOutcome } from "./run.js";
import type { Moved, SandboxBridges } from "./types.js";

/** The agent's Result, as much of it as a CodeExecution needs. */
interface AgentResult {
  status: "succeeded" | "failed" | "interrupted" | "timed_out" | string;
  result?: string;
  final?: boolean;
  error?: { type: string; message: string; traceback?: string };
  stateLost?: boolean;
  exitCode?: number;
  resumed?: boolean;
  moved?: Moved;
  run?: number;
  stdout?: string;
  stderr?: string;
}

export function outcomeOf(r: AgentResult): RawOutcome {
  const status = r.status === "succeeded" ? (r.final ? "final" : "ok") : r.status === "failed" ? "error" : r.status;
  return { status, result: r.result ?? null, error: r.error ?? null, stateLost: r.stateLost, exitCode: r.exitCode, resumed: r.resumed, moved: r.moved, run: r.run,
    stdout: r.stdout, stderr: r.stderr };
}

/** Thrown when a stream ended without its result. */
export class StreamCutError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StreamCutError";
  }
}

/**
 * Reads a run's events to its result: output to `output`, bridge calls
 * answered with `bridges` and sent back with `send` (in parallel with the
 * reading, so that output keeps coming while a model thinks).
 */
export async function readRun(body: Readable, output: OutputCollector, bridges: SandboxBridges,
                              send: (callId: string, answer: { result?: unknown; error?: string }) => Promise<void>): Promise<RawOutcome> {
  const answers: Promise<void>[] = [];
  let outcome: RawOutcome | undefined;
  for await (const line of readline.createInterface({ input: body, crlfDelay: Infinity })) {
    if (!line.trim()) continue;
    let ev: any;
    try {
      ev = JSON.parse(line);
    } catch {
      throw new StreamCutError("the run's stream was cut mid-event");
    }
    switch (ev.type) {
      case "stdout":
      case "stderr":
        output.write(ev.type, ev.data ?? "");
        break;
      case "display":
        if (ev.display) output.display(ev.display);
        break;
      case "bridge": {
        const call = ev.call ?? {};
        answers.push((async () => {
          let answer: { result?: unknown; error?: string };
          try {
            answer = { result: await answerBridge(bridges, call.method, call.params) };
          } catch (e) {
            answer = { error: bridgeErrorMessage(e) };
          }
          try {
            await send(call.id, answer);
          } catch {
            // The run ended (its timeout, cancel()) while the bridge thought:
            // nobody waits for this answer; the result follows on the stream.
          }
        })());
        break;
      }
      case "result":
        // The stream ends right after its result; read to that end, so the
        // connection serves the next request.
        outcome = outcomeOf(ev.result ?? {});
        break;
    }
  }
  await Promise.all(answers);
  if (outcome) return outcome;
  throw new StreamCutError("the run's stream ended without a result: the sandbox or the server went away");
}
