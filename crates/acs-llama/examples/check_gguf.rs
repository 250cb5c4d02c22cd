//! Holds ACS to llama.cpp on a GGUF file: for each prompt of llama.cpp's greedy
//! continuations (the JSON lines `scripts/oracle/greedy.c` prints), whether ACS's
//! tokenizer gives llama.cpp's ids, and how many of llama.cpp's greedy tokens ACS's
//! CPU pass gives before the first that differs. A difference where llama.cpp's own
//! pick was a near tie (its margin under [`NEAR_TIE`]) is rounding, not a fault.
//! `scripts/check-gguf.sh` runs both sides.
//!
//! `cargo run --release -p acs-llama --example check_gguf -- MODEL.gguf GREEDY.jsonl`

#[cfg(not(target_arch = "wasm32"))]
use acs_llama::model::Model;

/// llama.cpp's margin under which its pick and the runner-up are a tie within
/// rounding: on quantized files each implementation's logits stray from those of the
/// same weights in f32 by about 0.1 to 0.16 (root mean square) and up to 1, each
/// rounding activations to 8 bits its own way (docs/performance.md, "Accuracy").
#[cfg(not(target_arch = "wasm32"))]
const NEAR_TIE: f64 = 0.5;

/// The tool maps the file: a native program only.
#[cfg(target_arch = "wasm32")]
fn main() {}

#[cfg(not(target_arch = "wasm32"))]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(model), Some(oracle)) = (args.next(), args.next()) else {
        return Err("usage: check_gguf MODEL.gguf GREEDY.jsonl".into());
    };
    let model = Model::open(&model)?;
    let c = &model.config;
    eprintln!(
        "{} ({} layers, d_model {}, {} heads of {}, vocab {})",
        c.family.name(),
        c.n_layers,
        c.d_model,
        c.n_heads,
        c.head_dim,
        c.vocab
    );
    let mut faults = 0;
    for line in std::fs::read_to_string(&oracle)?.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let ids = |k: &str| -> Vec<u32> {
            v[k].as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_u64())
                        .map(|x| x as u32)
                        .collect()
                })
                .unwrap_or_default()
        };
        let prompt = v["prompt"].as_str().unwrap_or_default();
        let (want_prompt, want) = (ids("prompt_ids"), ids("ids"));
        let margins: Vec<f64> = v["margins"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default();
        let got_prompt = model.tokenizer.encode(prompt, true, false)?;
        if got_prompt != want_prompt {
            faults += 1;
            println!("{prompt:?}: tokens {got_prompt:?}, llama.cpp's {want_prompt:?}");
            continue;
        }
        let got = model.greedy(&got_prompt, want.len())?;
        let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        let text = model.tokenizer.decode(&got[..same]);
        if same == want.len() {
            println!("{prompt:?}: all {same} greedy tokens agree: {text:?}");
        } else if margins.get(same).is_some_and(|&m| m < NEAR_TIE) {
            println!(
                "{prompt:?}: {same} of {} agree, then a near tie (llama.cpp's margin {:.3}): {text:?}",
                want.len(),
                margins[same]
            );
        } else {
            faults += 1;
            println!(
                "{prompt:?}: {same} of {} agree, then ACS {:?} where llama.cpp {:?} (margin {:.3})",
                want.len(),
                model.tokenizer.decode(&got[same..same + 1]),
                model.tokenizer.decode(&want[same..same + 1]),
                margins.get(same).copied().unwrap_or(f64::NAN)
            );
        }
    }
    if faults > 0 {
        return Err(format!("{faults} prompt(s) differ from llama.cpp").into());
    }
    Ok(())
}
