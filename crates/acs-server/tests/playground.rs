//! The playground that `acs serve` serves at `/`, driven in headless Chromium by
//! tests/browser/playground.mjs (playwright-core, Debian's /usr/bin/chromium): the
//! default model runs in the page (WebGPU through SwiftShader) and the tutorial's two
//! prompts with n=2 stream into the grid in index order; a reload reads the model
//! from the Cache API and finds its job in IndexedDB; the openai JS SDK runs in the
//! page through the package's `fetch` (completions and chat, n=4, whole and streamed);
//! the remote endpoint (this server, with a key) gives the same shapes, lists its
//! models in the picker, and runs the chat mode: three replies side by side, then one
//! of them continued as its own conversation; the CPU backend on two threads (the
//! page is cross-origin isolated) samples what it samples on one. Needs web/pkg and
//! web/pkg-threads (`scripts/build-web.sh`).

mod common;

use std::process::Command;

use common::{Server, default_model, make_key, temp_dir};

#[test]
fn the_playground_samples_two_prompts_in_chromium() {
    for pkg in ["pkg", "pkg-threads"] {
        let wasm = format!(
            "{}/../../web/{pkg}/acs_web_bg.wasm",
            env!("CARGO_MANIFEST_DIR")
        );
        assert!(
            std::path::Path::new(&wasm).exists(),
            "the browser package web/{pkg} is not built: run scripts/build-web.sh"
        );
    }
    let data = temp_dir("playground");
    let key = make_key(&data, 100_000, 4);
    let model = default_model();
    let server = Server::start(&data, &model, &["--serve-model-file"]);
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/browser");
    // Outside `data`, which goes when the test passes.
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("playground.png");
    let out = Command::new("node")
        .current_dir(dir)
        .arg("playground.mjs")
        .arg(&server.base)
        .arg(&key)
        .arg(&shot)
        .arg(&model)
        .output()
        .expect("node runs (tests/browser needs `npm ci`)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(result["ok"], true, "{result}");
    // What a reader of the test log wants to know: load times and decode speed.
    println!(
        "in-browser: first load {} ms ({}), cached reload {} ms; wasm memory {} bytes for a {}-byte model; {} | {}",
        result["first"]["loadMs"],
        result["first"]["text"],
        result["reloaded"]["loadMs"],
        result["first"]["wasmMemory"],
        result["first"]["bytes"],
        result["browser"]["status"],
        result["browser"]["usage"]
    );
    println!("openai JS SDK in the page: {}", result["openai"]);
    println!(
        "chat mode against the server: {} (models {})",
        result["chat"], result["models"]
    );
    println!("a picked file: {}", result["picked"]["text"]);
    println!(
        "the CPU backend on one thread and on two: {}",
        result["threads"]
    );
    println!(
        "remote: {} | {}",
        result["remote"]["status"], result["remote"]["usage"]
    );
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "a real screenshot"
    );
    println!("screenshot: {}", shot.display());
}
