// An RLM-style agent loop in TypeScript with a fake model: the "model" writes
// Python, the sandbox runs it, the output goes back to the model, until the
// code calls FINAL. The same program runs on every backend; only the config
// changes:
//
//   node agent-loop.mjs                       # auto: the daemon, else python3, else Pyodide
//   node agent-loop.mjs pyodide
//   node agent-loop.mjs warmpool python       # a Session of pool "python" on the cluster
//
// Needs the package installed (npm install warmpool-*.tgz, see README.md).
import { createSandbox } from "warmpool";

const [backend = "auto", pool = "python", namespace] = process.argv.slice(2);

// The fake model: it answers the code's llm_query calls, and as the "root"
// model it writes the next code block from what the last one printed.
const fakeModel = {
  async complete(prompt) {
    const words = prompt.split(/\s+/).filter(Boolean).length;
    return `${words} words`;
  },
  nextBlock(turn, lastOutput) {
    switch (turn) {
      case 0:
        return "parts = chunk_text(context, 200, 20)\nprint(len(parts), 'parts')";
      case 1:
        return "notes = [llm_query('Count the words: ' + p) for p in parts]\nprint(notes)";
      case 2:
        return `hits = search_context('tea', 10)\nprint(len(hits), 'mentions of tea')`;
      default:
        return `FINAL(f"{len(parts)} parts, {len(hits)} mentions of tea; last turn said: ${lastOutput.trim().replace(/["\\]/g, "")}")`;
    }
  },
};

const book = "It was the best of teas, it was the worst of teas. ".repeat(40);
const sandbox = createSandbox(
  { backend, pool, namespace, timeout: 10_000, maxOutputLength: 2_000 },
  {
    onLLMQuery: (prompt) => fakeModel.complete(prompt),
    onRLMQuery: (task, context) => fakeModel.complete(`${task} ${context ?? ""}`),
  },
);

try {
  await sandbox.initialize(book);
  let output = "";
  for (let turn = 0; turn < 8; turn++) {
    const code = fakeModel.nextBlock(turn, output);
    const r = await sandbox.execute(code);
    console.log(`--- turn ${turn} (${r.duration.toFixed(1)} ms)\n${code}\n>>> ${r.error ?? r.stdout.trim()}`);
    if (r.final) {
      console.log(`=== answer: ${r.result}`);
      break;
    }
    output = r.error ?? r.stdout;
  }
  console.log(`backend: ${sandbox.backend ?? backend}`);
} finally {
  await sandbox.destroy();
}
