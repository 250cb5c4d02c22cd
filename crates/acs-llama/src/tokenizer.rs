//! The model's own tokenizer, built from the `tokenizer.ggml.*` metadata of a GGUF file.
//!
//! The weights were trained on one exact tokenization, and llama.cpp is the reference
//! that GGUF files are converted for, so the aim is llama.cpp's token ids for the same
//! text. Two vocabulary families are supported, under llama.cpp's names:
//!
//! - `gpt2`: byte-level BPE (SmolLM2, Llama 3, Qwen2, …). The text is split by the
//!   regexes that `tokenizer.ggml.pre` selects, each piece's bytes are written as
//!   printable characters (GPT-2's byte-to-unicode table) and merged by merge rank. This
//!   runs on the `tokenizers` crate: its BPE model and its Split and ByteLevel
//!   pre-tokenizers.
//! - `llama`: SentencePiece BPE (Llama 2, TinyLlama, …). Spaces become `▁`, characters
//!   merge by the score of the token they form, and characters without a token fall back
//!   to `<0xNN>` byte tokens. Hand-written, because a GGUF stores scores rather than
//!   merges and the `tokenizers` BPE merges by rank.
//!
//! Control and user-defined tokens (`<|im_start|>` and the like) are split out of the text
//! before either model sees it, as llama.cpp does.
//!
//! Not covered, as no supported model needs them yet: llama.cpp's other vocabulary types
//! (WordPiece, Unigram, RWKV), some pre-tokenizers with hand-made character classes
//! (chameleon, tekken, chatglm), per-token lstrip/rstrip attributes, and the
//! clean-up of spaces before punctuation that llama.cpp's detokenizer does for some
//! vocabularies.

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::fmt;

use thiserror::Error;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    Model as _, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer,
    SplitDelimiterBehavior,
};

/// The tokenizer metadata of a GGUF file, one field per `tokenizer.ggml.*` key.
///
/// A plain struct rather than a GGUF object, so that the tokenizer can be built and
/// tested from any source of the same facts. Absent keys are `None` or empty; the
/// defaults llama.cpp applies to them are applied by [`Tokenizer::from_spec`].
#[derive(Debug, Clone, Default)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer of a `gpt2` vocabulary (`"smollm"`,
    /// `"llama-bpe"`, …). Absent means llama.cpp's `"default"`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the text of each token, by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: one code per token (see [`TokenKind::from_gguf`]);
    /// empty means every token is normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.scores`: SentencePiece merge scores; empty means all zero.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.merges`: byte-level BPE merges, `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`. Absent: true for SentencePiece and for the Llama 3
    /// pre-tokenizers, false for other `gpt2` vocabularies (llama.cpp's defaults).
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`. Absent: false.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`: whether SentencePiece text gets a leading space.
    /// Absent: true. Byte-level BPE never adds one.
    pub add_space_prefix: Option<bool>,
}

/// What a token is, from `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// Ordinary text.
    Normal,
    /// The unknown-token placeholder.
    Unknown,
    /// A control token (`<|im_start|>`, `</s>`): structure, not text.
    Control,
    /// A token added to the vocabulary whose text is always matched whole.
    UserDefined,
    /// A reserved slot that no text encodes to.
    Unused,
    /// A SentencePiece byte-fallback token `<0xNN>`.
    Byte,
    /// Any other code (0 in GGUF, or out of range).
    Undefined,
}

impl TokenKind {
    /// The kind for a GGUF token-type code (1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte).
    pub fn from_gguf(code: i32) -> Self {
        match code {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }
}

/// Why a tokenizer could not be built, or a text not encoded.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("unknown tokenizer model {0:?} (supported: \"gpt2\", \"llama\")")]
    UnknownModel(String),
    #[error("unsupported pre-tokenizer {0:?}")]
    UnknownPreTokenizer(String),
    #[error("the vocabulary is empty")]
    EmptyVocabulary,
    #[error("{what} has {found} entries but the vocabulary has {expected} tokens")]
    LengthMismatch {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("token {id} repeats the text of an earlier token: {text:?}")]
    DuplicateToken { id: u32, text: String },
    #[error("the {name} token id {id} is outside the vocabulary of {vocab_size} tokens")]
    SpecialOutOfRange {
        name: &'static str,
        id: u32,
        vocab_size: usize,
    },
    #[error("merge {index} is not two tokens separated by a space: {merge:?}")]
    BadMerge { index: usize, merge: String },
    #[error("the byte-level BPE model could not be built")]
    BuildBpe(#[source] tokenizers::Error),
    #[error("the pre-tokenizer regex {pattern:?} is invalid")]
    BadRegex {
        pattern: &'static str,
        #[source]
        source: tokenizers::Error,
    },
    #[error("byte-level BPE encoding failed")]
    Encode(#[source] tokenizers::Error),
    #[error("the vocabulary has neither a byte token <0x{0:02X}> nor an unknown token")]
    MissingByteToken(u8),
}

/// A tokenizer for one model's vocabulary: text to token ids and back.
pub struct Tokenizer {
    tokens: Vec<String>,
    kinds: Vec<TokenKind>,
    /// The bytes each token decodes to, computed once: empty for control, unknown and
    /// unused tokens.
    pieces: Vec<Box<[u8]>>,
    ids: HashMap<String, u32>,
    /// Tokens matched whole in the text before the model runs, longest text first (the
    /// order llama.cpp tries them in).
    specials: Vec<u32>,
    model: Model,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<u32>,
}

/// Token texts that end a turn or a document. llama.cpp finds end-of-generation tokens by
/// these texts because GGUF files name only one EOS, while chat models stop on others.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<｜end▁of▁sentence｜>",
];

/// GPT-2's split: contractions, letters, numbers, other symbols, whitespace.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's split: case-insensitive contractions, numbers in groups of up to three.
const LLAMA3_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: Llama 3's with single digits.
const QWEN2_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// BLOOM's split: runs up to whitespace or punctuation.
const BLOOM_PATTERN: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
const SINGLE_DIGIT: &str = r"\p{N}";
/// DeepSeek LLM's splits, in turn (llama.cpp's table): line breaks, runs of the cased
/// letters of Latin, Greek, Cyrillic and other alphabets with their optional leading
/// space, runs of ASCII and full-width punctuation, trailing whitespace, runs of CJK
/// ideographs and Hangul, runs of digits.
const DEEPSEEK_LLM: &[&str] = &[
    "[\r\n]",
    "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+",
    "\\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+",
    "\\s+$",
    "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
    "\\p{N}+",
];
/// DeepSeek Coder's splits, in turn: line breaks, letters, punctuation (each run with
/// its optional leading space), CJK ideographs and Hangul, single digits.
const DEEPSEEK_CODER: &[&str] = &[
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
    "\\p{N}",
];

/// How a `gpt2` vocabulary's `tokenizer.ggml.pre` is tokenized, from llama.cpp's table.
struct PreTokenizerRule {
    /// Applied in turn; each splits the pieces the previous one left, keeping every part.
    patterns: &'static [&'static str],
    /// Take a whole pre-tokenized word when it is a token, before merging.
    ignore_merges: bool,
    add_bos: bool,
}

impl PreTokenizerRule {
    fn for_name(name: &str) -> Result<Self, TokenizerError> {
        let rule = |patterns, ignore_merges, add_bos| Self {
            patterns,
            ignore_merges,
            add_bos,
        };
        Ok(match name {
            "default" => rule(
                &[
                    r"[\p{P}\$\+<=>\^~\|]+",
                    GPT2_PATTERN,
                    r"\p{N}+",
                    "[0-9][0-9][0-9]",
                ],
                false,
                false,
            ),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" => rule(&[LLAMA3_PATTERN], true, true),
            "dbrx" | "smaug-bpe" => rule(&[LLAMA3_PATTERN], false, false),
            "falcon" => rule(
                &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_PATTERN, "[0-9][0-9][0-9]"],
                false,
                false,
            ),
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" => rule(&[SINGLE_DIGIT, GPT2_PATTERN], false, false),
            "gpt-2" | "phi-2" | "roberta-bpe" | "gigachat" | "jina-es" | "jina-de"
            | "jina-v1-en" | "jina-v2-es" | "jina-v2-de" | "jina-v2-code" | "mpt" | "olmo"
            | "jais" => rule(&[GPT2_PATTERN], false, false),
            "qwen2" | "stablelm2" | "megrez" => rule(&[QWEN2_PATTERN], false, false),
            "poro-chat" | "bloom" | "gpt3-finnish" => rule(&[BLOOM_PATTERN], false, false),
            "viking" => rule(&[BLOOM_PATTERN, SINGLE_DIGIT], false, false),
            "deepseek-llm" => rule(DEEPSEEK_LLM, false, true),
            "deepseek-coder" => rule(DEEPSEEK_CODER, false, true),
            other => return Err(TokenizerError::UnknownPreTokenizer(other.to_owned())),
        })
    }
}

/// The part of tokenization that differs between vocabulary families.
enum Model {
    ByteLevelBpe {
        /// Boxed: it is far larger than the SentencePiece variant.
        bpe: Box<BPE>,
        pre_tokenizer: Sequence,
    },
    SentencePiece {
        scores: Vec<f32>,
        /// The `<0xNN>` token of each byte, for characters that have no token.
        byte_tokens: Box<[Option<u32>; 256]>,
        add_space_prefix: bool,
    },
}

/// A stretch of the input: text for the model, or a special token matched whole.
#[derive(Clone, Copy)]
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

impl Tokenizer {
    /// Builds the tokenizer, checking that the metadata is consistent.
    pub fn from_spec(spec: TokenizerSpec) -> Result<Self, TokenizerError> {
        let TokenizerSpec {
            model,
            pre,
            tokens,
            token_types,
            scores,
            merges,
            bos,
            eos,
            unk,
            pad,
            add_bos,
            add_eos,
            add_space_prefix,
        } = spec;
        let n = tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocabulary);
        }
        for (what, found) in [("token_type", token_types.len()), ("scores", scores.len())] {
            if found != 0 && found != n {
                return Err(TokenizerError::LengthMismatch {
                    what,
                    expected: n,
                    found,
                });
            }
        }
        let mut ids = HashMap::with_capacity(n);
        for (id, text) in tokens.iter().enumerate() {
            if ids.insert(text.clone(), id as u32).is_some() {
                return Err(TokenizerError::DuplicateToken {
                    id: id as u32,
                    text: text.clone(),
                });
            }
        }
        let check = |name: &'static str, id: Option<u32>| match id {
            Some(id) if id as usize >= n => Err(TokenizerError::SpecialOutOfRange {
                name,
                id,
                vocab_size: n,
            }),
            _ => Ok(id),
        };
        let (bos, eos, unk, pad) = (
            check("BOS", bos)?,
            check("EOS", eos)?,
            check("unknown", unk)?,
            check("padding", pad)?,
        );

        let mut kinds: Vec<TokenKind> = if token_types.is_empty() {
            vec![TokenKind::Normal; n]
        } else {
            token_types
                .iter()
                .copied()
                .map(TokenKind::from_gguf)
                .collect()
        };

        let (model, bos, eos, unk, add_bos) = match model.as_str() {
            "gpt2" => {
                let rule = PreTokenizerRule::for_name(pre.as_deref().unwrap_or("default"))?;
                let model = byte_level_bpe(&tokens, merges, &rule)?;
                (model, bos, eos, unk, add_bos.unwrap_or(rule.add_bos))
            }
            "llama" => {
                let byte_tokens = Box::new(std::array::from_fn(|byte| {
                    ids.get(&format!("<0x{byte:02X}>")).copied()
                }));
                let scores = if scores.is_empty() {
                    vec![0.0; n]
                } else {
                    scores
                };
                let model = Model::SentencePiece {
                    scores,
                    byte_tokens,
                    add_space_prefix: add_space_prefix.unwrap_or(true),
                };
                // SentencePiece's conventional ids, which llama.cpp assumes when absent.
                let default = |id: u32| (id < n as u32).then_some(id);
                (
                    model,
                    bos.or_else(|| default(1)),
                    eos.or_else(|| default(2)),
                    unk.or_else(|| default(0)),
                    add_bos.unwrap_or(true),
                )
            }
            other => return Err(TokenizerError::UnknownModel(other.to_owned())),
        };

        // End-of-generation tokens are control tokens even where a converter forgot to
        // mark them (as llama.cpp forces too): they print nothing, and plain user text
        // cannot produce them.
        let mut eog: BTreeSet<u32> = eos.into_iter().collect();
        for text in END_OF_GENERATION_TEXTS {
            if let Some(&id) = ids.get(*text) {
                eog.insert(id);
                kinds[id as usize] = TokenKind::Control;
            }
        }

        let pieces = model.pieces(&tokens, &kinds);
        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                matches!(
                    kinds[id as usize],
                    TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
                ) && !tokens[id as usize].is_empty()
            })
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(tokens[id as usize].len()));

        Ok(Self {
            tokens,
            kinds,
            pieces,
            ids,
            specials,
            model,
            bos,
            eos,
            unk,
            pad,
            add_bos,
            add_eos: add_eos.unwrap_or(false),
            eog: eog.into_iter().collect(),
        })
    }

    /// Encodes `text` to token ids.
    ///
    /// `add_special` adds BOS (and EOS) where the vocabulary asks for them.
    /// `parse_special` lets the text spell control tokens such as `<|im_start|>`; without
    /// it they are encoded as plain characters, so user text cannot forge turn markers.
    /// User-defined tokens are matched whole either way, as in llama.cpp.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        // SentencePiece puts its leading space on text that starts the input or follows a
        // special token.
        let mut after_special = true;
        for fragment in self.split_special(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(piece) => {
                    self.encode_text(piece, after_special, &mut out)?;
                    after_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
    }

    /// Decodes token ids to text, replacing invalid UTF-8 with U+FFFD. Control tokens
    /// produce nothing. For SentencePiece the leading space that [`Tokenizer::encode`]
    /// adds is removed again, so that decoding an encoded text gives the text back.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| self.token_bytes(id))
            .copied()
            .collect();
        if let Model::SentencePiece {
            add_space_prefix: true,
            ..
        } = self.model
            && bytes.first() == Some(&b' ')
        {
            bytes.remove(0);
        }
        match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        }
    }

    /// The bytes token `id` contributes to decoded text: possibly part of a UTF-8
    /// character, empty for control, unknown and unused tokens and for ids outside the
    /// vocabulary. A control token's name is [`Tokenizer::token_text`].
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], |piece| piece)
    }

    /// The text of token `id` as the vocabulary stores it (byte-level BPE tokens in their
    /// printable-character form, SentencePiece tokens with `▁`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose stored text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// What token `id` is; `None` outside the vocabulary.
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// Whether `id` is a control token (structure rather than text).
    pub fn is_control(&self, id: u32) -> bool {
        self.token_kind(id) == Some(TokenKind::Control)
    }

    /// Whether generating `id` ends the generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation tokens, ascending: EOS plus the end-of-turn tokens the
    /// vocabulary has (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, …).
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// The number of tokens, which is the number of logits the model produces.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// Whether `encode(_, add_special: true, _)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// Whether `encode(_, add_special: true, _)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos && self.eos.is_some()
    }

    /// Splits special tokens out of `text` as llama.cpp does: each special token in turn,
    /// longest first, is cut out of every remaining stretch of text. Control and unknown
    /// tokens take part only when `parse_special` is set.
    fn split_special<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut fragments = Vec::new();
        if text.is_empty() {
            return fragments;
        }
        fragments.push(Fragment::Text(text));
        for &id in &self.specials {
            let kind = self.kinds[id as usize];
            if !parse_special && matches!(kind, TokenKind::Control | TokenKind::Unknown) {
                continue;
            }
            let needle = self.tokens[id as usize].as_str();
            let found = fragments
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(needle)));
            if !found {
                continue;
            }
            let mut split = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(mut rest) = fragment else {
                    split.push(fragment);
                    continue;
                };
                while let Some(at) = rest.find(needle) {
                    if at > 0 {
                        split.push(Fragment::Text(&rest[..at]));
                    }
                    split.push(Fragment::Token(id));
                    rest = &rest[at + needle.len()..];
                }
                if !rest.is_empty() {
                    split.push(Fragment::Text(rest));
                }
            }
            fragments = split;
        }
        fragments
    }

    fn encode_text(
        &self,
        text: &str,
        after_special: bool,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        match &self.model {
            Model::ByteLevelBpe { bpe, pre_tokenizer } => {
                let mut words = PreTokenizedString::from(text);
                pre_tokenizer
                    .pre_tokenize(&mut words)
                    .map_err(TokenizerError::Encode)?;
                for (word, _, _) in words.get_splits(OffsetReferential::Original, OffsetType::None)
                {
                    let tokens = bpe.tokenize(word).map_err(TokenizerError::Encode)?;
                    out.extend(tokens.iter().map(|token| token.id));
                }
                Ok(())
            }
            Model::SentencePiece {
                scores,
                byte_tokens,
                add_space_prefix,
            } => {
                let mut escaped = String::with_capacity(text.len() + 3);
                if *add_space_prefix && after_special {
                    escaped.push('▁');
                }
                escaped.extend(text.chars().map(|c| if c == ' ' { '▁' } else { c }));
                self.sentencepiece(&escaped, scores, byte_tokens, out)
            }
        }
    }

    /// SentencePiece BPE over one escaped text: start from single characters, repeatedly
    /// merge the adjacent pair whose concatenation is the token with the highest score
    /// (leftmost on ties), then emit each symbol's token or, failing that, its bytes.
    fn sentencepiece(
        &self,
        text: &str,
        scores: &[f32],
        byte_tokens: &[Option<u32>; 256],
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let count = text.chars().count();
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .enumerate()
            .map(|(i, (start, c))| Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: (i + 1 < count).then_some(i + 1),
            })
            .collect();
        let mut queue = BinaryHeap::new();
        let push_pair = |symbols: &[Symbol],
                         queue: &mut BinaryHeap<Pair>,
                         left: Option<usize>,
                         right: Option<usize>| {
            let (Some(left), Some(right)) = (left, right) else {
                return;
            };
            let (l, r): (&Symbol, &Symbol) = (&symbols[left], &symbols[right]);
            let len = l.len + r.len;
            if let Some(&id) = self.ids.get(&text[l.start..l.start + len]) {
                queue.push(Pair {
                    score: scores[id as usize],
                    left,
                    right,
                    len,
                });
            }
        };
        for i in 1..count {
            push_pair(&symbols, &mut queue, Some(i - 1), Some(i));
        }
        while let Some(pair) = queue.pop() {
            let (left, right) = (symbols[pair.left], symbols[pair.right]);
            // A pair is stale once either side has been merged into something else.
            if left.len == 0 || right.len == 0 || left.len + right.len != pair.len {
                continue;
            }
            symbols[pair.left].len = pair.len;
            symbols[pair.left].next = right.next;
            symbols[pair.right].len = 0;
            if let Some(next) = right.next {
                symbols[next].prev = Some(pair.left);
            }
            push_pair(&symbols, &mut queue, left.prev, Some(pair.left));
            push_pair(&symbols, &mut queue, Some(pair.left), right.next);
        }
        // Every merge formed a token, so a symbol without a token is a single character
        // that the vocabulary lacks: it falls back to byte tokens.
        let mut at = (count > 0).then_some(0);
        while let Some(i) = at {
            let symbol = symbols[i];
            let piece = &text[symbol.start..symbol.start + symbol.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for byte in piece.bytes() {
                        let id = byte_tokens[byte as usize]
                            .or(self.unk)
                            .ok_or(TokenizerError::MissingByteToken(byte))?;
                        out.push(id);
                    }
                }
            }
            at = symbol.next;
        }
        Ok(())
    }
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let model = match self.model {
            Model::ByteLevelBpe { .. } => "byte-level BPE",
            Model::SentencePiece { .. } => "SentencePiece BPE",
        };
        f.debug_struct("Tokenizer")
            .field("model", &model)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

impl Model {
    /// The bytes each token decodes to, following llama.cpp's `token_to_piece`.
    fn pieces(&self, tokens: &[String], kinds: &[TokenKind]) -> Vec<Box<[u8]>> {
        let char_to_byte: HashMap<char, u8> =
            byte_to_char_table().into_iter().zip(0u8..=255).collect();
        let piece = |text: &str, kind| -> Box<[u8]> {
            match (self, kind) {
                (_, TokenKind::UserDefined) => text.as_bytes().into(),
                // A character outside the table (which no well-formed vocabulary has)
                // stands for its own UTF-8.
                (Model::ByteLevelBpe { .. }, TokenKind::Normal) => {
                    let mut bytes = Vec::with_capacity(text.len());
                    for c in text.chars() {
                        match char_to_byte.get(&c) {
                            Some(&byte) => bytes.push(byte),
                            None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    bytes.into()
                }
                (Model::SentencePiece { .. }, TokenKind::Normal) => {
                    text.replace('▁', " ").into_bytes().into()
                }
                (Model::SentencePiece { .. }, TokenKind::Byte) => text
                    .strip_prefix("<0x")
                    .and_then(|hex| hex.strip_suffix('>'))
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                    .map_or_else(|| Box::from([]), |byte| Box::from([byte])),
                _ => Box::from([]),
            }
        };
        tokens
            .iter()
            .zip(kinds)
            .map(|(text, &kind)| piece(text, kind))
            .collect()
    }
}

/// One symbol of the SentencePiece merge: a byte range of the text, linked to its
/// neighbours; merged-away symbols have length 0.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate SentencePiece merge; the queue pops the highest score, then the leftmost.
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Pair {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

fn byte_level_bpe(
    tokens: &[String],
    merges: Vec<String>,
    rule: &PreTokenizerRule,
) -> Result<Model, TokenizerError> {
    let vocab: ahash::AHashMap<String, u32> = tokens
        .iter()
        .enumerate()
        .map(|(id, text)| (text.clone(), id as u32))
        .collect();
    let merges = merges
        .into_iter()
        .enumerate()
        .map(|(index, merge)| {
            // The separator is the first space after the first character, as llama.cpp
            // reads it.
            match merge.char_indices().skip(1).find(|&(_, c)| c == ' ') {
                Some((at, _)) => Ok((merge[..at].to_owned(), merge[at + 1..].to_owned())),
                None => Err(TokenizerError::BadMerge { index, merge }),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(rule.ignore_merges)
        .build()
        .map_err(TokenizerError::BuildBpe)?;
    let mut steps = rule
        .patterns
        .iter()
        .map(|&pattern| {
            Split::new(
                SplitPattern::Regex(pattern.to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map(PreTokenizerWrapper::Split)
            .map_err(|source| TokenizerError::BadRegex { pattern, source })
        })
        .collect::<Result<Vec<_>, _>>()?;
    // The regexes have split already; ByteLevel only maps bytes to characters.
    steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, false, false,
    )));
    Ok(Model::ByteLevelBpe {
        bpe: Box::new(bpe),
        pre_tokenizer: Sequence::new(steps),
    })
}

/// GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the
/// other bytes take the characters from U+0100 up, in byte order. Byte-level vocabularies
/// store token text in this form so that every token is printable.
fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (byte, slot) in (0u8..=255).zip(table.iter_mut()) {
        let printable = matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        *slot = if printable {
            char::from(byte)
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
    }
    table
}

/// Turns a stream of token ids into text, emitting only complete UTF-8 characters.
///
/// A byte-level or byte-fallback token can end in the middle of a character (an emoji is
/// often two or more tokens); the partial character is held back until the tokens that
/// complete it arrive, so every emitted chunk is valid text and the chunks concatenate to
/// [`Tokenizer::decode`] of the same ids (without SentencePiece's leading-space removal:
/// a stream continues text that came before it).
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds token `id` and returns the text it completes (often empty). Bytes that can
    /// never become valid UTF-8 come out as U+FFFD.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(tokenizer.token_bytes(id));
        // Find where the text stops being complete: skip invalid sequences (they will
        // print as U+FFFD) until an error that is only an unfinished character.
        let mut cut = self.pending.len();
        let mut start = 0;
        while let Err(err) = std::str::from_utf8(&self.pending[start..cut]) {
            match err.error_len() {
                Some(invalid) => start += err.valid_up_to() + invalid,
                None => {
                    cut = start + err.valid_up_to();
                    break;
                }
            }
        }
        let text = String::from_utf8_lossy(&self.pending[..cut]).into_owned();
        self.pending.drain(..cut);
        text
    }

    /// Whether a partial character is being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the stream: returns what was held back (a cut-off character as U+FFFD) and
    /// leaves the decoder empty for reuse.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}
