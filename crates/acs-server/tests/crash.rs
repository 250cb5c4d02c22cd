//! SIGKILL while jobs run and completions hold tokens; after a restart every job
//! finishes exactly once, each key is charged exactly what its results used, and
//! nothing stays held.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, call, default_model, make_key, temp_dir, wait_job};
use serde_json::json;

#[test]
fn kill_9_loses_no_job_and_leaks_no_hold() {
    let data = temp_dir("crash");
    let jobs_key = make_key(&data, 1_000_000, 2);
    let stream_key = make_key(&data, 100_000, 4);
    let mut server = Server::start(&data, &default_model(), &[]);
    let base = server.base.clone();

    let body = json!({"model": "llama-8b", "prompt": ["The sky is", "The grass is"], "max_tokens": 40, "n": 2, "seed": 5}).to_string();
    let mut ids = Vec::new();
    for _ in 0..4 {
        let (status, job) = call(&base, &jobs_key, "POST", "/v1/completion-jobs", Some(&body));
        assert_eq!(status, 202, "{job}");
        ids.push(job["id"].as_str().unwrap().to_owned());
    }
    // Two long streamed completions that hold tokens of the other key.
    let streams: Vec<_> = (0..2)
        .map(|_| {
            Command::new("curl")
                .args(["-sN", &format!("{base}/v1/completions")])
                .args(["-H", &format!("Authorization: Bearer {stream_key}")])
                .args(["-H", "Content-Type: application/json"])
                .args(["-d", r#"{"model":"llama-8b","prompt":"Once upon a time","max_tokens":400,"stream":true}"#])
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();

    // Wait until a job runs and the streams hold tokens.
    let t = Instant::now();
    loop {
        let (_, b) = call(&base, &stream_key, "GET", "/v1/budget", None);
        let (_, j) = call(&base, &jobs_key, "GET", "/v1/budget", None);
        if b["running"] == 2 && j["running"].as_u64() > Some(0) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "work never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill9();
    for mut s in streams {
        let _ = s.kill();
        let _ = s.wait();
    }
    server.restart();
    let base = server.base.clone();

    // The cut completions: held tokens released, nothing charged.
    let (_, b) = call(&base, &stream_key, "GET", "/v1/budget", None);
    assert_eq!(
        (b["tokens_held"].as_u64(), b["running"].as_u64()),
        (Some(0), Some(0)),
        "{b}"
    );
    assert_eq!(b["tokens_left"], 100_000, "{b}");

    // Every job ends, succeeded, charged once.
    let mut used = 0;
    for id in &ids {
        let job = wait_job(&base, &jobs_key, id, Duration::from_secs(180));
        assert_eq!(job["status"], "succeeded", "{job}");
        assert_eq!(job["usage_pending"], false);
        let (status, result) = call(
            &base,
            &jobs_key,
            "GET",
            &format!("/v1/completion-jobs/{id}/result"),
            None,
        );
        assert_eq!(status, 200, "{result}");
        assert_eq!(result["choices"].as_array().unwrap().len(), 4);
        used += result["usage"]["total_tokens"].as_u64().unwrap();
    }
    let (_, b) = call(&base, &jobs_key, "GET", "/v1/budget", None);
    assert_eq!(b["tokens_held"], 0, "{b}");
    assert_eq!(b["tokens_left"].as_u64(), Some(1_000_000 - used), "{b}");
    let (_, list) = call(
        &base,
        &jobs_key,
        "GET",
        "/v1/completion-jobs?limit=100",
        None,
    );
    assert_eq!(
        list["data"].as_array().unwrap().len(),
        4,
        "no job lost or doubled"
    );
}
