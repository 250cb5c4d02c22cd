//! Where downloaded models are kept, shared by `acs` (which fetches the default model
//! there) and the tests (which look for it there).

/// File name of the default model (SmolLM2-135M-Instruct Q4_1) in the model cache.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where fetched models are kept: `$ACS_MODEL_CACHE`, else `~/.cache/acs/models`
/// (`scripts/fetch-model.sh` and `acs serve` put the default model there).
#[cfg(not(target_arch = "wasm32"))]
pub fn model_cache_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("ACS_MODEL_CACHE") {
        return dir.into();
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
    std::path::PathBuf::from(home).join(".cache/acs/models")
}
