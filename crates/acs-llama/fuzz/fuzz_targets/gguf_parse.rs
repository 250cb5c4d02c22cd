//! Arbitrary bytes into the GGUF header parser, the tensor-info walk, the streaming
//! tensor reader and the dequantizers: none may panic, hang or over-allocate.
//!
//! The reader's source files (and the CPU modules its kernels call) are
//! compiled in directly rather than through the `acs-llama` crate, so a sanitizer
//! build does not have to build the tokenizer's dependency tree too.
#![no_main]
#![allow(dead_code, unused_imports)]

#[path = "../../src/cpu/mod.rs"]
mod cpu;
#[path = "../../src/exp.rs"]
mod exp;
#[path = "../../src/gguf/mod.rs"]
mod gguf;
#[path = "../../src/lanes.rs"]
mod lanes;
#[path = "../../src/quant/mod.rs"]
mod quant;

use gguf::{GgufError, GgufFile, GgufHeader, HeaderParse, TensorInfo, TensorStream};
use libfuzzer_sys::fuzz_target;

/// Dequantizes and dots the first row of a tensor, if it is small enough to be quick.
fn exercise(t: &TensorInfo, bytes: &[u8]) {
    let n = t.row_len() as usize;
    if !t.ty.is_supported() || n == 0 || n > 4096 {
        return;
    }
    let Ok(rb) = t.ty.row_bytes(n) else { return };
    let Some(row) = bytes.get(..rb) else { return };
    let mut y = vec![0f32; n];
    quant::dequantize_row(t.ty, row, &mut y).expect("shape checked");
    let x: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
    quant::dot_row(t.ty, row, &x).expect("shape checked");
    if t.ty.uses_q8_activations() {
        quant::dot_row_q8(t.ty, row, &quant::quantize_activations(&x)).expect("shape checked");
    }
}

fuzz_target!(|data: &[u8]| {
    match GgufHeader::parse(data) {
        Ok(HeaderParse::Complete(h)) => {
            // A file that claims to be a split's part: the parts given as the same
            // file twice never merge (one part's number is out of place).
            if h.split().is_ok_and(|s| s.is_some()) {
                assert!(
                    GgufHeader::merge_split(vec![h.as_ref().clone(), h.as_ref().clone()]).is_err()
                );
            }
            let in_file = h.check_file_len(0, data.len() as u64).is_ok();
            let mut stream = TensorStream::new(&h).expect("ranges were checked by parse");
            let mut seen = 0usize;
            for chunk in data.chunks(61) {
                stream
                    .push(chunk, |t, b| {
                        assert_eq!(b.len() as u64, t.n_bytes);
                        exercise(t, b);
                        seen += 1;
                        Ok::<(), GgufError>(())
                    })
                    .expect("callback never fails");
            }
            assert_eq!(stream.finish().is_ok(), in_file);
            assert!(!in_file || seen == h.tensors.len());
            // The same file piece by piece (the browser's GPU upload): the pieces of
            // each tensor add up to its size.
            let mut stream = TensorStream::new(&h).expect("ranges were checked by parse");
            let (mut done, mut got) = (0usize, 0u64);
            for chunk in data.chunks(47) {
                stream
                    .push_pieces(chunk, |t, b, last| {
                        got += b.len() as u64;
                        if last {
                            assert_eq!(got, t.n_bytes);
                            (got, done) = (0, done + 1);
                        }
                        Ok::<(), GgufError>(())
                    })
                    .expect("callback never fails");
            }
            assert_eq!(stream.finish().is_ok(), in_file);
            assert!(!in_file || done == h.tensors.len());
        }
        Ok(HeaderParse::NeedMore { min_len }) => assert!(min_len > data.len() as u64),
        Err(_) => {}
    }
    if let Ok(f) = GgufFile::from_vec(data.to_vec()) {
        for t in f.tensors() {
            let b = f.tensor_bytes(t).expect("in bounds after open");
            assert_eq!(b.len() as u64, t.n_bytes);
        }
    }
});
