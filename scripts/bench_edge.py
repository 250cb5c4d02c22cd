#!/usr/bin/env python3
"""The latency the edge worker adds: p50/p99 over N sequential requests (keep-alive)
to a trivial upstream route, `GET /v1/models`, once straight to `acs serve` and once
through the worker in workerd; `GET /v1/budget`, answered by the key's Durable
Object without the upstream; and a one-token completion of a cached prompt, straight
and through the worker (whose path adds the key's checks, the upstream's prepare,
the Hold, and the settle that writes the key's usage log).

Usage: scripts/bench_edge.py [N]   (default 1000; needs the release acs binary, the
built worker (worker/build.sh) and a model: ACS_TEST_MODEL or the default one.)
"""

from __future__ import annotations

import gzip
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[1]
ACS_BIN = os.environ.get("ACS_BIN", str(pathlib.Path(os.environ.get("CARGO_TARGET_DIR", "/root/.cache/acs-target")) / "release/acs"))


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait(url: str) -> None:
    for _ in range(600):
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit(f"{url} did not come up")


def measure(client: httpx.Client, url: str, n: int, headers: dict | None = None,
            body: dict | None = None) -> list[float]:
    def send() -> httpx.Response:
        if body is None:
            return client.get(url, headers=headers)
        return client.post(url, headers=headers, json=body)
    for _ in range(20):  # warm up connections, the isolate and the prompt cache
        send()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = send()
        out.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 200, r.text
    return out


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with tempfile.TemporaryDirectory(prefix="acs-bench-edge.") as d:
        up_port, edge_port = free_port(), free_port()
        model = ["--model", os.environ["ACS_TEST_MODEL"]] if os.environ.get("ACS_TEST_MODEL") else []
        env = dict(os.environ, ACS_EDGE_SECRET="bench", RUST_LOG="warn")
        up = subprocess.Popen([ACS_BIN, "serve", "--addr", f"127.0.0.1:{up_port}", "--data", f"{d}/up", *model],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        edge_env = dict(os.environ, ACS_UPSTREAMS=f"http://127.0.0.1:{up_port}", ACS_EDGE_SECRET="bench",
                        ACS_ADMIN_SECRET="bench-admin", ACS_EDGE_DATA=f"{d}/edge",
                        ACS_EDGE_ADDR=f"127.0.0.1:{edge_port}")
        edge = subprocess.Popen([str(ROOT / "worker/run-local.sh")], env=edge_env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait(f"http://127.0.0.1:{up_port}/health")
            wait(f"http://127.0.0.1:{edge_port}/health")
            key = httpx.post(f"http://127.0.0.1:{edge_port}/admin/keys", json={"tokens": 10**9},
                             headers={"authorization": "Bearer bench-admin"}).json()["key"]
            made = subprocess.run([ACS_BIN, "keys", "create", "--data", f"{d}/up", "--tokens", str(10**9)],
                                  check=True, capture_output=True, text=True)
            up_key = made.stdout.strip().splitlines()[-1]
            model = httpx.get(f"http://127.0.0.1:{up_port}/v1/models").json()["data"][0]["id"]
            one = {"model": model, "prompt": "The sky is", "max_tokens": 1, "temperature": 0}
            with httpx.Client(timeout=60) as c:
                direct = measure(c, f"http://127.0.0.1:{up_port}/v1/models", n)
                proxied = measure(c, f"http://127.0.0.1:{edge_port}/v1/models", n)
                keyed = measure(c, f"http://127.0.0.1:{edge_port}/v1/budget", n,
                                {"authorization": f"Bearer {key}"})
                run_direct = measure(c, f"http://127.0.0.1:{up_port}/v1/completions", n,
                                     {"authorization": f"Bearer {up_key}"}, one)
                run_edge = measure(c, f"http://127.0.0.1:{edge_port}/v1/completions", n,
                                   {"authorization": f"Bearer {key}"}, one)
        finally:
            for p in (edge, up):
                p.kill()
                p.wait()
    print(f"{n} sequential requests each, milliseconds (p50 / p99 / mean)")
    for name, xs in [("acs serve  GET /v1/models", direct), ("edge       GET /v1/models (proxied)", proxied),
                     ("edge       GET /v1/budget (Durable Object)", keyed),
                     ("acs serve  POST /v1/completions (1 token)", run_direct),
                     ("edge       POST /v1/completions (1 token)", run_edge)]:
        print(f"  {name:45s} {pct(xs, 50):7.3f} / {pct(xs, 99):7.3f} / {statistics.mean(xs):7.3f}")
    print(f"added by the edge on a proxied route: p50 {pct(proxied, 50) - pct(direct, 50):.3f} ms, "
          f"p99 {pct(proxied, 99) - pct(direct, 99):.3f} ms")
    print(f"added by the edge on a completion: p50 {pct(run_edge, 50) - pct(run_direct, 50):.3f} ms, "
          f"p99 {pct(run_edge, 99) - pct(run_direct, 99):.3f} ms")
    wasm = ROOT / "worker/build/index_bg.wasm"
    raw = wasm.read_bytes()
    print(f"worker wasm: {len(raw)} bytes, {len(gzip.compress(raw, 9))} gzipped")


if __name__ == "__main__":
    main()
