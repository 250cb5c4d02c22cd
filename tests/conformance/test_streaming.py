"""stream: true — server-sent events, one data: chunk per token batch, data: [DONE]."""

import json
import time

import pytest

from conftest import EOS_BAN, MODEL, check_usage


def read_events(resp):
    """The data payloads of an SSE response, checking the framing as it goes."""
    assert resp.status_code == 200, resp.read()[:300]
    assert resp.headers["content-type"].startswith("text/event-stream"), resp.headers
    events = []
    for line in resp.iter_lines():
        if line == "":
            continue
        assert line.startswith("data: "), f"not an SSE data line: {line!r}"
        events.append(line[len("data: "):])
    return events


def stream(api, **fields):
    body = {"model": MODEL, "prompt": "The sky is", "max_tokens": 2, "stream": True}
    body.update(fields)
    with api.stream(body) as resp:
        return read_events(resp), resp


def check_chunks(events, expected_choices, include_usage=False):
    assert events, "no events"
    assert events[-1] == "[DONE]", events[-3:]
    assert events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("cmpl-"), ids
    texts = {i: "" for i in range(expected_choices)}
    finished = {}
    usage = None
    for k, c in enumerate(chunks):
        assert c["object"] == "text_completion"
        assert c["model"] == MODEL
        assert isinstance(c["created"], int)
        assert "error" not in c, c
        if "usage" in c and c["usage"] is not None:
            assert include_usage, "usage chunk without stream_options.include_usage"
            assert k == len(chunks) - 1, "the usage chunk must be the last before [DONE]"
            assert c["choices"] == []
            usage = c["usage"]
            check_usage(usage)
            continue
        indices = [ch["index"] for ch in c["choices"]]
        assert indices == sorted(indices) and len(set(indices)) == len(indices), indices
        for ch in c["choices"]:
            assert set(ch) >= {"index", "text", "finish_reason"}, ch
            i = ch["index"]
            assert i in texts, f"index {i} outside 0..{expected_choices - 1}"
            assert i not in finished, f"delta for choice {i} after its finish_reason"
            texts[i] += ch["text"]
            if ch["finish_reason"] is not None:
                assert ch["finish_reason"] in ("stop", "length")
                finished[i] = ch["finish_reason"]
    assert set(finished) == set(texts), f"choices without a final finish_reason: {set(texts) - set(finished)}"
    if include_usage:
        assert usage is not None, "include_usage asked, no usage chunk"
    return texts, finished, usage


def test_stream_single(api):
    events, resp = stream(api)
    texts, finished, _ = check_chunks(events, 1)
    assert resp.headers["x-request-id"].startswith("req_")


def test_stream_many_prompts_and_n(api):
    events, _ = stream(api, prompt=["The sky is", "The grass is", "Water is"], n=3, max_tokens=3,
                       logit_bias=EOS_BAN)
    texts, finished, _ = check_chunks(events, 9)
    assert all(f == "length" for f in finished.values())


def test_stream_include_usage(api):
    events, _ = stream(api, prompt=["The sky is", "The grass is"], n=2, max_tokens=2,
                       logit_bias=EOS_BAN, stream_options={"include_usage": True})
    _, _, usage = check_chunks(events, 4, include_usage=True)
    assert usage["completion_tokens"] == 8
    plain = api.ok_complete(prompt=["The sky is", "The grass is"], max_tokens=1)
    assert usage["prompt_tokens"] == plain["usage"]["prompt_tokens"]


def test_stream_without_include_usage_has_no_usage(api):
    events, _ = stream(api, stream_options={"include_usage": False})
    for e in events[:-1]:
        assert json.loads(e).get("usage") is None


def test_stream_text_equals_whole_text_greedy(api):
    body = dict(prompt=["The capital of France is", "1, 2, 3,"], n=2, max_tokens=4, temperature=0)
    whole = api.ok_complete(**body)
    events, _ = stream(api, **body)
    texts, finished, _ = check_chunks(events, 4)
    for ch in whole["choices"]:
        assert texts[ch["index"]] == ch["text"]
        assert finished[ch["index"]] == ch["finish_reason"]


def test_stream_charges_its_usage(fresh):
    a = fresh(100_000)
    before = a.budget()
    events, resp = stream(a, prompt=["Hello", "Bye"], n=2, max_tokens=3,
                          stream_options={"include_usage": True})
    for h in ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-budget-remaining-tokens"):
        assert resp.headers.get(h, "").isdigit(), h
    _, _, usage = check_chunks(events, 4, include_usage=True)
    after = a.settled_budget()
    assert before["tokens_left"] - after["tokens_left"] == usage["total_tokens"]


def test_stream_client_gone_releases_hold(fresh):
    a = fresh(100_000, 2)
    before = a.budget()
    body = {"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 400, "stream": True,
            "logit_bias": EOS_BAN}
    with a.stream(body) as resp:
        assert resp.status_code == 200
        mid = a.budget()
        assert mid["running"] == 1 and mid["tokens_held"] > 0, mid
        for i, _ in enumerate(resp.iter_lines()):
            if i >= 2:
                break
    after = a.settled_budget(timeout=20)
    charged = before["tokens_left"] - after["tokens_left"]
    assert 0 <= charged <= mid["tokens_held"]
    assert charged < mid["tokens_held"], "a request stopped early is charged what it generated"
