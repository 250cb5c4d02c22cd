//! The tutorial ("Sample many rollouts") against a real `acs serve` with the default
//! model: its curl | jq commands run verbatim, then its Python steps with the openai SDK.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Server, call, default_model, make_key, temp_dir, wait_job};
use serde_json::Value;

/// Runs a shell snippet with the tutorial's environment; returns stdout.
fn sh(base: &str, key: &str, script: &str) -> String {
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .env("ACS_API_BASE", format!("{base}/v1"))
        .env("ACS_API_KEY", key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

// The tutorial's commands, character for character.
const TWO_PROMPTS: &str = r#"curl "$ACS_API_BASE/completions" \
  -H "Authorization: Bearer $ACS_API_KEY" \
  -H "Content-Type: application/json" \
  -d '{"model": "llama-8b", "prompt": ["The sky is", "The grass is"], "max_tokens": 2, "n": 2}' \
  | jq -c '.choices[] | [.index, .text]'"#;

const EIGHT_AT_ONCE: &str = r#"for i in 1 2 3 4 5 6 7 8; do
  curl -s "$ACS_API_BASE/completions" \
    -H "Authorization: Bearer $ACS_API_KEY" \
    -H "Content-Type: application/json" \
    -d '{"model": "llama-8b", "prompt": "The sky is", "max_tokens": 2}' \
    | jq -c '.choices[0].text' &
done
wait"#;

const SUBMIT_JOB: &str = r#"curl "$ACS_API_BASE/completion-jobs" \
  -H "Authorization: Bearer $ACS_API_KEY" \
  -H "Content-Type: application/json" \
  -H "Idempotency-Key: rollouts-001" \
  -d '{"model": "llama-8b", "prompt": ["The sky is", "The grass is"], "max_tokens": 2, "n": 2}'"#;

const CHECK_JOB: &str = r#"curl "$ACS_API_BASE/completion-jobs/$JOB_ID" \
  -H "Authorization: Bearer $ACS_API_KEY""#;

const FETCH_RESULT: &str = r#"curl "$ACS_API_BASE/completion-jobs/$JOB_ID/result" \
  -H "Authorization: Bearer $ACS_API_KEY" | jq -c '[.choices[].text]'"#;

// The README's chat command, character for character.
const CHAT: &str = r#"curl "$ACS_API_BASE/chat/completions" \
  -H "Authorization: Bearer $ACS_API_KEY" \
  -H "Content-Type: application/json" \
  -d '{"model": "llama-8b", "messages": [{"role": "user", "content": "Name a colour."}], "n": 3, "max_completion_tokens": 12}' \
  | jq -c '.choices[] | [.index, .message.content, .finish_reason]'"#;

const JOB_FIELDS: [&str; 13] = [
    "cancel_requested",
    "created_at",
    "expires_at",
    "finished_at",
    "id",
    "model",
    "request_id",
    "result_expired",
    "result_url",
    "started_at",
    "status",
    "status_url",
    "usage_pending",
];

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn the_tutorial_runs_unchanged() {
    let data = temp_dir("tutorial");
    let key = make_key(&data, 1_000_000, 16);
    let server = Server::start(&data, &default_model(), &[]);
    let base = &server.base;

    // Sample two prompts in one request: 4 choices, indexes 0..3 in order.
    let out = sh(base, &key, &format!("{TWO_PROMPTS} 2>/dev/null"));
    let rows: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4, "{out}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[0], i as u64, "{out}");
        assert!(r[1].as_str().is_some_and(|t| !t.is_empty()), "{out}");
    }

    // The README's chat request: three replies to one conversation.
    assert!(
        include_str!("../../../README.md").contains(CHAT),
        "the README's chat command changed"
    );
    let out = sh(base, &key, &format!("{CHAT} 2>/dev/null"));
    let rows: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[0], i as u64, "{out}");
        assert!(r[1].is_string(), "{out}");
        assert!(r[2] == "stop" || r[2] == "length", "{out}");
    }

    // Send many requests at once: 8 texts.
    let out = sh(base, &key, EIGHT_AT_ONCE);
    let texts: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(texts.len(), 8, "{out}");
    assert!(texts.iter().all(Value::is_string), "{out}");

    // Run the same work as a Job.
    let out = sh(base, &key, &format!("{SUBMIT_JOB} 2>/dev/null"));
    let job: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(keys(&job), JOB_FIELDS, "{out}");
    assert_eq!(job["status"], "queued");
    assert_eq!(job["cancel_requested"], false);
    assert_eq!(job["model"], "llama-8b");
    let id = job["id"].as_str().unwrap().to_owned();
    assert_eq!(
        job["request_id"],
        format!("req_job_{}", id.replace('-', ""))
    );
    assert_eq!(job["status_url"], format!("/v1/completion-jobs/{id}"));
    assert_eq!(
        job["result_url"],
        format!("/v1/completion-jobs/{id}/result")
    );
    let created = job["created_at"].as_str().unwrap();
    assert_eq!(created.len(), "2026-11-02T18:35:08.037+00:00".len());
    assert!(created.ends_with("+00:00"));
    // The same Idempotency-Key and body answer the same job.
    let again: Value =
        serde_json::from_str(&sh(base, &key, &format!("{SUBMIT_JOB} 2>/dev/null"))).unwrap();
    assert_eq!(again["id"], job["id"]);

    let done = wait_job(base, &key, &id, Duration::from_secs(60));
    assert_eq!(done["status"], "succeeded", "{done}");
    let checked: Value = serde_json::from_str(&sh(
        base,
        &key,
        &format!("JOB_ID={id}\n{CHECK_JOB} 2>/dev/null"),
    ))
    .unwrap();
    assert_eq!(keys(&checked), JOB_FIELDS);
    assert_eq!(checked["status"], "succeeded");
    assert_eq!(checked["usage_pending"], false);
    let out = sh(
        base,
        &key,
        &format!("JOB_ID={id}\n{FETCH_RESULT} 2>/dev/null"),
    );
    let texts: Vec<String> = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(texts.len(), 4, "{out}");

    // The result's usage counts each prompt once.
    let (status, result) = call(
        base,
        &key,
        "GET",
        &format!("/v1/completion-jobs/{id}/result"),
        None,
    );
    assert_eq!(status, 200);
    let usage = &result["usage"];
    assert_eq!(usage["prompt_tokens"], 6, "two 3-token prompts: {usage}");
    assert!(usage["completion_tokens"].as_u64().unwrap() <= 8);
    // The Job sends the prompts of the first step again: both come from the prompt
    // cache (still counted and charged), as the stored result says.
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], 6,
        "{usage}"
    );

    // Nothing stays held.
    let (_, budget) = call(base, &key, "GET", "/v1/budget", None);
    assert_eq!(budget["tokens_held"], 0, "{budget}");
    assert_eq!(budget["running"], 0, "{budget}");
}

#[test]
fn the_openai_python_sdk_runs_the_tutorials_python_steps() {
    let data = temp_dir("openai");
    let key = make_key(&data, 1_000_000, 16);
    let server = Server::start(&data, &default_model(), &[]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/tutorial/openai_steps.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .env("ACS_API_BASE", format!("{}/v1", server.base))
        .env("ACS_API_KEY", &key)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{stdout}");
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["indexes"], serde_json::json!([0, 1, 2, 3]));
    assert_eq!(summary["usage"]["prompt_tokens"], 6);
    let u = &summary["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
    );
    assert_eq!(summary["parallel"], 8);
    assert_eq!(summary["streamed_indexes"], serde_json::json!([0, 1, 2, 3]));
    // Chat through the SDK: four choices of one conversation, whole and streamed
    // (with the same seed, the same texts), each choice's first delta naming its role.
    assert_eq!(summary["chat_object"], "chat.completion");
    assert_eq!(summary["chat_indexes"], serde_json::json!([0, 1, 2, 3]));
    assert_eq!(summary["chat_texts"], summary["chat_streamed"], "{summary}");
    assert_eq!(
        summary["chat_roles"],
        serde_json::json!(["assistant", "assistant", "assistant", "assistant"])
    );
    let (whole, streamed) = (&summary["chat_usage"], &summary["chat_stream_usage"]);
    assert_eq!(
        whole["prompt_tokens"], streamed["prompt_tokens"],
        "{summary}"
    );
    assert_eq!(
        whole["completion_tokens"], streamed["completion_tokens"],
        "{summary}"
    );
    assert!(
        whole["completion_tokens"].as_u64().unwrap() <= 32,
        "{summary}"
    );
    // The first lines are "p i 'text'" for the four choices.
    let first: Vec<&str> = stdout.lines().take(4).collect();
    for (k, line) in first.iter().enumerate() {
        assert!(line.starts_with(&format!("{} {} ", k / 2, k % 2)), "{line}");
    }
}
