// Where Pyodide may be loaded from (validatePyodideURL): checked by every
// backend at initialize, whatever the backend.
import assert from "node:assert/strict";
import { test } from "node:test";

import { allowedIndexURLHosts, validatePyodideURL } from "warmpool";

test("local paths and file: URLs are the caller's own", () => {
  for (const u of [undefined, "", "/opt/pyodide/", "./pyodide", "file:///opt/pyodide/"]) validatePyodideURL(u, []);
});

test("an https host must be allowed; the refusal names it", () => {
  validatePyodideURL("https://mirror.example/pyodide/", ["mirror.example"]);
  assert.throws(() => validatePyodideURL("https://other.example/pyodide/", ["mirror.example"]),
    /^SandboxError: Untrusted Pyodide URL domain: other\.example\. Allowed: mirror\.example/);
  assert.throws(() => validatePyodideURL(["https://first.example/p/", "https://mirror.example/p/"], ["mirror.example"]),
    /Untrusted Pyodide URL domain: first\.example/, "the first of a list is the one used");
  assert.throws(() => validatePyodideURL("http://mirror.example/pyodide/", ["mirror.example"]), /only https URLs and local paths/);
});

test("the allowed hosts are the config's and the environment's", () => {
  const before = process.env.WARMPOOL_PYODIDE_ALLOWED_HOSTS;
  process.env.WARMPOOL_PYODIDE_ALLOWED_HOSTS = "a.example, b.example";
  try {
    assert.deepEqual(allowedIndexURLHosts({ allowedIndexURLHosts: ["c.example"] }), ["c.example", "a.example", "b.example"]);
  } finally {
    if (before === undefined) delete process.env.WARMPOOL_PYODIDE_ALLOWED_HOSTS;
    else process.env.WARMPOOL_PYODIDE_ALLOWED_HOSTS = before;
  }
});
