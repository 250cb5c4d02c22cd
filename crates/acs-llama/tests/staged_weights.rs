//! A model whose weights stay outside the process ([`WeightSource`]: a browser's JS
//! memory for a model larger than wasm32 addresses) runs as the same model loaded from
//! its file: each step stages one block's matrices at a time into a buffer the size
//! of the largest group, and a source that fails refuses the step with its reason.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use acs_llama::gguf::{GgufFile, GgufHeader, split_model};
use acs_llama::model::{Logits, Model, ModelError, SeqInput, WeightSource};
use acs_llama::quant::GgmlType;
use acs_llama::testgen::{TestModelSpec, test_model_bytes};

/// Files' bytes held apart from the model, counting what is read, failing on request.
#[derive(Debug, Default)]
struct Files {
    parts: Vec<Vec<u8>>,
    read: AtomicU64,
    fail: std::sync::atomic::AtomicBool,
}

impl WeightSource for Files {
    fn read(&self, part: u16, offset: u64, dst: &mut [u8]) -> Result<(), String> {
        if self.fail.load(Ordering::Relaxed) {
            return Err("the page was closed".into());
        }
        let file = &self.parts[usize::from(part)];
        let at = usize::try_from(offset).map_err(|e| e.to_string())?;
        let src = file
            .get(at..at + dst.len())
            .ok_or_else(|| format!("bytes {at}.. are past file {part}'s end"))?;
        dst.copy_from_slice(src);
        self.read.fetch_add(dst.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Every row's logits of `prompt` fed as one prefill, then of `next` as a decode step.
fn logits(model: &Model, prompt: &[u32], next: u32) -> Result<Vec<Vec<f32>>, ModelError> {
    let mut cache = model.new_cache();
    let mut out = Vec::new();
    for (tokens, logits) in [(prompt, Logits::All), (&[next][..], Logits::Last)] {
        let mut batch = [SeqInput {
            cache: &mut cache,
            tokens,
            steering: &[],
            capture: &[],
            logits,
        }];
        out.push(model.forward(&mut batch)?.remove(0).logits);
    }
    Ok(out)
}

/// The kernels read staged matrices as the file has them, where a file's matrices
/// may be repacked into panels for this CPU: the same sums in another order.
fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    for (a, b) in a.iter().zip(b) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-3 * x.abs().max(1.0),
                "{what}: logit {i}: {x} from the file, {y} staged"
            );
        }
    }
}

fn staged(parts: Vec<Vec<u8>>) -> (Model, Arc<Files>) {
    let headers = parts
        .iter()
        .map(|p| GgufHeader::parse_complete(p).unwrap())
        .collect();
    let header = GgufHeader::of_files(headers).unwrap();
    let files = Arc::new(Files {
        parts,
        ..Files::default()
    });
    let source: Arc<dyn WeightSource> = files.clone();
    (Model::from_source(&header, source).unwrap(), files)
}

#[test]
fn staged_weights_run_as_the_file_does() {
    let fused = TestModelSpec {
        family: acs_llama::model::Family::Phi3,
        ..TestModelSpec::tiny()
    };
    let q4_k_m = TestModelSpec {
        value_down_type: Some(GgmlType::Q6_K),
        ..TestModelSpec::tiny_k(GgmlType::Q4_K)
    };
    // Tied and untied output matrices, fused projections (rows of one tensor), and
    // the K-quants' super-blocks.
    for (name, spec) in [
        ("tiny", TestModelSpec::tiny()),
        ("phi3", fused),
        ("q4_k_m", q4_k_m),
    ] {
        let bytes = test_model_bytes(&spec).unwrap();
        let file = Model::from_gguf(Arc::new(GgufFile::from_vec(bytes.clone()).unwrap())).unwrap();
        let (model, files) = staged(vec![bytes.clone()]);
        let prompt = [1, 7, 42, 99, 5, 250];
        let expect = logits(&file, &prompt, 17).unwrap();
        let before = files.read.load(Ordering::Relaxed);
        assert_close(&expect, &logits(&model, &prompt, 17).unwrap(), name);

        // Each step read every matrix once more, and the stage holds one group: a
        // block's matrices, or the output matrix.
        let per_step = model.weight_bytes_per_token();
        let read = files.read.load(Ordering::Relaxed) - before;
        assert!(
            read >= 2 * per_step,
            "{name}: {read} bytes read in two steps"
        );
        assert!(model.stage_bytes() > 0);
        assert!(
            (model.stage_bytes() as u64) < per_step,
            "{name}: a stage of {} bytes for {per_step} bytes of matrices",
            model.stage_bytes()
        );
        assert_eq!(file.stage_bytes(), 0);
    }
}

#[test]
fn a_split_model_stages_from_each_of_its_files() {
    let bytes = test_model_bytes(&TestModelSpec::tiny_k(GgmlType::Q6_K)).unwrap();
    let one = GgufFile::from_vec(bytes).unwrap();
    let parts = split_model(&one, 3).unwrap();
    let file = Model::from_gguf(Arc::new(one)).unwrap();
    let (model, _) = staged(parts);
    let prompt = [3, 17, 99, 4];
    assert_close(
        &logits(&file, &prompt, 8).unwrap(),
        &logits(&model, &prompt, 8).unwrap(),
        "split",
    );
}

#[test]
fn a_source_that_fails_refuses_the_step_and_the_next_one_runs() {
    let bytes = test_model_bytes(&TestModelSpec::tiny()).unwrap();
    let (model, files) = staged(vec![bytes]);
    let prompt = [1, 2, 3];
    let expect = logits(&model, &prompt, 4).unwrap();
    files.fail.store(true, Ordering::Relaxed);
    match logits(&model, &prompt, 4) {
        Err(ModelError::WeightSource(why)) => assert_eq!(why, "the page was closed"),
        other => panic!("expected the source's error, got {other:?}"),
    }
    files.fail.store(false, Ordering::Relaxed);
    assert_eq!(logits(&model, &prompt, 4).unwrap(), expect);
}

#[test]
fn a_source_short_of_its_tensors_is_an_error_not_a_panic() {
    let bytes = test_model_bytes(&TestModelSpec::tiny()).unwrap();
    let header = GgufHeader::parse_complete(&bytes).unwrap();
    // The norms are read as the model loads, the matrices as each step stages them:
    // a source cut inside the first block fails at one or the other.
    let cut = header.data_offset as usize + (bytes.len() - header.data_offset as usize) / 2;
    let files = Arc::new(Files {
        parts: vec![bytes[..cut].to_vec()],
        ..Files::default()
    });
    match Model::from_source(&header, files) {
        Err(ModelError::WeightSource(_)) => {}
        Ok(model) => assert!(matches!(
            logits(&model, &[1, 2], 3),
            Err(ModelError::WeightSource(_))
        )),
        Err(other) => panic!("expected the source's error, got {other:?}"),
    }
}
