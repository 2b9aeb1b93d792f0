//! The fuzz targets' inputs kept as regressions (`fuzz/regressions/<target>/`: every crasher the
//! fuzzers found, and a few seeds), replayed through the same checks the targets run
//! (`tests/support/decoders.rs`), so that `scripts/test` runs them on stable Rust.

#[path = "support/decoders.rs"]
mod decoders;

use std::path::PathBuf;

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let folder = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions")
        .join(target);
    let mut inputs: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&folder)
        .unwrap_or_else(|error| panic!("{}: {error}", folder.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} holds no inputs", folder.display());
    inputs
}

#[test]
fn o1_fuzz_regressions_record_line() {
    for (_, bytes) in inputs("record_line") {
        decoders::record_line(&bytes);
    }
}

#[test]
fn r1_fuzz_regressions_device_file() {
    for (_, bytes) in inputs("device_file") {
        let folder = tempfile::tempdir().unwrap();
        decoders::device_file(folder.path(), &bytes);
    }
}

#[test]
fn f1_f2_fuzz_regressions_intent_payload() {
    for (_, bytes) in inputs("intent_payload") {
        decoders::intent_payload(&bytes);
    }
}

#[test]
fn i1_fuzz_regressions_device_key() {
    for (_, bytes) in inputs("device_key") {
        decoders::device_key(&bytes);
    }
}

#[test]
fn fuzz_regressions_genesis() {
    for (_, bytes) in inputs("genesis") {
        decoders::genesis(&bytes);
    }
}

#[cfg(feature = "sqlite")]
#[test]
fn k3_fuzz_regressions_checkpoint() {
    let scratch = tempfile::tempdir().unwrap();
    let fixture = decoders::checkpoint_fixture(scratch.path());
    for (_, bytes) in inputs("checkpoint") {
        decoders::checkpoint(&fixture, scratch.path(), &bytes);
    }
}

#[test]
fn s6_fuzz_regressions_sealed_checkpoint() {
    for (_, bytes) in inputs("sealed_checkpoint") {
        decoders::sealed_checkpoint(&bytes);
    }
}
