// Plain HTTP(S) requests with Node's own modules: the daemon's Unix socket
// and kube-apiserver (with the TLS and headers the Kubernetes client library
// derives from the kubeconfig) both need streamed bodies and keep-alive,
// which a request per call of a generated client does not give.
import http from "node:http";
import https from "node:https";

export interface Request {
  method: string;
  path: string;
  body?: unknown;
  /** Raw body (files); sent as application/octet-stream. */
  raw?: Buffer | string;
  accept?: string;
  signal?: AbortSignal;
}

/** An answer that is not 2xx: its status and the server's message. */
export class HTTPError extends Error {
  constructor(readonly status: number, readonly reason: string, message: string) {
    super(message);
    this.name = "HTTPError";
  }
}

export type Options = http.RequestOptions & https.RequestOptions;

export function send(opts: Options, req: Request, secure: boolean): Promise<http.IncomingMessage> {
  const headers: Record<string, string> = { ...(opts.headers as Record<string, string> | undefined), accept: req.accept ?? "application/json" };
  let payload: Buffer | string | undefined;
  if (req.raw !== undefined) {
    payload = req.raw;
    headers["content-type"] = "application/octet-stream";
  } else if (req.body !== undefined) {
    payload = JSON.stringify(req.body);
    headers["content-type"] = "application/json";
  }
  if (payload !== undefined) headers["content-length"] = String(Buffer.byteLength(payload));
  return new Promise((resolve, reject) => {
    const r = (secure ? https : http).request({ ...opts, method: req.method, path: req.path, headers, signal: req.signal }, resolve);
    r.on("error", reject);
    r.end(payload);
  });
}

export async function readAll(res: http.IncomingMessage): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of res) parts.push(c as Buffer);
  return Buffer.concat(parts);
}

/** Throws an HTTPError for a non-2xx answer, with the message of its body (a metav1.Status or {"error": ...}). */
export async function check(res: http.IncomingMessage): Promise<http.IncomingMessage> {
  const status = res.statusCode ?? 0;
  if (status >= 200 && status < 300) return res;
  const text = (await readAll(res)).toString("utf8");
  let reason = res.statusMessage ?? "";
  let message = text.trim();
  try {
    const body = JSON.parse(text);
    reason = body.reason ?? reason;
    message = body.message ?? body.error ?? message;
  } catch {
    // not JSON: the text is the message
  }
  throw new HTTPError(status, reason, message || `${status} ${reason}`);
}

export async function json<T = any>(res: http.IncomingMessage): Promise<T> {
  const text = (await readAll(await check(res))).toString("utf8");
  return (text ? JSON.parse(text) : undefined) as T;
}
