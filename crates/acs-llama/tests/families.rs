//! Model families and the files ACS refuses: a family loads from its own metadata
//! keys and tensors, and an architecture or a weight format that ACS cannot run is
//! refused when the file loads, with what it does run in the message.
// Native only: the browser runs tests/wasm_cpu.rs.
#![cfg(not(target_arch = "wasm32"))]

use std::sync::Arc;

use acs_llama::gguf::{GgufFile, GgufWriter, MetaValue};
use acs_llama::model::{Family, KvCache, Logits, Model, ModelError, SeqInput};
use acs_llama::quant::GgmlType;
use acs_llama::sample::top_k_indices;
use acs_llama::testgen::{TestModelSpec, test_model_bytes};

fn load(bytes: Vec<u8>) -> Result<Model, ModelError> {
    Model::from_gguf(Arc::new(GgufFile::from_vec(bytes)?))
}

fn last_logits(model: &Model, cache: &mut KvCache, tokens: &[u32]) -> Vec<f32> {
    let mut batch = [SeqInput {
        cache,
        tokens,
        steering: &[],
        capture: &[],
        logits: Logits::Last,
    }];
    model.forward(&mut batch).expect("step").remove(0).logits
}

#[test]
fn qwen2_loads_its_keys_and_biases() {
    let spec = TestModelSpec {
        family: Family::Qwen2,
        ..TestModelSpec::tiny()
    };
    let model = load(test_model_bytes(&spec).unwrap()).expect("qwen2 loads");
    assert_eq!(model.config.family, Family::Qwen2);
    assert_eq!(model.config.d_model, spec.d_model);
    assert_eq!(model.config.n_kv_heads, spec.n_kv_heads);

    // The same weights read as Llama (no biases, RoPE on neighbours) give other
    // logits: the recipe is followed, not ignored.
    let llama = TestModelSpec {
        family: Family::Llama,
        ..spec.clone()
    };
    let llama = load(test_model_bytes(&llama).unwrap()).expect("llama loads");
    let tokens = [5, 70, 200, 31];
    let q = last_logits(&model, &mut model.new_cache(), &tokens);
    let l = last_logits(&llama, &mut llama.new_cache(), &tokens);
    assert!(q.iter().all(|v| v.is_finite()));
    let diff = q
        .iter()
        .zip(&l)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff > 1e-3, "qwen2 and llama logits agree to {diff}");
}

#[test]
fn a_missing_bias_is_an_error_naming_it() {
    let spec = TestModelSpec {
        family: Family::Qwen2,
        ..TestModelSpec::tiny()
    };
    let file = GgufFile::from_vec(test_model_bytes(&spec).unwrap()).unwrap();
    // The same file without blk.1.attn_k.bias.
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata().iter() {
        w.add(k, v.clone());
    }
    for t in file
        .tensors()
        .iter()
        .filter(|t| t.name != "blk.1.attn_k.bias")
    {
        let data = file.tensor_bytes(t).unwrap().to_vec();
        w.add_tensor(t.name.clone(), &t.dims, t.ty, data).unwrap();
    }
    let err = load(w.to_bytes()).unwrap_err().to_string();
    assert!(err.contains("blk.1.attn_k.bias"), "{err}");
}

#[test]
fn an_unknown_architecture_is_refused_with_the_supported_list() {
    let mut w = GgufWriter::new();
    w.add("general.architecture", MetaValue::String("mamba".into()));
    let err = load(w.to_bytes()).unwrap_err();
    assert!(matches!(err, ModelError::Architecture { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("\"mamba\""), "{msg}");
    for f in Family::ALL {
        assert!(msg.contains(f.name()), "{msg}");
    }
}

/// A copy of `bytes`' model with the metadata `extra` added.
fn with_metadata(bytes: Vec<u8>, extra: &[(&str, MetaValue)]) -> Vec<u8> {
    let file = GgufFile::from_vec(bytes).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata().iter() {
        w.add(k, v.clone());
    }
    for (k, v) in extra {
        w.add(*k, v.clone());
    }
    for t in file.tensors() {
        let data = file.tensor_bytes(t).unwrap().to_vec();
        w.add_tensor(t.name.clone(), &t.dims, t.ty, data).unwrap();
    }
    w.to_bytes()
}

/// Linear RoPE scaling divides every angle by its factor; a scaling ACS does not
/// implement (YaRN) is refused by name rather than run wrong.
#[test]
fn rope_scaling_is_linear_or_refused() {
    let bytes = test_model_bytes(&TestModelSpec::tiny()).unwrap();
    let string = |s: &str| MetaValue::String(s.to_owned());
    let linear = with_metadata(
        bytes.clone(),
        &[
            ("llama.rope.scaling.type", string("linear")),
            ("llama.rope.scaling.factor", MetaValue::F32(4.0)),
        ],
    );
    assert_eq!(load(linear).unwrap().config.rope_freq_scale, 0.25);
    let yarn = with_metadata(bytes, &[("llama.rope.scaling.type", string("yarn"))]);
    let err = load(yarn).unwrap_err();
    assert!(matches!(err, ModelError::Unsupported(_)), "{err:?}");
    assert!(err.to_string().contains("yarn"), "{err}");
}

/// Phi-3's 128k files rotate by LongRoPE's factors, which ACS does not implement:
/// they are refused from their metadata, by name.
#[test]
fn phi3_longrope_is_refused() {
    let spec = TestModelSpec::oracle_case("phi3").expect("a known case");
    let bytes = test_model_bytes(&spec).unwrap();
    assert!(load(bytes.clone()).is_ok());
    let long = with_metadata(
        bytes,
        &[(
            "phi3.rope.scaling.original_context_length",
            MetaValue::U32(4096),
        )],
    );
    let err = load(long).unwrap_err();
    assert!(matches!(err, ModelError::Unsupported(_)), "{err:?}");
    assert!(err.to_string().contains("LongRoPE"), "{err}");
}

/// A tensor in a format without kernels (here Q8_1, ggml's activation format,
/// written over a Q8_0 one of the same shape) fails the load, naming the tensor and its format, rather than the
/// first step that reaches it.
#[test]
fn a_format_without_kernels_is_refused_at_load() {
    let bytes = test_model_bytes(&TestModelSpec::tiny()).unwrap();
    let file = GgufFile::from_vec(bytes).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata().iter() {
        w.add(k, v.clone());
    }
    for t in file.tensors() {
        let (ty, data) = if t.name == "blk.1.ffn_up.weight" {
            let n = t.n_elements() as usize;
            (GgmlType::Q8_1, vec![0u8; n / 32 * 36])
        } else {
            (t.ty, file.tensor_bytes(t).unwrap().to_vec())
        };
        w.add_tensor(t.name.clone(), &t.dims, ty, data).unwrap();
    }
    let err = load(w.to_bytes()).unwrap_err();
    assert!(matches!(err, ModelError::Format { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("blk.1.ffn_up.weight") && msg.contains("Q8_1"),
        "{msg}"
    );
    assert!(msg.contains("Q4_K"), "the formats it runs: {msg}");
}

/// llama.cpp's logits at the last of the fixture's tokens on the tiny test model
/// `name` (recorded by `scripts/oracle/record.sh`).
fn llama_cpp_logits(name: &str) -> (Vec<u32>, Vec<f32>) {
    let path = format!(
        "{}/tests/fixtures/families/{name}.json",
        env!("CARGO_MANIFEST_DIR"),
    );
    let text = std::fs::read_to_string(&path).expect("fixture");
    let v: serde_json::Value = serde_json::from_str(&text).expect("fixture parses");
    let nums = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_f64().expect("number"))
            .collect()
    };
    let tokens = nums("tokens").into_iter().map(|t| t as u32).collect();
    let logits = nums("logits").into_iter().map(|l| l as f32).collect();
    (tokens, logits)
}

/// The largest difference between ACS's and llama.cpp's logits allowed: both round
/// activations to 8 bits and caches to half floats, at different points (the tiny
/// models differ by about 0.06); a wrong recipe (RoPE on the wrong pairs, a missing
/// bias) is off by whole units (3.8 for Qwen2's file run as Llama).
const TOLERANCE: f32 = 0.25;

/// Each family's CPU pass (and Llama 3.1's frequency factors) gives llama.cpp's
/// logits on the same file, its greedy token wherever llama.cpp's own margin is
/// wider than the tolerance, and its top five ids.
#[test]
fn every_family_matches_llama_cpp() {
    for name in TestModelSpec::ORACLE_CASES {
        let spec = TestModelSpec::oracle_case(name).expect("a known case");
        let model = load(test_model_bytes(&spec).unwrap()).expect("loads");
        let (tokens, want) = llama_cpp_logits(name);
        let got = last_logits(&model, &mut model.new_cache(), &tokens);
        assert_eq!(got.len(), want.len(), "{name}");
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!("{name}: max |logit - llama.cpp's| {diff}");
        assert!(diff < TOLERANCE, "{name}: logits differ by {diff}");
        let (ours, theirs) = (top_k_indices(&got, 5), top_k_indices(&want, 5));
        assert!(
            want[theirs[0]] - want[ours[0]] < TOLERANCE,
            "{name}: greedy token {}, llama.cpp's {} by a margin of {}",
            ours[0],
            theirs[0],
            want[theirs[0]] - want[ours[0]]
        );
        // llama.cpp's top five are ours, but for one that ties our fifth within the
        // tolerance.
        for &id in &theirs {
            assert!(
                ours.contains(&id) || got[ours[4]] - got[id] < TOLERANCE,
                "{name}: llama.cpp's top-5 id {id} is not in ours {ours:?}"
            );
        }
    }
}
