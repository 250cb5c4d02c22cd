//! Which models `acs serve` serves: the `--model` specs (`FILE` or `ID=FILE`), their
//! ids, how the KV memory is split between their engines, and which control vectors
//! fit each.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use acs_engine::control::{ControlVector, ControlVectors};
use acs_llama::gguf::GgufFile;
use acs_llama::model::Model;

use crate::models;

/// Why the set of models cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ModelSetError {
    /// Two models under one id.
    #[error("two models have the id {0:?}; name them apart with --model ID=FILE")]
    DuplicateId(String),
    /// A `--model-kv-mib` that names no model, or is not `ID=MIB`.
    #[error("--model-kv-mib {0:?}: {1}")]
    KvShare(String, String),
    /// The KV memory given to named models leaves none for the others.
    #[error(
        "--model-kv-mib gives {given} MiB of the {total} MiB of --kv-mib to some models; the others would get none"
    )]
    KvOverdrawn {
        /// MiB given by `--model-kv-mib`.
        given: usize,
        /// `--kv-mib`.
        total: usize,
    },
    /// A `--control-vector` that is not `NAME=FILE`, cannot be read, or fits no model.
    #[error("--control-vector {0}: {1}")]
    ControlVector(String, String),
    /// A model file that cannot be had or loaded.
    #[error(transparent)]
    Fetch(#[from] models::FetchError),
}

/// One `--model` spec: the file, and the id it was given, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// `ID` of `ID=FILE`.
    pub id: Option<String>,
    /// The file (`None` for the default model).
    pub path: Option<PathBuf>,
}

impl ModelSpec {
    /// `FILE` or `ID=FILE`. A path with `=` in it is taken whole when it exists.
    pub fn parse(spec: &str) -> ModelSpec {
        match spec.split_once('=') {
            Some((id, path)) if !id.is_empty() && !std::path::Path::new(spec).exists() => {
                ModelSpec {
                    id: Some(id.to_owned()),
                    path: Some(path.into()),
                }
            }
            _ => ModelSpec {
                id: None,
                path: Some(spec.into()),
            },
        }
    }
}

/// A model to serve, loaded.
#[derive(Debug)]
pub struct Loaded {
    /// The id requests name.
    pub id: String,
    /// Its file.
    pub path: PathBuf,
    /// The model.
    pub model: Arc<Model>,
}

/// Loads every spec (the default model when there is none); `first_id` names the
/// first (`--model-id`).
pub fn load(specs: &[ModelSpec], first_id: Option<String>) -> Result<Vec<Loaded>, ModelSetError> {
    let default = [ModelSpec {
        id: None,
        path: None,
    }];
    let specs = if specs.is_empty() {
        &default[..]
    } else {
        specs
    };
    let mut loaded: Vec<Loaded> = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let is_default = spec.path.is_none();
        let path = models::resolve(spec.path.clone())?;
        let id = match (i, &first_id, &spec.id) {
            (0, Some(id), _) => id.clone(),
            (_, _, Some(id)) => id.clone(),
            _ => models::model_id(&path, is_default),
        };
        if loaded.iter().any(|l| l.id == id) {
            return Err(ModelSetError::DuplicateId(id));
        }
        let model = models::load(&path)?;
        loaded.push(Loaded { id, path, model });
    }
    Ok(loaded)
}

/// Each model's share of `total_mib` of KV memory, in bytes: what `shares`
/// (`ID=MIB`) gives it, and the rest split among the others in proportion to their
/// bytes per position, so that each of them holds as many positions.
pub fn kv_split(
    models: &[Loaded],
    total_mib: usize,
    shares: &[String],
) -> Result<Vec<usize>, ModelSetError> {
    let mut named: BTreeMap<usize, usize> = BTreeMap::new();
    for share in shares {
        let bad = |why: &str| ModelSetError::KvShare(share.clone(), why.to_owned());
        let (id, mib) = share
            .split_once('=')
            .ok_or_else(|| bad("it takes ID=MIB"))?;
        let mib: usize = mib.parse().map_err(|_| bad("MIB is a whole number"))?;
        let at = models
            .iter()
            .position(|m| m.id == id)
            .ok_or_else(|| bad("no model has that id"))?;
        named.insert(at, mib);
    }
    let given: usize = named.values().sum();
    let others: Vec<usize> = (0..models.len())
        .filter(|i| !named.contains_key(i))
        .collect();
    if !others.is_empty() && given >= total_mib {
        return Err(ModelSetError::KvOverdrawn {
            given,
            total: total_mib,
        });
    }
    let rest = (total_mib - given.min(total_mib)) << 20;
    let per_position: usize = others
        .iter()
        .map(|&i| models[i].model.config.kv_bytes_per_token())
        .sum();
    Ok((0..models.len())
        .map(|i| match named.get(&i) {
            Some(&mib) => mib << 20,
            None => {
                let own = models[i].model.config.kv_bytes_per_token();
                (rest as u128 * own as u128 / per_position.max(1) as u128) as usize
            }
        })
        .collect())
}

/// The control vectors of `specs` (`NAME=FILE`) for each model: a vector goes to
/// every model whose blocks and width it fits, and one that fits none is an error.
pub fn control_vectors(
    models: &[Loaded],
    specs: &[String],
) -> Result<Vec<ControlVectors>, ModelSetError> {
    let mut sets: Vec<ControlVectors> = models.iter().map(|_| ControlVectors::new()).collect();
    for spec in specs {
        let bad = |why: String| ModelSetError::ControlVector(spec.clone(), why);
        let (name, file) = spec
            .split_once('=')
            .ok_or_else(|| bad("it takes NAME=FILE".into()))?;
        let gguf = GgufFile::open(file).map_err(|e| bad(e.to_string()))?;
        let mut fits = Vec::new();
        let mut last_error = String::new();
        for (i, m) in models.iter().enumerate() {
            let c = &m.model.config;
            match ControlVector::from_gguf(&gguf, c.n_layers, c.d_model) {
                Ok(cv) => fits.push((i, cv)),
                Err(e) => last_error = format!("{}: {e}", m.id),
            }
        }
        if fits.is_empty() {
            return Err(bad(last_error));
        }
        for (i, cv) in fits {
            sets[i].insert(name.to_owned(), cv);
        }
    }
    Ok(sets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_files_or_ids_of_files() {
        assert_eq!(
            ModelSpec::parse("small=/m/a.gguf"),
            ModelSpec {
                id: Some("small".into()),
                path: Some("/m/a.gguf".into())
            }
        );
        assert_eq!(
            ModelSpec::parse("/m/a.gguf"),
            ModelSpec {
                id: None,
                path: Some("/m/a.gguf".into())
            }
        );
    }
}
