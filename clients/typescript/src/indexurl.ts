// Where Pyodide may be loaded from. A Pyodide from elsewhere runs its code
// with the caller's bridges, so an https host must be one the caller trusts:
// listed in config.allowedIndexURLHosts or WARMPOOL_PYODIDE_ALLOWED_HOSTS
// (comma-separated). Local paths and file: URLs (the default is the
// installed pyodide package) are the caller's own.
import { SandboxError, type SandboxConfig } from "./types.js";

/** The hosts an https indexURL may name: the config's, then the environment's. */
export function allowedIndexURLHosts(config: Partial<SandboxConfig> = {}): string[] {
  const fromEnv = (process.env.WARMPOOL_PYODIDE_ALLOWED_HOSTS ?? "").split(",").map((h) => h.trim()).filter(Boolean);
  return [...(config.allowedIndexURLHosts ?? []), ...fromEnv];
}

/**
 * Throws a SandboxError unless `url` (or the first of a list: the one used)
 * is a local path, a file: URL, or an https URL of an allowed host. Every
 * backend checks it when it is initialized, so one config is refused the same
 * way wherever it runs (auto may pick Pyodide on another machine).
 */
export function validatePyodideURL(url: string | string[] | undefined, allowed: string[] = allowedIndexURLHosts()): void {
  const u = Array.isArray(url) ? url[0] : url;
  if (u === undefined || u === "") return;
  if (!/^[a-z][a-z0-9+.-]*:/i.test(u) || /^file:/i.test(u)) return;
  let parsed: URL;
  try {
    parsed = new URL(u);
  } catch {
    throw new SandboxError(`Invalid Pyodide URL: ${u.slice(0, 80)}`);
  }
  if (parsed.protocol !== "https:") {
    throw new SandboxError(`Invalid Pyodide URL: only https URLs and local paths are allowed, not ${parsed.protocol} (${u.slice(0, 80)})`);
  }
  if (!allowed.includes(parsed.hostname)) {
    throw new SandboxError(`Untrusted Pyodide URL domain: ${parsed.hostname}. Allowed: ${allowed.length ? allowed.join(", ") : "none"} ` +
      "(config.allowedIndexURLHosts, or WARMPOOL_PYODIDE_ALLOWED_HOSTS)");
  }
}
