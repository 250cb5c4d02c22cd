//! What a second server, a slow client or a crowd of idle connections cannot do to
//! a running `acs serve`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Server, acs, curl, default_model, make_key, temp_dir};

/// A second `acs serve` on the data of a running one refuses to start (its recovery
/// would release the first's live Holds and requeue its running jobs), and the first
/// serves on; once the first is gone (killed: the system drops its lock), a server
/// starts there again.
#[test]
fn a_second_server_on_the_same_data_refuses_to_start() {
    let data = temp_dir("data-lock");
    let mut first = Server::start(&data, &default_model(), &[]);
    let out = acs()
        .args(["serve", "--addr", "127.0.0.1:0", "--data"])
        .arg(&*data)
        .arg("--model")
        .arg(default_model())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second server ran: {err}");
    assert!(err.contains("in use by another acs serve"), "{err}");
    assert_eq!(curl(&first.base, "GET", "/health", None, &[]).0, 200);
    first.restart();
    assert_eq!(curl(&first.base, "GET", "/health", None, &[]).0, 200);
}

fn connect(base: &str) -> TcpStream {
    let s = TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Reads until the server closes the connection; what it sent, and how long it took.
fn until_closed(s: &mut TcpStream) -> (String, Duration) {
    let t = Instant::now();
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .expect("the server closes the connection before the client's 20 s");
    (String::from_utf8_lossy(&got).into_owned(), t.elapsed())
}

/// A client that sends half a request line and stops is cut off at the head's
/// deadline; one that sends its head and part of its body gets 408
/// `request_timeout` at the body's.
#[test]
fn half_sent_requests_are_cut_off_at_their_deadlines() {
    let data = temp_dir("deadlines");
    let key = make_key(&data, 1_000_000, 4);
    let server = Server::start(
        &data,
        &default_model(),
        &["--header-timeout-secs", "1", "--body-timeout-secs", "1"],
    );
    let mut head = connect(&server.base);
    head.write_all(b"POST /v1/compl").unwrap();
    let (_, waited) = until_closed(&mut head);
    assert!(waited < Duration::from_secs(5), "closed after {waited:?}");

    let mut body = connect(&server.base);
    let part = br#"{"model":"llama-8b","#;
    write!(
        body,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    .unwrap();
    body.write_all(part).unwrap();
    let (reply, waited) = until_closed(&mut body);
    assert!(waited < Duration::from_secs(5), "answered after {waited:?}");
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains(r#""code":"request_timeout""#), "{reply}");
    // The server serves on.
    assert_eq!(curl(&server.base, "GET", "/health", None, &[]).0, 200);
}

/// Past `--max-connections`, a new connection waits to be accepted: idle
/// connections that send nothing hold every place until their head's deadline
/// closes them, and then the waiting request is served.
#[test]
fn connections_past_the_cap_wait_for_a_place() {
    let data = temp_dir("connection-cap");
    let server = Server::start(
        &data,
        &default_model(),
        &["--max-connections", "2", "--header-timeout-secs", "3"],
    );
    // Wait for the start-up probe's connection to close (it may be kept alive).
    std::thread::sleep(Duration::from_secs(4));
    let idle: Vec<TcpStream> = (0..2).map(|_| connect(&server.base)).collect();
    let t = Instant::now();
    let mut waiting = connect(&server.base);
    waiting
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (reply, _) = until_closed(&mut waiting);
    let waited = t.elapsed();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        waited > Duration::from_secs(2) && waited < Duration::from_secs(10),
        "served after {waited:?}: it should wait for an idle connection's 3 s deadline"
    );
    drop(idle);
}

/// The model's weights are offered at `/model.gguf` only when the operator asks.
#[test]
fn the_model_file_is_served_only_when_asked() {
    for (extra, want) in [(&[][..], 404), (&["--serve-model-file"][..], 206)] {
        let data = temp_dir("model-file");
        let server = Server::start(&data, &default_model(), extra);
        let range = [("Range", "bytes=0-3")];
        let (status, _, body) = curl(&server.base, "GET", "/model.gguf", None, &range);
        assert_eq!(status, want, "{extra:?}: {body}");
        if want == 206 {
            assert_eq!(body, "GGUF");
        }
    }
}

/// With `--log-format json`, each request leaves one JSON line under the request id
/// its response carries, with its method, path, status and calling key, and a run
/// leaves its token counts under the same id.
#[test]
fn each_request_logs_a_line_under_its_request_id() {
    let data = temp_dir("access-log");
    let out = acs()
        .args(["keys", "create", "--data"])
        .arg(&*data)
        .args(["--tokens", "100000", "--max-running", "4"])
        .output()
        .unwrap();
    let key = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let made = String::from_utf8_lossy(&out.stderr).into_owned();
    let key_id = made.split_whitespace().nth(1).unwrap().to_owned();
    let server = Server::start(&data, &default_model(), &["--log-format", "json"]);
    let auth = format!("Bearer {key}");
    let body = r#"{"model":"llama-8b","prompt":"The sky is","max_tokens":3,"temperature":0}"#;
    let (status, headers, _) = curl(
        &server.base,
        "POST",
        "/v1/completions",
        Some(body),
        &[("Authorization", &auth)],
    );
    assert_eq!(status, 200);
    let rid = headers
        .iter()
        .find(|(k, _)| k == "x-request-id")
        .map(|(_, v)| v.clone())
        .unwrap();
    let (status, _, _) = curl(&server.base, "GET", "/v1/nowhere", None, &[]);
    assert_eq!(status, 404);
    let log = server.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let of = |id: &str, target: &str| {
        lines
            .iter()
            .find(|l| l["request_id"] == id && l["target"] == target)
            .unwrap_or_else(|| panic!("no {target} line for {id} in:\n{log}"))
            .clone()
    };
    let access = of(&rid, "acs::access");
    assert_eq!(access["method"], "POST");
    assert_eq!(access["path"], "/v1/completions");
    assert_eq!(access["status"], 200);
    assert_eq!(access["key"], key_id.as_str());
    let run = of(&rid, "acs::run");
    assert_eq!(run["completion_tokens"], 3);
    assert!(run["prompt_tokens"].as_u64().unwrap() > 0, "{run}");
    let unknown = lines
        .iter()
        .find(|l| l["target"] == "acs::access" && l["path"] == "/v1/nowhere")
        .unwrap_or_else(|| panic!("no line for the unknown route in:\n{log}"));
    assert_eq!(unknown["status"], 404);
    assert_eq!(unknown["key"], "-");
}

/// `/metrics` counts requests by route pattern and status, and the engine's work.
#[test]
fn metrics_count_requests_and_the_engines_work() {
    let data = temp_dir("metrics");
    let key = make_key(&data, 1_000_000, 4);
    let server = Server::start(&data, &default_model(), &[]);
    let auth = format!("Bearer {key}");
    let body = r#"{"model":"llama-8b","prompt":"The sky is","max_tokens":3,"temperature":0}"#;
    for _ in 0..2 {
        let (status, _, _) = curl(
            &server.base,
            "POST",
            "/v1/completions",
            Some(body),
            &[("Authorization", &auth)],
        );
        assert_eq!(status, 200);
    }
    let missing = "/v1/completion-jobs/0190b7d2-0000-7000-8000-000000000000";
    assert_eq!(
        curl(
            &server.base,
            "GET",
            missing,
            None,
            &[("Authorization", &auth)]
        )
        .0,
        404
    );
    let (status, headers, text) = curl(&server.base, "GET", "/metrics", None, &[]);
    assert_eq!(status, 200);
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-type" && v.starts_with("text/plain")),
        "{headers:?}"
    );
    let value = |line_start: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {line_start} in:\n{text}"))
    };
    // The engine's metrics carry the served model's id.
    let engine_value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| {
                let rest = l.strip_prefix(name)?.strip_prefix("{model=\"")?;
                rest.split_once("\"} ")?.1.trim().parse().ok()
            })
            .unwrap_or_else(|| panic!("no {name} of a model in:\n{text}"))
    };
    assert_eq!(
        value(r#"acs_http_requests_total{method="POST",route="/v1/completions",status="200"}"#),
        2.0
    );
    assert_eq!(
        value(
            r#"acs_http_requests_total{method="GET",route="/v1/completion-jobs/{id}",status="404"}"#
        ),
        1.0
    );
    assert!(engine_value("acs_engine_decode_tokens_total") >= 4.0);
    assert_eq!(
        engine_value("acs_engine_prompt_cache_hits_total"),
        1.0,
        "the same prompt again"
    );
    assert!(engine_value("acs_engine_step_seconds_total") > 0.0);
    assert!(engine_value("acs_engine_kv_capacity_bytes") > 0.0);
    assert_eq!(engine_value("acs_engine_up"), 1.0);
    assert_eq!(engine_value("acs_engine_running_requests"), 0.0);
}
