"""GET /v1/models, request ids and traffic headers across routes."""

import re

from conftest import MODEL, REQUEST_ID, expect_error


def test_models_list(api):
    r = api.get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert isinstance(body["data"], list) and body["data"]
    ids = [m["id"] for m in body["data"]]
    assert MODEL in ids and "llama-8b" in ids
    for m in body["data"]:
        assert m.get("object") == "model"
        for f in ("context_window", "n_layers", "d_model"):
            assert isinstance(m[f], int) and m[f] > 0, (f, m)
        assert isinstance(m["id"], str)


def test_alias_and_id_describe_the_same_model(api):
    data = api.get("/v1/models").json()["data"]
    shapes = {(m["context_window"], m["n_layers"], m["d_model"]) for m in data}
    assert len(shapes) == 1


def test_request_ids_are_unique(api):
    seen = set()
    for _ in range(5):
        rid = api.get("/v1/models").headers["x-request-id"]
        assert REQUEST_ID.match(rid)
        seen.add(rid)
    rid = api.complete().headers["x-request-id"]
    assert REQUEST_ID.match(rid)
    seen.add(rid)
    assert len(seen) == 6


def test_request_id_on_errors(api):
    r = api.get("/v1/nope")
    assert REQUEST_ID.match(r.headers["x-request-id"])
    r = api.request("GET", "/v1/budget", key=None)
    assert r.status_code == 401 and REQUEST_ID.match(r.headers["x-request-id"])


def test_job_responses_carry_traffic_headers(fresh):
    a = fresh(1000, 5)
    r = a.submit_job(max_tokens=1)
    assert r.status_code == 202
    assert r.headers["x-ratelimit-limit-requests"] == "5"
    assert r.headers["x-ratelimit-remaining-requests"].isdigit()
    assert r.headers["x-budget-remaining-tokens"].isdigit()
    job_id = r.json()["id"]
    a.wait_job(job_id)
    # Every answer to the key: its job, the list, the result, a cancel.
    for method, path in (("GET", f"/v1/completion-jobs/{job_id}"), ("GET", "/v1/completion-jobs"),
                         ("GET", f"/v1/completion-jobs/{job_id}/result"),
                         ("POST", f"/v1/completion-jobs/{job_id}/cancel")):
        r = a.request(method, path)
        assert r.status_code == 200, r.text
        assert r.headers.get("x-ratelimit-limit-requests") == "5", (path, dict(r.headers))
        assert r.headers.get("x-ratelimit-remaining-requests", "").isdigit(), (path, dict(r.headers))
        assert r.headers.get("x-budget-remaining-tokens", "").isdigit(), (path, dict(r.headers))


def test_refusals_carry_traffic_headers(fresh):
    """'responses carry x-ratelimit-…' — including the 402/429 refusals a client must act on."""
    a = fresh(5, 2)
    r = a.complete(max_tokens=50)
    expect_error(r, 402, "budget_exhausted")
    assert r.headers.get("x-ratelimit-limit-requests") == "2", dict(r.headers)
    assert r.headers.get("x-ratelimit-remaining-requests", "").isdigit(), dict(r.headers)
    assert r.headers.get("x-budget-remaining-tokens") == "5", dict(r.headers)


def test_cors_exposes_headers(http):
    r = http.options("/v1/completions", headers={
        "Origin": "https://example.com", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,idempotency-key"})
    assert r.status_code in (200, 204)
    assert r.headers.get("access-control-allow-origin") in ("*", "https://example.com")


def test_preflight_allows_the_authorization_header(http):
    """Browsers never let a `*` in Access-Control-Allow-Headers cover Authorization
    (Fetch standard), so a cross-origin page cannot send its Bearer key unless the
    header is named (or the request's list echoed)."""
    r = http.options("/v1/completions", headers={
        "Origin": "https://example.com", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    allowed = [h.strip().lower() for h in r.headers.get("access-control-allow-headers", "").split(",")]
    assert "authorization" in allowed, r.headers.get("access-control-allow-headers")


def test_preflight_and_health_carry_request_id(http):
    """'Every response carries x-request-id' — CORS preflights and /health included."""
    r = http.get("/health")
    assert REQUEST_ID.match(r.headers.get("x-request-id", "")), dict(r.headers)
    r = http.options("/v1/completions", headers={
        "Origin": "https://example.com", "Access-Control-Request-Method": "POST"})
    assert REQUEST_ID.match(r.headers.get("x-request-id", "")), dict(r.headers)
