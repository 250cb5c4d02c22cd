//! SentencePiece BPE (`llama` vocabularies) on a small vocabulary built here, with the
//! expected ids worked out by hand from the algorithm: merge the adjacent pair whose
//! concatenation is the highest-scoring token (leftmost on ties), and fall back to
//! `<0xNN>` byte tokens for characters the vocabulary lacks.

use acs_llama::tokenizer::{StreamDecoder, TokenKind, Tokenizer, TokenizerSpec};

const BYTE_BASE: u32 = 3;
const SPACE: u32 = 259;
const HELLO: u32 = 270;
const SPACE_HELLO: u32 = 271;
const WORLD: u32 = 274;
const A: u32 = 276;
const AA: u32 = 277;

/// `<unk> <s> </s>`, the 256 byte tokens, then words with scores.
fn spec() -> TokenizerSpec {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    let mut token_types = vec![2, 3, 3];
    let mut scores = vec![0.0; 3];
    for byte in 0..=255u8 {
        tokens.push(format!("<0x{byte:02X}>"));
        token_types.push(6);
        scores.push(0.0);
    }
    let words = [
        ("▁", -1.0),
        ("h", -10.0),
        ("e", -10.0),
        ("l", -10.0),
        ("o", -10.0),
        ("w", -10.0),
        ("r", -10.0),
        ("d", -10.0),
        ("ll", -2.0),
        ("he", -3.0),
        ("hell", -4.0),
        ("hello", -5.0),
        ("▁hello", -1.5),
        ("wo", -6.0),
        ("wor", -6.5),
        ("world", -8.0),
        ("ld", -7.0),
        ("a", -10.0),
        ("aa", -3.0),
    ];
    for (word, score) in words {
        tokens.push(word.into());
        token_types.push(1);
        scores.push(score);
    }
    TokenizerSpec {
        model: "llama".into(),
        tokens,
        token_types,
        scores,
        ..TokenizerSpec::default()
    }
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_spec(spec()).unwrap()
}

fn byte(b: u8) -> u32 {
    BYTE_BASE + u32::from(b)
}

#[test]
fn defaults_follow_llama_cpp() {
    let t = tokenizer();
    assert_eq!((t.bos(), t.eos(), t.unk()), (Some(1), Some(2), Some(0)));
    assert!(t.add_bos() && !t.add_eos());
    assert_eq!(t.eog_tokens(), [2]);
    assert_eq!(t.token_kind(byte(0x41)), Some(TokenKind::Byte));
    assert_eq!(t.token_bytes(byte(0x41)), b"A");
    assert_eq!(t.token_bytes(SPACE_HELLO), b" hello");
    assert_eq!(t.token_bytes(1), b"");
}

#[test]
fn merges_follow_scores() {
    let t = tokenizer();
    // "▁hello▁world": ll, he, hell, hello, ▁hello; then wo, wor, ld, world ("▁world" is
    // not a token, so the second space stays alone).
    let ids = t.encode("hello world", true, false).unwrap();
    assert_eq!(ids, [1, SPACE_HELLO, SPACE, WORLD]);
    assert_eq!(t.decode(&ids), "hello world");
    assert_eq!(
        t.encode("hello world", false, false).unwrap()[0],
        SPACE_HELLO
    );
}

#[test]
fn equal_scores_merge_leftmost_first() {
    let t = tokenizer();
    assert_eq!(t.encode("aaa", false, false).unwrap(), [SPACE, AA, A]);
}

#[test]
fn missing_characters_fall_back_to_bytes() {
    let t = tokenizer();
    let ids = t.encode("Hé", false, false).unwrap();
    assert_eq!(ids, [SPACE, byte(b'H'), byte(0xC3), byte(0xA9)]);
    assert_eq!(t.decode(&ids), "Hé");
    let text = "日本 😀\n\ttabs";
    assert_eq!(t.decode(&t.encode(text, true, false).unwrap()), text);
}

#[test]
fn control_tokens_are_parsed_only_when_asked() {
    let t = tokenizer();
    // After a special token the text gets SentencePiece's leading space again.
    assert_eq!(t.encode("<s>hello", false, true).unwrap(), [1, SPACE_HELLO]);
    let plain = t.encode("<s>hello", false, false).unwrap();
    assert_eq!(plain, [SPACE, byte(b'<'), byte(b's'), byte(b'>'), HELLO]);
    assert_eq!(t.decode(&plain), "<s>hello");
}

#[test]
fn space_prefix_can_be_turned_off() {
    let t = Tokenizer::from_spec(TokenizerSpec {
        add_space_prefix: Some(false),
        add_bos: Some(false),
        ..spec()
    })
    .unwrap();
    assert_eq!(t.encode("hello", true, false).unwrap(), [HELLO]);
    assert_eq!(t.decode(&[SPACE_HELLO]), " hello");
    assert!(t.encode("", true, false).unwrap().is_empty());
}

#[test]
fn stream_decoder_joins_byte_tokens() {
    let t = tokenizer();
    let mut stream = StreamDecoder::new();
    // A stream continues earlier text, so its leading space is kept.
    assert_eq!(stream.push(&t, SPACE_HELLO), " hello");
    assert_eq!(stream.push(&t, byte(0xC3)), "");
    assert_eq!(stream.push(&t, byte(0xA9)), "é");
    assert_eq!(stream.push(&t, 2), "");
    assert_eq!(stream.finish(), "");
}
