//! Writes the tiny random-weight test model of a family (`TestModelSpec::tiny`, with
//! the family's metadata and tensors): what `scripts/oracle/record.sh` gives llama.cpp
//! so that the tests can hold ACS to llama.cpp's logits on the same file.
//!
//! `cargo run -p acs-llama --example test_model -- FAMILY OUT.gguf`

use acs_llama::model::Family;
use acs_llama::testgen::{TestModelSpec, write_test_model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(family), Some(out)) = (args.next(), args.next()) else {
        return Err("usage: test_model FAMILY OUT.gguf".into());
    };
    let spec = TestModelSpec {
        family: Family::from_name(&family)?,
        ..TestModelSpec::tiny()
    };
    write_test_model(&spec, &out)?;
    eprintln!("wrote {out}");
    Ok(())
}
