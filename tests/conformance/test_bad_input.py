"""Bad input: every case gets its contract error (4xx, exact code and param), never a
5xx, and the server keeps serving afterwards."""

import base64
import json
import math
import socket
import struct
from urllib.parse import urlsplit

import pytest

from conftest import BASE_URL, BODY_TIMEOUT_SECS, FACE, MAX_BODY_BYTES, MODEL, check_error_shape

M = MODEL
D = 576  # replaced by the model's d_model in the tests that need it (see _fix)
BASE = {"model": M, "prompt": "Hi", "max_tokens": 1}


def body(**kw):
    b = dict(BASE)
    for k, v in kw.items():
        if v is ...:
            b.pop(k, None)
        else:
            b[k] = v
    return b


def f32b64(values):
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


# Each case: (id, body (dict → JSON, or bytes sent as they are), status, code, param)
# `code`/`param` may be a set of accepted alternatives where the contract leaves it open.
V = "invalid_value"
T = "invalid_type"
CASES = [
    # --- not JSON / not an object
    ("json-truncated", b'{"model": "llama-8b", "prompt": "Hi"', 400, "invalid_json", None),
    ("json-empty-body", b"", 400, "invalid_json", None),
    ("json-array", b"[]", 400, "invalid_json", None),
    ("json-string", b'"hello"', 400, "invalid_json", None),
    ("json-null", b"null", 400, "invalid_json", None),
    ("json-number", b"42", 400, "invalid_json", None),
    ("json-trailing-garbage", b'{"model":"llama-8b","prompt":"Hi"} x', 400, "invalid_json", None),
    ("json-single-quotes", b"{'model':'llama-8b','prompt':'Hi'}", 400, "invalid_json", None),
    ("json-NaN-literal", b'{"model":"llama-8b","prompt":"Hi","temperature":NaN}', 400, "invalid_json", None),
    ("json-Infinity-literal", b'{"model":"llama-8b","prompt":"Hi","max_tokens":Infinity}', 400, "invalid_json", None),
    ("json-minus-Infinity", b'{"model":"llama-8b","prompt":"Hi","top_p":-Infinity}', 400, "invalid_json", None),
    ("json-invalid-utf8", b'{"model":"llama-8b","prompt":"\xff\xfe\xfd"}', 400, "invalid_json", None),
    ("json-lone-surrogate", b'{"model":"llama-8b","prompt":"\\ud800"}', 400, "invalid_json", None),
    ("json-overlong-float", b'{"model":"llama-8b","prompt":"Hi","temperature":1e999}', 400,
     {"invalid_json", V}, {None, "temperature"}),
    ("json-deep-nesting", b'{"model":"llama-8b","prompt":' + b"[" * 5000 + b"]" * 5000 + b"}", 400,
     {"invalid_json", T, V}, {None, "prompt"}),
    # --- model
    ("model-missing", body(model=...), {400, 404}, {"missing_required_parameter", "model_not_found"}, "model"),
    ("model-null", body(model=None), {400, 404}, {"missing_required_parameter", "model_not_found"}, "model"),
    ("model-number", body(model=8), 400, T, "model"),
    ("model-empty", body(model=""), {400, 404}, {V, "model_not_found"}, "model"),
    ("model-unknown", body(model="gpt-4"), 404, "model_not_found", "model"),
    ("model-huge", body(model="m" * 5000), {400, 404}, {V, "model_not_found"}, "model"),
    ("model-case", body(model=M.upper() if M.upper() != M else M.lower()), 404, "model_not_found", "model"),
    # --- prompt
    ("prompt-missing", body(prompt=...), 400, "missing_required_parameter", "prompt"),
    ("prompt-null", body(prompt=None), 400, "missing_required_parameter", "prompt"),
    ("prompt-number", body(prompt=5), 400, T, "prompt"),
    ("prompt-object", body(prompt={"text": "Hi"}), 400, T, "prompt"),
    ("prompt-bool", body(prompt=True), 400, T, "prompt"),
    ("prompt-empty-list", body(prompt=[]), 400, V, "prompt"),
    ("prompt-empty-token-list", body(prompt=[[]]), 400, V, "prompt"),
    ("prompt-mixed-str-int", body(prompt=["a", 1]), 400, T, "prompt"),
    ("prompt-mixed-int-str", body(prompt=[1, "a"]), 400, T, "prompt"),
    ("prompt-mixed-list-str", body(prompt=[[1], "a"]), 400, T, "prompt"),
    ("prompt-null-item", body(prompt=["a", None]), 400, T, "prompt"),
    ("prompt-negative-id", body(prompt=[-1]), 400, V, "prompt"),
    ("prompt-float-id", body(prompt=[1.5]), 400, {V, T}, "prompt"),
    ("prompt-id-past-vocab", body(prompt=[99_999_999]), 400, V, "prompt"),
    ("prompt-id-past-u32", body(prompt=[4_294_967_296]), 400, V, "prompt"),
    ("prompt-id-huge", body(prompt=[1e30]), 400, {V, T}, "prompt"),
    ("prompt-lists-id-past-vocab", body(prompt=[[1, 2], [99_999_999]]), 400, V, "prompt"),
    ("prompt-nested-too-deep", body(prompt=[[[1]]]), 400, {T, V}, "prompt"),
    ("prompt-too-many", body(prompt=["a"] * 300), 400, V, "prompt"),
    ("prompt-enormous-text", body(prompt="hello " * 12000), 400, "context_length_exceeded", "prompt"),
    ("prompt-enormous-ids", body(prompt=[100] * 9000), 400, "context_length_exceeded", "prompt"),
    ("prompt-plus-max-tokens-over-window", body(max_tokens=8192), 400, "context_length_exceeded", "prompt"),
    # --- max_tokens
    ("max_tokens-negative", body(max_tokens=-1), 400, V, "max_tokens"),
    ("max_tokens-string", body(max_tokens="5"), 400, T, "max_tokens"),
    ("max_tokens-float", body(max_tokens=1.5), 400, {T, V}, "max_tokens"),
    ("max_tokens-bool", body(max_tokens=True), 400, T, "max_tokens"),
    ("max_tokens-huge-int", body(max_tokens=10**20), 400, {V, "context_length_exceeded"}, {"max_tokens", "prompt"}),
    ("max_tokens-1e30", body(max_tokens=1e30), 400, {V, "context_length_exceeded"}, {"max_tokens", "prompt"}),
    ("max_tokens-u32-max", body(max_tokens=4_294_967_295), 400, {V, "context_length_exceeded"}, {"max_tokens", "prompt"}),
    ("max_tokens-array", body(max_tokens=[1]), 400, T, "max_tokens"),
    # --- n
    ("n-zero", body(n=0), 400, V, "n"),
    ("n-129", body(n=129), 400, V, "n"),
    ("n-negative", body(n=-3), 400, V, "n"),
    ("n-string", body(n="2"), 400, T, "n"),
    ("n-float", body(n=2.5), 400, {T, V}, "n"),
    ("n-huge", body(n=10**12), 400, V, "n"),
    # --- sampling numbers
    ("temperature-negative", body(temperature=-0.1), 400, V, "temperature"),
    ("temperature-too-big", body(temperature=2.5), 400, V, "temperature"),
    ("temperature-string", body(temperature="hot"), 400, T, "temperature"),
    ("temperature-huge", body(temperature=1e308), 400, V, "temperature"),
    ("top_p-zero", body(top_p=0), 400, V, "top_p"),
    ("top_p-over-one", body(top_p=1.5), 400, V, "top_p"),
    ("top_p-negative", body(top_p=-0.5), 400, V, "top_p"),
    ("top_k-negative", body(top_k=-1), 400, V, "top_k"),
    ("top_k-float", body(top_k=2.5), 400, {T, V}, "top_k"),
    ("top_k-string", body(top_k="10"), 400, T, "top_k"),
    ("seed-string", body(seed="abc"), 400, T, "seed"),
    ("seed-float", body(seed=1.5), 400, {T, V}, "seed"),
    ("seed-too-big", body(seed=1e20), 400, V, "seed"),
    ("presence_penalty-too-big", body(presence_penalty=3), 400, V, "presence_penalty"),
    ("frequency_penalty-too-small", body(frequency_penalty=-3), 400, V, "frequency_penalty"),
    ("frequency_penalty-string", body(frequency_penalty="x"), 400, T, "frequency_penalty"),
    # --- stop
    ("stop-number", body(stop=5), 400, T, "stop"),
    ("stop-five", body(stop=["a", "b", "c", "d", "e"]), 400, V, "stop"),
    ("stop-empty-string", body(stop=[""]), 400, V, "stop"),
    ("stop-empty-string-scalar", body(stop=""), 400, V, "stop"),
    ("stop-number-item", body(stop=[1]), 400, T, "stop"),
    ("stop-object", body(stop={"a": 1}), 400, T, "stop"),
    ("stop-too-long", body(stop=["x" * 257]), 400, V, "stop"),
    # n choices each repeating 1,500 prompt tokens' scores: 1.15 M log-probabilities.
    ("echo-logprobs-too-many", body(prompt="hello " * 1500, n=128, echo=True, logprobs=5,
                                    max_tokens=0), 400, V, "logprobs"),
    # --- booleans, logprobs, user
    ("echo-string", body(echo="yes"), 400, T, "echo"),
    ("echo-int", body(echo=1), 400, T, "echo"),
    ("logprobs-6", body(logprobs=6), 400, V, "logprobs"),
    ("logprobs-negative", body(logprobs=-1), 400, V, "logprobs"),
    ("logprobs-string", body(logprobs="2"), 400, T, "logprobs"),
    ("logprobs-huge", body(logprobs=10**10), 400, V, "logprobs"),
    ("stream-string", body(stream="true"), 400, T, "stream"),
    ("stream-int", body(stream=1), 400, T, "stream"),
    ("user-number", body(user=5), 400, T, "user"),
    # --- logit_bias
    ("logit_bias-array", body(logit_bias=[1, 2]), 400, T, "logit_bias"),
    ("logit_bias-bad-key", body(logit_bias={"abc": 1}), 400, V, "logit_bias"),
    ("logit_bias-negative-key", body(logit_bias={"-1": 1}), 400, V, "logit_bias"),
    ("logit_bias-too-big", body(logit_bias={"1": 200}), 400, V, "logit_bias"),
    ("logit_bias-string-value", body(logit_bias={"1": "x"}), 400, T, "logit_bias"),
    ("logit_bias-id-past-vocab", body(logit_bias={"99999999": 1}), 400, V, "logit_bias"),
    # --- stream_options
    ("stream_options-string", body(stream=True, stream_options="x"), 400, T, "stream_options"),
    ("stream_options-unknown", body(stream=True, stream_options={"foo": True}), 400,
     "unknown_parameter", "stream_options.foo"),
    ("stream_options-include_usage-int", body(stream=True, stream_options={"include_usage": 1}),
     400, T, "stream_options.include_usage"),
    # --- unknown fields
    ("unknown-tempature", body(tempature=0.5), 400, "unknown_parameter", "tempature"),
    ("unknown-null-valued", body(foo=None), 400, "unknown_parameter", "foo"),
    ("unknown-suffix", body(suffix="x"), 400, "unknown_parameter", "suffix"),
    ("unknown-best_of", body(best_of=2), 400, "unknown_parameter", "best_of"),
    # --- steering
    ("steering-string", body(steering="x"), 400, T, "steering"),
    ("steering-object", body(steering={"layer": 0}), 400, T, "steering"),
    ("steering-item-number", body(steering=[5]), 400, T, "steering[0]"),
    ("steering-missing-layer", body(steering=[{"vector": [0.0] * D}]), 400,
     "missing_required_parameter", "steering[0].layer"),
    ("steering-layer-out-of-range", body(steering=[{"layer": 30, "vector": [0.0] * D}]), 400, V,
     "steering[0].layer"),
    ("steering-layer-negative", body(steering=[{"layer": -1, "vector": [0.0] * D}]), 400, V,
     "steering[0].layer"),
    ("steering-layer-string", body(steering=[{"layer": "0", "vector": [0.0] * D}]), 400, T,
     "steering[0].layer"),
    ("steering-vector-wrong-length", body(steering=[{"layer": 0, "vector": [0.0] * 10}]), 400, V,
     "steering[0].vector"),
    ("steering-vector-empty", body(steering=[{"layer": 0, "vector": []}]), 400, V, "steering[0].vector"),
    ("steering-vector-string-item", body(steering=[{"layer": 0, "vector": ["NaN"] + [0.0] * (D - 1)}]),
     400, T, "steering[0].vector"),
    ("steering-vector-overflows-f32", body(steering=[{"layer": 0, "vector": [1e39] + [0.0] * (D - 1)}]),
     400, V, "steering[0].vector"),
    ("steering-vector-not-array", body(steering=[{"layer": 0, "vector": "abc"}]), 400, T,
     "steering[0].vector"),
    ("steering-b64-not-base64", body(steering=[{"layer": 0, "vector_b64": "!!!not base64!!!"}]), 400, V,
     "steering[0].vector_b64"),
    ("steering-b64-odd-bytes", body(steering=[{"layer": 0, "vector_b64": base64.b64encode(b"abc").decode()}]),
     400, V, "steering[0].vector_b64"),
    ("steering-b64-nan", body(steering=[{"layer": 0, "vector_b64": f32b64([math.nan] + [0.0] * (D - 1))}]),
     400, V, "steering[0].vector_b64"),
    ("steering-b64-inf", body(steering=[{"layer": 0, "vector_b64": f32b64([math.inf] * D)}]),
     400, V, "steering[0].vector_b64"),
    ("steering-b64-wrong-length", body(steering=[{"layer": 0, "vector_b64": f32b64([0.0] * 4)}]),
     400, V, {"steering[0].vector_b64", "steering[0].vector"}),
    ("steering-b64-number", body(steering=[{"layer": 0, "vector_b64": 5}]), 400, T, "steering[0].vector_b64"),
    ("steering-two-sources", body(steering=[{"layer": 0, "vector": [0.0] * D, "positive": "a",
                                             "negative": "b"}]), 400, V, "steering[0]"),
    ("steering-no-source", body(steering=[{"layer": 0, "scale": 1}]), 400, {V, "missing_required_parameter"},
     {"steering[0]", "steering[0].vector"}),
    ("steering-positive-only", body(steering=[{"layer": 0, "positive": "happy"}]), 400,
     "missing_required_parameter", "steering[0].negative"),
    ("steering-positive-empty", body(steering=[{"layer": 0, "positive": "", "negative": "x"}]), 400, V,
     {"steering[0].positive", "steering[0].negative"}),
    ("steering-scale-string", body(steering=[{"layer": 0, "vector": [0.0] * D, "scale": "big"}]), 400, T,
     "steering[0].scale"),
    ("steering-scale-huge", body(steering=[{"layer": 0, "vector": [0.0] * D, "scale": 1e30}]), 400, V,
     "steering[0].scale"),
    ("steering-vector-value-huge", body(steering=[{"layer": 0, "vector": [2e6] + [0.0] * (D - 1)}]),
     400, V, "steering[0].vector"),
    ("steering-scale-times-vector-huge", body(steering=[{"layer": 0, "vector": [3e5] * D, "scale": 1000}]),
     400, V, "steering[0].scale"),
    ("steering-unknown-field", body(steering=[{"layer": 0, "vector": [0.0] * D, "colour": "red"}]), 400,
     "unknown_parameter", "steering[0].colour"),
    ("steering-second-entry-bad", body(steering=[{"layer": 0, "vector": [0.0] * D},
                                                 {"layer": 0, "vector": [0.0] * 3}]), 400, V,
     "steering[1].vector"),
    # (A job refuses `stream` itself first.)
    ("activations-with-stream", body(stream=True, activations={"layers": [0]}), 400, V,
     {"activations", "stream"}),
    ("steering-too-many", body(steering=[{"layer": 0, "positive": "a", "negative": "b"}] * 17), 400, V,
     "steering"),
]

# Bodies only the jobs endpoint sees.
JOB_CASES = [
    ("jobs-stream-true", body(stream=True), 400, V, "stream"),
    ("jobs-unknown-field", body(priority=1), 400, "unknown_parameter", "priority"),
    ("jobs-model-unknown", body(model="nope"), 404, "model_not_found", "model"),
    ("jobs-context-exceeded", body(max_tokens=100_000), 400, "context_length_exceeded", "prompt"),
    ("jobs-bad-json", b"{nope", 400, "invalid_json", None),
    ("jobs-activations-string", body(activations="all"), 400, T, "activations"),
    ("jobs-activations-missing-layers", body(activations={"positions": "last"}), 400,
     "missing_required_parameter", "activations.layers"),
    ("jobs-activations-empty-layers", body(activations={"layers": []}), 400, V, "activations.layers"),
    ("jobs-activations-layer-out-of-range", body(activations={"layers": [0, 30]}), 400, V,
     "activations.layers"),
    ("jobs-activations-layer-negative", body(activations={"layers": [-1]}), 400, {T, V}, "activations.layers"),
    ("jobs-activations-bad-positions", body(activations={"layers": [0], "positions": "first"}), 400, V,
     "activations.positions"),
    ("jobs-activations-layer-twice", body(activations={"layers": [0, 1, 0]}), 400, V, "activations.layers"),
    ("jobs-activations-unknown-field", body(activations={"layers": [0], "dtype": "f16"}), 400,
     "unknown_parameter", "activations.dtype"),
    ("jobs-steering-bad", body(steering=[{"layer": 99, "vector": [0.0] * D}]), 400, V, "steering[0].layer"),
]


def _fix(payload, model_info):
    """Rewrites the d_model-sized vectors and layer numbers for the model served."""
    if isinstance(payload, bytes):
        return payload
    d, layers = model_info["d_model"], model_info["n_layers"]
    text = json.dumps(payload)
    p = json.loads(text)
    for s in p.get("steering", []) if isinstance(p.get("steering"), list) else []:
        if isinstance(s, dict):
            v = s.get("vector")
            if isinstance(v, list) and len(v) == D:
                s["vector"] = v[:1] + [0.0] * (d - 1)
            if isinstance(s.get("vector_b64"), str):
                try:
                    raw = base64.b64decode(s["vector_b64"], validate=True)
                except ValueError:
                    raw = None
                if raw is not None and len(raw) == 4 * D:
                    s["vector_b64"] = base64.b64encode(raw[:4] + raw[4:8] * (d - 1)).decode()
            if s.get("layer") == 30:
                s["layer"] = layers
            if s.get("layer") == 99:
                s["layer"] = layers + 69
    a = p.get("activations")
    if isinstance(a, dict) and a.get("layers") == [0, 30]:
        a["layers"] = [0, layers]
    if p.get("max_tokens") == 8192:
        p["max_tokens"] = model_info["context_window"]
    return p


def _send(api, path, payload, model_info):
    payload = _fix(payload, model_info)
    if isinstance(payload, bytes):
        return api.request("POST", path, content=payload)
    return api.post(path, payload)


def _check(resp, status, code, param):
    statuses = status if isinstance(status, set) else {status}
    codes = code if isinstance(code, set) else {code}
    params = param if isinstance(param, set) else {param}
    assert resp.status_code in statuses, f"expected {statuses} {codes}, got {resp.status_code}: {resp.text[:300]}"
    err = check_error_shape(resp)
    assert err["code"] in codes, f"expected code in {codes}, got {err}"
    assert err["param"] in params, f"expected param in {params}, got {err}"
    if resp.status_code == 400:
        assert err["type"] == "invalid_request_error"


def _alive(api):
    r = api.get("/v1/models")
    assert r.status_code == 200


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_completion_request(api, model_info, case):
    _, payload, status, code, param = case
    r = _send(api, "/v1/completions", payload, model_info)
    _check(r, status, code, param)
    _alive(api)


@pytest.mark.parametrize("case", [c for c in CASES if not c[0].startswith("stream")] + JOB_CASES,
                         ids=[c[0] for c in CASES if not c[0].startswith("stream")] + [c[0] for c in JOB_CASES])
def test_bad_job_request(api, model_info, case):
    _, payload, status, code, param = case
    r = _send(api, "/v1/completion-jobs", payload, model_info)
    _check(r, status, code, param)
    _alive(api)


def test_bad_requests_charge_nothing(fresh, model_info):
    a = fresh(1000)
    before = a.budget()
    for _, payload, *_ in CASES:
        r = _send(a, "/v1/completions", payload, model_info)
        assert 400 <= r.status_code < 500
    for _, payload, *_ in JOB_CASES:
        r = _send(a, "/v1/completion-jobs", payload, model_info)
        assert 400 <= r.status_code < 500
    after = a.budget()
    assert after == before
    lst = a.get("/v1/completion-jobs").json()
    assert lst["data"] == []


def test_body_over_the_limit_is_413(api):
    big = b'{"model":"' + MODEL.encode() + b'","prompt":"' + b"a" * (MAX_BODY_BYTES + 1024) + b'"}'
    for path in ("/v1/completions", "/v1/completion-jobs"):
        try:
            r = api.request("POST", path, content=big)
        except Exception as e:  # the server may close before reading it all
            pytest.fail(f"413 expected, connection failed instead: {e!r}")
        _check(r, 413, "request_too_large", None)
    _alive(api)


def _part_of_a_body(api, close: bool, timeout: float) -> tuple[bytes, bytes]:
    """Sends a completions head and part of its body, then closes its side (`close`)
    or waits with the connection open; the reply's status and body."""
    url = urlsplit(BASE_URL)
    part = b'{"model":"' + MODEL.encode() + b'"'
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {api.key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(part) + 100}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname, url.port or 80), timeout=timeout) as sock:
        sock.sendall(head + part)
        if close:
            sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    return status_line.split()[1], rest.partition(b"\r\n\r\n")[2]


def test_body_cut_off_before_its_length_is_400(api):
    # A client that sends part of its body and stops: a malformed request (400), not
    # one over the size limit (413).
    status, body = _part_of_a_body(api, close=True, timeout=30)
    assert status == b"400", body[:400]
    assert b'"code":"invalid_json"' in body, body[:400]
    _alive(api)


@pytest.mark.skipif(BODY_TIMEOUT_SECS > 10, reason="the server's body deadline is too long to wait for")
@pytest.mark.skipif(FACE == "edge", reason="the Workers runtime bounds a request's time itself")
def test_body_that_stops_arriving_is_408(api):
    # A client that sends its head and part of its body, then nothing, with the
    # connection open: 408 at the body's deadline, not a connection held forever.
    status, body = _part_of_a_body(api, close=False, timeout=BODY_TIMEOUT_SECS + 20)
    assert status == b"408", body[:400]
    assert b'"code":"request_timeout"' in body, body[:400]
    _alive(api)


def test_body_just_under_the_limit_is_parsed(api):
    # Under the limit: parsed, and refused for its size in tokens, not in bytes.
    n = MAX_BODY_BYTES - 200
    big = b'{"model":"' + MODEL.encode() + b'","max_tokens":1,"prompt":"' + b"hello " * (n // 6) + b'"}'
    r = api.request("POST", "/v1/completions", content=big)
    _check(r, 400, "context_length_exceeded", "prompt")


@pytest.mark.parametrize("idem,why", [
    ("x" * 256, "256 chars"),
    ("", "empty"),
    ("tab\there", "control char"),
])
def test_bad_idempotency_key(api, idem, why):
    r = api.request("POST", "/v1/completion-jobs", json_body=BASE,
                    headers={"Idempotency-Key": idem})
    _check(r, 400, "invalid_idempotency_key", {"Idempotency-Key", "idempotency-key"})
    _alive(api)


def test_non_ascii_idempotency_key(api, http, session_key):
    r = http.post("/v1/completion-jobs", content=json.dumps(BASE).encode(),
                  headers=[(b"Authorization", f"Bearer {session_key}".encode()),
                           (b"Content-Type", b"application/json"),
                           (b"Idempotency-Key", "clé-é".encode("utf-8"))])
    from conftest import check_common
    check_common(r)
    _check(r, 400, "invalid_idempotency_key", {"Idempotency-Key", "idempotency-key"})


def test_idempotency_key_of_255_chars_is_fine(api):
    import uuid
    k = (uuid.uuid4().hex * 8)[:255]
    r = api.request("POST", "/v1/completion-jobs", json_body=BASE, headers={"Idempotency-Key": k})
    assert r.status_code == 202, r.text


@pytest.mark.parametrize("query,param", [
    ({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"limit": "abc"}, "limit"),
    ({"limit": "-1"}, "limit"), ({"after": "not-a-job"}, "after"),
])
def test_bad_list_query(api, query, param):
    r = api.get("/v1/completion-jobs", params=query)
    _check(r, 400, V, param)


@pytest.mark.parametrize("path", [
    "/v1/completion-jobs/not-a-uuid",
    "/v1/completion-jobs/01a19d8b-338e-7a52-9329-6190679221fa",
    "/v1/completion-jobs/01a19d8b-338e-7a52-9329-6190679221fa/result",
    "/v1/completion-jobs/%00%ff",
])
def test_unknown_job_is_404(api, path):
    r = api.get(path)
    _check(r, 404, "not_found", None)


def test_cancel_unknown_job_is_404(api):
    r = api.post("/v1/completion-jobs/01a19d8b-338e-7a52-9329-6190679221fa/cancel")
    _check(r, 404, "not_found", None)


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/nope"), ("POST", "/v1/chat/complete"), ("GET", "/v2/completions"),
    ("GET", "/v1/completion-jobs/x/y/z"), ("DELETE", "/v1/unknown"),
])
def test_unknown_route_is_404(api, method, path):
    r = api.request(method, path)
    _check(r, 404, "unknown_route", None)


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/completions"), ("DELETE", "/v1/completion-jobs"), ("POST", "/v1/models"),
    ("PUT", "/v1/budget"), ("GET", "/v1/completion-jobs/01a19d8b-338e-7a52-9329-6190679221fa/cancel"),
])
def test_wrong_method(api, method, path):
    r = api.request(method, path)
    # The contract names no status for a wrong method; OpenAI answers 405.
    assert r.status_code in (404, 405), r.text
    check_error_shape(r)


@pytest.mark.parametrize("auth", [
    None, "Bearer wrong-key", "Bearer", "Basic dXNlcjpwYXNz", "wrong", "Bearer acs-0000",
])
@pytest.mark.parametrize("method,path", [
    ("POST", "/v1/completions"), ("POST", "/v1/completion-jobs"), ("GET", "/v1/completion-jobs"),
    ("GET", "/v1/budget"), ("GET", "/v1/completion-jobs/01a19d8b-338e-7a52-9329-6190679221fa"),
])
def test_missing_or_wrong_key_is_401(api, auth, method, path):
    headers = {"Authorization": auth} if auth is not None else {}
    kw = {"json_body": BASE} if method == "POST" else {}
    r = api.request(method, path, key=None, headers=headers, **kw)
    _check(r, 401, "invalid_api_key", None)
    assert r.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("scheme", ["bearer", "BEARER"])
def test_the_bearer_scheme_is_case_insensitive(api, scheme):
    # RFC 9110: an authentication scheme's name is case-insensitive.
    r = api.request("GET", "/v1/budget", key=None, headers={"Authorization": f"{scheme} {api.key}"})
    assert r.status_code == 200, r.text


def test_still_serving_after_bad_input(api):
    c = api.ok_complete(prompt="Still there?", max_tokens=1)
    assert c["object"] == "text_completion"
