//! llama.cpp on the same file as `acs bench`, for `--llama-cpp`: its own tools where
//! they are on the PATH (`llama-bench` for prefill and one sequence's decode,
//! `llama-batched-bench` for the batch's decode), else llama-cpp-python
//! (`scripts/bench_llamacpp.py`). Either prints one `llama.cpp …` line in the format of
//! acs's own, which [`parse_anchor`] reads back for the ratios.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The shapes both sides run.
#[derive(Debug, Clone, Copy)]
pub struct Shapes {
    pub prompt: usize,
    pub decode: usize,
    pub repeat: usize,
    pub threads: usize,
    /// Sequences of the batched decode.
    pub batch: usize,
}

/// Runs llama.cpp on `model` and returns what it printed (its `llama.cpp …` line
/// among it), or why it could not.
pub fn run(model: &Path, s: Shapes) -> Result<String, String> {
    match (tool("llama-bench"), tool("llama-batched-bench")) {
        (Some(bench), Some(batched)) => tools(&bench, &batched, model, s),
        _ if s.batch != 8 => Err(format!(
            "the llama-cpp-python anchor decodes 8 sequences, not {}: put llama-bench and llama-batched-bench on the PATH",
            s.batch
        )),
        _ => python(model, s),
    }
}

/// `name` in `$LLAMA_BIN` or on the PATH.
fn tool(name: &str) -> Option<PathBuf> {
    let dirs = std::env::var_os("LLAMA_BIN")
        .into_iter()
        .chain(std::env::var_os("PATH"))
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    dirs.map(|d| d.join(name)).find(|p| p.is_file())
}

fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// llama.cpp's own tools, one after the other.
fn tools(bench: &Path, batched: &Path, model: &Path, s: Shapes) -> Result<String, String> {
    let json = output(Command::new(bench).arg("-m").arg(model).args([
        "-p",
        &s.prompt.to_string(),
        "-n",
        &s.decode.to_string(),
        "-t",
        &s.threads.to_string(),
        "-r",
        &s.repeat.to_string(),
        "-o",
        "json",
    ]))?;
    let (pp, tg, build) = parse_llama_bench(&json).ok_or("unreadable llama-bench output")?;
    let table = output(Command::new(batched).arg("-m").arg(model).args([
        "-c",
        &(s.batch * (s.prompt + s.decode) + 64).to_string(),
        "-npp",
        &s.prompt.to_string(),
        "-ntg",
        &s.decode.to_string(),
        "-npl",
        &s.batch.to_string(),
        "-t",
        &s.threads.to_string(),
    ]))?;
    let tg8 = parse_batched_bench(&table).ok_or("unreadable llama-batched-bench output")?;
    // A build from a source tree without git history numbers itself 0.
    let build = match build {
        0 => String::new(),
        n => format!(", build {n}"),
    };
    let batch = s.batch;
    Ok(format!(
        "llama.cpp prefill {pp:8.1} tok/s | decode x1 {tg:7.1} tok/s | decode x{batch} {tg8:7.1} tok/s   (llama-bench, llama-batched-bench{build})\n"
    ))
}

/// llama-cpp-python, through the script beside this repository's sources.
fn python(model: &Path, s: Shapes) -> Result<String, String> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/bench_llamacpp.py"
    );
    output(Command::new("python3").arg(script).arg(model).args([
        s.prompt.to_string(),
        s.decode.to_string(),
        s.repeat.to_string(),
        s.threads.to_string(),
    ]))
    .map_err(|e| {
        format!("{e} (put llama-bench and llama-batched-bench on the PATH, or pip install llama-cpp-python)")
    })
}

/// `llama-bench -o json`: the prompt test's and the generation test's mean tokens/s,
/// and the build number.
fn parse_llama_bench(text: &str) -> Option<(f64, f64, u64)> {
    let rows: Vec<serde_json::Value> = serde_json::from_str(text).ok()?;
    let field = |pred: &dyn Fn(&serde_json::Value) -> bool| {
        rows.iter().find(|r| pred(r))?["avg_ts"].as_f64()
    };
    let pp = field(&|r| r["n_prompt"].as_u64() > Some(0))?;
    let tg = field(&|r| r["n_gen"].as_u64() > Some(0))?;
    let build = rows.first()?["build_number"].as_u64().unwrap_or(0);
    Some((pp, tg, build))
}

/// `llama-batched-bench`'s table: the last row's S_TG (generated tokens/s over all
/// sequences).
fn parse_batched_bench(text: &str) -> Option<f64> {
    let row = text.lines().rev().find(|l| {
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        cells.len() > 8 && cells[1].parse::<u64>().is_ok()
    })?;
    row.split('|').nth(8)?.trim().parse().ok()
}

/// Reads the three figures of the anchor's `llama.cpp prefill … | decode x1 … | decode xN …` line.
pub fn parse_anchor(text: &str) -> Option<(f64, f64, f64)> {
    let line = text.lines().find(|l| l.starts_with("llama.cpp"))?;
    let nums: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    match nums.as_slice() {
        [p, d1, d8, ..] => Some((*p, *d1, *d8)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_bench_json_gives_prefill_decode_and_build() {
        let text = r#"[
          {"build_number": 11434, "n_prompt": 16, "n_gen": 0, "avg_ts": 508.791779},
          {"build_number": 11434, "n_prompt": 0, "n_gen": 4, "avg_ts": 152.01943}
        ]"#;
        assert_eq!(
            parse_llama_bench(text),
            Some((508.791779, 152.01943, 11434))
        );
        assert_eq!(parse_llama_bench("not json"), None);
    }

    #[test]
    fn batched_bench_table_gives_the_last_rows_generation_rate() {
        let text = "\
main: n_kv_max = 200, n_batch = 2048

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    16 |      4 |    8 |    160 |    0.166 |   773.39 |    0.082 |   387.89 |    0.248 |   645.15 |
";
        assert_eq!(parse_batched_bench(text), Some(387.89));
        assert_eq!(parse_batched_bench("no table"), None);
    }

    #[test]
    fn the_anchor_line_reads_back() {
        let line = "llama.cpp prefill    508.8 tok/s | decode x1   152.0 tok/s | decode x8   387.9 tok/s   (llama-bench, llama-batched-bench; build 11434)\n";
        assert_eq!(parse_anchor(line), Some((508.8, 152.0, 387.9)));
    }
}
