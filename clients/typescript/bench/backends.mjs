// Side by side, in one process: execute('print(1)') on each backend, the
// start-up of each (Pyodide's load included), the memory destroy() gives back
// for Pyodide, and BashKit's exec('echo hi') on warmpool. Prints one JSON
// report. test/tssdk's BenchmarkTypeScriptBackends runs it with a daemon and
// a pool; by hand:
//
//   WARMPOOL_TS_BACKENDS=native,pyodide node --expose-gc bench/backends.mjs
import { createSandbox } from "warmpool";
import { createWarmpoolSandbox } from "warmpool/bashkit";

const runs = Number(process.env.WARMPOOL_TS_BENCH_RUNS ?? 500);
const backends = (process.env.WARMPOOL_TS_BACKENDS ?? "native,pyodide").split(",").filter(Boolean);
const bridges = { onLLMQuery: async (p) => p, onRLMQuery: async (t) => t };
const target = {
  daemon: { socketPath: process.env.WARMPOOL_TS_DAEMON_SOCKET },
  warmpool: { kubeconfig: process.env.WARMPOOL_TEST_KUBECONFIG, namespace: process.env.WARMPOOL_TEST_NAMESPACE, pool: process.env.WARMPOOL_TEST_POOL ?? "python" },
};

function pct(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return +s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))].toFixed(2);
}

async function settle() {
  for (let i = 0; i < 3; i++) {
    globalThis.gc?.();
    await new Promise((r) => setTimeout(r, 200));
  }
  return process.memoryUsage().rss / 2 ** 20;
}

async function timeCalls(f) {
  for (let i = 0; i < Math.min(20, runs); i++) await f(); // warm-up
  const xs = [];
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    await f();
    xs.push(performance.now() - t);
  }
  return { p50: pct(xs, 50), p99: pct(xs, 99), runs };
}

const report = { node: process.version, runs, backends: {} };
for (const backend of backends) {
  const rssBefore = await settle();
  const t0 = performance.now();
  const sb = createSandbox({ backend, timeout: 30_000, maxOutputLength: 10_000, ...target[backend] }, bridges);
  await sb.initialize("");
  const startMs = +(performance.now() - t0).toFixed(1);
  const rssLoaded = await settle();
  const r = await sb.execute("print(1)");
  if (r.stdout !== "1\n") throw new Error(`${backend}: print(1) gave ${JSON.stringify(r)}`);
  const exec = await timeCalls(() => sb.execute("print(1)"));
  const rssUsed = await settle();
  await sb.destroy();
  const rssAfter = await settle();
  report.backends[backend] = {
    start_ms: startMs, print1_ms: exec,
    rss_mib: { before: +rssBefore.toFixed(0), loaded: +rssLoaded.toFixed(0), after_runs: +rssUsed.toFixed(0), after_destroy: +rssAfter.toFixed(0) },
  };
}
if (backends.includes("warmpool")) {
  const sb = await createWarmpoolSandbox(target.warmpool);
  const t0 = performance.now();
  await sb.exec("true");
  const firstMs = +(performance.now() - t0).toFixed(1);
  const exec = await timeCalls(async () => {
    const r = await sb.exec("echo hi");
    if (r.stdout !== "hi\n") throw new Error(`echo hi gave ${JSON.stringify(r)}`);
  });
  await sb.destroy();
  report.bashkit_warmpool = { first_call_ms: firstMs, echo_hi_ms: exec };
}
console.log(JSON.stringify(report, null, 2));
