// kube-apiserver with the caller's own credentials, found the way kubectl
// finds them ($KUBECONFIG, ~/.kube/config, in-cluster), by the Kubernetes
// project's own client library: tokens, client certificates and exec
// plugins all work. Requests go out with Node's https and one keep-alive
// connection pool, because runs are streamed NDJSON and a run is a few
// milliseconds (a TLS handshake per request would cost more than the run).
import https from "node:https";
import http from "node:http";

import { check, send, type Request } from "./http.js";

export const GROUP = "sandbox.warmpool.dev";
export const DATA_GROUP = "data.warmpool.dev";
export const VERSION = "v1alpha1";

type KubeConfig = import("@kubernetes/client-node").KubeConfig;

export class Kube {
  private agent?: https.Agent;
  private agentKey?: unknown[];
  private readonly url: URL;

  private constructor(private readonly kc: KubeConfig, readonly namespace: string) {
    const cluster = kc.getCurrentCluster();
    if (!cluster) throw new Error("the kubeconfig names no cluster for its current context");
    this.url = new URL(cluster.server);
  }

  /** Loads a kubeconfig (the library is imported only here: the laptop backends never pay for it). */
  static async load(opts: { kubeconfig?: string; kubeContext?: string } = {}): Promise<Kube> {
    const k8s = await import("@kubernetes/client-node");
    const kc = new k8s.KubeConfig();
    if (opts.kubeconfig) kc.loadFromFile(opts.kubeconfig);
    else kc.loadFromDefault();
    if (opts.kubeContext) kc.setCurrentContext(opts.kubeContext);
    const ctx = kc.getContextObject(kc.getCurrentContext());
    let namespace = ctx?.namespace || "default";
    if (!opts.kubeconfig && !opts.kubeContext && kc.getCurrentContext() === "inClusterContext") {
      // loadFromDefault in a pod: the pod's own namespace, as kubectl does.
      try {
        const fs = await import("node:fs");
        namespace = fs.readFileSync("/var/run/secrets/kubernetes.io/serviceaccount/namespace", "utf8").trim() || namespace;
      } catch {
        // not in a pod after all
      }
    }
    return new Kube(kc, namespace);
  }

  /** Sends a request; non-2xx answers throw an HTTPError with the API server's message. */
  async request(req: Request): Promise<http.IncomingMessage> {
    const opts: https.RequestOptions = { headers: {} };
    // Per request: an exec plugin's token expires and is renewed here.
    await this.kc.applyToHTTPSOptions(opts);
    const secure = this.url.protocol === "https:";
    const tls = [opts.ca, opts.cert, opts.key, opts.pfx, opts.passphrase, opts.servername, opts.rejectUnauthorized];
    if (!this.agent || !this.agentKey || tls.some((v, i) => v !== this.agentKey![i] && String(v) !== String(this.agentKey![i]))) {
      this.agent?.destroy();
      this.agent = new https.Agent({
        keepAlive: true, ca: opts.ca, cert: opts.cert, key: opts.key, pfx: opts.pfx, passphrase: opts.passphrase,
        servername: opts.servername, rejectUnauthorized: opts.rejectUnauthorized,
      });
      this.agentKey = tls;
    }
    const base = this.url.pathname.replace(/\/$/, "");
    const res = await send({
      protocol: this.url.protocol, hostname: this.url.hostname, port: this.url.port || (secure ? 443 : 80),
      headers: opts.headers, auth: opts.auth, agent: secure ? this.agent : undefined,
    }, { ...req, path: base + req.path }, secure);
    return check(res);
  }

  close(): void {
    this.agent?.destroy();
    this.agent = undefined;
  }
}
