//! Several models in one `acs serve`: the default SmolLM2, a generated tiny Llama and
//! Gemma 3 270M (whose file has no chat template), each with an engine and a share of
//! the KV memory; `/v1/models` lists them; `model` picks one on every route, jobs
//! included; `llama-8b` names the first.

mod common;

use std::time::Duration;

use common::{Server, call, default_model, make_key, temp_dir, wait_job};
use serde_json::{Value, json};

#[test]
fn one_server_serves_several_models_each_by_its_id() {
    let data = temp_dir("models");
    let tiny = data.join("tiny-llama.gguf");
    acs_llama::testgen::write_test_model(&acs_llama::testgen::TestModelSpec::tiny(), &tiny)
        .unwrap();
    let key = make_key(&data, 1_000_000, 8);
    let tiny_arg = tiny.display().to_string();
    let gemma_arg = format!(
        "gemma={}",
        acs_llama::testgen::gemma3_model_for_tests().display()
    );
    let server = Server::start(
        &data,
        &default_model(),
        &[
            "--model",
            &tiny_arg,
            "--model",
            &gemma_arg,
            "--kv-mib",
            "256",
            "--model-kv-mib",
            "tiny-llama=16",
        ],
    );
    let base = &server.base;

    // Every model under its id, the first also as llama-8b, with its own facts.
    let (status, list) = call(base, &key, "GET", "/v1/models", None);
    assert_eq!(status, 200, "{list}");
    let models: Vec<&Value> = list["data"].as_array().unwrap().iter().collect();
    let ids: Vec<&str> = models.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        ["SmolLM2-135M-Instruct", "llama-8b", "tiny-llama", "gemma"],
        "{list}"
    );
    let by_id = |id: &str| *models.iter().find(|m| m["id"] == id).unwrap();
    assert_eq!(
        by_id("llama-8b")["d_model"],
        by_id("SmolLM2-135M-Instruct")["d_model"]
    );
    assert_eq!(
        (
            by_id("tiny-llama")["family"].as_str(),
            by_id("tiny-llama")["d_model"].as_u64()
        ),
        (Some("llama"), Some(64))
    );
    assert_eq!(by_id("gemma")["family"], "gemma3");
    assert_eq!(by_id("SmolLM2-135M-Instruct")["n_layers"], 30);

    // `model` picks the engine: each answers under its id, with its own tokenizer.
    for id in ["llama-8b", "tiny-llama", "gemma"] {
        let body =
            json!({"model": id, "prompt": "The sky is", "max_tokens": 2, "n": 2}).to_string();
        let (status, c) = call(base, &key, "POST", "/v1/completions", Some(&body));
        assert_eq!(status, 200, "{id}: {c}");
        assert_eq!(c["model"], id);
        assert_eq!(c["choices"].as_array().unwrap().len(), 2);
    }
    // Token ids past the tiny model's vocabulary are refused on it alone.
    let big_id = by_id("tiny-llama")["vocab_size"].as_u64().unwrap() + 10;
    let body = |id: &str| json!({"model": id, "prompt": [big_id], "max_tokens": 1}).to_string();
    assert_eq!(
        call(
            base,
            &key,
            "POST",
            "/v1/completions",
            Some(&body("tiny-llama"))
        )
        .0,
        400
    );
    assert_eq!(
        call(
            base,
            &key,
            "POST",
            "/v1/completions",
            Some(&body("llama-8b"))
        )
        .0,
        200
    );

    // Chat: the template of the model named; a file without one is a 400.
    let chat = |id: &str| {
        json!({"model": id, "messages": [{"role": "user", "content": "Hi"}],
               "max_completion_tokens": 2})
        .to_string()
    };
    let (status, c) = call(
        base,
        &key,
        "POST",
        "/v1/chat/completions",
        Some(&chat("tiny-llama")),
    );
    assert_eq!(
        (status, c["object"].as_str()),
        (200, Some("chat.completion")),
        "{c}"
    );
    let (status, e) = call(
        base,
        &key,
        "POST",
        "/v1/chat/completions",
        Some(&chat("gemma")),
    );
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["code"], "chat_template_missing", "{e}");

    // Jobs run on the model they name.
    let job = json!({"model": "tiny-llama", "prompt": "Hi", "max_tokens": 3}).to_string();
    let (status, j) = call(base, &key, "POST", "/v1/completion-jobs", Some(&job));
    assert_eq!(status, 202, "{j}");
    let id = j["id"].as_str().unwrap();
    assert_eq!(
        wait_job(base, &key, id, Duration::from_secs(60))["status"],
        "succeeded"
    );
    let (status, r) = call(
        base,
        &key,
        "GET",
        &format!("/v1/completion-jobs/{id}/result"),
        None,
    );
    assert_eq!(
        (status, r["model"].as_str()),
        (200, Some("tiny-llama")),
        "{r}"
    );

    // An unknown id is 404 and says what is served.
    let (status, e) = call(base, &key, "POST", "/v1/completions", Some(&body("nope")));
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tiny-llama"),
        "{e}"
    );

    // Each engine has its share of the KV memory, and reports under its model.
    let (_, _, metrics) = common::curl(base, "GET", "/metrics", None, &[]);
    let capacity = |id: &str| -> f64 {
        let prefix = format!("acs_engine_kv_capacity_bytes{{model=\"{id}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no capacity of {id}:\n{metrics}"))
    };
    assert!(capacity("tiny-llama") <= (16 << 20) as f64);
    let rest = capacity("SmolLM2-135M-Instruct") + capacity("gemma");
    assert!(
        rest <= (240 << 20) as f64 && rest > (200 << 20) as f64,
        "{rest}"
    );
}
