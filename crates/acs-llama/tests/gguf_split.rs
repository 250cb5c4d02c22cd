//! Split models (`NAME-00001-of-0000N.gguf`, as `llama-gguf-split` writes them): the
//! parts load as the one file they came from, and parts that do not fit together are
//! refused with what is wrong.
// Native only: it writes files and maps them.
#![cfg(not(target_arch = "wasm32"))]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use acs_llama::gguf::{
    GgufError, GgufFile, GgufHeader, SplitInfo, parse_part_name, part_name, split_model,
};
use acs_llama::model::{Logits, Model, SeqInput};
use acs_llama::testgen::{TestModelSpec, test_model_bytes};

fn last_logits(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache();
    let mut batch = [SeqInput {
        cache: &mut cache,
        tokens,
        steering: &[],
        capture: &[],
        logits: Logits::Last,
    }];
    model.forward(&mut batch).expect("step").remove(0).logits
}

/// A fresh directory under the target's temporary folder.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("acs-split-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The parts written as `dir/model-0000k-of-0000n.gguf`; the first's path.
fn write_parts(dir: &Path, parts: &[Vec<u8>]) -> PathBuf {
    let count = parts.len() as u16;
    for (no, bytes) in (0u16..).zip(parts) {
        std::fs::write(dir.join(part_name("model", no, count)), bytes).unwrap();
    }
    dir.join(part_name("model", 0, count))
}

fn whole() -> Vec<u8> {
    test_model_bytes(&TestModelSpec::tiny()).unwrap()
}

#[test]
fn parts_load_as_the_file_they_came_from() {
    let bytes = whole();
    let one = GgufFile::from_vec(bytes.clone()).unwrap();
    let parts = split_model(&one, 3).unwrap();
    let dir = scratch("load");
    let first = write_parts(&dir, &parts);
    let split = GgufFile::open(&first).unwrap();

    assert_eq!(split.tensors().len(), one.tensors().len());
    assert_eq!(
        split.header().split().unwrap(),
        Some(SplitInfo {
            no: 0,
            count: 3,
            tensors: one.tensors().len() as u64
        })
    );
    // Every part holds some tensors, each read back from its own file.
    for part in 0..3 {
        assert!(split.tensors().iter().any(|t| t.part == part));
    }
    for t in one.tensors() {
        let (s, data) = split.tensor_data(&t.name).unwrap();
        assert_eq!((&s.dims, s.ty), (&t.dims, t.ty));
        assert_eq!(data, one.tensor_bytes(t).unwrap(), "{}", t.name);
    }

    // The same model: the same logits, from the mapped parts and from bytes.
    let tokens = [3, 17, 99, 4];
    let expect = last_logits(&Model::from_gguf(Arc::new(one)).unwrap(), &tokens);
    let mapped = Model::open(&first).unwrap();
    assert_eq!(last_logits(&mapped, &tokens), expect);
    let owned = Model::from_gguf(Arc::new(GgufFile::from_parts(parts).unwrap())).unwrap();
    assert_eq!(last_logits(&owned, &tokens), expect);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_part_alone_or_missing_is_refused_with_what_to_do() {
    let one = GgufFile::from_vec(whole()).unwrap();
    let parts = split_model(&one, 3).unwrap();
    let dir = scratch("refuse");
    write_parts(&dir, &parts);

    let second = dir.join(part_name("model", 1, 3));
    let e = GgufFile::open(&second).unwrap_err();
    assert!(
        matches!(&e, GgufError::Split(m) if m.contains("part 2 of 3") && m.contains("first part")),
        "{e}"
    );

    let third = dir.join(part_name("model", 2, 3));
    std::fs::remove_file(&third).unwrap();
    let e = GgufFile::open(dir.join(part_name("model", 0, 3))).unwrap_err();
    assert!(
        matches!(&e, GgufError::Io { path, .. } if path.ends_with("model-00003-of-00003.gguf")),
        "{e}"
    );

    // A first part renamed so that its siblings cannot be found.
    let renamed = dir.join("model.gguf");
    std::fs::write(&renamed, &parts[0]).unwrap();
    let e = GgufFile::open(&renamed).unwrap_err();
    assert!(
        matches!(&e, GgufError::Split(m) if m.contains("NAME-00001-of-00003.gguf")),
        "{e}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn parts_that_do_not_fit_together_are_refused() {
    let one = GgufFile::from_vec(whole()).unwrap();
    let three = split_model(&one, 3).unwrap();
    let two = split_model(&one, 2).unwrap();
    let err = |parts: Vec<Vec<u8>>| match GgufFile::from_parts(parts) {
        Err(GgufError::Split(m)) => m,
        other => panic!("expected a split error, got {other:?}"),
    };

    // Out of order, short of a part, a part of another split.
    let m = err(vec![three[0].clone(), three[2].clone(), three[1].clone()]);
    assert!(
        m.contains("part 3 of 3 was given where part 2 of 3 belongs"),
        "{m}"
    );
    let m = err(three[..2].to_vec());
    assert!(m.contains("2 of the model's 3 parts"), "{m}");
    let m = err(vec![three[0].clone(), two[1].clone(), three[2].clone()]);
    assert!(m.contains("part 2 of 2"), "{m}");
    // A part given alone as a whole model.
    let m = err(vec![three[1].clone()]);
    assert!(m.contains("part 2 of 3"), "{m}");
    // A whole file is not a split's first part.
    let headers = vec![one.header().clone(), one.header().clone()];
    assert!(matches!(
        GgufHeader::merge_split(headers),
        Err(GgufError::Split(_))
    ));
}

#[test]
fn part_names_follow_llama_gguf_split() {
    assert_eq!(part_name("m", 0, 3), "m-00001-of-00003.gguf");
    assert_eq!(
        parse_part_name("Llama-3.1-8B-Q4_0-00002-of-00012.gguf"),
        Some(("Llama-3.1-8B-Q4_0", 1, 12))
    );
    for bad in [
        "m.gguf",
        "m-00000-of-00003.gguf",
        "m-00004-of-00003.gguf",
        "m-0001-of-00003.gguf",
        "m-00001-of-00003.bin",
    ] {
        assert_eq!(parse_part_name(bad), None, "{bad}");
    }
}
