//! The GGUF reader: writer round trips, streaming, and hostile files.
// Native only: it reads files (the browser runs tests/webgpu_browser.rs).
#![cfg(not(target_arch = "wasm32"))]

use acs_llama::gguf::{
    GgufError, GgufFile, GgufHeader, GgufWriter, HeaderParse, MetaArray, MetaValue, TensorStream,
};
use acs_llama::quant::{GgmlType, dequantize_row, matmul, quantize_row};
use acs_llama::testgen::{TestModelSpec, test_model_bytes};

fn every_value() -> Vec<(&'static str, MetaValue)> {
    vec![
        ("t.u8", MetaValue::U8(200)),
        ("t.i8", MetaValue::I8(-100)),
        ("t.u16", MetaValue::U16(60000)),
        ("t.i16", MetaValue::I16(-30000)),
        ("t.u32", MetaValue::U32(4_000_000_000)),
        ("t.i32", MetaValue::I32(-2_000_000_000)),
        ("t.f32", MetaValue::F32(1.5e-5)),
        ("t.bool", MetaValue::Bool(true)),
        ("t.string", MetaValue::String("héllo ✓".into())),
        ("t.u64", MetaValue::U64(u64::MAX - 1)),
        ("t.i64", MetaValue::I64(i64::MIN + 1)),
        ("t.f64", MetaValue::F64(-2.5e300)),
        ("t.arr.u8", MetaValue::Array(MetaArray::U8(vec![1, 2, 3]))),
        ("t.arr.i8", MetaValue::Array(MetaArray::I8(vec![-1, 2]))),
        (
            "t.arr.u16",
            MetaValue::Array(MetaArray::U16(vec![7, 65535])),
        ),
        ("t.arr.i16", MetaValue::Array(MetaArray::I16(vec![-7]))),
        ("t.arr.u32", MetaValue::Array(MetaArray::U32(vec![1, 2]))),
        (
            "t.arr.i32",
            MetaValue::Array(MetaArray::I32(vec![-5, 6, 7])),
        ),
        (
            "t.arr.f32",
            MetaValue::Array(MetaArray::F32(vec![0.5, -0.25])),
        ),
        (
            "t.arr.bool",
            MetaValue::Array(MetaArray::Bool(vec![true, false])),
        ),
        (
            "t.arr.str",
            MetaValue::Array(MetaArray::String(vec![
                "a".into(),
                "".into(),
                "Ġthe".into(),
            ])),
        ),
        (
            "t.arr.u64",
            MetaValue::Array(MetaArray::U64(vec![u64::MAX])),
        ),
        (
            "t.arr.i64",
            MetaValue::Array(MetaArray::I64(vec![i64::MIN])),
        ),
        ("t.arr.f64", MetaValue::Array(MetaArray::F64(vec![1e-300]))),
        ("t.arr.empty", MetaValue::Array(MetaArray::F32(vec![]))),
        (
            "t.arr.nested",
            MetaValue::Array(MetaArray::Array(vec![
                MetaArray::U8(vec![9]),
                MetaArray::String(vec!["x".into()]),
                MetaArray::Array(vec![MetaArray::I32(vec![1])]),
            ])),
        ),
    ]
}

/// A small file with every metadata type and three tensors of different types.
fn small_file() -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.add(k, v);
    }
    let mut datas = Vec::new();
    let vals: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
    for (name, ty, dims) in [
        ("a.weight", GgmlType::F32, vec![4u64, 2]),
        ("b.weight", GgmlType::Q4_1, vec![32, 2]),
        ("c.weight", GgmlType::Q8_0, vec![64]),
    ] {
        let n = (dims.iter().product::<u64>()) as usize;
        let row = dims[0] as usize;
        let rb = ty.row_bytes(row).unwrap();
        let mut bytes = vec![0u8; rb * (n / row)];
        for (r, b) in vals[..n].chunks_exact(row).zip(bytes.chunks_exact_mut(rb)) {
            quantize_row(ty, r, b).unwrap();
        }
        w.add_tensor(name, &dims, ty, bytes.clone()).unwrap();
        datas.push((name.to_owned(), bytes));
    }
    (w.to_bytes(), datas)
}

#[test]
fn round_trip_every_metadata_type_and_tensor() {
    let (bytes, datas) = small_file();
    let f = GgufFile::from_vec(bytes).unwrap();
    assert_eq!(f.header().version, 3);
    assert_eq!(f.header().alignment, 32);
    assert_eq!(f.header().data_offset % 32, 0);
    let md = f.metadata();
    for (k, v) in every_value() {
        assert_eq!(md.get(k), Some(&v), "{k}");
    }
    assert_eq!(md.len(), every_value().len());
    assert_eq!(md.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(md.get_u64("t.u8").unwrap(), 200, "integers widen");
    assert_eq!(md.get_i32("t.i16").unwrap(), -30000);
    assert_eq!(md.get_f32("t.f32").unwrap(), 1.5e-5);
    assert!(md.get_bool("t.bool").unwrap());
    assert_eq!(md.get_str("t.string").unwrap(), "héllo ✓");
    assert_eq!(md.get_str_array("t.arr.str").unwrap()[2], "Ġthe");
    assert_eq!(md.get_f32_array("t.arr.f32").unwrap(), &[0.5, -0.25]);
    assert_eq!(md.get_i32_array("t.arr.i32").unwrap(), &[-5, 6, 7]);
    assert_eq!(md.get_array("t.arr.nested").unwrap().len(), 3);
    assert_eq!(
        md.get_u32("nope"),
        Err(GgufError::MissingKey("nope".into()))
    );
    assert!(matches!(
        md.get_u32("t.string"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(
        matches!(md.get_u32("t.i8"), Err(GgufError::WrongType { .. })),
        "negative"
    );
    assert!(
        matches!(md.get_u32("t.u64"), Err(GgufError::WrongType { .. })),
        "too big"
    );
    assert!(matches!(
        md.get_str_array("t.arr.f32"),
        Err(GgufError::WrongType { .. })
    ));

    assert_eq!(f.tensors().len(), 3);
    for (name, data) in &datas {
        let (t, got) = f.tensor_data(name).unwrap();
        assert_eq!(got, &data[..], "{name}");
        assert_eq!(t.offset % 32, 0);
    }
    let b = f.header().tensor("b.weight").unwrap();
    assert_eq!(
        (b.ty, b.row_len(), b.n_rows(), b.n_elements()),
        (GgmlType::Q4_1, 32, 2, 64)
    );
    assert!(matches!(
        f.tensor_data("zzz"),
        Err(GgufError::MissingTensor(_))
    ));
}

#[test]
fn custom_alignment_and_version_2() {
    let mut w = GgufWriter::new();
    w.set_version(2);
    w.add("general.alignment", MetaValue::U32(64));
    w.add_tensor("x", &[3], GgmlType::F32, vec![0; 12]).unwrap();
    w.add_tensor("y", &[1], GgmlType::F32, vec![1, 2, 3, 4])
        .unwrap();
    let f = GgufFile::from_vec(w.to_bytes()).unwrap();
    assert_eq!((f.header().version, f.header().alignment), (2, 64));
    assert_eq!(f.header().data_offset % 64, 0);
    assert_eq!(f.header().tensor("y").unwrap().offset, 64);
    assert_eq!(f.tensor_data("y").unwrap().1, &[1, 2, 3, 4]);
}

/// Feeds `bytes` to the streaming header parser and tensor stream in `chunk`-byte
/// pieces, as the browser does, and returns every tensor's bytes.
fn stream(bytes: &[u8], chunk: usize) -> Vec<(String, Vec<u8>)> {
    let mut have = 0;
    let header = loop {
        have = (have + chunk).min(bytes.len());
        match GgufHeader::parse(&bytes[..have]).unwrap() {
            HeaderParse::Complete(h) => break h,
            HeaderParse::NeedMore { min_len } => {
                assert!(min_len > have as u64 && min_len <= bytes.len() as u64);
            }
        }
    };
    let mut s = TensorStream::new(&header).unwrap();
    let mut got = Vec::new();
    for c in bytes.chunks(chunk) {
        s.push(c, |t, b| {
            got.push((t.name.clone(), b.to_vec()));
            Ok::<(), GgufError>(())
        })
        .unwrap();
    }
    assert!(s.is_done());
    s.finish().unwrap();
    got
}

/// As [`stream`], through `push_pieces`: each tensor's pieces, joined.
fn stream_pieces(bytes: &[u8], chunk: usize) -> Vec<(String, Vec<u8>)> {
    let header = GgufHeader::parse_complete(bytes).unwrap();
    let mut s = TensorStream::new(&header).unwrap();
    let mut got: Vec<(String, Vec<u8>)> = Vec::new();
    let mut open = false;
    for c in bytes.chunks(chunk) {
        s.push_pieces(c, |t, b, last| {
            if !open {
                got.push((t.name.clone(), Vec::new()));
            }
            let (name, data) = got.last_mut().unwrap();
            assert_eq!(name, &t.name, "pieces of one tensor come together");
            data.extend_from_slice(b);
            open = !last;
            Ok::<(), GgufError>(())
        })
        .unwrap();
    }
    assert!(s.is_done() && !open);
    s.finish().unwrap();
    got
}

#[test]
fn streaming_yields_the_same_tensors_for_any_chunking() {
    let (bytes, datas) = small_file();
    for chunk in [1, 3, 31, 32, 100, 4096, bytes.len()] {
        assert_eq!(stream(&bytes, chunk), datas, "chunk {chunk}");
    }
    let model = test_model_bytes(&TestModelSpec::tiny()).unwrap();
    let f = GgufFile::from_vec(model.clone()).unwrap();
    let want: Vec<(String, Vec<u8>)> = f
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), f.tensor_bytes(t).unwrap().to_vec()))
        .collect();
    for chunk in [997, 65536] {
        assert_eq!(stream(&model, chunk), want);
    }
    for chunk in [1, 31, 997, model.len()] {
        assert_eq!(stream_pieces(&model, chunk), want, "pieces, chunk {chunk}");
    }
    // A stream cut short says which tensor is incomplete.
    let h = GgufHeader::parse_complete(&model).unwrap();
    let mut s = TensorStream::new(&h).unwrap();
    s.push(&model[..model.len() - 1], |_, _| Ok::<(), GgufError>(()))
        .unwrap();
    assert!(matches!(
        s.finish(),
        Err(GgufError::TensorOutOfBounds { .. })
    ));
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let (bytes, _) = small_file();
    let h = GgufHeader::parse_complete(&bytes).unwrap();
    // The writer pads after the last tensor too; cutting that padding is harmless.
    let end = h
        .tensors
        .iter()
        .map(|t| h.tensor_range(t).unwrap().end)
        .max()
        .unwrap();
    assert!(GgufFile::from_vec(bytes[..end as usize].to_vec()).is_ok());
    for n in 0..end as usize {
        let r = GgufFile::from_vec(bytes[..n].to_vec());
        assert!(
            matches!(
                r,
                Err(GgufError::Truncated { .. }
                    | GgufError::TooMany { .. }
                    | GgufError::TensorOutOfBounds { .. })
            ),
            "prefix {n}: {r:?}"
        );
        match GgufHeader::parse(&bytes[..n]) {
            Ok(HeaderParse::NeedMore { min_len }) => assert!(min_len > n as u64),
            Ok(HeaderParse::Complete(h)) => {
                assert!(h.check_file_len(0, n as u64).is_err())
            }
            Err(e) => panic!("prefix {n} of a valid file: {e}"),
        }
    }
    // The generated model: every cut inside the header, and a stride through data.
    let model = test_model_bytes(&TestModelSpec::tiny()).unwrap();
    let data_offset = GgufHeader::parse_complete(&model).unwrap().data_offset as usize;
    let cuts = (0..data_offset).chain((data_offset..model.len()).step_by(509));
    for n in cuts {
        assert!(
            GgufFile::from_vec(model[..n].to_vec()).is_err(),
            "prefix {n}"
        );
    }
}

/// The small file with the 8 bytes at `at` replaced by `v`.
fn patched(at: usize, v: u64) -> Vec<u8> {
    let (mut bytes, _) = small_file();
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
    bytes
}

fn err(bytes: &[u8]) -> GgufError {
    GgufFile::from_vec(bytes.to_vec()).expect_err("corrupt file must be refused")
}

#[test]
fn hostile_counts_fail_fast_with_typed_errors() {
    let start = std::time::Instant::now();
    for v in [u64::MAX, u64::MAX / 24, 1 << 40, 1 << 20] {
        assert!(matches!(
            err(&patched(8, v)),
            GgufError::TooMany {
                what: "tensor info",
                ..
            }
        ));
        assert!(matches!(
            err(&patched(16, v)),
            GgufError::TooMany {
                what: "metadata pair",
                ..
            }
        ));
        // The first key's length.
        assert!(matches!(
            err(&patched(24, v)),
            GgufError::Truncated { .. } | GgufError::Overflow { .. }
        ));
    }
    // Streaming: a huge count asks for more bytes than any real file has.
    match GgufHeader::parse(&patched(8, 1 << 40)).unwrap() {
        HeaderParse::NeedMore { min_len } => assert!(min_len > 1 << 40),
        other => panic!("{other:?}"),
    }
    // An array of u64::MAX strings.
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"GGUF");
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.push(b'k');
    bytes.extend_from_slice(&9u32.to_le_bytes());
    bytes.extend_from_slice(&8u32.to_le_bytes());
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    bytes.extend_from_slice(&[0; 64]);
    assert!(matches!(
        err(&bytes),
        GgufError::TooMany {
            what: "array element",
            ..
        }
    ));
    assert!(
        start.elapsed().as_secs() < 2,
        "hostile counts must not allocate or loop"
    );
}

fn header_prefix(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

#[test]
fn malformed_headers_name_the_problem() {
    let mut bad = small_file().0;
    bad[0] = b'X';
    assert!(matches!(err(&bad), GgufError::BadMagic(_)));
    for v in [1u32, 4, 0x0300_0000] {
        let mut b = small_file().0;
        b[4..8].copy_from_slice(&v.to_le_bytes());
        assert_eq!(err(&b), GgufError::UnsupportedVersion(v));
    }
    // Unknown metadata value type.
    let mut b = header_prefix(0, 1);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&13u32.to_le_bytes());
    b.extend_from_slice(&[0; 16]);
    assert_eq!(err(&b), GgufError::UnknownValueType(13));
    // Invalid UTF-8 key.
    let mut b = header_prefix(0, 1);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(0xFF);
    b.extend_from_slice(&0u32.to_le_bytes());
    b.push(0);
    assert!(matches!(err(&b), GgufError::BadUtf8 { .. }));
    // Arrays nested past the limit.
    let mut b = header_prefix(0, 1);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..10_000 {
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
    }
    assert_eq!(err(&b), GgufError::TooDeep);

    let one = |f: &dyn Fn(&mut GgufWriter)| {
        let mut w = GgufWriter::new();
        f(&mut w);
        err(&w.to_bytes())
    };
    assert_eq!(
        one(&|w| {
            w.add("k", MetaValue::U8(1));
            w.add("k", MetaValue::U8(2));
        }),
        GgufError::DuplicateKey("k".into())
    );
    for a in [MetaValue::U32(0), MetaValue::U32(48), MetaValue::U64(32)] {
        assert!(matches!(
            one(&|w| w.add("general.alignment", a.clone())),
            GgufError::BadAlignment(_)
        ));
    }
    assert!(matches!(
        one(&|w| w.add_raw_tensor("t", vec![1], 5, vec![0; 4])),
        GgufError::UnknownType { id: 5, .. }
    ));
    assert!(matches!(
        one(&|w| w.add_raw_tensor("t", vec![1; 5], 0, vec![0; 4])),
        GgufError::TooManyDims { n_dims: 5, .. }
    ));
    assert!(matches!(
        one(&|w| w.add_raw_tensor("t", vec![33], 8, vec![0; 40])),
        GgufError::RaggedRow { .. }
    ));
    assert!(matches!(
        one(&|w| w.add_raw_tensor("t", vec![u64::MAX / 2, 4], 0, vec![])),
        GgufError::Overflow { .. }
    ));
    assert!(matches!(
        one(&|w| w.add_raw_tensor("t", vec![1 << 40], 0, vec![0; 4])),
        GgufError::TensorOutOfBounds { .. }
    ));
    assert!(matches!(
        one(&|w| {
            w.add_raw_tensor("t", vec![1], 0, vec![0; 4]);
            w.add_raw_tensor("t", vec![1], 0, vec![0; 4]);
        }),
        GgufError::DuplicateTensor(_)
    ));
    // Offsets: patch the second tensor info's offset (the last 8 bytes before the
    // padding) to overlap the first, and to a misaligned value.
    let mut w = GgufWriter::new();
    w.add_tensor("a", &[16], GgmlType::F32, vec![0; 64])
        .unwrap();
    w.add_tensor("b", &[1], GgmlType::F32, vec![0; 4]).unwrap();
    let good = w.to_bytes();
    let at = good
        .windows(8)
        .rposition(|x| x == 64u64.to_le_bytes())
        .unwrap();
    let mut b = good.clone();
    b[at..at + 8].copy_from_slice(&32u64.to_le_bytes());
    assert!(matches!(err(&b), GgufError::TensorOverlap { .. }));
    b[at..at + 8].copy_from_slice(&65u64.to_le_bytes());
    assert!(matches!(err(&b), GgufError::Misaligned { offset: 65, .. }));
    // An offset whose absolute position (data section start + offset) overflows;
    // found by the fuzzer.
    b[at..at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    assert!(matches!(err(&b), GgufError::Overflow { .. }));
    assert!(GgufHeader::parse(&b).is_err());
}

#[test]
fn generated_models_carry_llama_metadata() {
    for spec in [TestModelSpec::tiny(), TestModelSpec::tiny_k(GgmlType::Q4_K)] {
        let f = GgufFile::from_vec(test_model_bytes(&spec).unwrap()).unwrap();
        let md = f.metadata();
        assert_eq!(md.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(
            md.get_usize("llama.embedding_length").unwrap(),
            spec.d_model
        );
        assert_eq!(md.get_usize("llama.block_count").unwrap(), spec.n_layers);
        assert_eq!(
            md.get_usize("llama.attention.head_count_kv").unwrap(),
            spec.n_kv_heads
        );
        assert_eq!(md.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
        let tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap();
        assert_eq!(tokens.len(), spec.vocab);
        assert_eq!(
            md.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
            spec.vocab
        );
        assert_eq!(tokens[1], "<|im_start|>");
        assert_eq!(tokens[3 + b' ' as usize], "Ġ");
        let merges = md.get_str_array("tokenizer.ggml.merges").unwrap();
        assert!(merges.len() >= 50);
        for m in merges {
            let (a, b) = m.split_once(' ').unwrap();
            assert!(tokens.contains(&format!("{a}{b}")), "{m}");
        }
        let embd = f.header().tensor("token_embd.weight").unwrap();
        assert_eq!(embd.dims, vec![spec.d_model as u64, spec.vocab as u64]);
        assert_eq!(f.header().tensor("output.weight").is_some(), !spec.tied);
        let k = f.header().tensor("blk.1.attn_k.weight").unwrap();
        let kv = (spec.d_model / spec.n_heads * spec.n_kv_heads) as u64;
        assert_eq!(
            (k.ty, k.dims.clone()),
            (spec.weight_type, vec![spec.d_model as u64, kv])
        );
        let down = f.header().tensor("blk.0.ffn_down.weight").unwrap();
        assert_eq!(down.dims, vec![spec.ffn as u64, spec.d_model as u64]);
        // Deterministic: the same spec gives the same bytes.
        assert_eq!(test_model_bytes(&spec).unwrap(), f.part_bytes(0));
    }
}

/// The real default model; values from the `gguf` Python package's dequantizer.
#[test]
fn real_model_matches_python_reference() {
    let f = GgufFile::open(acs_llama::testgen::default_model_for_tests()).unwrap();
    let md = f.metadata();
    assert_eq!(md.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(md.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(md.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(md.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(md.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(md.get_u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(
        md.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    assert_eq!(
        md.get_str_array("tokenizer.ggml.merges").unwrap().len(),
        48900
    );
    assert_eq!(md.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert!(!md.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(f.header().data_offset, 1_785_664);
    assert!(f.header().tensor("output.weight").is_none());

    let row = |name: &str, r: usize| {
        let (t, bytes) = f.tensor_data(name).unwrap();
        let n = t.row_len() as usize;
        let rb = t.ty.row_bytes(n).unwrap();
        let mut y = vec![0f32; n];
        dequantize_row(t.ty, &bytes[r * rb..(r + 1) * rb], &mut y).unwrap();
        (t.ty, y)
    };
    let close = |got: &[f32], want: &[f64]| {
        for (g, w) in got.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{g} vs {w}");
        }
    };
    let (ty, e) = row("token_embd.weight", 504);
    assert_eq!((ty, e.len()), (GgmlType::Q8_0, 576));
    close(
        &e,
        &[
            0.1096038818359375,
            0.017436981201171875,
            -0.09465789794921875,
            0.08220291137695312,
        ],
    );
    assert!((e.iter().sum::<f32>() + 3.5683346).abs() < 1e-3);
    let (ty, d) = row("blk.0.ffn_down.weight", 0);
    assert_eq!((ty, d.len()), (GgmlType::Q4_1, 1536));
    close(
        &d,
        &[
            -0.330810546875,
            0.3460693359375,
            0.0753173828125,
            -0.4661865234375,
        ],
    );
    assert!((d.iter().sum::<f32>() + 17.089996).abs() < 1e-3);
    let (_, n) = row("blk.0.attn_norm.weight", 0);
    close(
        &n,
        &[
            0.01397705078125,
            0.0238037109375,
            -0.019775390625,
            -0.0302734375,
        ],
    );

    // attn_q · embedding row 504, against numpy's f32 product of the dequantized data.
    let (t, q) = f.tensor_data("blk.0.attn_q.weight").unwrap();
    let mut y = vec![0f32; 576];
    matmul(t.ty, q, 576, 576, &e, &mut y).unwrap();
    let want = [
        -0.5713664169306867,
        0.15926811582176015,
        -0.8155170732643455,
        -0.288626521039987,
    ];
    for (g, w) in y.iter().zip(want) {
        assert!((f64::from(*g) - w).abs() < 0.02, "{g} vs {w}");
    }
    let norm = y.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!((norm - 11.160212).abs() < 0.05, "{norm}");
}

/// Found by fuzzing: an empty tensor listed after a tensor at the same offset was
/// delivered after the stream had passed that offset, and the stream underflowed.
#[test]
fn stream_delivers_an_empty_tensor_sharing_an_offset() {
    let data = include_bytes!("../fuzz/seeds/zero-length-tensor-after-its-twin.bin");
    let HeaderParse::Complete(h) = GgufHeader::parse(data).unwrap() else {
        panic!("the header is complete");
    };
    let in_file = h.check_file_len(0, data.len() as u64).is_ok();
    for size in [1, 7, 61, data.len()] {
        let mut stream = TensorStream::new(&h).unwrap();
        let mut seen = 0;
        for chunk in data.chunks(size) {
            stream
                .push(chunk, |t, b| {
                    assert_eq!(b.len() as u64, t.n_bytes);
                    seen += 1;
                    Ok::<(), GgufError>(())
                })
                .unwrap();
        }
        assert_eq!(stream.finish().is_ok(), in_file, "chunks of {size}");
        assert!(!in_file || seen == h.tensors.len());
    }
}
