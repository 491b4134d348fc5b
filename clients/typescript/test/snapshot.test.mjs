// Snapshots, restore and fork on the warmpool backend (a Session on a
// cluster: WARMPOOL_TEST_KUBECONFIG, WARMPOOL_TEST_NAMESPACE, WARMPOOL_TEST_POOL).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { createSandbox, readManifest } from "warmpool";

const target = {
  backend: "warmpool", timeout: 10000, kubeconfig: process.env.WARMPOOL_TEST_KUBECONFIG,
  namespace: process.env.WARMPOOL_TEST_NAMESPACE, pool: process.env.WARMPOOL_TEST_POOL ?? "python",
};
const bridges = { onLLMQuery: async (p) => `answer to ${p}` };
const enabled = (process.env.WARMPOOL_TS_BACKENDS ?? "").split(",").includes("warmpool");

describe("warmpool snapshots", { skip: !enabled && "needs the warmpool backend (WARMPOOL_TS_BACKENDS)", concurrency: false }, () => {
  test("snapshot, fork into three that go on alone, and restore the bytes into a new sandbox", async () => {
    const sb = createSandbox(target, bridges);
    const made = [sb];
    try {
      await sb.initialize("");
      await sb.execute("x = 40\ndef bump(n):\n    global x\n    x += n\n    return x\nimport socket\ns = socket.socket()");
      const snap = await sb.snapshot();
      const m = readManifest(snap);
      assert.ok(m.variables.some((v) => v.name === "bump" && v.type === "function"));
      assert.deepEqual(m.skipped.map((s) => s.name), ["s"], "the socket is named, not silently dropped");

      const forks = await sb.fork(3);
      made.push(...forks);
      assert.equal(new Set(forks.map((f) => f.name)).size, 3);
      const got = [];
      for (const [i, f] of forks.entries()) got.push((await f.execute(`bump(${i + 1})`)).result);
      assert.deepEqual(got, ["41", "42", "43"]);
      assert.equal((await sb.execute("x")).result, "40", "the source is where it was");

      const again = createSandbox(target, bridges);
      made.push(again);
      const restored = await again.restore(snap);
      assert.ok(restored.variables >= 2);
      assert.equal((await again.execute("bump(2)")).result, "42");
    } finally {
      for (const s of made) await s.destroy().catch(() => {});
    }
  });

  test("bytes that are not a snapshot are refused before they reach a sandbox", () => {
    assert.throws(() => readManifest(Buffer.from("hello")), /not a warmpool snapshot/);
  });
});
