// The golden cases of the lost-answer recovery (docs/recovery.md,
// pkg/protocol/testdata/recovery.json), run against the scripted data plane
// (internal/testing/scriptedplane) that the Go and Python clients run them
// against too. It is built from the repository (WARMPOOL_REPO, which the
// suite's harness sets; else the clone this file is in).
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { HTTPError, NotRunError, WarmpoolSandbox } from "warmpool";

const repo = process.env.WARMPOOL_REPO ?? path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const { cases } = JSON.parse(fs.readFileSync(path.join(repo, "pkg/protocol/testdata/recovery.json"), "utf8"));
const bridges = { onLLMQuery: async () => "", onRLMQuery: async () => "" };

let plane, url, kubeconfig;

before(async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "warmpool-cases-"));
  const binary = path.join(dir, "scriptedplane");
  execFileSync(process.env.GO ?? "go", ["build", "-o", binary, "./internal/testing/scriptedplane/cmd/scriptedplane"], { cwd: repo, stdio: "inherit" });
  plane = spawn(binary, [], { stdio: ["ignore", "pipe", "inherit"] });
  url = await new Promise((resolve) => readline.createInterface({ input: plane.stdout }).once("line", resolve));
  kubeconfig = path.join(dir, "kubeconfig");
  fs.writeFileSync(kubeconfig, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "${url}", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: ns}}]
current-context: c
`);
});

after(() => plane?.kill());

/** The client's answer in the cases' terms. */
async function outcome(run) {
  const handed = [];
  try {
    // onStdout gets whole lines, without their newline.
    const ex = await run((line) => handed.push(line + "\n"));
    if (ex.stateLost) return { error: "state_lost" };
    const out = { status: ex.status === "ok" ? "succeeded" : ex.status, stdout: ex.stdout, handedStdout: handed.join("") };
    if (ex.result) out.result = ex.result;
    return Object.fromEntries(Object.entries(out).filter(([, v]) => v !== ""));
  } catch (e) {
    if (e instanceof NotRunError) return { error: "not_run" };
    if (e instanceof HTTPError) return { error: "status", code: e.status };
    return { error: String(e) };
  }
}

for (const c of cases) {
  test(c.name, async () => {
    const put = await fetch(`${url}/_script`, { method: "PUT", body: JSON.stringify(c.exchanges) });
    assert.equal(put.status, 200);
    const got = await outcome((onStdout) =>
      new WarmpoolSandbox({ backend: "warmpool", kubeconfig, pool: "python", namespace: "ns", onStdout }, bridges, "s", true).execute("x"));
    const want = Object.fromEntries(Object.entries(c.outcome).filter(([, v]) => v !== ""));
    assert.deepEqual(got, want);
    const verdict = await (await fetch(`${url}/_verdict`)).json();
    assert.deepEqual(verdict.problems ?? [], [], JSON.stringify(verdict));
  });
}
