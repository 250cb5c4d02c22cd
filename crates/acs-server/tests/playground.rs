//! The playground that `acs serve` serves at `/`, driven in headless Chromium by
//! tests/browser/playground.mjs (playwright-core, Debian's /usr/bin/chromium): the
//! default model runs in the page (WebGPU through SwiftShader) and the tutorial's two
//! prompts with n=2 stream into the grid in index order; a reload reads the model
//! from the Cache API and finds its job in IndexedDB; the openai JS SDK runs in the
//! page through the package's `fetch` (completions and chat, n=4, whole and streamed);
//! the remote endpoint (this server, with a key) gives the same shapes, lists its
//! models in the picker, and runs the chat mode: three replies side by side, then one
//! of them continued as its own conversation; the CPU backend on two threads (the
//! page is cross-origin isolated) samples what it samples on one. The same playground
//! in headless Firefox, and the acs-web npm package (packed, installed, type-checked,
//! its example page run). Needs web/pkg and web/pkg-threads (`scripts/build-web.sh`).

mod common;

use std::process::Command;

use common::{Server, default_model, make_key, temp_dir};

/// tests/browser, where the scripts that drive the browsers live.
const BROWSER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/browser");

/// A screenshot's path, outside the test's data (which goes when the test passes).
fn screenshot(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// Runs `node SCRIPT BASE ARGS…` in tests/browser against `server` and returns the one
/// JSON line it prints, which must say `"ok": true`.
fn drive(server: &Server, script: &str, args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let out = Command::new("node")
        .current_dir(BROWSER)
        .arg(script)
        .arg(&server.base)
        .args(args)
        .output()
        .expect("node runs (tests/browser needs `npm ci`)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}: {stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(result["ok"], true, "{result}");
    result
}

/// Checks that the script left a real screenshot at `shot`, and says where.
fn check_screenshot(shot: &std::path::Path) {
    assert!(
        std::fs::metadata(shot).unwrap().len() > 10_000,
        "a real screenshot"
    );
    println!("screenshot: {}", shot.display());
}

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
    let shot = screenshot("playground.png");
    let result = drive(
        &server,
        "playground.mjs",
        &[key.as_ref(), shot.as_ref(), model.as_ref()],
    );
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
    check_screenshot(&shot);
}

/// The playground in headless Firefox (tests/browser/firefox.mjs: Debian's firefox-esr
/// over WebDriver BiDi): without a GPU the served model runs on the wasm CPU backend
/// on the device's threads, the page being cross-origin isolated; the two prompts'
/// four choices land in index order; a missing model URL is refused in plain words;
/// sixty engines started one after another on two threads all start.
#[test]
fn the_playground_runs_in_firefox_on_the_cpu_threads() {
    let data = temp_dir("playground-firefox");
    let server = Server::start(&data, &default_model(), &["--serve-model-file"]);
    let shot = screenshot("playground-firefox.png");
    let result = drive(&server, "firefox.mjs", &[shot.as_ref()]);
    println!(
        "firefox: {} | {} | WebGPU: {} | a missing model: {} | WebGPU asked for: {} | engine starts: {}",
        result["userAgent"],
        result["loaded"]["text"],
        result["gpu"],
        result["missing"]["text"],
        result["noWebGpu"]["text"],
        result["starts"]
    );
    check_screenshot(&shot);
}

/// Runs `program args` in `dir`; panics with its output when it fails.
fn run_in(dir: &std::path::Path, program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} {args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The acs-web npm package as a user gets it: `npm pack web` (the manifest's files),
/// `npm install` of the tarball into an empty site, its types checked by `tsc
/// --strict` against a page's calls (tests/browser/typed.ts, misuses refused), and its
/// example page (five lines of JS) served from that site, sampling four choices in
/// headless Chromium.
#[test]
fn the_npm_package_installs_type_checks_and_runs_its_example() {
    let data = temp_dir("npm-package");
    let site = data.join("site");
    std::fs::create_dir_all(&site).unwrap();
    let web = concat!(env!("CARGO_MANIFEST_DIR"), "/../../web");
    let browser = std::path::Path::new(BROWSER);
    let site_arg = site.to_str().unwrap();
    let tarball = run_in(
        browser,
        "npm",
        &["pack", web, "--pack-destination", site_arg, "--silent"],
    );
    let tarball = site.join(tarball.trim());
    std::fs::write(site.join("package.json"), r#"{"private": true}"#).unwrap();
    run_in(
        &site,
        "npm",
        &[
            "install",
            "--offline",
            "--no-audit",
            "--no-fund",
            tarball.to_str().unwrap(),
        ],
    );
    let package = site.join("node_modules/acs-web");
    for file in [
        "acs-client.d.ts",
        "acs-worker.js",
        "acs-team.js",
        "helpers.js",
        "pkg/acs_web_bg.wasm",
        "pkg-threads/acs_web_bg.wasm",
    ] {
        assert!(package.join(file).is_file(), "the package holds {file}");
    }
    std::fs::copy(browser.join("typed.ts"), site.join("typed.ts")).unwrap();
    let tsc = browser.join("node_modules/.bin/tsc");
    run_in(
        &site,
        tsc.to_str().unwrap(),
        &[
            "--noEmit",
            "--strict",
            "--target",
            "es2022",
            "--module",
            "nodenext",
            "--moduleResolution",
            "nodenext",
            "--lib",
            "es2022,dom",
            "typed.ts",
        ],
    );
    std::fs::copy(package.join("example/index.html"), site.join("index.html")).unwrap();
    let model = default_model();
    let server = Server::start(&data, &model, &["--serve-model-file", "--web", site_arg]);
    let result = drive(&server, "example.mjs", &[]);
    println!("the npm package's example page: {}", result["text"]);
}

/// The GPU device lost mid-session (tests/browser/device_lost.mjs: the playground on
/// SwiftShader's WebGPU, its device destroyed by a wrapper of the engine's worker): a
/// request meanwhile fails with 503 `gpu_device_lost`, the model loads again on the CPU
/// by itself, the status line says why, and the page samples again.
#[test]
fn a_lost_gpu_device_reloads_the_model_on_the_cpu() {
    let data = temp_dir("device-lost");
    let server = Server::start(&data, &default_model(), &["--serve-model-file"]);
    let shot = screenshot("device-lost.png");
    let result = drive(&server, "device_lost.mjs", &[shot.as_ref()]);
    println!(
        "a lost GPU: {} | then {}",
        result["during"]["message"], result["after"]["load"]
    );
    println!("screenshot: {}", shot.display());
}

/// The models a visitor keeps (tests/browser/models.mjs): the served model listed in
/// the cache with its size, read from there while the server's file is the same,
/// downloaded again when it changes and when it changes back, deleted from the list,
/// and loaded without a copy, said in plain words, when the site's quota is too small.
#[test]
fn the_playground_keeps_lists_revalidates_and_deletes_models() {
    let data = temp_dir("models");
    let server = Server::start(&data, &default_model(), &["--serve-model-file"]);
    let shot = screenshot("models.png");
    let result = drive(&server, "models.mjs", &[shot.as_ref()]);
    for l in result["loads"].as_array().unwrap() {
        println!(
            "{}: from the cache {} | {}",
            l["label"], l["fromCache"], l["text"]
        );
    }
    check_screenshot(&shot);
}

/// A split model (tests/browser/split.mjs): the default model in three files, which
/// `acs serve` runs and serves (its /model.gguf leads to the first), and which another
/// origin serves with a connection that breaks off in the middle of the second file,
/// loads from its first file's URL (the download resumes), samples what the one-file
/// model samples, loads again from the cache and from the three picked files, and two
/// of the three are refused in plain words.
#[test]
fn a_split_model_loads_from_its_files_and_a_broken_download_resumes() {
    let data = temp_dir("split");
    let model = default_model();
    let parts = data.join("parts");
    std::fs::create_dir_all(&parts).unwrap();
    let file = acs_llama::gguf::GgufFile::open(&model).unwrap();
    for (no, bytes) in (0u16..).zip(acs_llama::gguf::split_model(&file, 3).unwrap()) {
        let name = acs_llama::gguf::part_name("model", no, 3);
        std::fs::write(parts.join(name), bytes).unwrap();
    }
    std::fs::copy(&model, parts.join("whole.gguf")).unwrap();
    let first = parts.join(acs_llama::gguf::part_name("model", 0, 3));
    let server = Server::start(&data, &first, &["--serve-model-file"]);
    let shot = screenshot("split.png");
    let result = drive(&server, "split.mjs", &[parts.as_ref(), shot.as_ref()]);
    println!(
        "acs serve's split model: {} | another origin: {} | resumed {} time(s), with {} | cached: {} | picked: {} | two of three: {}",
        result["served"]["text"],
        result["first"]["text"],
        result["first"]["resumes"],
        result["resumedWith"],
        result["again"]["text"],
        result["picked"]["text"],
        result["short"]
    );
    check_screenshot(&shot);
}

/// One engine for the pages of an origin (tests/browser/shared.mjs): pages that start
/// with the same model share a SharedWorker's engine (the second joins without a
/// load, sees the first's job, samples beside it and after it has closed); another
/// backend gets an engine of its own.
#[test]
fn pages_that_start_the_same_model_share_one_engine() {
    let data = temp_dir("shared");
    let server = Server::start(&data, &default_model(), &["--serve-model-file"]);
    let result = drive(&server, "shared.mjs", &[]);
    println!(
        "first page: {} | second page: {} | the job seen by the second: {} | side by side: {} | another backend: {}",
        result["a"], result["b"], result["jobSeenByB"], result["sideBySide"], result["c"]
    );
}

/// The CPU backend with its weights in JS memory (tests/browser/js_weights.mjs), as a
/// model past wasm32's 4 GiB loads: on the page's threads it samples what the weights
/// in wasm memory sample, without the file in wasm memory.
#[test]
fn weights_kept_in_js_memory_sample_as_in_wasm_memory() {
    let data = temp_dir("js-weights");
    let server = Server::start(&data, &default_model(), &["--serve-model-file"]);
    let result = drive(&server, "js_weights.mjs", &[]);
    println!(
        "weights in wasm memory: {} | in JS memory: {}",
        result["wasm"], result["js"]
    );
}

/// A model past what wasm32 addresses (tests/browser/big.mjs): a generated file of
/// 4.38 GB (F32 matrices, random in its first and last blocks, zero between), picked in
/// headless Chromium, loads and samples on WebGPU with the engine alone in wasm
/// memory, and on the CPU with its weights in JS memory; both sample the same tokens.
#[test]
fn a_model_past_4_gib_runs_on_webgpu_and_on_the_cpu() {
    use acs_llama::quant::GgmlType;
    use acs_llama::testgen::{TestModelSpec, write_large_test_model};

    /// The file goes with the test, passed or failed: it is 4.38 GB.
    struct Removed(std::path::PathBuf);
    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let spec = TestModelSpec {
        d_model: 2048,
        n_layers: 18,
        n_heads: 32,
        n_kv_heads: 8,
        ffn: 8192,
        weight_type: GgmlType::F32,
        embed_type: GgmlType::F32,
        tied: false,
        ..TestModelSpec::tiny()
    };
    let file = Removed(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("big-model.gguf"));
    let last = spec.n_layers - 1;
    write_large_test_model(&spec, &|l| l == 0 || l == last, &file.0).unwrap();
    let bytes = std::fs::metadata(&file.0).unwrap().len();
    assert!(bytes > 1 << 32, "{bytes} bytes");

    let data = temp_dir("big");
    let server = Server::start(&data, &default_model(), &[]);
    let result = drive(&server, "big.mjs", &[file.0.as_ref()]);
    println!(
        "a model of {bytes} bytes: on WebGPU {} | on the CPU {}",
        result["webgpu"], result["cpu"]
    );
}
