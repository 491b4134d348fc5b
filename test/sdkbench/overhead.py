"""The Python client's per-run overhead over the raw data plane, side by side
in one process against one Session (docs/performance.md):

  raw         POST .../sessions/NAME/exec, blocking JSON, with the kubernetes
              client's ApiClient (the same connection pool and credentials)
  raw-stream  the same, streamed (NDJSON), read to the result event
  sdk         Sandbox.run_code (streamed, parsed into an Execution)

Runs alternate (raw, raw-stream, sdk, raw, ...) so that drift of the cluster
hits all three alike. Usage (Debian's python3, with clients/python on the path):

  PYTHONPATH=clients/python /usr/bin/python3 test/sdkbench/overhead.py \
      --kubeconfig KUBECONFIG --namespace default --pool python --runs 300
"""

import argparse
import json
import statistics
import time

import warmpool
from warmpool import _api


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig")
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--pool", default="python")
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--code", default="print(1)")
    ap.add_argument("--order", default="raw,raw-stream,sdk", help="the paths, in the order each round runs them")
    a = ap.parse_args()

    with warmpool.Sandbox.create(a.pool, a.namespace, kubeconfig=a.kubeconfig) as sb:
        path = _api.data_plane_path(sb.namespace, sb.name, "exec")

        def raw():
            r = _api.request(sb._api, "POST", path, body={"code": a.code})
            res = json.loads(r.data)
            assert res["status"] == "succeeded", res

        def raw_stream():
            r = _api.request(sb._api, "POST", path, body={"code": a.code, "stream": True}, accept="application/x-ndjson")
            try:
                for line in r:
                    if line.startswith(b'{"type":"result"'):
                        assert json.loads(line)["result"]["status"] == "succeeded"
                        r.drain_conn()  # read the stream's end, so the connection is reused
                        return
            finally:
                r.release_conn()
            raise AssertionError("no result")

        def sdk():
            ex = sb.run_code(a.code)
            assert ex.ok, ex

        paths = {"raw": raw, "raw-stream": raw_stream, "sdk": sdk}
        kinds = [(k, paths[k]) for k in a.order.split(",")]
        for _, f in kinds * 10:  # warm the connections and the interpreter
            f()
        lat = {k: [] for k, _ in kinds}
        for _ in range(a.runs):
            for k, f in kinds:
                t0 = time.perf_counter()
                f()
                lat[k].append((time.perf_counter() - t0) * 1000)
    print(f"{a.runs} runs of {a.code!r} each, interleaved, one Session")
    print(f"{'path':<12}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'mean ms':>9}")
    for k, _ in kinds:
        xs = lat[k]
        print(f"{k:<12}{pct(xs, 50):>9.1f}{pct(xs, 90):>9.1f}{pct(xs, 99):>9.1f}{statistics.mean(xs):>9.1f}")
    d = [s - r for s, r in zip(lat["sdk"], lat["raw-stream"])]
    print(f"sdk - raw-stream per run: median {statistics.median(d):.2f} ms")


if __name__ == "__main__":
    main()
