//! Per-minute limits of a key on a real server: `acs keys create
//! --requests-per-minute` and `--tokens-per-minute` refuse past the minute's limit
//! with 429 `rate_limit_exceeded` and a `retry-after` to the next minute, and a
//! refused request holds nothing.

mod common;

use common::{Server, call, curl, default_model, make_key_with, temp_dir};
use serde_json::json;

/// Waits while the clock is in a minute's last 10 s, so that the requests that follow
/// fall in one minute (the limits count by the minute of the clock).
fn clear_of_a_minutes_end() {
    let secs = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 60
    };
    while secs() >= 50 {
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

#[test]
fn a_keys_per_minute_limits_refuse_past_the_minute() {
    let data = temp_dir("rate-limits");
    let few = make_key_with(&data, 1_000_000, 8, &["--requests-per-minute", "2"]);
    let small = make_key_with(&data, 1_000_000, 8, &["--tokens-per-minute", "40"]);
    let server = Server::start(&data, &default_model(), &[]);
    let base = &server.base;
    // EOS banned, so that each request generates its max_tokens.
    let body = |max: u32| {
        json!({"model": "llama-8b", "prompt": "The sky is", "max_tokens": max,
               "logit_bias": {"0": -100, "1": -100, "2": -100}})
        .to_string()
    };

    // Two requests a minute: a third is refused until the next minute.
    clear_of_a_minutes_end();
    for _ in 0..2 {
        assert_eq!(
            call(base, &few, "POST", "/v1/completions", Some(&body(2))).0,
            200
        );
    }
    let auth = format!("Bearer {few}");
    let (status, headers, text) = curl(
        base,
        "POST",
        "/v1/completions",
        Some(&body(2)),
        &[("Authorization", &auth)],
    );
    assert_eq!(status, 429, "{text}");
    let e: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(e["error"]["code"], "rate_limit_exceeded", "{e}");
    assert_eq!(e["error"]["type"], "rate_limit_error", "{e}");
    let wait: u64 = headers
        .iter()
        .find(|(k, _)| k == "retry-after")
        .map(|(_, v)| v.parse().unwrap())
        .expect("a retry-after");
    assert!((1..=60).contains(&wait), "{wait}");
    let (_, budget) = call(base, &few, "GET", "/v1/budget", None);
    assert_eq!(
        (budget["running"].as_u64(), budget["tokens_held"].as_u64()),
        (Some(0), Some(0))
    );

    // 40 tokens a minute: a request's Hold counts into its minute, less what it gives
    // back; the first of a minute runs whatever its size.
    clear_of_a_minutes_end();
    let (status, c) = call(base, &small, "POST", "/v1/completions", Some(&body(100)));
    assert_eq!(status, 200, "{c}");
    let (status, e) = call(base, &small, "POST", "/v1/completions", Some(&body(1)));
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (429, Some("rate_limit_exceeded")),
        "{e}"
    );
    // Another key is not slowed by it.
    assert_eq!(call(base, &few, "GET", "/v1/budget", None).0, 200);
}
