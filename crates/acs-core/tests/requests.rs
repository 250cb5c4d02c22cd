//! Parsing and checking completion requests: every field, every bad value.

use acs_core::request::{
    self, ActivationsRequest, Positions, Prompt, SteeringSource, canonical_json, choice_index,
    hold_tokens,
};
use acs_core::{CompletionRequest, Endpoint, ErrorCode, ModelInfo};
use base64::Engine as _;
use serde_json::json;

fn parse(v: serde_json::Value) -> Result<CompletionRequest, acs_core::ApiError> {
    CompletionRequest::parse(v.to_string().as_bytes(), Endpoint::Completions)
}

fn err(v: serde_json::Value) -> (u16, &'static str, &'static str, Option<String>) {
    let e = parse(v).expect_err("must be refused");
    (e.status(), e.code.kind(), e.code.code(), e.param)
}

fn model() -> ModelInfo {
    ModelInfo {
        id: "m".into(),
        object: "model".into(),
        created: 0,
        owned_by: "acs".into(),
        family: "llama".into(),
        context_window: 64,
        n_layers: 4,
        d_model: 8,
        vocab_size: 100,
    }
}

#[test]
fn the_tutorial_request_parses_with_defaults() {
    let r = parse(json!({"model": "llama-8b", "prompt": ["The sky is", "The grass is"], "max_tokens": 2, "n": 2})).unwrap();
    assert_eq!(
        r.prompt,
        Prompt::Texts(vec!["The sky is".into(), "The grass is".into()])
    );
    assert_eq!(
        (r.max_tokens, r.n, r.temperature, r.top_p),
        (2, 2, 1.0, 1.0)
    );
    assert_eq!(r.choice_count(), 4);
    let d = parse(json!({"model": "m", "prompt": "x"})).unwrap();
    assert_eq!(
        (d.max_tokens, d.n, d.stream, d.echo, d.logprobs),
        (16, 1, false, false, None)
    );
}

#[test]
fn every_prompt_shape_parses() {
    assert_eq!(
        parse(json!({"model":"m","prompt":"hi"})).unwrap().prompt,
        Prompt::Text("hi".into())
    );
    assert_eq!(
        parse(json!({"model":"m","prompt":[1,2,3]})).unwrap().prompt,
        Prompt::Tokens(vec![1, 2, 3])
    );
    assert_eq!(
        parse(json!({"model":"m","prompt":[[1],[2,3]]}))
            .unwrap()
            .prompt,
        Prompt::TokenLists(vec![vec![1], vec![2, 3]])
    );
}

#[test]
fn every_field_parses() {
    let v = [1.0f32, -2.5];
    let b64 = base64::engine::general_purpose::STANDARD
        .encode(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    let r = parse(json!({
        "model": "m", "prompt": "p", "max_tokens": 0, "n": 128, "temperature": 0, "top_p": 0.5,
        "top_k": 40, "seed": -1, "stop": ["a", "b"], "echo": true, "logprobs": 5,
        "presence_penalty": -2, "frequency_penalty": 2, "logit_bias": {"7": -100, "9": 100},
        "stream": true, "stream_options": {"include_usage": true}, "user": "u",
        "steering": [{"layer": 1, "vector": [1, 2], "scale": -3},
                     {"layer": 2, "vector_b64": b64},
                     {"layer": 3, "positive": "love", "negative": "hate", "scale": 4},
                     {"control_vector": "happy", "scale": 0.5}]
    }))
    .unwrap();
    assert_eq!(r.seed, Some(u64::MAX));
    assert_eq!(r.stop, vec!["a", "b"]);
    assert_eq!(r.logit_bias.get(&7), Some(&-100.0));
    assert!(r.stream && r.stream_include_usage && r.echo);
    assert_eq!(r.steering[0].source, SteeringSource::Vector(vec![1.0, 2.0]));
    assert_eq!(r.steering[0].scale, -3.0);
    assert_eq!(
        r.steering[1].source,
        SteeringSource::Vector(vec![1.0, -2.5])
    );
    assert_eq!(r.steering[1].scale, 1.0);
    assert_eq!(
        r.steering[2].source,
        SteeringSource::Contrast {
            positive: "love".into(),
            negative: "hate".into()
        }
    );
    assert_eq!(
        r.steering[3].source,
        SteeringSource::ControlVector("happy".into())
    );
    assert_eq!((r.steering[3].layer, r.steering[0].layer), (None, Some(1)));
    // Activations come with a whole Completion: not with `stream`.
    let read_out = json!({"layers": [0, 3], "positions": "all"});
    assert_eq!(
        parse(json!({"model": "m", "prompt": "p", "activations": read_out}))
            .unwrap()
            .activations,
        Some(ActivationsRequest {
            layers: vec![0, 3],
            positions: Positions::All
        })
    );
    let e = parse(json!({"model": "m", "prompt": "p", "stream": true, "activations": read_out}))
        .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("activations"));
    assert_eq!(
        parse(json!({"model":"m","prompt":"p","stop":"x"}))
            .unwrap()
            .stop,
        vec!["x"]
    );
    // null is the same as absent
    assert_eq!(
        parse(json!({"model":"m","prompt":"p","n":null,"stop":null}))
            .unwrap()
            .n,
        1
    );
}

#[test]
fn bad_requests_get_their_contract_error() {
    use ErrorCode as C;
    let cases: Vec<(serde_json::Value, ErrorCode, Option<&str>)> = vec![
        (json!({"prompt": "x"}), C::MissingParameter, Some("model")),
        (json!({"model": "m"}), C::MissingParameter, Some("prompt")),
        (
            json!({"model": "m", "prompt": "x", "tempature": 1}),
            C::UnknownParameter,
            Some("tempature"),
        ),
        (
            json!({"model": 5, "prompt": "x"}),
            C::InvalidType,
            Some("model"),
        ),
        (
            json!({"model": "", "prompt": "x"}),
            C::InvalidValue,
            Some("model"),
        ),
        (
            json!({"model": "m", "prompt": []}),
            C::InvalidValue,
            Some("prompt"),
        ),
        (
            json!({"model": "m", "prompt": [[]]}),
            C::InvalidValue,
            Some("prompt"),
        ),
        (
            json!({"model": "m", "prompt": ["a", 1]}),
            C::InvalidType,
            Some("prompt"),
        ),
        (
            json!({"model": "m", "prompt": [1, "a"]}),
            C::InvalidType,
            Some("prompt"),
        ),
        (
            json!({"model": "m", "prompt": [-1]}),
            C::InvalidValue,
            Some("prompt"),
        ),
        (
            json!({"model": "m", "prompt": [1.5]}),
            C::InvalidValue,
            Some("prompt"),
        ),
        (
            json!({"model": "m", "prompt": [5_000_000_000u64]}),
            C::InvalidValue,
            Some("prompt"),
        ),
        (
            json!({"model": "m", "prompt": 5}),
            C::InvalidType,
            Some("prompt"),
        ),
        (
            json!({"model": "m", "prompt": {"a": 1}}),
            C::InvalidType,
            Some("prompt"),
        ),
        (
            json!({"model": "m", "prompt": "x", "n": 0}),
            C::InvalidValue,
            Some("n"),
        ),
        (
            json!({"model": "m", "prompt": "x", "n": 129}),
            C::InvalidValue,
            Some("n"),
        ),
        (
            json!({"model": "m", "prompt": "x", "n": 1.5}),
            C::InvalidType,
            Some("n"),
        ),
        (
            json!({"model": "m", "prompt": "x", "n": "2"}),
            C::InvalidType,
            Some("n"),
        ),
        (
            json!({"model": "m", "prompt": "x", "n": 1e300}),
            C::InvalidValue,
            Some("n"),
        ),
        (
            json!({"model": "m", "prompt": "x", "max_tokens": -1}),
            C::InvalidValue,
            Some("max_tokens"),
        ),
        (
            json!({"model": "m", "prompt": "x", "max_tokens": 99999999999u64}),
            C::InvalidValue,
            Some("max_tokens"),
        ),
        (
            json!({"model": "m", "prompt": "x", "max_tokens": u64::MAX}),
            C::InvalidValue,
            Some("max_tokens"),
        ),
        (
            json!({"model": "m", "prompt": "x", "temperature": -0.1}),
            C::InvalidValue,
            Some("temperature"),
        ),
        (
            json!({"model": "m", "prompt": "x", "temperature": 2.5}),
            C::InvalidValue,
            Some("temperature"),
        ),
        (
            json!({"model": "m", "prompt": "x", "temperature": "hot"}),
            C::InvalidType,
            Some("temperature"),
        ),
        (
            json!({"model": "m", "prompt": "x", "top_p": 0}),
            C::InvalidValue,
            Some("top_p"),
        ),
        (
            json!({"model": "m", "prompt": "x", "top_p": 1.1}),
            C::InvalidValue,
            Some("top_p"),
        ),
        (
            json!({"model": "m", "prompt": "x", "top_k": -1}),
            C::InvalidValue,
            Some("top_k"),
        ),
        (
            json!({"model": "m", "prompt": "x", "seed": 1.5}),
            C::InvalidType,
            Some("seed"),
        ),
        (
            json!({"model": "m", "prompt": "x", "seed": 1e30}),
            C::InvalidValue,
            Some("seed"),
        ),
        (
            json!({"model": "m", "prompt": "x", "stop": ["a","b","c","d","e"]}),
            C::InvalidValue,
            Some("stop"),
        ),
        (
            json!({"model": "m", "prompt": "x", "stop": [""]}),
            C::InvalidValue,
            Some("stop"),
        ),
        (
            json!({"model": "m", "prompt": "x", "stop": 3}),
            C::InvalidType,
            Some("stop"),
        ),
        (
            json!({"model": "m", "prompt": "x", "echo": "yes"}),
            C::InvalidType,
            Some("echo"),
        ),
        (
            json!({"model": "m", "prompt": "x", "logprobs": 6}),
            C::InvalidValue,
            Some("logprobs"),
        ),
        (
            json!({"model": "m", "prompt": "x", "logprobs": true}),
            C::InvalidType,
            Some("logprobs"),
        ),
        (
            json!({"model": "m", "prompt": "x", "presence_penalty": 3}),
            C::InvalidValue,
            Some("presence_penalty"),
        ),
        (
            json!({"model": "m", "prompt": "x", "frequency_penalty": -3}),
            C::InvalidValue,
            Some("frequency_penalty"),
        ),
        (
            json!({"model": "m", "prompt": "x", "logit_bias": {"x": 1}}),
            C::InvalidValue,
            Some("logit_bias"),
        ),
        (
            json!({"model": "m", "prompt": "x", "logit_bias": {"1": 101}}),
            C::InvalidValue,
            Some("logit_bias"),
        ),
        (
            json!({"model": "m", "prompt": "x", "logit_bias": {"1": "a"}}),
            C::InvalidType,
            Some("logit_bias"),
        ),
        (
            json!({"model": "m", "prompt": "x", "logit_bias": [1]}),
            C::InvalidType,
            Some("logit_bias"),
        ),
        (
            json!({"model": "m", "prompt": "x", "stream": 1}),
            C::InvalidType,
            Some("stream"),
        ),
        (
            json!({"model": "m", "prompt": "x", "stream_options": {"x": 1}}),
            C::UnknownParameter,
            Some("stream_options.x"),
        ),
        (
            json!({"model": "m", "prompt": "x", "user": 1}),
            C::InvalidType,
            Some("user"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": {}}),
            C::InvalidType,
            Some("steering"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [1]}),
            C::InvalidType,
            Some("steering[0]"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"vector": [1]}]}),
            C::MissingParameter,
            Some("steering[0].layer"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"layer": 0}]}),
            C::InvalidValue,
            Some("steering[0]"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"layer": 0, "vector": [1], "positive": "a", "negative": "b"}]}),
            C::InvalidValue,
            Some("steering[0]"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"layer": -1, "vector": [1]}]}),
            C::InvalidValue,
            Some("steering[0].layer"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"layer": 0, "vector": []}]}),
            C::InvalidValue,
            Some("steering[0].vector"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"layer": 0, "vector": ["a"]}]}),
            C::InvalidType,
            Some("steering[0].vector"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"layer": 0, "vector": [1e39]}]}),
            C::InvalidValue,
            Some("steering[0].vector"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"layer": 0, "vector": [1], "scale": 1e9}]}),
            C::InvalidValue,
            Some("steering[0].scale"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"layer": 0, "vector_b64": "!!"}]}),
            C::InvalidValue,
            Some("steering[0].vector_b64"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"layer": 0, "vector_b64": "AAA="}]}),
            C::InvalidValue,
            Some("steering[0].vector_b64"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"layer": 0, "positive": "a"}]}),
            C::MissingParameter,
            Some("steering[0].negative"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"layer": 0, "positive": "", "negative": "b"}]}),
            C::InvalidValue,
            Some("steering[0].positive"),
        ),
        (
            json!({"model": "m", "prompt": "x", "steering": [{"layer": 0, "vector": [1], "colour": 1}]}),
            C::UnknownParameter,
            Some("steering[0].colour"),
        ),
        (
            json!({"model": "m", "prompt": "x", "activations": {"layers": []}}),
            C::InvalidValue,
            Some("activations.layers"),
        ),
        (
            json!({"model": "m", "prompt": "x", "activations": {"positions": "all"}}),
            C::MissingParameter,
            Some("activations.layers"),
        ),
        (
            json!({"model": "m", "prompt": "x", "activations": {"layers": [0], "positions": "some"}}),
            C::InvalidValue,
            Some("activations.positions"),
        ),
        (
            json!({"model": "m", "prompt": "x", "activations": {"layers": ["a"]}}),
            C::InvalidType,
            Some("activations.layers"),
        ),
        (
            json!({"model": "m", "prompt": "x", "activations": {"layers": [0], "x": 1}}),
            C::UnknownParameter,
            Some("activations.x"),
        ),
    ];
    for (body, code, param) in cases {
        let e = parse(body.clone()).expect_err(&format!("{body} must be refused"));
        assert_eq!((e.code, e.param.as_deref()), (code, param), "{body}");
        assert_eq!(e.status(), 400, "{body}");
        assert!(!e.message.is_empty());
    }
}

#[test]
fn malformed_bodies_are_invalid_json() {
    for body in [
        &b"{"[..],
        b"",
        b"[1,2]",
        b"\"text\"",
        b"null",
        b"{\"a\":NaN}",
        b"\xff\xfe{}",
        b"{\"model\":\"m\",}",
    ] {
        let e = CompletionRequest::parse(body, Endpoint::Completions).unwrap_err();
        assert_eq!(
            e.code,
            ErrorCode::InvalidJson,
            "{:?}",
            String::from_utf8_lossy(body)
        );
        assert_eq!((e.status(), e.param), (400, None));
    }
}

#[test]
fn jobs_refuse_stream() {
    let body = json!({"model": "m", "prompt": "x", "stream": true}).to_string();
    let e = CompletionRequest::parse(body.as_bytes(), Endpoint::Jobs).unwrap_err();
    assert_eq!(
        (e.code, e.param.as_deref()),
        (ErrorCode::InvalidValue, Some("stream"))
    );
    let ok = json!({"model": "m", "prompt": "x", "stream": false}).to_string();
    assert!(CompletionRequest::parse(ok.as_bytes(), Endpoint::Jobs).is_ok());
}

#[test]
fn model_checks() {
    let m = model();
    let ok = parse(json!({"model":"m","prompt":[1,2],"max_tokens":62})).unwrap();
    ok.check_against(&m, &[2]).unwrap();

    let long = parse(json!({"model":"m","prompt":[1,2],"max_tokens":63})).unwrap();
    let e = long.check_against(&m, &[2]).unwrap_err();
    assert_eq!(
        (e.code, e.code.code()),
        (ErrorCode::ContextLengthExceeded, "context_length_exceeded")
    );
    assert_eq!(e.status(), 400);

    let oov = parse(json!({"model":"m","prompt":[[1],[100]]})).unwrap();
    let e = oov.check_against(&m, &[1, 1]).unwrap_err();
    assert_eq!(
        (e.code, e.param.as_deref()),
        (ErrorCode::InvalidValue, Some("prompt"))
    );

    let empty = parse(json!({"model":"m","prompt":""})).unwrap();
    assert_eq!(
        empty.check_against(&m, &[0]).unwrap_err().param.as_deref(),
        Some("prompt")
    );

    let bias = parse(json!({"model":"m","prompt":"x","logit_bias":{"100":1}})).unwrap();
    assert_eq!(
        bias.check_against(&m, &[1]).unwrap_err().param.as_deref(),
        Some("logit_bias")
    );

    let layer = parse(
        json!({"model":"m","prompt":"x","steering":[{"layer":4,"vector":[0,0,0,0,0,0,0,0]}]}),
    )
    .unwrap();
    assert_eq!(
        layer.check_against(&m, &[1]).unwrap_err().param.as_deref(),
        Some("steering[0].layer")
    );

    let width =
        parse(json!({"model":"m","prompt":"x","steering":[{"layer":0,"vector":[1,2]}]})).unwrap();
    assert_eq!(
        width.check_against(&m, &[1]).unwrap_err().param.as_deref(),
        Some("steering[0].vector")
    );

    let act = parse(json!({"model":"m","prompt":"x","activations":{"layers":[9]}})).unwrap();
    assert_eq!(
        act.check_against(&m, &[1]).unwrap_err().param.as_deref(),
        Some("activations.layers")
    );
}

#[test]
fn indexes_and_holds_follow_the_tutorial() {
    // Choice i of prompt p has index p * n + i.
    let idx: Vec<u32> = (0..2)
        .flat_map(|p| (0..2).map(move |i| choice_index(p, i, 2)))
        .collect();
    assert_eq!(idx, vec![0, 1, 2, 3]);
    assert_eq!(choice_index(3, 1, 5), 16);
    // Hold: prompts' tokens + prompts × n × max_tokens.
    assert_eq!(hold_tokens(&[3, 3], 2, 2), 6 + 2 * 2 * 2);
    assert_eq!(
        hold_tokens(&[usize::MAX], u32::MAX, u32::MAX),
        u64::MAX,
        "saturates"
    );
}

#[test]
fn canonical_json_ignores_key_order_and_whitespace() {
    let a: serde_json::Value =
        serde_json::from_str(r#"{"b":1,"a":{"y":[1,{"q":2,"p":3}],"x":"s"}}"#).unwrap();
    let b: serde_json::Value =
        serde_json::from_str(r#"{ "a" : {"x":"s","y":[1,{"p":3,"q":2}]}, "b":1 }"#).unwrap();
    assert_eq!(canonical_json(&a), canonical_json(&b));
    assert_eq!(
        canonical_json(&a),
        r#"{"a":{"x":"s","y":[1,{"p":3,"q":2}]},"b":1}"#
    );
    let c: serde_json::Value =
        serde_json::from_str(r#"{"b":2,"a":{"x":"s","y":[1,{"p":3,"q":2}]}}"#).unwrap();
    assert_ne!(canonical_json(&a), canonical_json(&c));
}

#[test]
fn too_many_prompts_are_refused() {
    let prompts: Vec<String> = (0..=request::MAX_PROMPTS).map(|i| i.to_string()).collect();
    let (status, _, code, param) = err(json!({"model":"m","prompt":prompts}));
    assert_eq!(
        (status, code, param.as_deref()),
        (400, "invalid_value", Some("prompt"))
    );
}

#[test]
fn canonical_json_parses_back_to_itself_even_for_long_floats() {
    // Found by fuzzing: without exact float parsing, 6.666…e52 came back one ULP off.
    let body = br#"{"model":66666666666666666666666666666666666666666666666666666.666666666666666666666666666666666666666666666}"#;
    let v = request::parse_json_object(body).unwrap();
    let once = canonical_json(&v);
    let again: serde_json::Value = serde_json::from_str(&once).unwrap();
    assert_eq!(canonical_json(&again), once);
}

fn parse_chat(
    v: serde_json::Value,
    endpoint: Endpoint,
) -> Result<CompletionRequest, acs_core::ApiError> {
    CompletionRequest::parse(v.to_string().as_bytes(), endpoint)
}

#[test]
fn a_chat_body_is_one_conversation_with_chats_fields() {
    let r = parse_chat(
        json!({"model": "m", "n": 2, "logprobs": true, "top_logprobs": 20, "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "u"},
            {"role": "assistant", "content": "c"},
        ]}),
        Endpoint::ChatCompletions,
    )
    .unwrap();
    let Prompt::Chat(messages) = &r.prompt else {
        panic!("{:?}", r.prompt)
    };
    let texts: Vec<(&str, &str)> = messages
        .iter()
        .map(|m| (m.role.as_str(), m.content.as_str()))
        .collect();
    assert_eq!(
        texts,
        [("system", "S"), ("user", "a\nb"), ("assistant", "c")]
    );
    assert_eq!((r.n, r.logprobs, r.echo, r.top_k), (2, Some(20), false, 0));
    assert!(r.is_chat());
    assert_eq!(r.shape(), acs_core::Shape::Chat { top_logprobs: 20 });
    // No limit named: the default, fitted to what the context window leaves.
    assert!(r.fit_max_tokens);
    assert_eq!(r.max_tokens, request::DEFAULT_CHAT_MAX_TOKENS);
    assert_eq!(r.max_tokens_for(&model(), 10), 54);
    r.check_against(&model(), &[10]).unwrap();
    let e = r.check_against(&model(), &[64]).unwrap_err();
    assert_eq!(
        (e.code.code(), e.param.as_deref()),
        ("context_length_exceeded", Some("messages"))
    );
    // A job's body is chat when it has messages; max_tokens is the older name.
    let job = parse_chat(
        json!({"model": "m", "max_tokens": 7, "messages": [{"role": "user", "content": "x"}]}),
        Endpoint::Jobs,
    )
    .unwrap();
    assert!(job.is_chat() && !job.fit_max_tokens && job.max_tokens == 7);
    assert_eq!(job.max_tokens_for(&model(), 60), 7);
    // Completions' own fields are not chat's, nor the other way round.
    let e = parse_chat(
        json!({"model": "m", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}),
        Endpoint::ChatCompletions,
    )
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("prompt"));
    assert_eq!(
        err(json!({"model": "m", "prompt": "x", "messages": []}))
            .3
            .as_deref(),
        Some("messages")
    );
}
