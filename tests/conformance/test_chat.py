"""POST /v1/chat/completions: the chat shape, n choices of one conversation, usage,
streaming with deltas, the end-of-turn stop, logprobs, Budgets, chat jobs, bad input."""

import json
import re

import pytest

from conftest import EOS_BAN, MODEL, check_job, check_usage, expect_error

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Say hello."}]
# A conversation the default model answers at temperature 0 and ends with its
# end-of-turn token well within 64 tokens.
PARIS = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def chat(api, **fields):
    body = {"model": MODEL, "messages": HELLO, "max_completion_tokens": 2}
    body.update(fields)
    body = {k: v for k, v in body.items() if v is not ...}
    return api.post(CHAT, body)


def token_bytes(name):
    if name.startswith("bytes:"):
        return [int(h, 16) for h in re.findall(r"\\x([0-9a-f]{2})", name)]
    return list(name.encode())


def ok_chat(api, **fields):
    r = chat(api, **fields)
    assert r.status_code == 200, r.text[:500]
    return r.json()


def check_chat(c, choices=None):
    allowed = {"id", "object", "created", "model", "choices", "usage"}
    assert allowed <= set(c) <= allowed | {"activations"}, sorted(c)
    assert c["id"].startswith("chatcmpl-"), c["id"]
    assert c["object"] == "chat.completion"
    assert c["model"] == MODEL
    assert isinstance(c["created"], int) and c["created"] > 1_600_000_000
    if choices is not None:
        assert len(c["choices"]) == choices
    for i, ch in enumerate(c["choices"]):
        assert set(ch) == {"index", "message", "finish_reason", "logprobs"}, ch
        assert ch["index"] == i
        assert ch["message"] == {"role": "assistant", "content": ch["message"]["content"]}
        assert isinstance(ch["message"]["content"], str)
        assert ch["finish_reason"] in ("stop", "length")
    check_usage(c["usage"])


def chat_events(api, body):
    with api.client.stream("POST", CHAT, headers=api.headers({"Content-Type": "application/json"}),
                           content=json.dumps(body).encode()) as resp:
        assert resp.status_code == 200, resp.read()[:300]
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in resp.iter_lines() if line]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1, events[-3:]
    return [json.loads(e) for e in events[:-1]]


def test_chat_shape(api):
    c = ok_chat(api)
    check_chat(c, choices=1)
    assert c["choices"][0]["logprobs"] is None
    assert c["usage"]["completion_tokens"] <= 2


def test_n_choices_share_the_conversation_counted_once(api):
    one = ok_chat(api, n=1, max_completion_tokens=3, logit_bias=EOS_BAN)
    four = ok_chat(api, n=4, max_completion_tokens=3, logit_bias=EOS_BAN)
    check_chat(four, choices=4)
    assert [ch["index"] for ch in four["choices"]] == [0, 1, 2, 3]
    assert one["usage"]["prompt_tokens"] == four["usage"]["prompt_tokens"] > 0
    assert four["usage"]["completion_tokens"] == 12
    assert all(ch["finish_reason"] == "length" for ch in four["choices"])


def test_greedy_choices_agree_and_seeds_repeat(api):
    greedy = ok_chat(api, messages=PARIS, n=3, temperature=0, max_completion_tokens=8)
    texts = {ch["message"]["content"] for ch in greedy["choices"]}
    assert len(texts) == 1, texts
    a = ok_chat(api, messages=PARIS, n=2, seed=7, max_completion_tokens=8)
    b = ok_chat(api, messages=PARIS, n=2, seed=7, max_completion_tokens=8)
    assert [c["message"] for c in a["choices"]] == [c["message"] for c in b["choices"]]


def test_a_reply_ends_at_the_end_of_its_turn(api):
    c = ok_chat(api, messages=PARIS, temperature=0, max_completion_tokens=64)
    ch = c["choices"][0]
    assert ch["finish_reason"] == "stop", ch
    assert c["usage"]["completion_tokens"] < 64
    # The end-of-turn token is not part of the reply.
    assert "<|im_end|>" not in ch["message"]["content"] and ch["message"]["content"].strip()


def test_max_tokens_is_max_completion_tokens(api):
    c = ok_chat(api, max_completion_tokens=..., max_tokens=3, logit_bias=EOS_BAN)
    assert c["usage"]["completion_tokens"] == 3
    both = ok_chat(api, max_completion_tokens=2, max_tokens=5, logit_bias=EOS_BAN)
    assert both["usage"]["completion_tokens"] == 2


def test_the_stream_sends_deltas_with_the_role_first(api):
    body = {"model": MODEL, "messages": PARIS, "n": 2, "temperature": 0,
            "max_completion_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}
    chunks = chat_events(api, body)
    whole = ok_chat(api, **{k: v for k, v in body.items() if k not in ("stream", "stream_options")})
    texts, roles, finished = {}, {}, {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"] | {
        "prompt_tokens_details": chunks[-1]["usage"]["prompt_tokens_details"]}
    for c in chunks:
        assert c["object"] == "chat.completion.chunk" and c["id"].startswith("chatcmpl-")
        assert len({c["id"] for c in chunks}) == 1
        for ch in c["choices"]:
            i = ch["index"]
            if i not in texts:
                assert ch["delta"].get("role") == "assistant", ch
                texts[i] = ""
            else:
                assert "role" not in ch["delta"], ch
            texts[i] += ch["delta"].get("content", "")
            if ch["finish_reason"] is not None:
                finished[i] = ch["finish_reason"]
    for ch in whole["choices"]:
        assert texts[ch["index"]] == ch["message"]["content"]
        assert finished[ch["index"]] == ch["finish_reason"]


def test_logprobs_list_each_token_with_its_alternatives(api):
    c = ok_chat(api, max_completion_tokens=4, logit_bias=EOS_BAN, logprobs=True, top_logprobs=3)
    content = c["choices"][0]["logprobs"]["content"]
    assert len(content) == c["usage"]["completion_tokens"] == 4
    # A sampled token may be a piece of a character, named `bytes:\xNN…` as OpenAI
    # names it; the tokens' bytes together are the text, a cut character replaced.
    text = bytes(b for t in content for b in t["bytes"]).decode(errors="replace")
    assert text == c["choices"][0]["message"]["content"]
    for t in content:
        assert t["logprob"] <= 0 and t["bytes"] == token_bytes(t["token"])
        tops = t["top_logprobs"]
        assert len(tops) == 3
        assert [x["logprob"] for x in tops] == sorted((x["logprob"] for x in tops), reverse=True)
        assert t["logprob"] <= tops[0]["logprob"] + 1e-6
    plain = ok_chat(api, max_completion_tokens=2, logprobs=True)
    assert all(t["top_logprobs"] == [] for t in plain["choices"][0]["logprobs"]["content"])


def test_chat_holds_and_charges_its_tokens(fresh):
    a = fresh(100_000)
    before = a.budget()["tokens_left"]
    c = ok_chat(a, n=2, max_completion_tokens=3)
    after = a.settled_budget()["tokens_left"]
    assert before - after == c["usage"]["total_tokens"]


def test_a_limit_left_unnamed_holds_the_default_and_can_be_refused(fresh):
    # With no max_completion_tokens a choice may run to 4096 tokens (less where the
    # context ends sooner), and the Hold covers that: a Budget of 1000 never fits it.
    a = fresh(1000)
    r = chat(a, max_completion_tokens=...)
    expect_error(r, 402, "budget_exhausted")
    assert a.settled_budget()["tokens_left"] == 1000
    ok_chat(a, max_completion_tokens=4)


def test_steering_rides_along(api, model_info):
    d = model_info["d_model"]
    c = ok_chat(api, max_completion_tokens=2,
                steering=[{"layer": 0, "vector": [0.0] * d, "scale": 1.0}])
    check_chat(c, choices=1)


def test_a_chat_job_answers_a_chat_completion(api):
    body = {"model": MODEL, "messages": PARIS, "n": 2, "max_completion_tokens": 3,
            "logit_bias": EOS_BAN, "activations": {"layers": [0], "positions": "last"}}
    r = api.submit_job(body, idem="chat-job-" + str(id(body)))
    assert r.status_code == 202, r.text
    job = r.json()
    check_job(job, model=MODEL)
    assert api.wait_job(job["id"])["status"] == "succeeded"
    res = api.get(job["result_url"])
    assert res.status_code == 200, res.text
    c = res.json()
    check_chat(c, choices=2)
    assert c["usage"]["completion_tokens"] == 6
    assert [a["layer"] for a in c["activations"]] == [0]
    again = api.submit_job(body, idem="chat-job-" + str(id(body)))
    assert again.status_code == 200 and again.json()["id"] == job["id"]


BAD = [
    ("no-messages", {"messages": ...}, 400, "missing_required_parameter", "messages"),
    ("messages-not-a-list", {"messages": "Hi"}, 400, "invalid_type", "messages"),
    ("empty-messages", {"messages": []}, 400, "invalid_value", "messages"),
    ("message-not-an-object", {"messages": ["Hi"]}, 400, "invalid_type", "messages[0]"),
    ("unknown-role", {"messages": [{"role": "tool", "content": "x"}]}, 400, "invalid_value",
     "messages[0].role"),
    ("no-role", {"messages": [{"content": "x"}]}, 400, "missing_required_parameter",
     "messages[0].role"),
    ("no-content", {"messages": [{"role": "user"}]}, 400, "missing_required_parameter",
     "messages[0].content"),
    ("content-number", {"messages": [{"role": "user", "content": 3}]}, 400, "invalid_type",
     "messages[0].content"),
    ("part-not-an-object", {"messages": [{"role": "user", "content": [1]}]}, 400, "invalid_type",
     "messages[0].content[0]"),
    ("part-text-not-a-string",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, 400,
     "invalid_type", "messages[0].content[0].text"),
    ("image-part",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "invalid_value", "messages[0].content[0].type"),
    ("image-type", {"messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400,
     "invalid_value", "messages[0].content[0].type"),
    ("message-unknown-field", {"messages": [{"role": "user", "content": "x", "mood": 1}]}, 400,
     "unknown_parameter", "messages[0].mood"),
    ("prompt-in-chat", {"prompt": "Hi"}, 400, "unknown_parameter", "prompt"),
    ("echo-in-chat", {"echo": True}, 400, "unknown_parameter", "echo"),
    ("n-zero", {"n": 0}, 400, "invalid_value", "n"),
    ("n-129", {"n": 129}, 400, "invalid_value", "n"),
    ("top-logprobs-21", {"logprobs": True, "top_logprobs": 21}, 400, "invalid_value",
     "top_logprobs"),
    ("top-logprobs-without-logprobs", {"top_logprobs": 2}, 400, "invalid_value", "top_logprobs"),
    ("logprobs-number", {"logprobs": 2}, 400, "invalid_type", "logprobs"),
    ("max-completion-tokens-negative", {"max_completion_tokens": -1}, 400, "invalid_value",
     "max_completion_tokens"),
    ("context-exceeded", {"max_completion_tokens": 10_000_000}, 400, "context_length_exceeded",
     "messages"),
    ("stream-with-activations", {"stream": True, "activations": {"layers": [0]}}, 400,
     "invalid_value", "activations"),
    ("unknown-model", {"model": "no-such-model"}, 404, "model_not_found", "model"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_chat_request(api, case):
    _, fields, status, code, param = case
    expect_error(chat(api, **fields), status, code, param)


def test_a_chat_job_cannot_stream(api):
    r = api.submit_job({"model": MODEL, "messages": HELLO, "stream": True})
    expect_error(r, 400, "invalid_value", "stream")


def test_bad_chat_requests_charge_nothing(fresh):
    a = fresh(10_000)
    for _, fields, *_ in BAD:
        chat(a, **fields)
    b = a.settled_budget()
    assert b["tokens_left"] == 10_000, b
