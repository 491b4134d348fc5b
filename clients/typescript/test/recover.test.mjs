// The warmpool backend's answer to a lost answer (a data-plane replica that
// stopped, a connection that broke), against a stand-in for kube-apiserver
// and the data plane on loopback: the run is asked about by its ID, its
// result taken and the output the cut stream did not bring handed on, or it
// is sent again only when it never left. No cluster.
import assert from "node:assert/strict";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";

import { createSandbox } from "warmpool";

const bridges = { onLLMQuery: async () => "", onRLMQuery: async () => "" };
// kube-apiserver's 503 for an APIService it cannot reach.
const unavailable = (res, message) => {
  res.statusCode = 503;
  res.setHeader("content-type", "application/json");
  res.end(JSON.stringify({ kind: "Status", status: "Failure", reason: "ServiceUnavailable", message, code: 503 }));
};
const result = (r) => JSON.stringify({ type: "result", result: { id: "x", status: "succeeded", stdout: "", stderr: "", ...r } }) + "\n";

let server, kubeconfig, handle;
const seen = [];

before(async () => {
  server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      const sub = req.url.split("?")[0].split("/").slice(-3).join("/");
      seen.push({ method: req.method, sub, body: body ? JSON.parse(body) : undefined, url: req.url });
      handle(req, res, sub, body ? JSON.parse(body) : undefined);
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  kubeconfig = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "warmpool-ts-")), "kubeconfig");
  fs.writeFileSync(kubeconfig, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:${server.address().port}", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: ns}}]
current-context: c
`);
});

after(() => server.close());

function sandbox() {
  seen.length = 0;
  return createSandbox({ backend: "warmpool", kubeconfig, pool: "py" }, bridges);
}

test("a stream cut before its result is picked up by its ID, the rest of its output from the result", async () => {
  let execs = 0;
  handle = (req, res, sub, body) => {
    if (sub.endsWith("/exec") && sub.startsWith("runs/")) return res.end(result({ result: "None" })); // the lease
    if (sub.endsWith("/exec")) {
      execs++;
      res.write(JSON.stringify({ type: "stdout", data: "a\n" }) + "\n{\"type\":\"std");
      return setTimeout(() => res.socket.destroy(), 50); // the replica went away mid-run
    }
    if (sub.endsWith("/executions")) {
      res.setHeader("content-type", "application/json");
      return res.end(JSON.stringify({ id: "x", running: false, result: { id: "x", status: "succeeded", stdout: "a\nb\n", stderr: "", result: "2" } }));
    }
    res.statusCode = 404;
    res.end("{}");
  };
  const sb = sandbox();
  await sb.initialize(""); // the lease
  const ex = await sb.execute("print('a')\nprint('b')\n2");
  assert.equal(ex.status, "ok", ex.error);
  assert.equal(ex.result, "2");
  assert.equal(ex.stdout, "a\nb\n", "each line once");
  assert.equal(execs, 1, "never sent again");
  const asked = seen.filter((s) => s.sub.endsWith("/executions"));
  const sent = seen.filter((s) => s.sub.startsWith("sessions/") && s.sub.endsWith("/exec"));
  assert.ok(asked.length >= 1 && asked[0].url.includes(`id=${sent[0].body.id}`), "asked about it by its ID");
  await sb.close?.();
});

test("a run refused as not ready is sent again, with its ID, and never asked about", async () => {
  let execs = 0;
  handle = (req, res, sub) => {
    if (sub.endsWith("/exec") && sub.startsWith("runs/")) return res.end(result({ result: "None" }));
    if (sub.endsWith("/exec")) {
      if (++execs < 3) {
        return unavailable(res, "not ready");
      }
      return res.end(result({ result: "5" }));
    }
    res.statusCode = 404;
    res.end("{}");
  };
  const sb = sandbox();
  await sb.initialize(""); // the lease
  const ex = await sb.execute("5");
  assert.equal(ex.result, "5");
  const sent = seen.filter((s) => s.sub.startsWith("sessions/") && s.sub.endsWith("/exec"));
  assert.equal(sent.length, 3);
  assert.ok(sent.every((s) => s.body.id === sent[0].body.id), "the same ID each time");
  assert.equal(seen.filter((s) => s.sub.endsWith("/executions")).length, 0);
  await sb.close?.();
});

test("a run sent again that attaches (it had arrived after all) hands on its output from the result", async () => {
  let execs = 0;
  handle = (req, res, sub) => {
    if (sub.endsWith("/exec") && sub.startsWith("runs/")) return res.end(result({ result: "None" }));
    if (sub.endsWith("/exec")) {
      if (++execs === 1) {
        // A 503 from a replica that went away after forwarding the run.
        return unavailable(res, "no endpoints");
      }
      return res.end(result({ stdout: "step 1\n", result: "1" })); // attached: the result alone
    }
    res.statusCode = 404;
    res.end("{}");
  };
  const sb = sandbox();
  await sb.initialize(""); // the lease
  const ex = await sb.execute("print('step 1')\n1");
  assert.equal(ex.result, "1");
  assert.equal(ex.stdout, "step 1\n", "the output once");
  await sb.close?.();
});

// kube-apiserver's and the data plane's errors are metav1.Status objects.
const status = (res, code, reason, message) => {
  res.statusCode = code;
  res.setHeader("content-type", "application/json");
  res.end(JSON.stringify({ kind: "Status", apiVersion: "v1", status: "Failure", reason, message, code }));
};

// A stand-in for the Session the data plane makes under the sandbox's name
// (runs/NAME/exec), its GET and its DELETE; first(res, body, ses) answers
// the first call.
function oneCallSessions(first) {
  const st = { session: undefined, creates: 0, deletes: [], execs: 0 };
  handle = (req, res, sub, body) => {
    const name = req.url.split("?")[0].split("/").at(-2);
    if (sub.startsWith("runs/")) {
      if (st.session) return status(res, 409, "AlreadyExists", `sessions.sandbox.warmpool.dev "${name}" already exists`);
      st.creates++;
      st.session = { metadata: { name, uid: `uid-${st.creates}`, annotations: { "sandbox.warmpool.dev/run": body.id } }, status: { phase: "Ready" } };
      if (st.creates === 1) return first(res, body, st.session);
      return res.end(result({ result: "2" }));
    }
    if (sub.startsWith("ns/sessions/")) {
      if (!st.session) return status(res, 404, "NotFound", "not found");
      if (req.method === "DELETE") {
        if (body?.preconditions?.uid !== st.session.metadata.uid) return status(res, 409, "Conflict", "precondition failed");
        st.deletes.push(body.preconditions.uid);
        st.session = undefined;
        return res.end("{}");
      }
      res.setHeader("content-type", "application/json");
      return res.end(JSON.stringify(st.session));
    }
    if (sub.startsWith("sessions/") && sub.endsWith("/exec")) {
      st.execs++;
      return res.end(result({ result: "2" }));
    }
    if (sub.endsWith("/executions")) return status(res, 404, "NotFound", "no run with this ID");
    status(res, 404, "NotFound", "not found");
  };
  return st;
}

test("a first call that found no pod in time leaves a sandbox whose next call makes its Session again (it answered 409 already exists)", async () => {
  const st = oneCallSessions((res, _body, ses) => {
    ses.status.phase = "Closed"; // the data plane closes the Session of a run that did not start
    status(res, 504, "Timeout", `Session ${ses.metadata.name} was not Ready within 1m0s (NoIdleSandbox: no idle pod); it is closed; the code has not run`);
  });
  const sb = sandbox();
  const first = await sb.initialize("").catch((e) => e);
  assert.ok(first instanceof Error, "the first call failed");
  await sb.initialize("");
  const ex = await sb.execute("1 + 1");
  assert.equal(ex.status, "ok", ex.error);
  assert.equal(ex.result, "2");
  assert.deepEqual(st.deletes, ["uid-1"], "the ended Session was deleted, by its UID");
  assert.equal(st.creates, 2);
  await sb.close?.();
});

test("a first call whose answer was lost before its code reached the agent takes its Session over, and runs the code once", async () => {
  const st = oneCallSessions((res) => setTimeout(() => res.socket.destroy(), 20)); // the Session is Ready; the answer never comes
  const sb = sandbox();
  await sb.initialize("");
  assert.equal(st.creates, 1, "the Session was not made twice");
  assert.equal(st.execs, 1, "the first call's code ran once, in the Session it made");
  const ex = await sb.execute("1 + 1");
  assert.equal(ex.status, "ok", ex.error);
  assert.equal(ex.result, "2");
  assert.deepEqual(st.deletes, []);
  await sb.close?.();
});

test("a Session under the sandbox's name that is not its own is left alone, and the call says so", async () => {
  const st = oneCallSessions(() => assert.fail("not created by this sandbox"));
  st.session = { metadata: { name: "x", uid: "theirs", annotations: { "sandbox.warmpool.dev/run": "someone-else" } }, status: { phase: "Closed" } };
  const sb = sandbox();
  const got = await sb.initialize("").catch((e) => e);
  const msg = got instanceof Error ? got.message : String(got);
  assert.match(msg, /not this sandbox's/);
  assert.deepEqual(st.deletes, []);
  await sb.close?.();
});
