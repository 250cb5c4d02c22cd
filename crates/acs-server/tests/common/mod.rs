//! Starting real `acs` servers on loopback ports for the end-to-end tests, and talking
//! to them with curl (a real HTTP client, the one the tutorial uses).

// Each test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `acs` binary under test.
pub fn acs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_acs"))
}

/// The default model, as every test that needs real text finds it.
pub fn default_model() -> PathBuf {
    acs_llama::testgen::default_model_for_tests()
}

/// A fresh directory under the system temp dir, removed when dropped unless the test
/// is failing: then it stays, with the server's log, for whoever reads the failure.
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for inspection: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A fresh [`TempDir`] for one test.
pub fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("acs-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// Makes a key with `acs keys create`; returns the secret.
pub fn make_key(data: &Path, tokens: u64, max_running: u32) -> String {
    make_key_with(data, tokens, max_running, &[])
}

/// [`make_key`] with more `acs keys create` arguments (its per-minute limits).
pub fn make_key_with(data: &Path, tokens: u64, max_running: u32, more: &[&str]) -> String {
    let out = acs()
        .args(["keys", "create", "--data"])
        .arg(data)
        .args([
            "--tokens",
            &tokens.to_string(),
            "--max-running",
            &max_running.to_string(),
        ])
        .args(more)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let key = stdout.lines().last().unwrap().trim().to_owned();
    assert!(key.starts_with("acs-"), "{stdout}");
    key
}

/// A running `acs serve`; killed when dropped.
pub struct Server {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    port: u16,
    data: PathBuf,
    model: PathBuf,
    extra: Vec<String>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    /// Starts a server on a free port and waits until it answers.
    pub fn start(data: &Path, model: &Path, extra: &[&str]) -> Server {
        let mut s = Server {
            child: None,
            base: String::new(),
            port: free_port(),
            data: data.to_owned(),
            model: model.to_owned(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.base = format!("http://127.0.0.1:{}", s.port);
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.data.join("server.log")).unwrap();
        let child = acs()
            .args([
                "serve",
                "--addr",
                &format!("127.0.0.1:{}", self.port),
                "--data",
            ])
            .arg(&self.data)
            .arg("--model")
            .arg(&self.model)
            .args(["--model-id", "SmolLM2-135M-Instruct"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let t = Instant::now();
        loop {
            if curl(&self.base, "GET", "/health", None, &[]).0 == 200 {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "server did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.join("server.log")).unwrap_or_default()
    }

    /// Kills the server with SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One HTTP exchange with curl: (status, headers lowercased, body).
pub fn curl(
    base: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-S", "-i", "-X", method, &format!("{base}{path}")]);
    for (k, v) in headers {
        cmd.args(["-H", &format!("{k}: {v}")]);
    }
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    let out = cmd.output().unwrap();
    if !out.status.success() {
        return (0, Vec::new(), String::from_utf8_lossy(&out.stderr).into());
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

/// An authorised JSON call: (status, body as JSON).
pub fn call(base: &str, key: &str, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let auth = format!("Bearer {key}");
    let (status, _, text) = curl(base, method, path, body, &[("Authorization", &auth)]);
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    (status, json)
}

/// Polls a job until it leaves queued/running.
pub fn wait_job(base: &str, key: &str, id: &str, limit: Duration) -> Value {
    let t = Instant::now();
    loop {
        let (status, job) = call(base, key, "GET", &format!("/v1/completion-jobs/{id}"), None);
        assert_eq!(status, 200, "{job}");
        let st = job["status"].as_str().unwrap().to_owned();
        if st != "queued" && st != "running" {
            return job;
        }
        assert!(t.elapsed() < limit, "job {id} still {st}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
