"""/v1/completion-jobs: lifecycle, results, expiry, cancel, isolation, listing."""

import base64
import datetime as dt
import time

import pytest

from conftest import (EOS_BAN, JOB_FIELDS, MAX_QUEUED_JOBS, MODEL, RETENTION_SECS,
                      check_completion, check_job, expect_error)


def ts(s):
    return dt.datetime.fromisoformat(s)


def test_job_lifecycle(fresh):
    a = fresh(100_000)
    before = a.budget()["tokens_left"]
    body = {"model": MODEL, "prompt": ["The sky is", "The grass is"], "max_tokens": 2, "n": 2}
    r = a.post("/v1/completion-jobs", body)
    assert r.status_code == 202, r.text
    j = r.json()
    assert list(j) == JOB_FIELDS or sorted(j) == sorted(JOB_FIELDS)
    check_job(j, model=MODEL)
    assert j["status"] == "queued"
    assert j["cancel_requested"] is False and j["result_expired"] is False
    assert j["started_at"] is None and j["finished_at"] is None and j["expires_at"] is None
    assert j["usage_pending"] is False
    assert r.headers["x-request-id"] == j["request_id"]
    assert r.headers.get("idempotent-replayed") in (None, "false")

    done = a.wait_job(j["id"])
    assert done["status"] == "succeeded", done
    for k in ("id", "request_id", "model", "created_at", "status_url", "result_url"):
        assert done[k] == j[k]
    assert ts(done["created_at"]) <= ts(done["started_at"]) <= ts(done["finished_at"])
    expires = ts(done["finished_at"]) + dt.timedelta(seconds=RETENTION_SECS)
    assert ts(done["expires_at"]) == expires, (done["finished_at"], done["expires_at"])
    assert done["usage_pending"] is False and done["result_expired"] is False

    r = a.get(done["result_url"])
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == j["request_id"]
    c = r.json()
    check_completion(c, choices=4)
    assert [ch["index"] for ch in c["choices"]] == [0, 1, 2, 3]
    assert c["usage"]["completion_tokens"] <= 8
    after = a.settled_budget()
    assert before - after["tokens_left"] == c["usage"]["total_tokens"]


def test_job_result_arithmetic_matches_completion(api):
    body = {"model": MODEL, "prompt": ["A", "B c d"], "max_tokens": 2, "n": 3, "temperature": 0,
            "logit_bias": EOS_BAN}
    j = api.post("/v1/completion-jobs", body).json()
    api.wait_job(j["id"])
    c = api.get(j["result_url"]).json()
    direct = api.ok_complete(**{k: v for k, v in body.items() if k != "model"})
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    # The direct request may branch from the prompts the job prefilled (its
    # prompt_tokens_details then says so): the counts are the same.
    assert [c["usage"][k] for k in counts] == [direct["usage"][k] for k in counts]
    assert [ch["text"] for ch in c["choices"]] == [ch["text"] for ch in direct["choices"]]


def test_job_shows_running_with_usage_pending(fresh):
    a = fresh(100_000)
    j = a.submit_job(max_tokens=120, logit_bias=EOS_BAN).json()
    seen = a.wait_job(j["id"], statuses={"running", "succeeded", "failed", "cancelled"})
    if seen["status"] == "running":
        assert seen["usage_pending"] is True and seen["started_at"] is not None
        b = a.budget()
        assert b["running"] == 1 and b["tokens_held"] > 0
        r = a.get(j["result_url"])
        expect_error(r, 409, "job_not_finished")
    end = a.wait_job(j["id"])
    assert end["status"] == "succeeded" and end["usage_pending"] is False


def test_result_of_unfinished_job_is_409(fresh):
    a = fresh(100_000, 1)
    with a.stream({"model": MODEL, "prompt": "Hi", "max_tokens": 300, "stream": True,
                   "logit_bias": EOS_BAN}) as resp:
        assert resp.status_code == 200
        j = a.submit_job(max_tokens=1).json()
        r = a.get(j["result_url"])
        expect_error(r, 409, "job_not_finished")
        assert a.job(j["id"])["status"] == "queued"
        # cancel while queued: cancelled at once
        r = a.post(f"/v1/completion-jobs/{j['id']}/cancel")
        assert r.status_code == 200, r.text
        c = r.json()
        check_job(c)
        assert c["status"] == "cancelled" and c["cancel_requested"] is True
        assert c["started_at"] is None and c["finished_at"] is not None
        assert r.headers["x-request-id"] == j["request_id"]
        expect_error(a.get(j["result_url"]), 409, "job_cancelled")
    a.settled_budget(timeout=20)
    time.sleep(0.5)
    still = a.job(j["id"])
    assert still["status"] == "cancelled", "a cancelled job never runs"


def test_cancel_running_job_stops_it(fresh):
    a = fresh(100_000)
    before = a.budget()["tokens_left"]
    j = a.submit_job(prompt="Count: 1, 2, 3,", max_tokens=1500, logit_bias=EOS_BAN).json()
    run = a.wait_job(j["id"], statuses={"running", "succeeded", "failed", "cancelled"})
    assert run["status"] == "running", run
    held = a.budget()["tokens_held"]
    time.sleep(0.3)
    r = a.post(f"/v1/completion-jobs/{j['id']}/cancel")
    assert r.status_code == 200
    assert r.json()["cancel_requested"] is True
    assert r.json()["status"] in ("running", "cancelled")
    t0 = time.monotonic()
    end = a.wait_job(j["id"], timeout=20)
    assert end["status"] == "cancelled", end
    assert time.monotonic() - t0 < 10, "a running job stops at its next token"
    assert end["cancel_requested"] is True and end["usage_pending"] is False
    expect_error(a.get(j["result_url"]), 409, "job_cancelled")
    after = a.settled_budget()
    charged = before - after["tokens_left"]
    assert 0 < charged < held, (charged, held)


def test_cancel_finished_job_changes_nothing(api):
    j = api.submit_job(max_tokens=1).json()
    done = api.wait_job(j["id"])
    r = api.post(f"/v1/completion-jobs/{j['id']}/cancel")
    assert r.status_code in (200, 409), r.text
    if r.status_code == 200:
        assert r.json()["status"] == done["status"]
    assert api.job(j["id"])["status"] == "succeeded"
    assert api.get(j["result_url"]).status_code == 200


def test_job_whose_hold_never_fits_fails_with_402(fresh):
    a = fresh(20)
    r = a.submit_job(max_tokens=100)
    assert r.status_code == 202, r.text
    j = a.wait_job(r.json()["id"])
    assert j["status"] == "failed", j
    assert j["finished_at"] is not None and j["expires_at"] is not None
    res = a.get(j["result_url"])
    expect_error(res, 402, "budget_exhausted", type_="insufficient_quota")
    assert a.settled_budget()["tokens_left"] == 20, "a failed job that never ran is charged nothing"


def test_result_expires(fresh):
    if RETENTION_SECS > 10:
        pytest.skip("server retention too long to wait out (set ACS_RETENTION_SECS <= 10)")
    a = fresh(100_000)
    j = a.submit_job(max_tokens=1).json()
    done = a.wait_job(j["id"])
    assert a.get(j["result_url"]).status_code == 200
    wait = (ts(done["expires_at"]) - ts(done["finished_at"])).total_seconds()
    assert wait == pytest.approx(RETENTION_SECS, abs=0.001)
    time.sleep(RETENTION_SECS + 0.3)
    later = a.job(j["id"])
    assert later["result_expired"] is True
    assert later["status"] == "succeeded"
    expect_error(a.get(j["result_url"]), 410, "result_expired")


def test_jobs_belong_to_their_key(fresh):
    a, b = fresh(100_000), fresh(100_000)
    j = a.submit_job(max_tokens=1).json()
    a.wait_job(j["id"])
    for r in (b.get(f"/v1/completion-jobs/{j['id']}"), b.get(j["result_url"]),
              b.post(f"/v1/completion-jobs/{j['id']}/cancel")):
        expect_error(r, 404, "not_found")
    assert all(x["id"] != j["id"] for x in b.get("/v1/completion-jobs").json()["data"])
    assert a.job(j["id"])["status"] == "succeeded"


def test_list_newest_first_with_limit_and_after(fresh):
    a = fresh(100_000)
    ids = []
    for i in range(5):
        r = a.submit_job(max_tokens=1, prompt=f"Job {i}")
        assert r.status_code == 202
        ids.append(r.json()["id"])
        time.sleep(0.005)
    newest_first = list(reversed(ids))
    r = a.get("/v1/completion-jobs")
    assert r.status_code == 200
    page = r.json()
    assert page["object"] == "list"
    assert [x["id"] for x in page["data"]] == newest_first
    assert page["has_more"] is False
    for x in page["data"]:
        check_job(x)
    p1 = a.get("/v1/completion-jobs", params={"limit": "2"}).json()
    assert [x["id"] for x in p1["data"]] == newest_first[:2]
    assert p1["has_more"] is True
    last = p1.get("last_id") or p1["data"][-1]["id"]
    p2 = a.get("/v1/completion-jobs", params={"limit": "2", "after": last}).json()
    assert [x["id"] for x in p2["data"]] == newest_first[2:4]
    assert p2["has_more"] is True
    p3 = a.get("/v1/completion-jobs", params={"limit": "2", "after": p2["data"][-1]["id"]}).json()
    assert [x["id"] for x in p3["data"]] == newest_first[4:]
    assert p3["has_more"] is False
    for i in ids:
        a.wait_job(i)


def test_list_empty_for_new_key(fresh):
    page = fresh(10).get("/v1/completion-jobs").json()
    assert page["object"] == "list" and page["data"] == [] and page["has_more"] is False


def test_job_activations(api, model_info):
    d, layers = model_info["d_model"], model_info["n_layers"]
    body = {"model": MODEL, "prompt": ["The sky is", "Hi"], "max_tokens": 1,
            "activations": {"layers": [0, layers - 1], "positions": "last"}}
    j = api.post("/v1/completion-jobs", body).json()
    assert api.wait_job(j["id"])["status"] == "succeeded"
    c = api.get(j["result_url"]).json()
    check_completion(c, choices=2)
    acts = c["activations"]
    assert len(acts) == 4
    for a in acts:
        assert set(a) == {"prompt_index", "layer", "positions", "shape", "dtype", "data"}, a
        assert a["dtype"] == "f32" and a["positions"] == "last"
        assert a["prompt_index"] in (0, 1) and a["layer"] in (0, layers - 1)
        assert a["shape"] == [1, d]
        assert len(base64.b64decode(a["data"])) == 4 * d
    # positions: all → one row per prompt token
    body = {"model": MODEL, "prompt": "The sky is blue", "max_tokens": 1,
            "activations": {"layers": [1], "positions": "all"}}
    j = api.post("/v1/completion-jobs", body).json()
    api.wait_job(j["id"])
    c = api.get(j["result_url"]).json()
    (a,) = c["activations"]
    assert a["shape"] == [c["usage"]["prompt_tokens"], d]
    assert len(base64.b64decode(a["data"])) == 4 * d * c["usage"]["prompt_tokens"]


# The most JSON a job's stored result may have (16 MiB), on every face.
MAX_RESULT_BYTES = 16 << 20


def test_result_over_the_stored_limit_fails_the_job_charged(fresh, model_info):
    # Every layer's activations at every position: base64 f32 is 16/3 bytes a value,
    # so enough positions make a result over the limit from one short prefill.
    d, layers = model_info["d_model"], model_info["n_layers"]
    per_position = layers * d * 16 // 3
    positions = MAX_RESULT_BYTES // per_position + 8
    assert positions < model_info["context_window"] // 2, "the model is too small for this test"
    a = fresh(1_000_000)
    body = {"model": MODEL, "prompt": [list(range(100, 100 + positions))], "max_tokens": 2,
            "logit_bias": EOS_BAN,
            "activations": {"layers": list(range(layers)), "positions": "all"}}
    j = a.post("/v1/completion-jobs", body).json()
    done = a.wait_job(j["id"], timeout=180)
    assert done["status"] == "failed", done
    assert done["usage_pending"] is False
    r = a.get(done["result_url"])
    err = expect_error(r, 413, "result_too_large")
    assert "MiB" in err["message"], err
    # Charged what it ran (the prompt and its tokens), once; nothing left held.
    b = a.get("/v1/budget").json()
    assert b["tokens_held"] == 0 and b["running"] == 0, b
    assert 1_000_000 - b["tokens_left"] == positions + 2, b


@pytest.mark.skipif(MAX_QUEUED_JOBS > 32, reason="the server queues too many jobs per key to fill")
def test_queued_jobs_per_key_are_bounded(fresh):
    # One job of the key runs at a time; the rest wait in the queue, up to the limit.
    a = fresh(10_000_000, max_running=1)
    accepted, refused = [], None
    for i in range(MAX_QUEUED_JOBS + 3):
        r = a.submit_job(max_tokens=200, prompt=f"Queue {i}", logit_bias=EOS_BAN,
                         idem=f"queue-{i}")
        if r.status_code == 429:
            refused = (i, r)
            break
        assert r.status_code == 202, r.text
        accepted.append(r.json()["id"])
    assert refused is not None, f"{len(accepted)} jobs accepted, none refused"
    i, r = refused
    expect_error(r, 429, "too_many_queued_jobs")
    # All but the running one (if it started yet) are queued.
    assert MAX_QUEUED_JOBS <= len(accepted) <= MAX_QUEUED_JOBS + 1
    for j in accepted:
        assert a.post(f"/v1/completion-jobs/{j}/cancel").status_code == 200
    for j in accepted:
        a.wait_job(j)
    # The refused submission's idempotency key was not spent: the same key and body
    # make a job now.
    again = a.submit_job(max_tokens=200, prompt=f"Queue {i}", logit_bias=EOS_BAN,
                         idem=f"queue-{i}")
    assert again.status_code == 202, again.text
    assert a.wait_job(again.json()["id"])["status"] == "succeeded"
