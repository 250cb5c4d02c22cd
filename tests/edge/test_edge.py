"""The edge worker in workerd in front of two real `acs serve` upstreams: failover when
an upstream dies mid-run, jobs charged once, a client that goes away, key isolation,
the admin secret, and the openai Python SDK as a client.

Needs: ACS_BIN (an acs binary), ACS_TEST_MODEL (a GGUF; the default SmolLM2),
ACS_GEMMA3_MODEL (Gemma 3 270M, for upstreams that serve different models), and the
built worker (worker/build.sh). tests/edge/run.sh sets them up.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid

import httpx
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ACS_BIN = os.environ.get("ACS_BIN", "/root/.cache/acs-target/release/acs")
MODEL = os.environ.get("ACS_TEST_MODEL")
EDGE_SECRET = "edge-test-secret"
ADMIN_SECRET = "admin-test-secret"
# Token ids 0..2 are SmolLM2's special tokens and EOS: banned, choices run to max_tokens.
NO_EOS = {str(i): -100 for i in (0, 1, 2)}


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(url: str, proc: subprocess.Popen, log: pathlib.Path, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


class Upstream:
    """One `acs serve --edge-secret` process, which can be killed and started again."""

    def __init__(self, data: pathlib.Path, models: list[str] | None = None):
        self.port = free_port()
        self.data = data
        # `--model` arguments; by default the test model as SmolLM2-135M-Instruct.
        self.models = models
        self.log = data / "serve.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [ACS_BIN, "serve", "--addr", f"127.0.0.1:{self.port}", "--data", str(self.data)]
        if self.models is not None:
            for m in self.models:
                args += ["--model", m]
        elif MODEL:
            args += ["--model", MODEL, "--model-id", "SmolLM2-135M-Instruct"]
        env = dict(os.environ, ACS_EDGE_SECRET=EDGE_SECRET)
        self.proc = subprocess.Popen(args, env=env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        wait_for(f"{self.url}/health", self.proc, self.log)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def cpu_seconds(self) -> float:
        """User + system CPU time so far, to tell which upstream is generating."""
        assert self.proc is not None
        fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Edge:
    def __init__(self, tmp: pathlib.Path, upstreams: list[Upstream], **settings: str):
        self.port = free_port()
        self.log = tmp / "edge.log"
        self.data = tmp / "edge"
        env = dict(
            os.environ,
            **settings,
            ACS_UPSTREAMS=",".join(u.url for u in upstreams),
            ACS_EDGE_SECRET=EDGE_SECRET,
            ACS_ADMIN_SECRET=ADMIN_SECRET,
            ACS_EDGE_DATA=str(tmp / "edge"),
            ACS_EDGE_ADDR=f"127.0.0.1:{self.port}",
        )
        self.proc = subprocess.Popen([str(ROOT / "worker" / "run-local.sh")], env=env,
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        wait_for(f"{self.url}/health", self.proc, self.log)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def new_key(self, tokens: int, max_running: int = 16, **limits) -> str:
        r = httpx.post(f"{self.url}/admin/keys", json={"tokens": tokens, "max_running": max_running, **limits},
                       headers={"authorization": f"Bearer {ADMIN_SECRET}"})
        assert r.status_code == 201, r.text
        return r.json()["key"]


@pytest.fixture(scope="module")
def cluster():
    with tempfile.TemporaryDirectory(prefix="acs-edge-test.") as d:
        tmp = pathlib.Path(d)
        ups = []
        for name in ("a", "b"):
            (tmp / name).mkdir()
            u = Upstream(tmp / name)
            u.start()
            ups.append(u)
        edge = Edge(tmp, ups)
        try:
            yield edge, ups
        finally:
            for p in [edge.proc] + [u.proc for u in ups]:
                if p and p.poll() is None:
                    p.kill()
                    p.wait()


def auth(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


def budget(edge: Edge, key: str) -> dict:
    r = httpx.get(f"{edge.url}/v1/budget", headers=auth(key))
    assert r.status_code == 200, r.text
    return r.json()


def settle_budget(edge: Edge, key: str, timeout: float = 30) -> dict:
    """The budget once nothing of the key runs any more."""
    deadline = time.time() + timeout
    while True:
        b = budget(edge, key)
        if b["running"] == 0 or time.time() > deadline:
            return b
        time.sleep(0.1)


def ensure_up(ups: list[Upstream]) -> None:
    for u in ups:
        if u.proc is None or u.proc.poll() is not None:
            u.start()


def wait_idle(ups: list[Upstream], timeout: float = 60) -> None:
    """Waits until no upstream has a request running or waiting (runs cancelled by an
    earlier test end at their upstream's next step), so that their load reports,
    which steer the edge, start from nothing."""
    deadline = time.time() + timeout
    for u in ups:
        while True:
            text = httpx.get(f"{u.url}/metrics").text
            busy = [line for line in text.splitlines()
                    if line.startswith(("acs_engine_running_requests", "acs_engine_waiting_requests"))
                    and float(line.rsplit(" ", 1)[1]) > 0]
            if not busy:
                break
            assert time.time() < deadline, busy
            time.sleep(0.1)


def busiest(ups: list[Upstream], window: float = 0.6) -> Upstream:
    before = [u.cpu_seconds() for u in ups]
    time.sleep(window)
    after = [u.cpu_seconds() for u in ups]
    deltas = [a - b for a, b in zip(after, before)]
    print(f"cpu seconds per upstream over {window} s: {deltas}")
    return ups[deltas.index(max(deltas))]


def test_admin_routes_need_the_admin_secret(cluster):
    edge, _ = cluster
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Bearer {ADMIN_SECRET}x"}):
        r = httpx.post(f"{edge.url}/admin/keys", json={"tokens": 10}, headers=headers)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "invalid_api_key"
    key = edge.new_key(1000)
    key_id = "key_" + key.split("-")[1]
    for what in ("top-up", "revoke"):
        r = httpx.post(f"{edge.url}/admin/keys/{key_id}/{what}", json={"tokens": 5},
                       headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401, r.text
    assert budget(edge, key)["tokens_left"] == 1000
    r = httpx.post(f"{edge.url}/admin/keys/{key_id}/top-up", json={"tokens": 500},
                   headers={"authorization": f"Bearer {ADMIN_SECRET}"})
    assert r.status_code == 200 and r.json()["tokens_left"] == 1500, r.text
    r = httpx.post(f"{edge.url}/admin/keys/{key_id}/revoke", json={},
                   headers={"authorization": f"Bearer {ADMIN_SECRET}"})
    assert r.status_code == 200, r.text
    r = httpx.get(f"{edge.url}/v1/budget", headers=auth(key))
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_a_keys_requests_per_minute_are_limited_at_the_edge(cluster):
    edge, ups = cluster
    ensure_up(ups)
    key = edge.new_key(100_000, requests_per_minute=2)
    body = {"model": "llama-8b", "prompt": "The sky is", "max_tokens": 1}
    # The limit counts by the minute of the clock: keep the three requests in one.
    while time.time() % 60 >= 50:
        time.sleep(0.25)
    for _ in range(2):
        r = httpx.post(f"{edge.url}/v1/completions", json=body, headers=auth(key), timeout=120)
        assert r.status_code == 200, r.text
    r = httpx.post(f"{edge.url}/v1/completions", json=body, headers=auth(key), timeout=120)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "rate_limit_exceeded", r.text
    assert 1 <= int(r.headers["retry-after"]) <= 60, r.headers
    assert settle_budget(edge, key)["tokens_held"] == 0


def test_forged_keys_touch_no_storage(cluster):
    # Well-formed keys that the edge did not make are refused by the entry worker,
    # before any key's object is addressed: no object, no storage.
    edge, _ = cluster
    key = edge.new_key(1000)
    assert httpx.get(f"{edge.url}/v1/budget", headers=auth(key)).status_code == 200

    # The objects' databases: their -wal and -shm files come and go as SQLite
    # checkpoints an object that went idle, which is no new storage.
    def stored() -> set[str]:
        return {str(p.relative_to(edge.data)) for p in edge.data.rglob("*.sqlite") if p.is_file()}

    before = stored()
    for _ in range(100):
        forged = f"acs-{os.urandom(6).hex()}-{os.urandom(24).hex()}"
        r = httpx.get(f"{edge.url}/v1/budget", headers=auth(forged))
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "invalid_api_key"
    # A real key with its MAC part changed is refused the same way.
    tampered = key[:-1] + ("0" if key[-1] != "0" else "1")
    assert httpx.get(f"{edge.url}/v1/budget", headers=auth(tampered)).status_code == 401
    assert stored() == before


def test_another_key_cannot_see_a_keys_jobs(cluster):
    edge, ups = cluster
    ensure_up(ups)
    mine, theirs = edge.new_key(100_000), edge.new_key(100_000)
    r = httpx.post(f"{edge.url}/v1/completion-jobs", headers=auth(mine),
                   json={"model": "llama-8b", "prompt": "The sky is", "max_tokens": 2})
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    for method, path in [("GET", ""), ("GET", "/result"), ("POST", "/cancel")]:
        r = httpx.request(method, f"{edge.url}/v1/completion-jobs/{job}{path}", headers=auth(theirs))
        assert r.status_code == 404, (path, r.text)
        assert r.json()["error"]["code"] == "not_found"
    listed = httpx.get(f"{edge.url}/v1/completion-jobs", headers=auth(theirs)).json()["data"]
    assert all(j["id"] != job for j in listed)
    # A key whose id is right but whose secret is not gets nothing either.
    forged = mine[:-4] + ("0000" if not mine.endswith("0000") else "1111")
    r = httpx.get(f"{edge.url}/v1/completion-jobs/{job}", headers=auth(forged))
    assert r.status_code == 401


def test_a_prompt_sampled_again_goes_to_the_upstream_that_keeps_it(cluster):
    """Each run goes to the upstream its prompt maps to: a prompt sent again (whole, as
    a stream, or as a job) is served from that upstream's prompt cache, as its usage
    says, and distinct prompts spread over both upstreams."""
    edge, ups = cluster
    ensure_up(ups)
    key = edge.new_key(1_000_000)
    prompts = [f"Rollout prompt number {i}: the sky is" for i in range(8)]
    before = [u.cpu_seconds() for u in ups]
    for p in prompts:
        for attempt in range(3):
            r = httpx.post(f"{edge.url}/v1/completions", headers=auth(key), timeout=60,
                           json={"model": "llama-8b", "prompt": p, "max_tokens": 2})
            assert r.status_code == 200, r.text
            u = r.json()["usage"]
            want = 0 if attempt == 0 else u["prompt_tokens"]
            assert u["prompt_tokens_details"]["cached_tokens"] == want, (p, attempt, u)
    spent = [u.cpu_seconds() - b for u, b in zip(ups, before)]
    print(f"cpu seconds per upstream: {spent}")
    assert min(spent) > 0.05, spent
    body = {"model": "llama-8b", "prompt": prompts[0], "max_tokens": 2}
    usage = None
    with httpx.stream("POST", f"{edge.url}/v1/completions", headers=auth(key), timeout=60,
                      json=dict(body, stream=True, stream_options={"include_usage": True})) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    assert usage and usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"], usage
    r = httpx.post(f"{edge.url}/v1/completion-jobs", headers=auth(key), json=dict(body, prompt=prompts[1]))
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    deadline = time.time() + 60
    while httpx.get(f"{edge.url}/v1/completion-jobs/{job}", headers=auth(key)).json()["status"] != "succeeded":
        assert time.time() < deadline
        time.sleep(0.1)
    u = httpx.get(f"{edge.url}/v1/completion-jobs/{job}/result", headers=auth(key)).json()["usage"]
    assert u["prompt_tokens_details"]["cached_tokens"] == u["prompt_tokens"], u
    b = settle_budget(edge, key)
    assert b["tokens_held"] == 0 and b["running"] == 0, b


def test_prompts_that_begin_alike_go_to_the_upstream_that_keeps_their_beginning(cluster):
    """Prompts that share a long beginning (a few-shot preamble) and differ after it go
    to one upstream, whose prompt cache keeps that beginning: every one after the first
    prefills only its own end, as its usage says."""
    edge, ups = cluster
    ensure_up(ups)
    key = edge.new_key(1_000_000)
    preamble = f"[{uuid.uuid4().hex}] " + "You answer questions about the weather in one short sentence. " * 5
    questions = ["Why is the sky blue?", "Why do clouds float?", "What makes rain?",
                 "Why is snow white?", "What is fog made of?"]
    for i, q in enumerate(questions):
        r = httpx.post(f"{edge.url}/v1/completions", headers=auth(key), timeout=60,
                       json={"model": "llama-8b", "prompt": preamble + q, "max_tokens": 2})
        assert r.status_code == 200, r.text
        u = r.json()["usage"]
        cached = u["prompt_tokens_details"]["cached_tokens"]
        if i == 0:
            assert cached == 0, u
        else:
            assert 60 <= cached < u["prompt_tokens"], (q, u)
    b = settle_budget(edge, key)
    assert b["tokens_held"] == 0 and b["running"] == 0, b


def test_an_upstream_stopped_mid_run(cluster):
    """Kill one of two upstreams while requests run: whole completions are finished on
    the other, streams end with an error event, new requests are served, and every
    Hold is released with the charge within what was held."""
    edge, ups = cluster
    ensure_up(ups)
    start_tokens = 1_000_000
    key = edge.new_key(start_tokens, max_running=32)
    body = {"model": "llama-8b", "prompt": ["Once upon a time", "The sky is"], "n": 2,
            "max_tokens": 48, "logit_bias": NO_EOS, "temperature": 1, "seed": 7}
    results: list[httpx.Response] = []
    streams: list[str] = []

    def whole():
        results.append(httpx.post(f"{edge.url}/v1/completions", json=body, headers=auth(key), timeout=120))

    def stream():
        text = []
        with httpx.stream("POST", f"{edge.url}/v1/completions", json=dict(body, stream=True),
                          headers=auth(key), timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                text.append(line)
        streams.append("\n".join(text))

    threads = [threading.Thread(target=whole) for _ in range(6)] + [threading.Thread(target=stream) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    victim = ups[0]
    victim.kill()
    for t in threads:
        t.join()
    assert len(results) == 6 and len(streams) == 2
    for r in results:
        assert r.status_code == 200, r.text
        c = r.json()
        assert [ch["index"] for ch in c["choices"]] == [0, 1, 2, 3]
        assert c["usage"]["completion_tokens"] == 4 * 48
    for s in streams:
        assert s.rstrip().endswith("data: [DONE]"), s[-300:]
        print("stream ended:", "cut by the dead upstream" if "upstream_unavailable" in s else "whole")
        assert "upstream_unavailable" in s or s.count('"finish_reason":"length"') == 4, s[-600:]
    # Served with one upstream down.
    for _ in range(3):
        r = httpx.post(f"{edge.url}/v1/completions", json=dict(body, max_tokens=4), headers=auth(key), timeout=60)
        assert r.status_code == 200, r.text
        results.append(r)
    b = settle_budget(edge, key)
    assert b["tokens_held"] == 0 and b["running"] == 0, b
    whole_charges = sum(r.json()["usage"]["total_tokens"] for r in results)
    stream_hold = 2 * (len(body["prompt"]) * 6 + 4 * 48)  # generous: prompts are short
    spent = start_tokens - b["tokens_left"]
    assert whole_charges <= spent <= whole_charges + stream_hold, (spent, whole_charges)
    victim.start()


def test_a_job_whose_upstream_dies_is_run_again_and_charged_once(cluster):
    edge, ups = cluster
    ensure_up(ups)
    start_tokens = 100_000
    key = edge.new_key(start_tokens)
    r = httpx.post(f"{edge.url}/v1/completion-jobs", headers=auth(key),
                   json={"model": "llama-8b", "prompt": "Once upon a time", "n": 2, "max_tokens": 160,
                         "logit_bias": NO_EOS, "seed": 3})
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    deadline = time.time() + 30
    while httpx.get(f"{edge.url}/v1/completion-jobs/{job}", headers=auth(key)).json()["status"] == "queued":
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    victim = busiest(ups)
    victim.kill()
    deadline = time.time() + 120
    while True:
        j = httpx.get(f"{edge.url}/v1/completion-jobs/{job}", headers=auth(key)).json()
        if j["status"] in ("succeeded", "failed", "cancelled"):
            break
        assert time.time() < deadline, j
        time.sleep(0.2)
    assert j["status"] == "succeeded", j
    assert j["usage_pending"] is False
    result = httpx.get(f"{edge.url}/v1/completion-jobs/{job}/result", headers=auth(key)).json()
    assert result["usage"]["completion_tokens"] == 2 * 160
    b = settle_budget(edge, key)
    assert b["tokens_held"] == 0 and b["running"] == 0
    # Charged once: exactly the result's usage, nothing for the lost attempt.
    assert b["tokens_left"] == start_tokens - result["usage"]["total_tokens"], b
    victim.start()


def test_a_client_that_goes_away_releases_its_hold(cluster):
    edge, ups = cluster
    ensure_up(ups)
    start_tokens = 100_000
    key = edge.new_key(start_tokens)
    body = {"model": "llama-8b", "prompt": "Once upon a time", "max_tokens": 2000,
            "logit_bias": NO_EOS, "stream": True}
    before = [u.cpu_seconds() for u in ups]
    with httpx.stream("POST", f"{edge.url}/v1/completions", json=body, headers=auth(key), timeout=60) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen += 1
                if seen == 5:
                    break
    b = settle_budget(edge, key)
    assert b["running"] == 0 and b["tokens_held"] == 0, b
    spent = start_tokens - b["tokens_left"]
    # Charged what was generated (at least the 5 tokens seen), far from the 2000 held.
    assert 5 <= spent < 1000, spent
    # The upstream stopped generating: its CPU time stays still.
    time.sleep(1.0)
    mid = [u.cpu_seconds() for u in ups]
    time.sleep(1.5)
    after = [u.cpu_seconds() for u in ups]
    assert sum(after) - sum(mid) < 0.5, (before, mid, after)


def test_the_openai_sdk_runs_the_tutorials_steps_through_the_edge(cluster):
    """The real openai Python SDK (tests/tutorial/openai_steps.py, as against acs serve):
    2 prompts × n=2, 8 parallel requests, streaming."""
    edge, ups = cluster
    ensure_up(ups)
    key = edge.new_key(100_000)
    env = dict(os.environ, ACS_API_BASE=f"{edge.url}/v1", ACS_API_KEY=key)
    out = subprocess.run(["python3", str(ROOT / "tests" / "tutorial" / "openai_steps.py")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["indexes"] == [0, 1, 2, 3]
    assert summary["streamed_indexes"] == [0, 1, 2, 3]
    assert summary["parallel"] == 8
    u = summary["usage"]
    assert u["completion_tokens"] == 8 and u["total_tokens"] == u["prompt_tokens"] + 8
    b = settle_budget(edge, key)
    assert b["tokens_held"] == 0 and b["running"] == 0


def test_each_request_goes_to_an_upstream_that_serves_its_model():
    # Two upstreams with different models: the edge lists both, and sends each request
    # (completions, chat, jobs) to the upstream that serves the model it names.
    gemma = os.environ.get("ACS_GEMMA3_MODEL")
    assert gemma and os.path.exists(gemma), "ACS_GEMMA3_MODEL (scripts/fetch-gemma3.sh) is needed"
    with tempfile.TemporaryDirectory(prefix="acs-edge-models.") as d:
        tmp = pathlib.Path(d)
        ups = []
        for name, models in (("smol", [f"SmolLM2-135M-Instruct={MODEL}"]), ("gemma", [f"gemma={gemma}"])):
            (tmp / name).mkdir()
            u = Upstream(tmp / name, models)
            u.start()
            ups.append(u)
        edge = Edge(tmp, ups)
        try:
            r = httpx.get(f"{edge.url}/v1/models")
            assert r.status_code == 200, r.text
            ids = [m["id"] for m in r.json()["data"]]
            assert ids == ["SmolLM2-135M-Instruct", "llama-8b", "gemma"], ids
            families = {m["id"]: m["family"] for m in r.json()["data"]}
            assert families["gemma"] == "gemma3" and families["llama-8b"] == "llama", families
            key = edge.new_key(1_000_000)
            for i in range(6):
                for model in ("gemma", "SmolLM2-135M-Instruct"):
                    r = httpx.post(f"{edge.url}/v1/completions", headers=auth(key), timeout=120,
                                   json={"model": model, "prompt": f"Prompt {i} is", "max_tokens": 2})
                    assert r.status_code == 200, (model, r.text)
                    assert r.json()["model"] == model
            chat = {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 2}
            r = httpx.post(f"{edge.url}/v1/chat/completions", headers=auth(key), timeout=120,
                           json={"model": "SmolLM2-135M-Instruct", **chat})
            assert r.status_code == 200 and r.json()["object"] == "chat.completion", r.text
            r = httpx.post(f"{edge.url}/v1/chat/completions", headers=auth(key), timeout=120,
                           json={"model": "gemma", **chat})
            assert r.status_code == 400 and r.json()["error"]["code"] == "chat_template_missing", r.text
            r = httpx.post(f"{edge.url}/v1/completions", headers=auth(key),
                           json={"model": "nope", "prompt": "x", "max_tokens": 1})
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
            r = httpx.post(f"{edge.url}/v1/completion-jobs", headers=auth(key),
                           json={"model": "gemma", "prompt": "The sky is", "max_tokens": 2})
            assert r.status_code == 202, r.text
            job = r.json()
            deadline = time.time() + 120
            while job["status"] not in ("succeeded", "failed", "cancelled") and time.time() < deadline:
                time.sleep(0.2)
                job = httpx.get(f"{edge.url}{job['status_url']}", headers=auth(key)).json()
            assert job["status"] == "succeeded", job
            res = httpx.get(f"{edge.url}{job['result_url']}", headers=auth(key)).json()
            assert res["model"] == "gemma" and len(res["choices"]) == 1, res
            assert settle_budget(edge, key)["tokens_held"] == 0
        finally:
            for p in [edge.proc] + [u.proc for u in ups]:
                if p and p.poll() is None:
                    p.kill()
                    p.wait()


class Hung:
    """An upstream that takes connections and never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self):
        self.sock.close()
        for c in self.held:
            c.close()


@contextlib.contextmanager
def hung_beside_real(prefix: str, **settings: str):
    """An edge over a hung upstream and a real one: yields the edge, and stops all."""
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        tmp = pathlib.Path(d)
        hung = Hung()
        (tmp / "real").mkdir()
        real = Upstream(tmp / "real")
        real.start()
        edge = Edge(tmp, [hung, real], **settings)
        try:
            yield edge
        finally:
            hung.close()
            for p in (edge.proc, real.proc):
                if p and p.poll() is None:
                    p.kill()
                    p.wait()


def test_an_upstream_that_hangs_costs_one_request_its_wait():
    # Without a deadline per attempt, a request whose prompt maps to the hung upstream
    # would wait for it forever; with one it moves on after 10 s, and the hung upstream
    # is tried last for a while after, so the requests after it do not wait.
    with hung_beside_real("acs-edge-hung.") as edge:
        key = edge.new_key(1_000_000)
        started = time.monotonic()
        for i in range(8):
            r = httpx.post(f"{edge.url}/v1/completions", headers=auth(key), timeout=60,
                           json={"model": "llama-8b", "prompt": f"Prompt number {i} is", "max_tokens": 1})
            assert r.status_code == 200, r.text
        elapsed = time.monotonic() - started
        print(f"8 requests with one upstream hung: {elapsed:.1f} s")
        assert elapsed < 25, elapsed
        assert settle_budget(edge, key)["tokens_held"] == 0


def admin_call(edge: Edge, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, f"{edge.url}/admin/keys{path}",
                         headers={"authorization": f"Bearer {ADMIN_SECRET}"}, **kw)


def finished_job(edge: Edge, key: str, body: dict) -> httpx.Response:
    """Submits a job, waits for it to succeed, and returns its result's response."""
    r = httpx.post(f"{edge.url}/v1/completion-jobs", headers=auth(key), json=body)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    deadline = time.time() + 120
    while (j := httpx.get(f"{edge.url}/v1/completion-jobs/{job}", headers=auth(key)).json())["status"] \
            in ("queued", "running"):
        assert time.time() < deadline, j
        time.sleep(0.1)
    assert j["status"] == "succeeded", j
    r = httpx.get(f"{edge.url}/v1/completion-jobs/{job}/result", headers=auth(key))
    assert r.status_code == 200, r.text
    return r


def test_the_admin_reads_a_keys_usage_log(cluster):
    edge, ups = cluster
    ensure_up(ups)
    key = edge.new_key(100_000)
    key_id = "key_" + key.split("-")[1]
    body = {"model": "llama-8b", "prompt": ["The sky is", "Water is"], "n": 2, "max_tokens": 3,
            "logit_bias": NO_EOS}
    whole = httpx.post(f"{edge.url}/v1/completions", json=body, headers=auth(key), timeout=120)
    assert whole.status_code == 200, whole.text
    chat = {"model": "llama-8b", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 3,
            "logit_bias": NO_EOS, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{edge.url}/v1/chat/completions", json=chat, headers=auth(key), timeout=120) as s:
        assert s.status_code == 200
        events = [json.loads(line[6:]) for line in s.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        stream_id = s.headers["x-request-id"]
    stream_usage = events[-1]["usage"]
    result = finished_job(edge, key, {"model": "llama-8b", "prompt": "Once", "max_tokens": 2,
                                      "logit_bias": NO_EOS})

    r = admin_call(edge, "GET", f"/{key_id}/usage")
    assert r.status_code == 200, r.text
    rows = r.json()["data"]
    assert [row["endpoint"] for row in rows] == ["/v1/completion-jobs", "/v1/chat/completions", "/v1/completions"]
    job_row, stream_row, whole_row = rows
    assert whole_row | {"latency_ms": 0, "upstream": None, "created_at": 0} == {
        "request_id": whole.headers["x-request-id"], "created_at": 0, "endpoint": "/v1/completions",
        "model": "llama-8b", "prompts": 2, "n": 2, "max_tokens": 3, "stream": False,
        "tokens": whole.json()["usage"]["total_tokens"], "latency_ms": 0, "upstream": None,
        "outcome": "succeeded"}
    assert abs(whole_row["created_at"] - time.time()) < 300
    assert stream_row["request_id"] == stream_id and stream_row["stream"] is True
    assert stream_row["tokens"] == stream_usage["total_tokens"] and stream_row["outcome"] == "succeeded"
    assert job_row["request_id"] == result.headers["x-request-id"]
    assert job_row["tokens"] == result.json()["usage"]["total_tokens"] and job_row["outcome"] == "succeeded"
    for row in rows:
        assert row["upstream"] in {u.url for u in ups} and row["latency_ms"] > 0, row
    # The log accounts for every token the Budget was charged.
    assert 100_000 - settle_budget(edge, key)["tokens_left"] == sum(row["tokens"] for row in rows)

    newest = admin_call(edge, "GET", f"/{key_id}/usage?limit=1").json()["data"]
    assert newest == rows[:1]
    for bad in ("0", "-1", "x", "1001"):
        r = admin_call(edge, "GET", f"/{key_id}/usage?limit={bad}")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_value", r.text
    # Another key's log is its own; the key itself cannot read the log.
    other = edge.new_key(1000)
    assert admin_call(edge, "GET", f"/key_{other.split('-')[1]}/usage").json()["data"] == []
    r = httpx.get(f"{edge.url}/admin/keys/{key_id}/usage", headers=auth(key))
    assert r.status_code == 401, r.text


def test_a_key_expires_and_keeps_to_its_models(cluster):
    edge, ups = cluster
    ensure_up(ups)
    key = edge.new_key(100_000, models=["llama-8b"], name="team-a")
    key_id = "key_" + key.split("-")[1]
    info = admin_call(edge, "GET", f"/{key_id}")
    assert info.status_code == 200, info.text
    assert info.json() | {"created_at": 0} == {
        "id": key_id, "name": "team-a", "created_at": 0, "revoked": False, "tokens_left": 100_000,
        "tokens_held": 0, "running": 0, "max_running": 16, "requests_per_minute": None,
        "tokens_per_minute": None, "expires_at": None, "models": ["llama-8b"]}

    ok = {"model": "llama-8b", "prompt": "The sky is", "max_tokens": 1}
    assert httpx.post(f"{edge.url}/v1/completions", json=ok, headers=auth(key), timeout=120).status_code == 200
    # A model off the list is refused at the edge as OpenAI refuses one a key cannot use.
    for path in ("/v1/completions", "/v1/completion-jobs"):
        r = httpx.post(f"{edge.url}{path}", json=ok | {"model": "gpt-4o"}, headers=auth(key))
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    r = httpx.post(f"{edge.url}/v1/chat/completions", headers=auth(key),
                   json={"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text

    # Expired: every route answers 401; a later expiry lets the key in again.
    r = admin_call(edge, "POST", f"/{key_id}/policy", json={"expires_at": int(time.time()) - 1})
    assert r.status_code == 200 and r.json()["models"] == ["llama-8b"], r.text
    for method, path in (("GET", "/v1/budget"), ("POST", "/v1/completions"), ("GET", "/v1/completion-jobs")):
        r = httpx.request(method, f"{edge.url}{path}", headers=auth(key), json=ok)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
        assert "expired" in r.json()["error"]["message"]
    later = int(time.time()) + 3600
    r = admin_call(edge, "POST", f"/{key_id}/policy", json={"expires_at": later, "models": None})
    assert r.status_code == 200 and r.json()["expires_at"] == later and r.json()["models"] is None, r.text
    assert budget(edge, key)["tokens_held"] == 0
    for bad in ({"expires_at": "soon"}, {"models": "llama-8b"}, {"models": [""]}, {"expiry": 5}):
        r = admin_call(edge, "POST", f"/{key_id}/policy", json=bad)
        assert r.status_code == 400, (bad, r.text)
    assert admin_call(edge, "GET", f"/{key_id}").json()["expires_at"] == later
    r = admin_call(edge, "POST", "", json={"tokens": 5, "models": ["m"] * 65})
    assert r.status_code == 400, r.text


def test_the_admin_lists_keys_by_id(cluster):
    edge, _ = cluster
    made = {"key_" + edge.new_key(10, name=f"listed-{i}").split("-")[1]: f"listed-{i}" for i in range(3)}
    seen, after = [], None
    while True:
        r = admin_call(edge, "GET", "?limit=2" + (f"&after={after}" if after else ""))
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["object"] == "list" and len(page["data"]) <= 2
        seen += page["data"]
        if not page["has_more"]:
            break
        after = page["data"][-1]["id"]
    ids = [k["id"] for k in seen]
    assert ids == sorted(set(ids)) and set(made) <= set(ids)
    for k in seen:
        # The list never holds a secret.
        assert set(k) == {"id", "name", "created_at"}, k
        if k["id"] in made:
            assert k["name"] == made[k["id"]] and abs(k["created_at"] - time.time()) < 300
    for bad in ("?limit=0", "?limit=1001", "?limit=x"):
        r = admin_call(edge, "GET", bad)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_value", r.text
    assert httpx.get(f"{edge.url}/admin/keys", headers={"authorization": "Bearer wrong"}).status_code == 401
    # Paths name keys by id; anything else names no object.
    for other in ("directory", "key_zz", "key_0123456789abc"):
        r = admin_call(edge, "GET", f"/{other}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text


def test_a_run_goes_where_all_keys_load_is_least(cluster):
    """Each key's object counts its own runs; an upstream also reports its load of all
    keys (x-acs-load), so that another key's run skips the prompt's own upstream when
    other keys keep it busy. The usage log names the upstream of each run."""
    edge, ups = cluster
    ensure_up(ups)
    wait_idle(ups)
    prompt = f"[{uuid.uuid4().hex}] Tell me a long story about the sea."
    body = {"model": "llama-8b", "prompt": prompt, "max_tokens": 4, "logit_bias": NO_EOS}

    def upstream_of(key: str) -> str:
        r = httpx.post(f"{edge.url}/v1/completions", json=body, headers=auth(key), timeout=120)
        assert r.status_code == 200, r.text
        key_id = "key_" + key.split("-")[1]
        row = admin_call(edge, "GET", f"/{key_id}/usage?limit=1").json()["data"][0]
        assert row["request_id"] == r.headers["x-request-id"], row
        return row["upstream"]

    # Idle upstreams: the prompt's own one runs it, for any key.
    own = upstream_of(edge.new_key(100_000))
    assert upstream_of(edge.new_key(100_000)) == own
    # One key keeps the prompt's own upstream busy: its object sends its runs there
    # until that upstream has AFFINITY_SLACK (4) more than the other, then spreads them.
    busy = edge.new_key(1_000_000)
    streams, started = [], threading.Barrier(9)
    stop = threading.Event()

    def hold_a_stream():
        with httpx.stream("POST", f"{edge.url}/v1/completions", headers=auth(busy), timeout=300,
                          json=body | {"max_tokens": 4000, "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: {"))
            started.wait(timeout=120)
            stop.wait(timeout=300)

    for _ in range(8):
        t = threading.Thread(target=hold_a_stream, daemon=True)
        t.start()
        streams.append(t)
    try:
        started.wait(timeout=120)
        time.sleep(0.5)  # a step after the last one's first token, for the engines' counts
        # A key with nothing running anywhere: by its own count the prompt's upstream
        # is idle, by the upstreams' reports it is the busier.
        assert upstream_of(edge.new_key(100_000)) != own
    finally:
        stop.set()
        for t in streams:
            t.join(timeout=60)
    assert settle_budget(edge, busy)["tokens_held"] == 0
    wait_idle(ups)


def test_a_failed_upstream_must_pass_its_health_check_before_it_is_used_again():
    # A cooldown of 1 s (doubled for each failure in a row) runs out many times in
    # the 20 s below; each time, the hung upstream gets a 1 s health check instead of
    # a request that would wait 10 s for it.
    with hung_beside_real("acs-edge-probe.", ACS_UPSTREAM_COOLDOWN_MS="1000") as edge:
        key = edge.new_key(1_000_000)
        waits = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            started = time.monotonic()
            r = httpx.post(f"{edge.url}/v1/completions", headers=auth(key), timeout=60,
                           json={"model": "llama-8b", "prompt": f"Probe prompt {len(waits)} is",
                                 "max_tokens": 1})
            assert r.status_code == 200, r.text
            waits.append(round(time.monotonic() - started, 2))
            time.sleep(0.3)
        print(f"seconds per request: {waits}")
        assert len([w for w in waits if w > 5]) == 1, waits


def test_an_upstream_that_comes_back_is_used_again(cluster):
    _, ups = cluster
    ensure_up(ups)
    with tempfile.TemporaryDirectory(prefix="acs-edge-back.") as d:
        edge = Edge(pathlib.Path(d), ups, ACS_UPSTREAM_COOLDOWN_MS="500")
        try:
            key = edge.new_key(1_000_000)
            key_id = "key_" + key.split("-")[1]

            def served_by(prompt: str) -> str:
                r = httpx.post(f"{edge.url}/v1/completions", headers=auth(key), timeout=60,
                               json={"model": "llama-8b", "prompt": prompt, "max_tokens": 1})
                assert r.status_code == 200, r.text
                return admin_call(edge, "GET", f"/{key_id}/usage?limit=1").json()["data"][0]["upstream"]

            wait_idle(ups)
            prompt = next(p for p in (f"Comeback prompt {i}" for i in range(64)) if served_by(p) == ups[1].url)
            ups[1].kill()
            assert served_by(prompt) == ups[0].url
            ups[1].start()
            time.sleep(1)
            # Its cooldown is over and it answers its health check: the prompt's own
            # upstream serves it again.
            assert served_by(prompt) == ups[1].url
        finally:
            edge.proc.kill()
            edge.proc.wait()


def test_a_job_too_big_to_store_at_the_edge_is_refused_whole(cluster):
    # A Durable Object's SQLite stores no row over 2 MB, and a job is one row: the edge
    # refuses a body over 1 MiB before it takes an idempotency key, a Hold or a row.
    edge, ups = cluster
    ensure_up(ups)
    key = edge.new_key(10_000_000)
    big = {"model": "llama-8b", "prompt": ["x" * 600_000, "y" * 600_000], "max_tokens": 1}
    r = httpx.post(f"{edge.url}/v1/completion-jobs", headers=auth(key) | {"idempotency-key": "big-1"},
                   json=big, timeout=60)
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and "1048576" in err["message"], err
    assert httpx.get(f"{edge.url}/v1/completion-jobs", headers=auth(key)).json()["data"] == []
    b = budget(edge, key)
    assert b["tokens_left"] == 10_000_000 and b["tokens_held"] == 0
    # The idempotency key was not taken: a body that fits may use it.
    r = httpx.post(f"{edge.url}/v1/completion-jobs", headers=auth(key) | {"idempotency-key": "big-1"},
                   json={"model": "llama-8b", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 202, r.text


def test_jobs_past_one_alarms_share_run_in_the_next(cluster):
    # Each alarm invocation starts ACS_JOBS_PER_ALARM jobs at most (Cloudflare counts
    # an invocation's subrequests), then hands the queue on to a fresh invocation.
    _, ups = cluster
    ensure_up(ups)
    with tempfile.TemporaryDirectory(prefix="acs-edge-alarm.") as d:
        edge = Edge(pathlib.Path(d), ups, ACS_JOBS_PER_ALARM="2")
        try:
            key = edge.new_key(1_000_000)
            ids = []
            for i in range(5):
                r = httpx.post(f"{edge.url}/v1/completion-jobs", headers=auth(key),
                               json={"model": "llama-8b", "prompt": f"Alarm job {i}", "max_tokens": 2})
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
            deadline = time.time() + 120
            for job in ids:
                while (j := httpx.get(f"{edge.url}/v1/completion-jobs/{job}", headers=auth(key)).json())[
                        "status"] in ("queued", "running"):
                    assert time.time() < deadline, j
                    time.sleep(0.1)
                assert j["status"] == "succeeded", j
            assert settle_budget(edge, key)["tokens_held"] == 0
        finally:
            edge.proc.kill()
            edge.proc.wait()
