"""Idempotency-Key on POST /v1/completion-jobs."""

import concurrent.futures as cf
import json
import uuid

from conftest import MODEL, check_common, expect_error

BODY = {"model": MODEL, "prompt": ["The sky is", "The grass is"], "max_tokens": 2, "n": 2}


def key():
    return "conformance-" + uuid.uuid4().hex


def test_same_key_same_body_replays(fresh):
    a = fresh(100_000)
    k = key()
    first = a.post("/v1/completion-jobs", BODY, headers={"Idempotency-Key": k})
    assert first.status_code == 202, first.text
    again = a.post("/v1/completion-jobs", BODY, headers={"Idempotency-Key": k})
    assert again.status_code == 200, again.text
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["x-request-id"] == first.json()["request_id"]
    a.wait_job(first.json()["id"])
    third = a.post("/v1/completion-jobs", BODY, headers={"Idempotency-Key": k})
    assert third.status_code == 200 and third.json()["id"] == first.json()["id"]
    assert third.json()["status"] == "succeeded"
    assert len(a.get("/v1/completion-jobs").json()["data"]) == 1


def test_same_key_other_body_is_422(fresh):
    a = fresh(100_000)
    k = key()
    assert a.post("/v1/completion-jobs", BODY, headers={"Idempotency-Key": k}).status_code == 202
    other = dict(BODY, max_tokens=1)
    r = a.post("/v1/completion-jobs", other, headers={"Idempotency-Key": k})
    expect_error(r, 422, "idempotency_key_reused")
    assert len(a.get("/v1/completion-jobs").json()["data"]) == 1


def test_keys_are_scoped_per_api_key(fresh):
    a, b = fresh(100_000), fresh(100_000)
    k = key()
    ja = a.post("/v1/completion-jobs", BODY, headers={"Idempotency-Key": k})
    jb = b.post("/v1/completion-jobs", BODY, headers={"Idempotency-Key": k})
    assert ja.status_code == 202 and jb.status_code == 202, (ja.text, jb.text)
    assert ja.json()["id"] != jb.json()["id"]
    # and another body under b's key is b's own business
    jb2 = b.post("/v1/completion-jobs", dict(BODY, n=1), headers={"Idempotency-Key": key()})
    assert jb2.status_code == 202


def test_no_key_makes_new_jobs(fresh):
    a = fresh(100_000)
    ids = {a.post("/v1/completion-jobs", BODY).json()["id"] for _ in range(2)}
    assert len(ids) == 2


def test_refused_body_does_not_burn_the_key(fresh):
    a = fresh(100_000)
    k = key()
    bad = dict(BODY, n=0)
    expect_error(a.post("/v1/completion-jobs", bad, headers={"Idempotency-Key": k}), 400, "invalid_value", "n")
    r = a.post("/v1/completion-jobs", BODY, headers={"Idempotency-Key": k})
    assert r.status_code in (202, 422), r.text  # the contract leaves this open


def test_50_concurrent_duplicates_make_one_job(fresh, http):
    a = fresh(100_000)
    k = key()
    headers = {"Authorization": f"Bearer {a.key}", "Idempotency-Key": k,
               "Content-Type": "application/json"}
    import json as _json
    payload = _json.dumps(BODY).encode()

    def post(_):
        return http.post("/v1/completion-jobs", content=payload, headers=headers)

    with cf.ThreadPoolExecutor(50) as ex:
        rs = list(ex.map(post, range(50)))
    ids = set()
    created = 0
    for r in rs:
        check_common(r)
        if r.status_code == 202:
            created += 1
            ids.add(r.json()["id"])
        elif r.status_code == 200:
            assert r.headers.get("idempotent-replayed") == "true"
            ids.add(r.json()["id"])
        else:
            expect_error(r, 409, "idempotency_key_in_use")
            assert r.headers.get("retry-after", "").isdigit()
    assert created == 1, [r.status_code for r in rs]
    assert len(ids) == 1
    jobs = a.get("/v1/completion-jobs").json()["data"]
    assert [j["id"] for j in jobs] == list(ids)
    a.wait_job(next(iter(ids)))


def test_repeated_key_fields_are_one_key(fresh):
    # Two Idempotency-Key fields are the key "k1, k2" (HTTP joins repeated fields),
    # on acs serve as at the edge, whose Fetch headers join them.
    a = fresh(100_000)
    k1, k2 = key(), key()
    headers = list(a.headers({"Content-Type": "application/json"}).items())
    r = a.client.post("/v1/completion-jobs", content=json.dumps(BODY).encode(),
                      headers=headers + [("Idempotency-Key", k1), ("Idempotency-Key", k2)])
    check_common(r)
    assert r.status_code == 202, r.text
    joined = a.post("/v1/completion-jobs", BODY, headers={"Idempotency-Key": f"{k1}, {k2}"})
    assert joined.status_code == 200, joined.text
    assert joined.headers.get("idempotent-replayed") == "true"
    assert joined.json()["id"] == r.json()["id"]
    single = a.post("/v1/completion-jobs", BODY, headers={"Idempotency-Key": k1})
    assert single.status_code == 202 and single.json()["id"] != r.json()["id"], single.text
