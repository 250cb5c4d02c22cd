//! Small random-weight models as GGUF files, for tests that must not depend on a
//! downloaded model.
//!
//! The files carry the metadata llama.cpp writes for their architecture and a
//! real (tiny) byte-level BPE vocabulary: the 256 GPT-2 byte tokens, merges learnt from
//! a built-in English text, and ChatML control tokens. Weights come from a seeded
//! splitmix64 stream, so a spec always yields the same bytes, and are scaled so that
//! activations stay near unit size through the layers.

use crate::arch::Family;
use crate::gguf::{GgufError, GgufWriter, MetaArray, MetaValue};
#[cfg(not(target_arch = "wasm32"))]
use crate::model_cache::{DEFAULT_MODEL_FILE, model_cache_dir};
use crate::quant::{GgmlType, QuantError, quantize_row};

/// The shape and formats of a generated model.
#[derive(Debug, Clone, PartialEq)]
pub struct TestModelSpec {
    /// The family: its architecture name, metadata keys and tensors.
    pub family: Family,
    /// Embedding width (`<architecture>.embedding_length`).
    pub d_model: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Query heads; must divide `d_model` unless `head_dim` is set.
    pub n_heads: usize,
    /// Key/value heads; must divide `n_heads`.
    pub n_kv_heads: usize,
    /// Feed-forward width.
    pub ffn: usize,
    /// Vocabulary size: at least the 256 byte tokens plus the 3 control tokens.
    pub vocab: usize,
    /// `<architecture>.context_length`.
    pub ctx: usize,
    /// Type of the attention and feed-forward matrices.
    pub weight_type: GgmlType,
    /// Type of the value and down projections instead, where set: the mix of
    /// llama.cpp's Q4_K_M, which keeps those two in more bits.
    pub value_down_type: Option<GgmlType>,
    /// Type of `token_embd.weight` (and of `output.weight` when untied).
    pub embed_type: GgmlType,
    /// Whether the output layer reuses the token embedding (no `output.weight`).
    pub tied: bool,
    /// PRNG seed.
    pub seed: u64,
    /// `<architecture>.rope.freq_base`.
    pub rope_base: f32,
    /// `<architecture>.attention.layer_norm_rms_epsilon`.
    pub rms_eps: f32,
    /// RoPE's per-pair frequency factors (`rope_freqs.weight`, one per rotated pair),
    /// as Llama 3.1 and 3.2 files carry them.
    pub rope_freq_factors: Option<Vec<f32>>,
    /// The head width (`attention.key_length` and `value_length`) where it is not
    /// `d_model / n_heads`, as in Qwen3 and Gemma 3.
    pub head_dim: Option<usize>,
    /// A sliding window and the period of its local/global layer pattern
    /// (`attention.sliding_window`, `attention.sliding_window_pattern`), for Gemma 3.
    pub sliding_window: Option<(usize, usize)>,
}

impl TestModelSpec {
    /// A tiny model with deliberately uneven sizes: 64 wide, 4 heads of 16, 2 KV
    /// heads, FFN 96, 2 layers, Q8_0 matrices and embedding, tied output.
    pub fn tiny() -> TestModelSpec {
        TestModelSpec {
            family: Family::Llama,
            d_model: 64,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            ffn: 96,
            vocab: 320,
            ctx: 256,
            weight_type: GgmlType::Q8_0,
            value_down_type: None,
            embed_type: GgmlType::Q8_0,
            tied: true,
            seed: 1,
            rope_base: 10000.0,
            rms_eps: 1e-5,
            rope_freq_factors: None,
            head_dim: None,
            sliding_window: None,
        }
    }

    /// A small model whose rows are multiples of 256, as the K-quant formats need.
    pub fn tiny_k(weight_type: GgmlType) -> TestModelSpec {
        TestModelSpec {
            d_model: 256,
            n_heads: 4,
            n_kv_heads: 1,
            ffn: 512,
            weight_type,
            embed_type: GgmlType::Q6_K,
            tied: false,
            ..TestModelSpec::tiny()
        }
    }

    /// The tiny models that `scripts/oracle/record.sh` records llama.cpp's logits on
    /// (`crates/acs-llama/tests/fixtures/families/NAME.json`), by name: one per family,
    /// and Llama with Llama 3.1's frequency factors on a low RoPE base (so that the
    /// slow pairs turn within the prompt). Qwen3 and Gemma 3 have heads wider than
    /// d_model/heads, as their real files do; Gemma 3's first layer attends to a
    /// window of 8 positions (shorter than the prompt) and its second to all, with
    /// RoPE bases of their own.
    pub fn oracle_case(name: &str) -> Option<TestModelSpec> {
        let family = |family| TestModelSpec {
            family,
            ..TestModelSpec::tiny()
        };
        Some(match name {
            "llama" => family(Family::Llama),
            "qwen2" => family(Family::Qwen2),
            "llama-rope-freqs" => TestModelSpec {
                rope_base: 100.0,
                rope_freq_factors: Some((1..=8).map(|i| i as f32).collect()),
                ..family(Family::Llama)
            },
            "qwen3" => TestModelSpec {
                head_dim: Some(32),
                ..family(Family::Qwen3)
            },
            "phi3" => family(Family::Phi3),
            "gemma3" => TestModelSpec {
                head_dim: Some(32),
                sliding_window: Some((8, 2)),
                rope_base: 1000.0,
                ..family(Family::Gemma3)
            },
            _ => return None,
        })
    }

    /// The names [`TestModelSpec::oracle_case`] knows.
    pub const ORACLE_CASES: [&str; 6] = [
        "llama",
        "qwen2",
        "llama-rope-freqs",
        "qwen3",
        "gemma3",
        "phi3",
    ];

    fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.d_model / self.n_heads.max(1))
    }

    fn check(&self) -> Result<(), TestGenError> {
        let bad = |why: &str| Err(TestGenError::BadSpec(why.to_owned()));
        if self.n_heads == 0
            || self.n_kv_heads == 0
            || (self.head_dim.is_none() && !self.d_model.is_multiple_of(self.n_heads))
        {
            return bad("n_heads must divide d_model");
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad("n_kv_heads must divide n_heads");
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad("the head dimension must be even for RoPE");
        }
        if self.vocab < FIRST_MERGED || self.n_layers == 0 || self.ffn == 0 {
            return bad("need vocab >= 259 and at least one layer and FFN unit");
        }
        if let Some(f) = &self.rope_freq_factors
            && f.len() != self.head_dim() / 2
        {
            return bad("one RoPE frequency factor per rotated pair");
        }
        Ok(())
    }
}

/// Why a test model could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum TestGenError {
    /// Inconsistent shape.
    #[error("bad test model spec: {0}")]
    BadSpec(String),
    /// A row length the chosen weight type cannot hold.
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// The writer refused a tensor.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// Writing the file failed.
    #[error("cannot write test model: {0}")]
    Io(#[from] std::io::Error),
}

/// The control tokens, at ids 0, 1 and 2 as in SmolLM2.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// Id of the first byte token; byte `b` is token `BYTE_TOKENS_START + b`.
pub const BYTE_TOKENS_START: usize = SPECIAL_TOKENS.len();
const FIRST_MERGED: usize = BYTE_TOKENS_START + 256;

/// The text the merges are learnt from: enough English for a few hundred merges.
const CORPUS: &str = "The sky is blue. The sun is bright and the clouds are white. \
A quick brown fox jumps over the lazy dog. Hello, world! Hello there, how are you today? \
I am fine, thank you. The weather is nice and the sky is clear. In the morning the sun \
rises in the east, and in the evening it sets in the west. Numbers: 0 1 2 3 4 5 6 7 8 9 \
10 100 2024. Once upon a time there was a little model that wanted to talk. It learned \
words and sentences, and then it learned to answer questions about the world. What is \
the capital of France? The capital of France is Paris. What is two plus two? Two plus \
two is four. The cat sat on the mat. The dog ran in the park with the children. \
Language models predict the next token from the previous tokens. They are trained on \
large amounts of text from books, articles and the internet. This is a test of the \
tokenizer and the model. Testing, testing, one two three. The end.";

/// GPT-2's byte-to-unicode map: printable bytes stand for themselves, the others are
/// shifted to code points from 256 up, so every token is printable text.
pub fn byte_to_unicode(b: u8) -> char {
    let printable = |c: u8| (33..=126).contains(&c) || (161..=172).contains(&c) || c >= 174;
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// The vocabulary of a spec: (tokens, token types, merges).
///
/// Token types are llama.cpp's: 1 normal, 3 control. Merges are learnt greedily from
/// the built-in `CORPUS` (most frequent adjacent pair first, ties broken by the pair's
/// text) until the vocabulary is full; if the corpus runs out, the rest are reserved
/// control tokens.
pub fn test_vocab(vocab: usize) -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = SPECIAL_TOKENS.iter().map(|s| (*s).to_owned()).collect();
    let mut types = vec![3i32; SPECIAL_TOKENS.len()];
    for b in 0..=255u8 {
        tokens.push(byte_to_unicode(b).to_string());
        types.push(1);
    }
    // Words as GPT-2 splits them, a leading space kept on the word ('Ġ').
    let mut words: Vec<Vec<String>> = Vec::new();
    for (i, w) in CORPUS.split(' ').enumerate() {
        let text = if i == 0 {
            w.to_owned()
        } else {
            format!(" {w}")
        };
        words.push(
            text.bytes()
                .map(|b| byte_to_unicode(b).to_string())
                .collect(),
        );
    }
    let mut merges = Vec::new();
    while tokens.len() < vocab {
        let mut counts: std::collections::BTreeMap<(&str, &str), usize> = Default::default();
        for w in &words {
            for p in w.windows(2) {
                *counts.entry((&p[0], &p[1])).or_default() += 1;
            }
        }
        let Some(((a, b), _)) = counts
            .into_iter()
            .min_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)))
        else {
            break;
        };
        let (a, b) = (a.to_owned(), b.to_owned());
        let joined = format!("{a}{b}");
        for w in &mut words {
            let mut i = 0;
            while i + 1 < w.len() {
                if w[i] == a && w[i + 1] == b {
                    w[i] = joined.clone();
                    w.remove(i + 1);
                }
                i += 1;
            }
        }
        merges.push(format!("{a} {b}"));
        tokens.push(joined);
        types.push(1);
    }
    while tokens.len() < vocab {
        tokens.push(format!("<|reserved_{}|>", tokens.len()));
        types.push(3);
    }
    (tokens, types, merges)
}

/// splitmix64: tiny, seedable, and good enough for test weights.
#[derive(Debug, Clone)]
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

const CHAT_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The bytes of the GGUF v3 file for `spec`.
pub fn test_model_bytes(spec: &TestModelSpec) -> Result<Vec<u8>, TestGenError> {
    Ok(test_model_writer(spec, &|_| true)?.to_bytes())
}

/// Writes to `path` the GGUF file for `spec` whose blocks' matrices are random only
/// in the blocks `random` picks, and zero in the others: a file past 4 GiB (what a
/// browser's wasm32 memory addresses) in seconds, where random values everywhere
/// would take minutes in a test build. The zero blocks add nothing to the residual
/// stream, but still run every kernel; the embedding, the output matrix and the
/// random blocks decide the tokens.
pub fn write_large_test_model(
    spec: &TestModelSpec,
    random: &dyn Fn(usize) -> bool,
    path: impl AsRef<std::path::Path>,
) -> Result<(), TestGenError> {
    let w = test_model_writer(spec, random)?;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    w.write_to(&mut out)?;
    std::io::Write::flush(&mut out)?;
    Ok(())
}

/// The writer of [`test_model_bytes`], with the blocks' matrices zero where `random`
/// answers false (see [`write_large_test_model`]).
fn test_model_writer(
    spec: &TestModelSpec,
    random: &dyn Fn(usize) -> bool,
) -> Result<GgufWriter, TestGenError> {
    spec.check()?;
    let s = spec;
    let mut w = GgufWriter::new();
    let u32v = |v: usize| MetaValue::U32(v as u32);
    let string = |v: &str| MetaValue::String(v.to_owned());
    let arch = s.family.name();
    w.add("general.architecture", string(arch));
    w.add("general.name", string("acs test model"));
    w.add(
        "general.file_type",
        MetaValue::U32(file_type(s.weight_type)),
    );
    w.add("general.quantization_version", MetaValue::U32(2));
    w.add(format!("{arch}.block_count"), u32v(s.n_layers));
    w.add(format!("{arch}.context_length"), u32v(s.ctx));
    w.add(format!("{arch}.embedding_length"), u32v(s.d_model));
    w.add(format!("{arch}.feed_forward_length"), u32v(s.ffn));
    w.add(format!("{arch}.attention.head_count"), u32v(s.n_heads));
    w.add(
        format!("{arch}.attention.head_count_kv"),
        u32v(s.n_kv_heads),
    );
    w.add(
        format!("{arch}.rope.freq_base"),
        MetaValue::F32(s.rope_base),
    );
    w.add(
        format!("{arch}.attention.layer_norm_rms_epsilon"),
        MetaValue::F32(s.rms_eps),
    );
    w.add(format!("{arch}.rope.dimension_count"), u32v(s.head_dim()));
    if let Some(hd) = s.head_dim {
        w.add(format!("{arch}.attention.key_length"), u32v(hd));
        w.add(format!("{arch}.attention.value_length"), u32v(hd));
    }
    if let Some((window, period)) = s.sliding_window {
        w.add(format!("{arch}.attention.sliding_window"), u32v(window));
        w.add(
            format!("{arch}.attention.sliding_window_pattern"),
            u32v(period),
        );
    }
    w.add(format!("{arch}.vocab_size"), u32v(s.vocab));
    let (tokens, types, merges) = test_vocab(s.vocab);
    w.add("tokenizer.ggml.model", string("gpt2"));
    let pre = match s.family {
        Family::Llama => "smollm",
        Family::Qwen2 | Family::Qwen3 => "qwen2",
        // Gemma's own files carry a SentencePiece vocabulary; the test vocabulary is
        // byte-level BPE for every family.
        Family::Gemma3 | Family::Phi3 => "default",
    };
    w.add("tokenizer.ggml.pre", string(pre));
    w.add(
        "tokenizer.ggml.tokens",
        MetaValue::Array(MetaArray::String(tokens)),
    );
    w.add(
        "tokenizer.ggml.token_type",
        MetaValue::Array(MetaArray::I32(types)),
    );
    w.add(
        "tokenizer.ggml.merges",
        MetaValue::Array(MetaArray::String(merges)),
    );
    w.add("tokenizer.ggml.bos_token_id", MetaValue::U32(1));
    w.add("tokenizer.ggml.eos_token_id", MetaValue::U32(2));
    w.add("tokenizer.ggml.unknown_token_id", MetaValue::U32(0));
    w.add("tokenizer.ggml.padding_token_id", MetaValue::U32(2));
    w.add("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    w.add("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false));
    w.add("tokenizer.chat_template", string(CHAT_TEMPLATE));

    let mut rng = SplitMix(s.seed);
    let kv_dim = s.head_dim() * s.n_kv_heads;
    let q_dim = s.head_dim() * s.n_heads;
    let recipe = s.family.recipe();
    let zero = std::cell::Cell::new(false);
    let mut matrix = |w: &mut GgufWriter, name: &str, cols: usize, rows: usize, ty: GgmlType| {
        if zero.get() {
            // Zero bytes are zero values in every format (a block's scale is 0).
            let bytes = vec![0u8; ty.row_bytes(cols)? * rows];
            w.add_tensor(name, &[cols as u64, rows as u64], ty, bytes)?;
            return Ok(());
        }
        let scale = (3.0 / cols as f32).sqrt(); // uniform with variance 1/cols
        let vals: Vec<f32> = (0..cols * rows).map(|_| rng.uniform() * scale).collect();
        let rb = ty.row_bytes(cols)?;
        let mut bytes = vec![0u8; rb * rows];
        for (r, b) in vals.chunks_exact(cols).zip(bytes.chunks_exact_mut(rb)) {
            quantize_row(ty, r, b)?;
        }
        w.add_tensor(name, &[cols as u64, rows as u64], ty, bytes)?;
        Ok::<(), TestGenError>(())
    };
    matrix(
        &mut w,
        "token_embd.weight",
        s.d_model,
        s.vocab,
        s.embed_type,
    )?;
    let norm_of = |w: &mut GgufWriter, name: &str, len: usize, rng: &mut SplitMix| {
        let bytes: Vec<u8> = (0..len)
            .flat_map(|_| (1.0 + 0.1 * rng.uniform()).to_le_bytes())
            .collect();
        w.add_tensor(name, &[len as u64], GgmlType::F32, bytes)
    };
    let norm =
        |w: &mut GgufWriter, name: &str, rng: &mut SplitMix| norm_of(w, name, s.d_model, rng);
    let mut norm_rng = SplitMix(s.seed ^ 0x5eed);
    for l in 0..s.n_layers {
        zero.set(!random(l));
        let n = |t: &str| format!("blk.{l}.{t}.weight");
        let wt = s.weight_type;
        let vt = s.value_down_type.unwrap_or(wt);
        norm(&mut w, &n("attn_norm"), &mut norm_rng)?;
        if recipe.fused {
            matrix(&mut w, &n("attn_qkv"), s.d_model, q_dim + 2 * kv_dim, wt)?;
        } else {
            matrix(&mut w, &n("attn_q"), s.d_model, q_dim, wt)?;
            matrix(&mut w, &n("attn_k"), s.d_model, kv_dim, wt)?;
            matrix(&mut w, &n("attn_v"), s.d_model, kv_dim, vt)?;
        }
        if recipe.qkv_bias {
            for (part, len) in [("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)] {
                let bytes: Vec<u8> = (0..len)
                    .flat_map(|_| (0.5 * norm_rng.uniform()).to_le_bytes())
                    .collect();
                let name = format!("blk.{l}.{part}.bias");
                w.add_tensor(&name, &[len as u64], GgmlType::F32, bytes)?;
            }
        }
        if recipe.qk_norm {
            norm_of(&mut w, &n("attn_q_norm"), s.head_dim(), &mut norm_rng)?;
            norm_of(&mut w, &n("attn_k_norm"), s.head_dim(), &mut norm_rng)?;
        }
        matrix(&mut w, &n("attn_output"), q_dim, s.d_model, wt)?;
        if recipe.post_norms {
            norm(&mut w, &n("post_attention_norm"), &mut norm_rng)?;
            norm(&mut w, &n("post_ffw_norm"), &mut norm_rng)?;
        }
        norm(&mut w, &n("ffn_norm"), &mut norm_rng)?;
        if recipe.fused {
            matrix(&mut w, &n("ffn_up"), s.d_model, 2 * s.ffn, wt)?;
        } else {
            matrix(&mut w, &n("ffn_gate"), s.d_model, s.ffn, wt)?;
            matrix(&mut w, &n("ffn_up"), s.d_model, s.ffn, wt)?;
        }
        matrix(&mut w, &n("ffn_down"), s.ffn, s.d_model, vt)?;
    }
    zero.set(false);
    norm(&mut w, "output_norm.weight", &mut norm_rng)?;
    if let Some(f) = &s.rope_freq_factors {
        let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.add_tensor("rope_freqs.weight", &[f.len() as u64], GgmlType::F32, bytes)?;
    }
    if !s.tied {
        matrix(&mut w, "output.weight", s.d_model, s.vocab, s.embed_type)?;
    }
    Ok(w)
}

/// llama.cpp's `general.file_type` for a model whose matrices are all `ty`.
fn file_type(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q5_0 => 8,
        GgmlType::Q5_1 => 9,
        GgmlType::Q8_0 => 7,
        GgmlType::Q2_K => 10,
        GgmlType::Q3_K => 11,
        GgmlType::Q4_K => 15,
        GgmlType::Q5_K => 17,
        GgmlType::Q6_K => 18,
        GgmlType::BF16 => 32,
        GgmlType::IQ4_NL => 25,
        GgmlType::IQ4_XS => 30,
        _ => 0,
    }
}

/// Writes the GGUF file for `spec` to `path`.
pub fn write_test_model(
    spec: &TestModelSpec,
    path: impl AsRef<std::path::Path>,
) -> Result<(), TestGenError> {
    std::fs::write(path, test_model_bytes(spec)?)?;
    Ok(())
}

/// The default model for the tests that need real text: `$ACS_TEST_MODEL`, else the
/// model cache. Panics, so that such a test fails rather than skips, when it is absent.
#[cfg(not(target_arch = "wasm32"))]
pub fn default_model_for_tests() -> std::path::PathBuf {
    let path = std::env::var_os("ACS_TEST_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| model_cache_dir().join(DEFAULT_MODEL_FILE));
    assert!(
        path.exists(),
        "default model missing at {}: run scripts/fetch-model.sh",
        path.display()
    );
    path
}

/// Gemma 3 270M Q4_K_M for the tests that need a second real model:
/// `$ACS_GEMMA3_MODEL`, else the model cache. Panics, so that such a test fails rather
/// than skips, when it is absent.
#[cfg(not(target_arch = "wasm32"))]
pub fn gemma3_model_for_tests() -> std::path::PathBuf {
    let path = std::env::var_os("ACS_GEMMA3_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| model_cache_dir().join("gemma-3-270m-q4_k_m.gguf"));
    assert!(
        path.exists(),
        "Gemma 3 270M missing at {}: run scripts/fetch-gemma3.sh",
        path.display()
    );
    path
}
