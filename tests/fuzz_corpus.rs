//! The fuzz corpus (`fuzz/corpus/<target>/`: the seeds and every input the fuzzers kept for new
//! coverage, crashes found and fixed included) replayed through the same entry points the fuzz
//! targets call (`sluice::fuzzing`), as an ordinary test on stable Rust (issue "reliability";
//! SPEC P4, S5). A regression that makes any of them panic fails here.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

use std::path::Path;

#[test]
fn every_corpus_input_runs_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut total = 0;
    for (name, target) in sluice::fuzzing::TARGETS {
        let dir = root.join(name);
        let mut inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .collect();
        inputs.sort();
        assert!(!inputs.is_empty(), "{name}: no corpus");
        for input in &inputs {
            let data = std::fs::read(input).unwrap();
            let ran = std::panic::catch_unwind(|| target(&data));
            assert!(ran.is_ok(), "{name}: {} panics", input.display());
        }
        total += inputs.len();
    }
    println!("{total} corpus inputs replayed");
}
