//! What the tests on the real default model share.

use std::path::PathBuf;

/// The default model, SmolLM2-135M-Instruct Q4_1: `$ACS_TEST_MODEL`, else the model
/// cache that `scripts/fetch-model.sh` fills. Panics (the test fails, it is not
/// skipped) when the file is not there.
pub fn default_model_path() -> PathBuf {
    let path = match std::env::var_os("ACS_TEST_MODEL") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME").expect("HOME is set");
            PathBuf::from(home).join(".cache/acs/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        }
    };
    assert!(
        path.exists(),
        "default model missing at {}: run scripts/fetch-model.sh",
        path.display()
    );
    path
}
