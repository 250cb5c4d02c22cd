//! The playground that `acs serve` serves at `/`, driven in headless Chromium by
//! tests/browser/playground.mjs (playwright-core, Debian's /usr/bin/chromium): the
//! tutorial's two prompts with n=2 stream into the grid in index order.

mod common;

use std::process::Command;

use common::{Server, default_model, make_key, temp_dir};

#[test]
fn the_playground_samples_two_prompts_in_chromium() {
    let data = temp_dir("playground");
    let key = make_key(&data, 100_000, 4);
    let server = Server::start(&data, &default_model(), &[]);
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/browser");
    let shot = data.join("playground.png");
    let out = Command::new("node")
        .current_dir(dir)
        .arg("playground.mjs")
        .arg(&server.base)
        .arg(&key)
        .arg(&shot)
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
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "a real screenshot"
    );
    println!("screenshot: {}", shot.display());
}
