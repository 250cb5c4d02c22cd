"""Crash and restart: jobs and results survive, a running job is re-run or resumed and
never lost, and no Hold outlives its request. Needs ACS_RESTART_CMD (a command that
kills the server hard and starts it again on the same address and data; the wrapper
run_against_acs.sh provides one). Runs last: it restarts the server."""

import os
import subprocess
import threading
import time

import httpx
import pytest

from conftest import EOS_BAN, MODEL

RESTART = os.environ.get("ACS_RESTART_CMD")


@pytest.mark.skipif(not RESTART, reason="ACS_RESTART_CMD not set")
def test_zz_crash_and_restart(fresh):
    a = fresh(1_000_000, 4)
    done = a.submit_job(max_tokens=1).json()
    a.wait_job(done["id"])
    running = a.submit_job(prompt="Count: 1, 2, 3,", max_tokens=1000, logit_bias=EOS_BAN).json()
    assert a.wait_job(running["id"], statuses={"running", "succeeded", "failed", "cancelled"})["status"] == "running"
    queued_cancelled = None

    # A stream held open across the crash: its Hold must not outlive it.
    opened = threading.Event()

    def hold_stream():
        try:
            with a.stream({"model": MODEL, "prompt": "Hi", "max_tokens": 1000, "stream": True,
                           "logit_bias": EOS_BAN}) as resp:
                opened.set()
                for _ in resp.iter_lines():
                    pass
        except (httpx.HTTPError, AssertionError):
            opened.set()

    t = threading.Thread(target=hold_stream, daemon=True)
    t.start()
    assert opened.wait(20)
    before = a.budget()
    assert before["running"] == 2, before

    out = subprocess.run(RESTART, shell=True, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    t.join(10)

    # The finished job and its status survive.
    assert a.job(done["id"])["status"] == "succeeded"
    # The running job is queued again or running again, never lost or failed.
    j = a.job(running["id"])
    assert j["status"] in ("queued", "running"), j
    # The stream's Hold went with the crash; at most the re-run job holds tokens now.
    b = a.budget()
    assert b["running"] <= 1, b
    assert b["tokens_left"] == before["tokens_left"], "nothing is charged for work a crash cut short"
    # Cancel the re-run job: it ends cancelled and is charged at most its Hold, once.
    r = a.post(f"/v1/completion-jobs/{running['id']}/cancel")
    assert r.status_code == 200
    end = a.wait_job(running["id"], timeout=30)
    assert end["status"] == "cancelled", end
    after = a.settled_budget(timeout=20)
    assert 0 <= before["tokens_left"] - after["tokens_left"] <= before["tokens_held"]
    # And the server serves as before.
    assert a.complete(max_tokens=1).status_code == 200
