"""Black-box conformance suite of the ACS API contract (../../shared/API.md).

Runs against any face of ACS given:
  ACS_BASE_URL   e.g. http://127.0.0.1:8080 (the /v1 prefix is added by the tests)
  ACS_MAKE_KEY   a shell command template with {tokens} and {max_running} placeholders
                 that prints a new API key alone on its last stdout line
optional:
  ACS_MODEL            model id to request (default: llama-8b, the tutorial's alias)
  ACS_RETENTION_SECS   the server's result/idempotency retention (default 86400; the
                       expiry test only runs when it is at most 10)
  ACS_MAX_BODY_BYTES   the server's body limit (default 4 MiB), for the 413 test
  ACS_MAX_QUEUED_JOBS  the jobs one key may queue (default 256; the test runs at <= 32)
  ACS_BODY_TIMEOUT_SECS  the server's body deadline (default 60; the 408 test runs at
                       <= 10)
  ACS_OPENAPI          path to the OpenAPI document for the schemathesis run
  ACS_SUMMARY_FILE     where to also write the final "N passed, N failed" line
  ACS_FACE             "acs" (default) or "edge": the face under test, for the few
                       behaviours that one face does not have yet (skipped, with why)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from typing import Any, Iterator

import httpx
import pytest

BASE_URL = os.environ.get("ACS_BASE_URL", "http://127.0.0.1:8080").rstrip("/")
MAKE_KEY = os.environ.get("ACS_MAKE_KEY", "")
MODEL = os.environ.get("ACS_MODEL", "llama-8b")
RETENTION_SECS = float(os.environ.get("ACS_RETENTION_SECS", "86400"))
MAX_BODY_BYTES = int(os.environ.get("ACS_MAX_BODY_BYTES", str(4 << 20)))
MAX_QUEUED_JOBS = int(os.environ.get("ACS_MAX_QUEUED_JOBS", "256"))
BODY_TIMEOUT_SECS = float(os.environ.get("ACS_BODY_TIMEOUT_SECS", "60"))
FACE = os.environ.get("ACS_FACE", "acs")
# Token ids banned through logit_bias so that choices run to max_tokens ("length").
# 0..2 are the special/EOS tokens of SmolLM2 and of most Llama-family vocabularies.
EOS_BAN = {str(i): -100 for i in (0, 1, 2)}

REQUEST_ID = re.compile(r"^req_[0-9a-f]{32}$")
JOB_REQUEST_ID = re.compile(r"^req_job_[0-9a-f]{32}$")
TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}\+00:00$")
UUID7_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")

# (status, type) fixed by each error code of the contract.
ERROR_CODES: dict[str, tuple[int, str]] = {
    "invalid_json": (400, "invalid_request_error"),
    "unknown_parameter": (400, "invalid_request_error"),
    "missing_required_parameter": (400, "invalid_request_error"),
    "invalid_type": (400, "invalid_request_error"),
    "invalid_value": (400, "invalid_request_error"),
    "context_length_exceeded": (400, "invalid_request_error"),
    "invalid_idempotency_key": (400, "invalid_request_error"),
    "invalid_api_key": (401, "authentication_error"),
    "budget_exhausted": (402, "insufficient_quota"),
    "model_not_found": (404, "invalid_request_error"),
    "not_found": (404, "invalid_request_error"),
    "unknown_route": (404, "invalid_request_error"),
    "method_not_allowed": (405, "invalid_request_error"),
    "request_timeout": (408, "invalid_request_error"),
    "idempotency_key_in_use": (409, "invalid_request_error"),
    "job_not_finished": (409, "invalid_request_error"),
    "job_cancelled": (409, "invalid_request_error"),
    "result_expired": (410, "invalid_request_error"),
    "request_too_large": (413, "invalid_request_error"),
    "result_too_large": (413, "invalid_request_error"),
    "idempotency_key_reused": (422, "invalid_request_error"),
    "budget_held": (429, "rate_limit_error"),
    "too_many_running": (429, "rate_limit_error"),
    "too_many_queued_jobs": (429, "rate_limit_error"),
    "rate_limit_exceeded": (429, "rate_limit_error"),
}

JOB_FIELDS = [
    "id", "request_id", "model", "status", "cancel_requested", "created_at",
    "started_at", "finished_at", "expires_at", "result_expired", "status_url",
    "result_url", "usage_pending",
]
FINAL_STATUSES = {"succeeded", "failed", "cancelled"}


# ---------------------------------------------------------------- checks on every response

def check_common(resp: httpx.Response, *, allow_5xx: bool = False) -> None:
    """What every response must satisfy: an x-request-id, no 5xx, the error shape."""
    rid = resp.headers.get("x-request-id")
    assert rid is not None, f"{resp.request.method} {resp.request.url.path} -> {resp.status_code}: no x-request-id"
    assert REQUEST_ID.match(rid) or JOB_REQUEST_ID.match(rid), f"bad x-request-id {rid!r}"
    if not allow_5xx:
        assert resp.status_code < 500, (
            f"server error {resp.status_code} on {resp.request.method} {resp.request.url.path}: "
            f"{resp.text[:500]}")
    if resp.status_code >= 400:
        check_error_shape(resp)
    if resp.status_code == 429:
        ra = resp.headers.get("retry-after")
        assert ra is not None and ra.strip().isdigit(), f"429 without a numeric retry-after: {ra!r}"


def check_error_shape(resp: httpx.Response) -> dict:
    assert resp.headers.get("content-type", "").startswith("application/json"), resp.headers
    body = resp.json()
    assert isinstance(body, dict) and list(body) == ["error"], body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str), err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err
    if err["code"] in ERROR_CODES:
        status, kind = ERROR_CODES[err["code"]]
        assert resp.status_code == status, f"code {err['code']} with status {resp.status_code}"
        assert err["type"] == kind, f"code {err['code']} with type {err['type']}"
    return err


_UNSET = object()


def expect_error(resp: httpx.Response, status: int, code: str, param: Any = _UNSET,
                 type_: str | None = None) -> dict:
    """Asserts the response is the contract's error `code` (and `param` when given)."""
    assert resp.status_code == status, f"expected {status} {code}, got {resp.status_code}: {resp.text[:400]}"
    err = check_error_shape(resp)
    assert err["code"] == code, f"expected code {code}, got {err}"
    if type_ is None and code in ERROR_CODES:
        type_ = ERROR_CODES[code][1]
    if type_ is not None:
        assert err["type"] == type_, err
    if param is not _UNSET:
        assert err["param"] == param, f"expected param {param!r}, got {err}"
    return err


# ---------------------------------------------------------------- the client

class Api:
    """A thin httpx wrapper: /v1 paths, a key, and check_common on every response."""

    def __init__(self, client: httpx.Client, key: str | None = None):
        self.client = client
        self.key = key

    def with_key(self, key: str | None) -> "Api":
        return Api(self.client, key)

    def headers(self, extra: dict | None = None, key: Any = _UNSET) -> dict:
        h = {}
        k = self.key if key is _UNSET else key
        if k is not None:
            h["Authorization"] = f"Bearer {k}"
        if extra:
            h.update(extra)
        return h

    def request(self, method: str, path: str, *, json_body: Any = _UNSET, content: Any = None,
                headers: dict | None = None, key: Any = _UNSET, allow_5xx: bool = False,
                params: dict | None = None, timeout: float | None = None) -> httpx.Response:
        kw: dict[str, Any] = {"headers": self.headers(headers, key)}
        if json_body is not _UNSET:
            kw["content"] = json.dumps(json_body).encode()
            kw["headers"].setdefault("Content-Type", "application/json")
        elif content is not None:
            kw["content"] = content
            kw["headers"].setdefault("Content-Type", "application/json")
        if params:
            kw["params"] = params
        if timeout is not None:
            kw["timeout"] = timeout
        resp = self.client.request(method, path, **kw)
        check_common(resp, allow_5xx=allow_5xx)
        return resp

    def get(self, path: str, **kw) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = _UNSET, **kw) -> httpx.Response:
        return self.request("POST", path, json_body=body, **kw)

    def complete(self, **fields) -> httpx.Response:
        body = {"model": MODEL, "prompt": "The sky is", "max_tokens": 1}
        body.update(fields)
        body = {k: v for k, v in body.items() if v is not ...}  # ... removes a field
        return self.post("/v1/completions", body)

    def ok_complete(self, **fields) -> dict:
        r = self.complete(**fields)
        assert r.status_code == 200, r.text[:500]
        return r.json()

    def budget(self) -> dict:
        r = self.get("/v1/budget")
        assert r.status_code == 200, r.text
        return r.json()

    def settled_budget(self, timeout: float = 15.0) -> dict:
        """The budget once no request of the key runs any more."""
        deadline = time.monotonic() + timeout
        while True:
            b = self.budget()
            if b["running"] == 0 and b["tokens_held"] == 0:
                return b
            assert time.monotonic() < deadline, f"holds outlive their requests: {b}"
            time.sleep(0.1)

    @contextlib.contextmanager
    def stream(self, body: dict, **kw) -> Iterator[httpx.Response]:
        with self.client.stream("POST", "/v1/completions", headers=self.headers(
                {"Content-Type": "application/json"}), content=json.dumps(body).encode(),
                **kw) as resp:
            check_common(resp)
            yield resp

    def submit_job(self, body: dict | None = None, idem: str | None = None, **fields) -> httpx.Response:
        b = {"model": MODEL, "prompt": "The sky is", "max_tokens": 1}
        if body is not None:
            b = body
        b.update(fields)
        headers = {"Idempotency-Key": idem} if idem is not None else None
        return self.post("/v1/completion-jobs", b, headers=headers)

    def job(self, job_id: str) -> dict:
        r = self.get(f"/v1/completion-jobs/{job_id}")
        assert r.status_code == 200, r.text
        check_job(r.json())
        assert r.headers["x-request-id"] == "req_job_" + job_id.replace("-", "")
        return r.json()

    def wait_job(self, job_id: str, statuses=FINAL_STATUSES, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            j = self.job(job_id)
            if j["status"] in statuses:
                return j
            assert time.monotonic() < deadline, f"job stuck: {j}"
            time.sleep(0.05)


def check_job(j: dict, model: str | None = None) -> None:
    assert isinstance(j, dict)
    assert sorted(j) == sorted(JOB_FIELDS), f"job fields {sorted(j)}"
    assert UUID7_RE.match(j["id"]), j["id"]
    assert j["request_id"] == "req_job_" + j["id"].replace("-", "")
    assert j["status"] in {"queued", "running", "succeeded", "failed", "cancelled"}
    assert isinstance(j["cancel_requested"], bool)
    assert isinstance(j["result_expired"], bool)
    assert isinstance(j["usage_pending"], bool)
    assert j["status_url"] == f"/v1/completion-jobs/{j['id']}"
    assert j["result_url"] == f"/v1/completion-jobs/{j['id']}/result"
    assert TIME_RE.match(j["created_at"]), j["created_at"]
    for f in ("started_at", "finished_at", "expires_at"):
        assert j[f] is None or (isinstance(j[f], str) and TIME_RE.match(j[f])), (f, j[f])
    if model is not None:
        assert j["model"] == model
    if j["status"] in FINAL_STATUSES:
        assert j["finished_at"] is not None and j["expires_at"] is not None, j
        assert not j["usage_pending"], j
    else:
        assert j["finished_at"] is None and j["expires_at"] is None, j
    if j["status"] == "queued":
        assert j["started_at"] is None and not j["usage_pending"], j
    if j["status"] == "running":
        assert j["started_at"] is not None and j["usage_pending"], j


def check_completion(c: dict, model: str = MODEL, choices: int | None = None) -> None:
    allowed = {"id", "object", "created", "model", "choices", "usage"}
    assert allowed <= set(c) <= allowed | {"activations"}, sorted(c)
    assert isinstance(c["id"], str) and c["id"].startswith("cmpl-"), c["id"]
    assert c["object"] == "text_completion"
    assert isinstance(c["created"], int) and not isinstance(c["created"], bool) and c["created"] > 1_600_000_000
    assert c["model"] == model
    assert isinstance(c["choices"], list)
    if choices is not None:
        assert len(c["choices"]) == choices
    for i, ch in enumerate(c["choices"]):
        assert set(ch) == {"index", "text", "finish_reason", "logprobs"}, ch
        assert ch["index"] == i, [x["index"] for x in c["choices"]]
        assert isinstance(ch["text"], str)
        assert ch["finish_reason"] in ("length", "stop"), ch
    check_usage(c["usage"])


def check_usage(u: dict) -> None:
    assert set(u) == {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}, u
    counts = [u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]]
    details = u["prompt_tokens_details"]
    assert isinstance(details, dict) and set(details) == {"cached_tokens"}, u
    for v in counts + [details["cached_tokens"]]:
        assert isinstance(v, int) and not isinstance(v, bool) and v >= 0, u
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    assert details["cached_tokens"] <= u["prompt_tokens"], u


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def http() -> Iterator[httpx.Client]:
    limits = httpx.Limits(max_connections=300, max_keepalive_connections=50)
    with httpx.Client(base_url=BASE_URL, timeout=120.0, limits=limits) as c:
        yield c


def new_key(tokens: int = 10_000_000, max_running: int = 8) -> str:
    if not MAKE_KEY:
        pytest.fail("ACS_MAKE_KEY is not set")
    cmd = MAKE_KEY.format(tokens=tokens, max_running=max_running)
    out = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{cmd}: {out.stderr}"
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    assert lines, f"{cmd} printed no key"
    return lines[-1]


@pytest.fixture
def make_key():
    return new_key


@pytest.fixture(scope="session")
def session_key() -> str:
    return new_key(10_000_000, 8)


@pytest.fixture
def api(http, session_key) -> Api:
    """A client with the session's big key (don't measure its budget: it's shared)."""
    return Api(http, session_key)


@pytest.fixture
def fresh(http):
    """Makes an Api with a new key of its own: fresh(tokens, max_running)."""
    def make(tokens: int = 1_000_000, max_running: int = 8) -> Api:
        return Api(http, new_key(tokens, max_running))
    return make


@pytest.fixture(scope="session")
def model_info(http) -> dict:
    r = http.get("/v1/models")
    assert r.status_code == 200, r.text
    for m in r.json()["data"]:
        if m["id"] == MODEL:
            return m
    pytest.fail(f"model {MODEL} not listed by /v1/models")


# ---------------------------------------------------------------- the summary line

def pytest_sessionfinish(session, exitstatus):
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        return
    passed = len(tr.stats.get("passed", []))
    failed = len(tr.stats.get("failed", [])) + len(tr.stats.get("error", []))
    skipped = len(tr.stats.get("skipped", []))
    line = f"{passed} passed, {failed} failed"
    session.config._acs_summary = line + (f", {skipped} skipped" if skipped else "")


def pytest_unconfigure(config):
    line = getattr(config, "_acs_summary", None)
    if line is None:
        return
    print(line, flush=True)
    path = os.environ.get("ACS_SUMMARY_FILE")
    if path:
        with open(path, "w") as f:
            f.write(line + "\n")
