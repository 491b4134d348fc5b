// BashKit's Sandbox interface on a warmpool Session (createWarmpoolSandbox),
// as BashKit's tools use it. Needs WARMPOOL_TEST_KUBECONFIG,
// WARMPOOL_TEST_NAMESPACE and WARMPOOL_TEST_POOL (test/tssdk sets them).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { createWarmpoolSandbox } from "warmpool/bashkit";

const kubeconfig = process.env.WARMPOOL_TEST_KUBECONFIG;

describe("BashKit Sandbox on warmpool", { skip: !kubeconfig && "no cluster (WARMPOOL_TEST_KUBECONFIG)", concurrency: false }, () => {
  let sb;
  before(async () => {
    sb = await createWarmpoolSandbox({
      pool: process.env.WARMPOOL_TEST_POOL ?? "python", namespace: process.env.WARMPOOL_TEST_NAMESPACE, kubeconfig,
    });
  });
  after(async () => {
    await sb?.destroy();
  });

  test("creation is lazy: id comes with the first call, which leases once however many calls race", async () => {
    assert.equal(sb.id, undefined);
    const results = await Promise.all([sb.exec("echo one"), sb.exec("echo two"), sb.fileExists("/nonexistent")]);
    assert.equal(results[0].stdout, "one\n");
    assert.equal(results[1].stdout, "two\n");
    assert.equal(results[2], false);
    assert.match(sb.id, /^ts-[a-z0-9]{10}$/);
  });

  test("exec runs bash: stdout, stderr, exit code, duration", async () => {
    const r = await sb.exec("echo out; echo err >&2; [[ 1 == 1 ]] && exit 3");
    assert.deepEqual([r.stdout, r.stderr, r.exitCode, r.interrupted], ["out\n", "err\n", 3, false]);
    assert.ok(r.durationMs > 0);
  });

  test("exec in cwd", async () => {
    await sb.exec("mkdir -p sub/dir");
    const r = await sb.exec("pwd", { cwd: "sub/dir" });
    assert.match(r.stdout, /\/sub\/dir\n$/);
  });

  test("a timeout interrupts the command: exit code 124, interrupted", async () => {
    const started = performance.now();
    const r = await sb.exec("echo started; sleep 30", { timeout: 500 });
    assert.equal(r.exitCode, 124);
    assert.equal(r.interrupted, true);
    assert.equal(r.stdout, "started\n");
    assert.ok(performance.now() - started < 10_000);
  });

  test("files: write, read, list, exists, directory, rename, delete", async () => {
    await sb.writeFile("notes/a.txt", "héllo\nwörld\n");
    assert.equal(await sb.readFile("notes/a.txt"), "héllo\nwörld\n");
    const pwd = (await sb.exec("pwd")).stdout.trim();
    assert.equal(await sb.readFile(`${pwd}/notes/a.txt`), "héllo\nwörld\n");
    assert.deepEqual(await sb.readDir("notes"), ["a.txt"]);
    assert.equal(await sb.fileExists("notes/a.txt"), true);
    assert.equal(await sb.isDirectory("notes"), true);
    assert.equal(await sb.isDirectory("notes/a.txt"), false);
    await sb.rename("notes/a.txt", "notes/b.txt");
    assert.equal(await sb.fileExists("notes/a.txt"), false);
    assert.equal((await sb.exec("cat notes/b.txt")).stdout, "héllo\nwörld\n");
    await sb.deleteFile("notes/b.txt");
    assert.deepEqual(await sb.readDir("notes"), []);
    await assert.rejects(sb.readFile("notes/missing.txt"), /^Error: File not found: notes\/missing.txt$/);
    await assert.rejects(sb.readFile("/tmp/missing.txt"), /^Error: File not found: \/tmp\/missing.txt$/);
    await assert.rejects(sb.readDir("notes/missing"), /^Error: Directory not found: notes\/missing$/);
  });

  test("files outside the workspace go through the shell", async () => {
    await sb.writeFile("/tmp/bk/x.txt", "it's here");
    assert.equal(await sb.readFile("/tmp/bk/x.txt"), "it's here");
    assert.equal(await sb.isDirectory("/tmp/bk"), true);
  });

  test("ripgrep: rgPath is set and runs", { skip: process.env.WARMPOOL_TEST_NO_RG && "no ripgrep where the agent runs" }, async () => {
    await sb.writeFile("src/code.py", "def needle():\n    pass\n");
    assert.ok(sb.rgPath, "rgPath is not set: ripgrep is missing in the sandbox");
    const r = await sb.exec(`${sb.rgPath} -n needle src`);
    assert.equal(r.stdout, "src/code.py:1:def needle():\n");
  });

  test("restart: a fresh shell environment, files kept", async () => {
    await sb.writeFile("keep.txt", "kept");
    const r = await sb.exec("cat keep.txt", { restart: true });
    assert.equal(r.stdout, "kept");
  });
});
