// The package carries the agent's own REPL server (one Python REPL in the
// repository): copied from internal/agent/interpreter at build time, and a
// test (test/replserver.test.mjs) fails when the copy and the source differ.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const src = path.resolve(here, "../../../internal/agent/interpreter/replserver.py");
const dst = path.resolve(here, "../python/replserver.py");
if (!fs.existsSync(src)) {
  // Built from a packed tarball, outside the repository: the copy is already there.
  if (!fs.existsSync(dst)) throw new Error(`neither ${src} nor ${dst} exists`);
  process.exit(0);
}
fs.mkdirSync(path.dirname(dst), { recursive: true });
fs.copyFileSync(src, dst);
