"""POST /v1/completions: shape, indices, usage arithmetic, sampling semantics."""

import base64
import struct
import time
import uuid

import pytest

from conftest import EOS_BAN, MODEL, check_completion, check_usage


def test_completion_shape(api):
    c = api.ok_complete(prompt="The sky is", max_tokens=2)
    check_completion(c, choices=1)
    assert c["choices"][0]["logprobs"] is None
    assert "activations" not in c
    assert abs(c["created"] - time.time()) < 3600 * 24 * 366 * 10  # plausible unix seconds


def test_completion_headers(api):
    r = api.complete()
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    for h in ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
              "x-budget-remaining-tokens"):
        assert r.headers.get(h, "").isdigit(), (h, r.headers.get(h))


def test_tutorial_two_prompts_n2(api):
    """The tutorial's first request: 2 prompts, n 2, max_tokens 2 -> 4 choices."""
    c = api.ok_complete(prompt=["The sky is", "The grass is"], max_tokens=2, n=2,
                        logit_bias=EOS_BAN)
    check_completion(c, choices=4)
    assert [ch["index"] for ch in c["choices"]] == [0, 1, 2, 3]
    assert c["usage"]["completion_tokens"] == 8
    assert all(ch["finish_reason"] == "length" for ch in c["choices"])


@pytest.mark.parametrize("prompts,n", [(1, 3), (3, 2), (2, 5)])
def test_choice_index_is_p_times_n_plus_i(api, prompts, n):
    # Prompts that differ a lot, with greedy decoding and n copies: the choices of
    # prompt p are the n identical texts at indices p*n .. p*n+n-1.
    texts = ["Paris is the capital of", "1, 2, 3, 4,", "def main():"][:prompts]
    c = api.ok_complete(prompt=texts, n=n, max_tokens=2, temperature=0, logit_bias=EOS_BAN)
    check_completion(c, choices=prompts * n)
    for p, text in enumerate(texts):
        alone = api.ok_complete(prompt=text, max_tokens=2, temperature=0, logit_bias=EOS_BAN)
        for i in range(n):
            ch = c["choices"][p * n + i]
            assert ch["index"] == p * n + i
            assert ch["text"] == alone["choices"][0]["text"], (p, i, ch)


def test_prompt_tokens_counted_once_whatever_n(api):
    one = api.ok_complete(prompt="The sky is", n=1, max_tokens=2, logit_bias=EOS_BAN)
    three = api.ok_complete(prompt="The sky is", n=3, max_tokens=2, logit_bias=EOS_BAN)
    assert one["usage"]["prompt_tokens"] == three["usage"]["prompt_tokens"] > 0
    assert one["usage"]["completion_tokens"] == 2
    assert three["usage"]["completion_tokens"] == 6
    check_usage(three["usage"])


def test_prompt_tokens_add_up_over_prompts(api):
    a = api.ok_complete(prompt="The sky is")["usage"]["prompt_tokens"]
    b = api.ok_complete(prompt="The grass is always greener")["usage"]["prompt_tokens"]
    both = api.ok_complete(prompt=["The sky is", "The grass is always greener"], n=2)
    assert both["usage"]["prompt_tokens"] == a + b
    assert both["usage"]["completion_tokens"] == 4


def test_completion_tokens_sum_of_choices_with_stops(api):
    # Without banning EOS some choices may stop early; usage still adds them up.
    c = api.ok_complete(prompt=["Hi", "Yes"], n=3, max_tokens=3)
    check_completion(c, choices=6)
    assert 0 < c["usage"]["completion_tokens"] <= 18


def test_token_id_prompts(api, model_info):
    single = api.ok_complete(prompt=[504, 3456, 314], max_tokens=1)
    check_completion(single, choices=1)
    assert single["usage"]["prompt_tokens"] in (3, 4)  # 4 if a BOS is put in front
    many = api.ok_complete(prompt=[[504, 3456], [314]], max_tokens=1, n=2)
    check_completion(many, choices=4)
    last = model_info["vocab_size"] - 1 if "vocab_size" in model_info else 1
    api.ok_complete(prompt=[last], max_tokens=1)


def test_default_max_tokens_is_16(api):
    c = api.ok_complete(prompt="Once upon a time", max_tokens=..., logit_bias=EOS_BAN,
                        temperature=0)
    assert c["usage"]["completion_tokens"] == 16
    assert c["choices"][0]["finish_reason"] == "length"


def test_max_tokens_zero(api):
    c = api.ok_complete(prompt="The sky is", max_tokens=0)
    check_completion(c, choices=1)
    assert c["usage"]["completion_tokens"] == 0


def test_null_fields_are_defaults(api):
    c = api.ok_complete(prompt="The sky is", max_tokens=1, n=None, temperature=None, top_p=None,
                        stop=None, logprobs=None, seed=None, user=None, steering=None)
    check_completion(c, choices=1)


def test_greedy_is_deterministic(api):
    a = api.ok_complete(prompt="The capital of France is", max_tokens=4, temperature=0)
    b = api.ok_complete(prompt="The capital of France is", max_tokens=4, temperature=0)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_seed_reproduces_texts(api):
    body = dict(prompt=["The sky is", "The grass is"], max_tokens=3, n=2, temperature=1, seed=1234)
    a = api.ok_complete(**body)
    b = api.ok_complete(**body)
    assert [c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]]


def test_sampled_choices_usually_differ(api):
    c = api.ok_complete(prompt="My favourite word is", max_tokens=4, n=8, temperature=1,
                        logit_bias=EOS_BAN)
    texts = {ch["text"] for ch in c["choices"]}
    assert len(texts) >= 2, texts


def test_stop_sequence_not_in_text(api):
    base = api.ok_complete(prompt="1, 2, 3, 4, 5,", max_tokens=6, temperature=0,
                           logit_bias=EOS_BAN)
    text = base["choices"][0]["text"]
    if len(text) < 3:
        pytest.skip(f"greedy text too short to cut: {text!r}")
    stop = text[2:4] if len(text) >= 4 else text[1:3]
    cut = text[: text.find(stop)]
    c = api.ok_complete(prompt="1, 2, 3, 4, 5,", max_tokens=6, temperature=0,
                        logit_bias=EOS_BAN, stop=[stop, "zzzzqqq"])
    ch = c["choices"][0]
    assert ch["finish_reason"] == "stop", (text, stop, ch)
    assert ch["text"] == cut, (text, stop, ch)
    assert stop not in ch["text"]


def test_echo_puts_prompt_in_front(api):
    c = api.ok_complete(prompt="The sky is", max_tokens=1, echo=True)
    assert c["choices"][0]["text"].startswith("The sky is")


def test_logprobs_shape(api):
    c = api.ok_complete(prompt="The sky is", max_tokens=3, logprobs=2, logit_bias=EOS_BAN, seed=1)
    lp = c["choices"][0]["logprobs"]
    assert isinstance(lp, dict)
    assert set(lp) >= {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 3
    assert "".join(lp["tokens"]) == c["choices"][0]["text"]
    # Offsets count characters of the text before each token.
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(3)]
    for x in lp["token_logprobs"]:
        assert isinstance(x, (int, float)) and x <= 0
    # The likeliest `logprobs` tokens, and the chosen one always (OpenAI's "up to
    # logprobs + 1").
    for token, x, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert isinstance(top, dict) and 1 <= len(top) <= 3
        assert top.get(token) == x, (token, x, top)


def test_logprobs_zero_and_five(api):
    api.ok_complete(prompt="The sky is", max_tokens=1, logprobs=0)
    c = api.ok_complete(prompt="The sky is", max_tokens=1, logprobs=5)
    top = c["choices"][0]["logprobs"]["top_logprobs"][0]
    assert 1 <= len(top) <= 6


def test_served_id_and_alias(http, api, model_info):
    r = http.get("/v1/models").json()
    ids = [m["id"] for m in r["data"]]
    for mid in ids:
        c = api.ok_complete(model=mid)
        assert c["model"] == mid


def test_sampling_parameters_accepted(api):
    c = api.ok_complete(prompt="Hello", max_tokens=2, temperature=0.7, top_p=0.9, top_k=40,
                        presence_penalty=0.5, frequency_penalty=-0.5, seed=-7,
                        logit_bias={"100": 5, "200": -5.5}, user="conformance",
                        stop="\n\n")
    check_completion(c, choices=1)


def test_steering_zero_vector_changes_nothing(api, model_info):
    d = model_info["d_model"]
    body = dict(prompt="The capital of France is", max_tokens=3, temperature=0)
    plain = api.ok_complete(**body)["choices"][0]["text"]
    zero = api.ok_complete(**body, steering=[{"layer": 0, "vector": [0.0] * d, "scale": 5}])
    assert zero["choices"][0]["text"] == plain
    b64 = base64.b64encode(struct.pack(f"<{d}f", *([0.0] * d))).decode()
    zb = api.ok_complete(**body, steering=[{"layer": model_info["n_layers"] - 1,
                                            "vector_b64": b64, "scale": 1}])
    assert zb["choices"][0]["text"] == plain


def test_steering_contrast_pair(api):
    c = api.ok_complete(prompt="I feel", max_tokens=2, steering=[
        {"layer": 3, "positive": "happy joyful", "negative": "sad gloomy", "scale": 4}])
    check_completion(c, choices=1)


def test_steered_and_plain_side_by_side(api, model_info):
    """A steered request must not change an unsteered one running beside it."""
    import concurrent.futures as cf
    d = model_info["d_model"]
    body = dict(prompt="The capital of France is", max_tokens=3, temperature=0)
    plain = api.ok_complete(**body)["choices"][0]["text"]
    big = [{"layer": 2, "vector": [1.0] * d, "scale": 50}]
    with cf.ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(api.ok_complete, **body, steering=big if i % 2 else None)
                for i in range(4)]
        res = [f.result() for f in futs]
    for i, c in enumerate(res):
        if i % 2 == 0:
            assert c["choices"][0]["text"] == plain


def test_kept_prompts_are_not_shared_between_keys(fresh):
    # Key b sends the prompt key a sent: nothing of a's is reused, so b's usage says
    # nothing was cached (it would tell b what a sent); a's second request reuses it.
    a, b = fresh(), fresh()
    prompt = f"{uuid.uuid4()} is a record of the weather in a town by the sea, day by day, for a year."
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    first = a.ok_complete(**body)
    n = first["usage"]["prompt_tokens"]
    assert n >= 16
    cached = lambda c: c["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)  # noqa: E731
    assert cached(first) == 0
    assert cached(b.ok_complete(**body)) == 0
    assert cached(a.ok_complete(**body)) == n
