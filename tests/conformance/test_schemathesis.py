"""Schemathesis against the live server, driven by crates/acs-server/openapi.json.

Checks: no 5xx, responses match the documented schemas and statuses. A copy of the
document pins `model` to the served model so that generated requests reach the
validation and the engine instead of stopping at model_not_found. The key has a small
Budget, so expensive generated requests are refused (402) instead of run.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess

import httpx
import pytest

from conftest import BASE_URL, MODEL, new_key

HERE = pathlib.Path(__file__).resolve().parent
DOC = pathlib.Path(os.environ.get("ACS_OPENAPI", HERE.parents[1] / "crates" / "acs-server" / "openapi.json"))
CLI = os.environ.get("ACS_SCHEMATHESIS") or shutil.which("schemathesis")
MAX_EXAMPLES = os.environ.get("ACS_SCHEMATHESIS_MAX_EXAMPLES", "15")


def _run(schema_path, key, checks, extra=()):
    cmd = [CLI, "run", str(schema_path), "--url", BASE_URL, "-H", f"Authorization: Bearer {key}",
           "--checks", checks, "--max-examples", MAX_EXAMPLES, "-w", "1",
           "--phases", "examples,coverage,fuzzing", "--request-timeout", "60", "--no-color", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return out.returncode, out.stdout + out.stderr


@pytest.fixture(scope="module")
def cli():
    # Required (requirements.txt): a missing tool is a failure, never a silent skip.
    assert CLI and os.path.exists(CLI), "schemathesis is not installed (pip install -r requirements.txt)"
    assert DOC.exists(), f"no OpenAPI document at {DOC}"
    return CLI


def test_openapi_document_is_valid_json(cli):
    doc = json.loads(DOC.read_text())
    assert doc["openapi"].startswith("3.1")
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/completion-jobs", "/v1/completion-jobs/{id}",
                 "/v1/completion-jobs/{id}/result", "/v1/completion-jobs/{id}/cancel",
                 "/v1/budget", "/v1/models"):
        assert path in doc["paths"], path


def test_schemathesis_as_documented(cli):
    code, out = _run(DOC, new_key(600, 4),
                     "not_a_server_error,status_code_conformance,response_schema_conformance")
    assert code == 0, out[-6000:]


def test_schemathesis_with_the_served_model(cli, tmp_path):
    doc = json.loads(DOC.read_text())
    for name in ("CompletionRequest", "CompletionJobRequest", "ChatCompletionRequest", "ChatJobRequest"):
        doc["components"]["schemas"][name]["properties"]["model"] = {"const": MODEL}
    pinned = tmp_path / "openapi-pinned.json"
    pinned.write_text(json.dumps(doc))
    code, out = _run(pinned, new_key(600, 4),
                     "not_a_server_error,status_code_conformance,response_schema_conformance")
    assert code == 0, out[-6000:]


def test_streamed_events_match_the_documented_event(cli, tmp_path):
    # Every request of this copy streams, so each run checks the events (the data of
    # a chunk, and the final [DONE]) against the text/event-stream schema; the
    # fuzzing above reaches a successful stream only now and then.
    doc = json.loads(DOC.read_text())
    doc["paths"] = {"/v1/completions": doc["paths"]["/v1/completions"]}
    doc["components"]["schemas"]["CompletionRequest"] = {
        "type": "object", "additionalProperties": False,
        "required": ["model", "prompt", "stream", "max_tokens"],
        "properties": {"model": {"const": MODEL}, "prompt": {"const": "The sky is"},
                       "stream": {"const": True}, "max_tokens": {"const": 3}}}
    streaming = tmp_path / "openapi-streaming.json"
    streaming.write_text(json.dumps(doc))
    code, out = _run(streaming, new_key(100_000, 4), "response_schema_conformance")
    assert code == 0, out[-6000:]
    cases = re.search(r"(\d+) generated, (\d+) passed", out)
    assert cases and int(cases.group(2)) > 0, out[-2000:]


def test_served_document_matches_the_file(cli):
    r = httpx.get(BASE_URL + "/openapi.json")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == json.loads(DOC.read_text()), "served /openapi.json differs from the file: rebuild acs"
