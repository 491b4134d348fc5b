// The package carries the agent's REPL server: the copy installed with the
// package must be the repository's (WARMPOOL_REPO), byte for byte.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

test("python/replserver.py is the agent's own", { skip: !process.env.WARMPOOL_REPO && "WARMPOOL_REPO not set" }, () => {
  const installed = path.join(path.dirname(fileURLToPath(import.meta.resolve("warmpool"))), "..", "python", "replserver.py");
  const source = path.join(process.env.WARMPOOL_REPO, "internal", "agent", "interpreter", "replserver.py");
  assert.equal(fs.readFileSync(installed, "utf8"), fs.readFileSync(source, "utf8"),
    `${installed} differs from ${source}: rebuild the package (npm run build copies it)`);
});
