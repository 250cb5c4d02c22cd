//! Writes one of the tiny random-weight models that the tests hold to llama.cpp's
//! logits ([`TestModelSpec::oracle_case`]): what `scripts/oracle/record.sh` gives
//! llama.cpp.
//!
//! `cargo run -p acs-llama --example test_model -- NAME OUT.gguf`

use acs_llama::testgen::{TestModelSpec, write_test_model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(name), Some(out)) = (args.next(), args.next()) else {
        return Err("usage: test_model NAME OUT.gguf".into());
    };
    let spec = TestModelSpec::oracle_case(&name).ok_or_else(|| {
        format!(
            "no test model {name:?}; one of {:?}",
            TestModelSpec::ORACLE_CASES
        )
    })?;
    write_test_model(&spec, &out)?;
    eprintln!("wrote {out}");
    Ok(())
}
