//! Byte-level BPE (`gpt2` vocabularies): a small vocabulary built here, and SmolLM2's
//! real one from the default model (see `acs_llama::testgen::default_model_for_tests`).
// Native only: it reads files (the browser runs tests/webgpu_browser.rs).
#![cfg(not(target_arch = "wasm32"))]

use std::sync::OnceLock;

use acs_llama::gguf::GgufFile;
use acs_llama::model::tokenizer_spec;
use acs_llama::tokenizer::{StreamDecoder, TokenKind, Tokenizer, TokenizerError, TokenizerSpec};

/// GPT-2's byte-to-character table, written out independently of the crate's.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (0x21..=0x7e)
        .chain(0xa1..=0xac)
        .chain(0xae..=0xff)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut next = 256;
    for byte in 0..256 {
        if !printable.contains(&byte) {
            printable.push(byte);
            chars.push(next);
            next += 1;
        }
    }
    let mut table = vec!['\0'; 256];
    for (byte, c) in printable.into_iter().zip(chars) {
        table[byte as usize] = char::from_u32(c).unwrap();
    }
    table
}

/// A byte-level vocabulary: specials, the 256 byte characters, then merged words.
fn tiny_spec(pre: &str) -> TokenizerSpec {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"]
        .map(String::from)
        .to_vec();
    let mut token_types = vec![3, 3, 3, 4];
    tokens.extend(byte_chars().into_iter().map(String::from));
    token_types.extend([1; 256]);
    let merges = [
        "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2",
    ];
    for merge in merges {
        tokens.push(merge.replace(' ', ""));
        token_types.push(1);
    }
    TokenizerSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types,
        merges: merges.map(String::from).to_vec(),
        ..TokenizerSpec::default()
    }
}

fn tiny(pre: &str) -> Tokenizer {
    Tokenizer::from_spec(tiny_spec(pre)).unwrap()
}

fn id(tokenizer: &Tokenizer, text: &str) -> u32 {
    tokenizer.token_id(text).unwrap()
}

#[test]
fn merges_apply_by_rank_within_pre_tokenized_words() {
    let t = tiny("gpt-2");
    let ids = t.encode("hello world", false, false).unwrap();
    assert_eq!(ids, [id(&t, "hello"), id(&t, "Ġworld")]);
    assert_eq!(t.decode(&ids), "hello world");
}

#[test]
fn pre_tokenizer_name_selects_the_split() {
    // "gpt-2" keeps " 123" together, so the "1 2" merge applies; "smollm" splits digits
    // one by one first.
    let gpt2 = tiny("gpt-2");
    let ids = gpt2.encode("a 123", false, false).unwrap();
    assert_eq!(
        ids,
        [
            id(&gpt2, "a"),
            id(&gpt2, "Ġ"),
            id(&gpt2, "12"),
            id(&gpt2, "3")
        ]
    );
    let smollm = tiny("smollm");
    let ids = smollm.encode("a 123", false, false).unwrap();
    let singles = ["a", "Ġ", "1", "2", "3"].map(|s| id(&smollm, s));
    assert_eq!(ids, singles);
}

#[test]
fn every_byte_round_trips() {
    let t = tiny("llama-bpe");
    for text in ["é", "日本", "😀 🇫🇷", "\u{0}\u{1f}\u{7f}", "tab\tcr\r\nlf\n"] {
        let ids = t.encode(text, false, false).unwrap();
        assert_eq!(t.decode(&ids), text);
    }
}

#[test]
fn control_tokens_need_parse_special_but_user_defined_do_not() {
    let t = tiny("gpt-2");
    let chat = "<|im_start|>user\nhi<tool><|im_end|>";
    let parsed = t.encode(chat, false, true).unwrap();
    assert_eq!(parsed.first(), Some(&1));
    assert_eq!(parsed.last(), Some(&2));
    assert!(parsed.contains(&3));
    let plain = t.encode(chat, false, false).unwrap();
    assert!(!plain.contains(&1) && !plain.contains(&2));
    assert!(plain.contains(&3), "user-defined tokens are always matched");
    // Control tokens print nothing, so the plain encoding is the one that round-trips.
    assert_eq!(t.decode(&plain), chat);
    assert_eq!(t.decode(&parsed), "user\nhi<tool>");
    assert_eq!(t.token_text(2), Some("<|im_end|>"));
}

#[test]
fn end_of_generation_tokens_are_found_by_name() {
    let t = tiny("gpt-2");
    assert_eq!(t.eos(), None);
    assert_eq!(t.eog_tokens(), [0, 2]);
    assert!(t.is_eog(2) && !t.is_eog(1));
    assert_eq!(t.token_kind(3), Some(TokenKind::UserDefined));
    // llama.cpp's default for `gpt2` vocabularies without `add_bos_token`.
    assert!(!t.add_bos());
    assert_eq!(tiny("llama-bpe").bos(), None);
}

#[test]
fn add_special_follows_the_metadata() {
    let spec = TokenizerSpec {
        bos: Some(1),
        eos: Some(2),
        add_bos: Some(true),
        add_eos: Some(true),
        ..tiny_spec("gpt-2")
    };
    let t = Tokenizer::from_spec(spec).unwrap();
    let hello = id(&t, "hello");
    assert_eq!(t.encode("hello", true, false).unwrap(), [1, hello, 2]);
    assert_eq!(t.encode("hello", false, false).unwrap(), [hello]);
    assert_eq!(t.encode("", true, false).unwrap(), [1, 2]);
}

#[test]
fn stream_decoder_holds_back_a_character_split_over_tokens() {
    let t = tiny("gpt-2");
    let chars = byte_chars();
    let byte_ids: Vec<u32> = "a😀"
        .bytes()
        .map(|b| id(&t, &chars[b as usize].to_string()))
        .collect();
    let mut stream = StreamDecoder::new();
    let chunks: Vec<String> = byte_ids.iter().map(|&i| stream.push(&t, i)).collect();
    assert_eq!(chunks, ["a", "", "", "", "😀"]);
    assert!(!stream.has_pending());
    assert_eq!(stream.finish(), "");

    // A character cut off at the end comes out as U+FFFD; invalid bytes as they come.
    for &i in &byte_ids[1..3] {
        assert_eq!(stream.push(&t, i), "");
    }
    assert!(stream.has_pending());
    assert_eq!(stream.finish(), "\u{fffd}");
    let lone_continuation = id(&t, &chars[0x80].to_string());
    assert_eq!(stream.push(&t, lone_continuation), "\u{fffd}");
    assert_eq!(stream.push(&t, 1), "", "control tokens print nothing");
}

#[test]
fn bad_metadata_is_an_error() {
    let err = |spec| Tokenizer::from_spec(spec).unwrap_err();
    assert!(matches!(
        err(TokenizerSpec {
            model: "bert".into(),
            ..tiny_spec("gpt-2")
        }),
        TokenizerError::UnknownModel(_)
    ));
    assert!(matches!(
        err(tiny_spec("no-such-pre")),
        TokenizerError::UnknownPreTokenizer(_)
    ));
    assert!(matches!(
        err(TokenizerSpec::default()),
        TokenizerError::EmptyVocabulary
    ));
    let mut spec = tiny_spec("gpt-2");
    spec.token_types.pop();
    assert!(matches!(err(spec), TokenizerError::LengthMismatch { .. }));
    let mut spec = tiny_spec("gpt-2");
    spec.tokens[5] = spec.tokens[4].clone();
    assert!(matches!(
        err(spec),
        TokenizerError::DuplicateToken { id: 5, .. }
    ));
    let mut spec = tiny_spec("gpt-2");
    spec.merges.push("nospace".into());
    assert!(matches!(err(spec), TokenizerError::BadMerge { .. }));
    let mut spec = tiny_spec("gpt-2");
    spec.merges.push("x yz".into());
    assert!(matches!(err(spec), TokenizerError::BuildBpe(_)));
    let spec = TokenizerSpec {
        eos: Some(100_000),
        ..tiny_spec("gpt-2")
    };
    assert!(matches!(
        err(spec),
        TokenizerError::SpecialOutOfRange { .. }
    ));
}

/// SmolLM2's tokenizer, read from the default model by the project's GGUF reader.
fn smollm2() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let file = GgufFile::open(acs_llama::testgen::default_model_for_tests())
            .expect("the default model opens");
        let spec = tokenizer_spec(file.metadata()).expect("the default model has tokenizer keys");
        Tokenizer::from_spec(spec).expect("SmolLM2's tokenizer builds")
    })
}

#[test]
fn smollm2_metadata() {
    let t = smollm2();
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!((t.bos(), t.eos()), (Some(1), Some(2)));
    assert!(!t.add_bos());
    assert_eq!(t.eog_tokens(), [0, 2]);
    assert!((0..17).all(|i| t.is_control(i)) && !t.is_control(17));
    assert_eq!(t.token_bytes(2), b"");
    assert_eq!(t.token_bytes(216), b" ");
}

#[test]
fn smollm2_matches_llama_cpp() {
    let t = smollm2();
    // From llama.cpp (llama-cpp-python 0.3.36) on this GGUF, without BOS.
    assert_eq!(
        t.encode("The sky is", true, false).unwrap(),
        [504, 6376, 314]
    );
    assert_eq!(
        t.encode("The grass is", true, false).unwrap(),
        [504, 5372, 314]
    );
}

#[test]
fn smollm2_matches_hf_tokenizers() {
    let t = smollm2();
    for &(text, parsed, plain) in REFERENCE {
        assert_eq!(
            t.encode(text, false, true).unwrap(),
            parsed,
            "parse_special: {text:?}"
        );
        assert_eq!(
            t.encode(text, false, false).unwrap(),
            plain,
            "plain: {text:?}"
        );
        assert_eq!(t.decode(plain), text);
    }
}

#[test]
fn smollm2_streams_what_decode_gives() {
    let t = smollm2();
    for &(text, _, plain) in REFERENCE {
        let mut stream = StreamDecoder::new();
        let mut streamed: String = plain.iter().map(|&i| stream.push(t, i)).collect();
        streamed += &stream.finish();
        assert_eq!(streamed, text);
    }
    // "😀" as its four byte tokens in SmolLM2's vocabulary (bytes F0 9F 98 80).
    let mut stream = StreamDecoder::new();
    let chunks: Vec<String> = [187, 249, 242, 218].map(|i| stream.push(t, i)).to_vec();
    assert_eq!(chunks, ["", "", "", "😀"]);
}

// Generated by `fixtures/reference_ids.py` from SmolLM2-135M-Instruct.Q4_1.gguf: HF
// `tokenizers` 0.23.3 (PyPI) set up as SmolLM2's tokenizer.json is, over the GGUF's
// vocabulary and merges; ids 0-16 are special added tokens.
const REFERENCE: &[(&str, &[u32], &[u32])] = &[
    ("The sky is", &[504, 6376, 314], &[504, 6376, 314]),
    ("The grass is", &[504, 5372, 314], &[504, 5372, 314]),
    (
        "Hello, world! How's it going? I'm fine—thanks.",
        &[
            19556, 28, 905, 17, 1073, 506, 357, 2045, 47, 339, 5248, 4979, 1265, 373, 3307, 30,
        ],
        &[
            19556, 28, 905, 17, 1073, 506, 357, 2045, 47, 339, 5248, 4979, 1265, 373, 3307, 30,
        ],
    ),
    (
        "  leading spaces and trailing   ",
        &[216, 2899, 5600, 284, 35079, 333],
        &[216, 2899, 5600, 284, 35079, 333],
    ),
    (
        "tabs\tand\nnewlines\n\n\nend",
        &[100, 7366, 197, 397, 198, 2241, 5110, 1116, 198, 486],
        &[100, 7366, 197, 397, 198, 2241, 5110, 1116, 198, 486],
    ),
    (
        "Numbers: 1234567890 3.14159 -42 1,000,000",
        &[
            39006, 42, 216, 33, 34, 35, 36, 37, 38, 39, 40, 41, 32, 216, 35, 30, 33, 36, 33, 37,
            41, 731, 36, 34, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32,
        ],
        &[
            39006, 42, 216, 33, 34, 35, 36, 37, 38, 39, 40, 41, 32, 216, 35, 30, 33, 36, 33, 37,
            41, 731, 36, 34, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32,
        ],
    ),
    (
        "Unicode: naïve café, Ünïcödé, 日本語のテキスト, Ελληνικά, русский",
        &[
            3706, 15817, 42, 15486, 46494, 37366, 28, 5549, 246, 94, 25972, 83, 7466, 84, 2756, 28,
            17097, 241, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134,
            11100, 226, 28, 5664, 239, 17162, 17162, 25723, 11517, 12001, 21118, 26112, 28, 216,
            9175, 14714, 9382, 39511, 7872, 24958,
        ],
        &[
            3706, 15817, 42, 15486, 46494, 37366, 28, 5549, 246, 94, 25972, 83, 7466, 84, 2756, 28,
            17097, 241, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134,
            11100, 226, 28, 5664, 239, 17162, 17162, 25723, 11517, 12001, 21118, 26112, 28, 216,
            9175, 14714, 9382, 39511, 7872, 24958,
        ],
    ),
    (
        "Emoji: 😀🎉👍🏽 👨\u{200d}👩\u{200d}👧\u{200d}👦 🇫🇷",
        &[
            10809, 33777, 42, 40303, 218, 10813, 232, 227, 10813, 235, 231, 10813, 233, 138, 15107,
            235, 118, 321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117, 321, 231, 10813, 235,
            116, 15107, 225, 121, 10813, 225, 132,
        ],
        &[
            10809, 33777, 42, 40303, 218, 10813, 232, 227, 10813, 235, 231, 10813, 233, 138, 15107,
            235, 118, 321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117, 321, 231, 10813, 235,
            116, 15107, 225, 121, 10813, 225, 132,
        ],
    ),
    (
        "def f(x):\n    return x**2  # square\n",
        &[
            1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 216, 907, 5222, 198,
        ],
        &[
            1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 216, 907, 5222, 198,
        ],
    ),
    (
        "    indented\n\tcode {\n\t\treturn;\n\t}",
        &[
            333, 641, 6574, 198, 197, 4635, 1662, 3354, 197, 5406, 43, 198, 197, 109,
        ],
        &[
            333, 641, 6574, 198, 197, 4635, 1662, 3354, 197, 5406, 43, 198, 197, 109,
        ],
    ),
    (
        "WE'RE SHOUTING, they'll've it'd",
        &[
            23342, 23, 3256, 334, 21953, 4728, 28, 502, 3060, 3543, 357, 6737,
        ],
        &[
            23342, 23, 3256, 334, 21953, 4728, 28, 502, 3060, 3543, 357, 6737,
        ],
    ),
    (
        "Mixed 中文 and English123abc",
        &[61, 13609, 216, 28589, 29184, 284, 2321, 33, 34, 35, 25276],
        &[61, 13609, 216, 28589, 29184, 284, 2321, 33, 34, 35, 25276],
    ),
    (
        "Ellipsis… “quotes” ‘single’ «guillemets»",
        &[
            36602, 2259, 271, 2829, 619, 385, 2346, 573, 1551, 18536, 417, 23708, 6058, 3285, 93,
            1175, 20306,
        ],
        &[
            36602, 2259, 271, 2829, 619, 385, 2346, 573, 1551, 18536, 417, 23708, 6058, 3285, 93,
            1175, 20306,
        ],
    ),
    (
        "a\r\nb\r\n",
        &[81, 201, 198, 82, 2738],
        &[81, 201, 198, 82, 2738],
    ),
    (
        "URL https://example.com/path?q=1&r=2#frag",
        &[
            14492, 5141, 1742, 7434, 30, 824, 31, 1537, 47, 97, 45, 33, 22, 98, 45, 34, 19, 28082,
        ],
        &[
            14492, 5141, 1742, 7434, 30, 824, 31, 1537, 47, 97, 45, 33, 22, 98, 45, 34, 19, 28082,
        ],
    ),
    ("    ", &[289], &[289]),
    (
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        &[
            46880, 46880, 46880, 46880, 46880, 46880, 46880, 46880, 46880, 46880, 46880, 46880,
        ],
        &[
            46880, 46880, 46880, 46880, 46880, 46880, 46880, 46880, 46880, 46880, 46880, 46880,
        ],
    ),
    (
        "\u{a0}nbsp\u{2009}thin\u{3000}ideographic",
        &[15442, 94, 32093, 321, 227, 39200, 12109, 218, 489, 4551],
        &[15442, 94, 32093, 321, 227, 39200, 12109, 218, 489, 4551],
    ),
    (
        "Zero\u{200b}width joiner",
        &[38767, 321, 229, 6930, 5757, 259],
        &[38767, 321, 229, 6930, 5757, 259],
    ),
    (
        "1st 2nd 3rd 4th 100th 2024-01-01",
        &[
            33, 302, 216, 34, 268, 216, 35, 7212, 216, 36, 373, 216, 33, 32, 32, 373, 216, 34, 32,
            34, 36, 29, 32, 33, 29, 32, 33,
        ],
        &[
            33, 302, 216, 34, 268, 216, 35, 7212, 216, 36, 373, 216, 33, 32, 32, 373, 216, 34, 32,
            34, 36, 29, 32, 33, 29, 32, 33,
        ],
    ),
    (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        &[1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198],
        &[
            44, 108, 306, 79, 3738, 108, 46, 4093, 198, 6004, 44, 108, 306, 79, 486, 108, 46, 198,
            44, 108, 306, 79, 3738, 108, 46, 520, 9531, 198,
        ],
    ),
    (
        "text<|endoftext|>more <file_sep> x",
        &[2692, 0, 3143, 216, 5, 1792],
        &[
            2692, 44, 108, 486, 1714, 2692, 108, 46, 3143, 2067, 2153, 79, 29070, 46, 1792,
        ],
    ),
];
