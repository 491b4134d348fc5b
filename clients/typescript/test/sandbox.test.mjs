// The RLM sandbox's behaviour, written once and run on every backend
// (WARMPOOL_TS_BACKENDS, default native,pyodide; daemon needs
// WARMPOOL_TS_DAEMON_SOCKET, warmpool needs WARMPOOL_TEST_KUBECONFIG,
// WARMPOOL_TEST_NAMESPACE and WARMPOOL_TEST_POOL). It imports the package
// by its name: test/tssdk installs the packed tarball and runs it there.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { createSandbox, detectBestBackend, isNativeAvailable, selectBackend } from "warmpool";

const backends = (process.env.WARMPOOL_TS_BACKENDS ?? "native,pyodide").split(",").filter(Boolean);

function targetFor(backend) {
  switch (backend) {
    case "daemon":
      return { socketPath: process.env.WARMPOOL_TS_DAEMON_SOCKET };
    case "warmpool":
      return {
        kubeconfig: process.env.WARMPOOL_TEST_KUBECONFIG,
        namespace: process.env.WARMPOOL_TEST_NAMESPACE,
        pool: process.env.WARMPOOL_TEST_POOL ?? "python",
      };
  }
  return {};
}

/** Bridges that record what the code asked. */
function recordingBridges() {
  const calls = [];
  return {
    calls,
    bridges: {
      onLLMQuery: async (prompt) => {
        calls.push(["llm", prompt]);
        if (prompt === "fail") throw new Error("the model is down");
        return `answer to ${prompt}`;
      },
      onRLMQuery: async (task, context) => {
        calls.push(["rlm", task, context]);
        return `sub-answer to ${task} with ${context}`;
      },
      onBatchRLMQuery: async (tasks) => {
        calls.push(["batch", tasks.length]);
        return tasks.map((t) => `batched ${t.task}/${t.context}`);
      },
    },
  };
}

for (const backend of backends) {
  describe(`${backend} backend`, { concurrency: false }, () => {
    const lines = { stdout: [], stderr: [] };
    const rec = recordingBridges();
    let sb;

    before(async () => {
      sb = createSandbox({
        backend, timeout: 3000, maxOutputLength: 1000, grace: 2000, ...targetFor(backend),
        onStdout: (l) => lines.stdout.push(l), onStderr: (l) => lines.stderr.push(l),
      }, rec.bridges);
      await sb.initialize("The quick brown fox jumps over the lazy dog. The end.");
    });

    after(async () => {
      await sb?.destroy();
    });

    test("execute and getVariable before initialize are refused: the code would run without its context", async () => {
      const own = createSandbox({ backend, timeout: 3000, maxOutputLength: 1000, ...targetFor(backend) }, rec.bridges);
      try {
        await assert.rejects(own.execute("1"), /not initialized: call initialize\(context\) first/);
        await assert.rejects(own.getVariable("x"), /not initialized/);
        await own.initialize("later");
        assert.equal((await own.execute("context")).result, "'later'");
      } finally {
        await own.destroy();
      }
      await assert.rejects(own.execute("1"), /destroyed/);
    });

    test("an indexURL of a host nobody allowed is refused at initialize, on every backend", async () => {
      const own = createSandbox({ backend, timeout: 3000, maxOutputLength: 1000, ...targetFor(backend),
        indexURL: "https://untrusted.example/pyodide/" }, rec.bridges);
      try {
        await assert.rejects(own.initialize("x"), /Untrusted Pyodide URL domain: untrusted\.example/);
      } finally {
        await own.destroy();
      }
    });

    test("initialize(context) sets `context` in Python", async () => {
      const r = await sb.execute("print(len(context)); context[:9]");
      assert.equal(r.error, undefined);
      assert.equal(r.stdout, "53\n");
      assert.equal(r.result, "'The quick'");
    });

    test("stdout, stderr and the duration are captured", async () => {
      const r = await sb.execute("import sys\nprint('out 1')\nprint('err 1', file=sys.stderr)\nprint('out 2')");
      assert.equal(r.stdout, "out 1\nout 2\n");
      assert.equal(r.stderr, "err 1\n");
      assert.equal(r.error, undefined);
      assert.equal(r.code, "import sys\nprint('out 1')\nprint('err 1', file=sys.stderr)\nprint('out 2')");
      assert.ok(r.duration > 0 && r.duration < 3000, `duration ${r.duration}`);
    });

    test("onStdout and onStderr get each line", async () => {
      lines.stdout.length = lines.stderr.length = 0;
      await sb.execute("import sys\nfor i in range(3): print(f'line {i}')\nprint('partial', end='')\nprint('oops', file=sys.stderr)");
      assert.deepEqual(lines.stdout, ["line 0", "line 1", "line 2", "partial"]);
      assert.deepEqual(lines.stderr, ["oops"]);
    });

    test("an exception is the error, with its message; output before it is kept", async () => {
      const r = await sb.execute("print('before')\nraise ValueError('bad input 42')");
      assert.equal(r.stdout, "before\n");
      assert.equal(r.status, "error");
      assert.match(r.error, /ValueError: bad input 42/);
      const s = await sb.execute("def f(:\n  pass");
      assert.match(s.error, /SyntaxError/);
    });

    test("variables persist between blocks; getVariable reads them as JS values", async () => {
      await sb.execute("data = {'n': 3, 'xs': [1, 2.5, 'three'], 'ok': True, 'none': None}\nclass K: pass\nobj = K()");
      assert.deepEqual(await sb.getVariable("data"), { n: 3, xs: [1, 2.5, "three"], ok: true, none: null });
      assert.equal(await sb.getVariable("missing_variable"), undefined);
      assert.match(String(await sb.getVariable("obj")), /<__main__\.K object at/);
    });

    test("output past maxOutputLength is cut with the number of characters left out", async () => {
      const r = await sb.execute("print('a' * 1500)");
      assert.equal(r.stdout, "a".repeat(1000) + "... [truncated, 501 chars omitted]");
      const s = await sb.execute("print('b' * 999)");
      assert.equal(s.stdout, "b".repeat(999) + "\n");
    });

    test("llm_query and rlm_query are answered by the bridges; rlm_query defaults to the context", async () => {
      rec.calls.length = 0;
      const r = await sb.execute("a = llm_query('2+2?')\nb = rlm_query('sub', 'ctx')\nc = rlm_query('deflt')\nprint(a); print(b); print(c)");
      assert.equal(r.error, undefined);
      assert.equal(r.stdout, "answer to 2+2?\nsub-answer to sub with ctx\n" +
        "sub-answer to deflt with The quick brown fox jumps over the lazy dog. The end.\n");
      assert.deepEqual(rec.calls.map((c) => c[0]), ["llm", "rlm", "rlm"]);
    });

    test("batched queries: onBatchRLMQuery, and llm_query_batched in order", async () => {
      rec.calls.length = 0;
      const r = await sb.execute("print(rlm_query_batched(['t1', ('t2', 'c2')]))\nprint(llm_query_batched(['x', 'y']))");
      assert.equal(r.error, undefined);
      assert.equal(r.stdout, "['batched t1/The quick brown fox jumps over the lazy dog. The end.', 'batched t2/c2']\n" +
        "['answer to x', 'answer to y']\n");
      assert.deepEqual(rec.calls[0], ["batch", 2]);
    });

    test("a batch answers every item: one that fails is its error, in its place", async () => {
      const r = await sb.execute("print(batch_llm_query(['x', 'fail', 'y']))\nprint(batch_llm_query([]))");
      assert.equal(r.error, undefined);
      assert.match(r.stdout, /^\['answer to x', '\[Error: .*the model is down.*\]', 'answer to y'\]\n\[\]\n$/);
    });

    test("text helpers over the context, as the RLM sandbox has them", async () => {
      const r = await sb.execute("print(count_matches('the'), find_line('fox')[0][0], get_line(1)[:9], quote_match('l.zy'), " +
        "search_context('end', window=4)[0]['context'])");
      assert.equal(r.error, undefined);
      assert.equal(r.stdout, "3 1 The quick lazy The end.\n");
    });

    test("a bridge that throws raises in the code, which can catch it", async () => {
      const r = await sb.execute("try:\n    llm_query('fail')\nexcept RuntimeError as e:\n    print('caught:', e)");
      assert.equal(r.error, undefined);
      assert.match(r.stdout, /caught: .*the model is down/);
    });

    test("chunk_text and search_context", async () => {
      const r = await sb.execute("chunk_text('abcdefghij', 4, 1)");
      assert.equal(r.result, "['abcd', 'defg', 'ghij']");
      const s = await sb.execute("m = search_context('fox', 4)\n[(x['match'], x['snippet']) for x in m]");
      assert.equal(s.result, "[('fox', 'own fox jum')]");
    });

    test("FINAL and FINAL_VAR end a block with the answer", async () => {
      const r = await sb.execute("answer = 6 * 7\nFINAL_VAR('answer')\nprint('not reached')");
      assert.equal(r.final, true);
      assert.equal(r.result, "42");
      assert.equal(r.stdout, "");
    });

    test("rich results come back in order between the output, with the last expression's as the main one", async () => {
      const seen = [];
      const own = createSandbox({
        backend, timeout: 3000, maxOutputLength: 1000, ...targetFor(backend),
        onStdout: (l) => seen.push(`out:${l}`), onResult: (r) => seen.push(`result:${r.formats().join(",")}${r.isMainResult ? " main" : ""}`),
      }, rec.bridges);
      try {
        await own.initialize("");
        const r = await own.execute(`
class Rich:
    def __repr__(self): return "Rich()"
    def _repr_html_(self): return "<b>rich</b>"
    def _repr_png_(self): return b"PNG bytes"
print("before")
display(Rich(), {"text/markdown": "**md**", "text/plain": "md"}, raw=True)
print("after")
Rich()`);
        assert.equal(r.error, undefined);
        assert.deepEqual(seen, ["out:before", "result:html,png", "result:markdown", "out:after", "result:html,png main"]);
        assert.equal(r.results.length, 3);
        assert.equal(r.results[0].text, "Rich()");
        assert.equal(r.results[0].html, "<b>rich</b>");
        assert.equal(Buffer.from(r.results[0].png, "base64").toString(), "PNG bytes");
        assert.equal(r.results[1].markdown, "**md**");
        assert.equal(r.result, "Rich()");
        assert.equal((await own.execute("1 + 1")).results, undefined);
      } finally {
        await own.destroy();
      }
    });

    test("a matplotlib chart comes back as a PNG", {
      skip: (backend === "pyodide" || !process.env.WARMPOOL_TEST_MATPLOTLIB) &&
        "needs matplotlib where the code runs (WARMPOOL_TEST_MATPLOTLIB; Pyodide's offline package has none)",
    }, async () => {
      // matplotlib's first import takes seconds on a busy machine: not what
      // this test times, so its sandbox has a timeout of its own.
      const own = createSandbox({ backend, timeout: 60000, maxOutputLength: 1000, ...targetFor(backend) }, rec.bridges);
      try {
        await own.initialize("");
        const r = await own.execute("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 5])\nprint('drawn')");
        assert.equal(r.error, undefined);
        assert.equal(r.stdout, "drawn\n");
        assert.equal(r.results.length, 1);
        assert.deepEqual(r.results[0].formats(), ["png"]);
        assert.equal(Buffer.from(r.results[0].png, "base64").subarray(0, 8).toString("latin1"), "\x89PNG\r\n\x1a\n");
      } finally {
        await own.destroy();
      }
    });

    test("the timeout interrupts the code with a real KeyboardInterrupt; state survives", async () => {
      await sb.execute("kept = 'still here'");
      const started = performance.now();
      // (A loop with an exit: CPython 3.11 does not catch an exception from a
      // signal handler in a bare `while True:` with the enclosing try.)
      const r = await sb.execute("n = 0\ntry:\n    while n >= 0: n += 1\nexcept KeyboardInterrupt:\n    print('got KeyboardInterrupt')\n    raise");
      const took = performance.now() - started;
      assert.equal(r.status, "timeout");
      assert.match(r.error, /timeout of 3000 ms/);
      assert.equal(r.stdout, "got KeyboardInterrupt\n");
      assert.ok(took >= 2900 && took < 4900, `took ${took} ms`);
      assert.equal(await sb.getVariable("kept"), "still here");
    });

    test("cancel() interrupts the running code; cancel() with nothing running is a no-op", async () => {
      await sb.cancel();
      const run = sb.execute("import time\nfor i in range(1000):\n    time.sleep(0.01)");
      await new Promise((r) => setTimeout(r, 500));
      await sb.cancel();
      const r = await run;
      assert.equal(r.status, "cancelled");
      assert.match(r.error, /KeyboardInterrupt/);
      assert.ok(r.duration < 2500, `cancelled after ${r.duration} ms`);
      const next = await sb.execute("kept");
      assert.equal(next.result, "'still here'");
    });

    test("destroy() releases the sandbox: it cannot be used afterwards", async () => {
      const own = createSandbox({ backend, timeout: 3000, maxOutputLength: 1000, ...targetFor(backend) }, rec.bridges);
      await own.initialize("ctx");
      assert.equal((await own.execute("1 + 1")).result, "2");
      await own.destroy();
      await assert.rejects(own.execute("1 + 1"), /destroyed/);
      if (backend === "warmpool") {
        // The Session is gone, so its pod is freed.
        const k8s = await import("@kubernetes/client-node");
        const kc = new k8s.KubeConfig();
        kc.loadFromFile(process.env.WARMPOOL_TEST_KUBECONFIG);
        const api = kc.makeApiClient(k8s.CustomObjectsApi);
        await assert.rejects(api.getNamespacedCustomObject({
          group: "sandbox.warmpool.dev", version: "v1alpha1", namespace: process.env.WARMPOOL_TEST_NAMESPACE,
          plural: "sessions", name: own.name,
        }), (e) => e.code === 404);
      }
    });
  });
}

describe("backend: 'auto'", () => {
  const daemon = process.env.WARMPOOL_TS_DAEMON_SOCKET;
  const bridges = recordingBridges().bridges;

  test("picks the daemon when its socket answers", { skip: !daemon && "no daemon (WARMPOOL_TS_DAEMON_SOCKET)" }, async () => {
    assert.equal(await selectBackend({ socketPath: daemon }), "daemon");
    const sb = createSandbox({ backend: "auto", socketPath: daemon }, bridges);
    try {
      await sb.initialize("");
      assert.equal((await sb.execute("1 + 2")).result, "3");
      assert.equal(sb.backend, "daemon");
    } finally {
      await sb.destroy();
    }
  });

  test("picks native when no daemon answers and python3 runs", async () => {
    const cfg = { socketPath: "/nonexistent/daemon.sock" };
    assert.equal(await selectBackend(cfg), "native");
    const sb = createSandbox({ backend: "auto", ...cfg }, bridges);
    try {
      await sb.initialize("");
      assert.equal((await sb.execute("1 + 2")).result, "3");
      assert.equal(sb.backend, "native");
    } finally {
      await sb.destroy();
    }
  });

  test("detectBestBackend asks the daemon first, then python3, with the checks it is given", async () => {
    const asked = [];
    const check = (name, answer) => async (arg) => { asked.push([name, arg]); return answer; };
    const opts = { socketPath: "/s", pythonPath: "/p" };
    assert.equal(await detectBestBackend({ ...opts, isDaemonRunning: check("daemon", false), isNativeAvailable: check("native", false) }), "pyodide");
    assert.deepEqual(asked, [["daemon", "/s"], ["native", "/p"]]);
    asked.length = 0;
    assert.equal(await detectBestBackend({ ...opts, isDaemonRunning: check("daemon", true), isNativeAvailable: check("native", true) }), "daemon");
    assert.deepEqual(asked, [["daemon", "/s"]], "a daemon that answers needs no python3");
    assert.equal(await detectBestBackend({ ...opts, isDaemonRunning: check("daemon", false), isNativeAvailable: check("native", true) }), "native");
    assert.equal(await isNativeAvailable("/nonexistent/python3"), false);
  });

  test("falls back to Pyodide with neither", async () => {
    const cfg = { socketPath: "/nonexistent/daemon.sock", pythonPath: "/nonexistent/python3" };
    assert.equal(await selectBackend(cfg), "pyodide");
    const sb = createSandbox({ backend: "auto", ...cfg }, bridges);
    try {
      await sb.initialize("");
      assert.match((await sb.execute("import sys; sys.platform")).result, /emscripten/);
      assert.equal(sb.backend, "pyodide");
    } finally {
      await sb.destroy();
    }
  });
});
