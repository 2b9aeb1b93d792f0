//! Fuzz target: see `crates/fencepost/tests/support/decoders.rs` (`checkpoint`).
#![no_main]

#[path = "../../crates/fencepost/tests/support/decoders.rs"]
mod decoders;

use std::sync::OnceLock;

/// One scratch folder and ledger for the whole run: each input damages the checkpoint, which is
/// put back after it.
static FIXTURE: OnceLock<(tempfile::TempDir, decoders::CheckpointFixture)> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    let (scratch, fixture) = FIXTURE.get_or_init(|| {
        let scratch = tempfile::tempdir().expect("a scratch folder");
        let fixture = decoders::checkpoint_fixture(scratch.path());
        (scratch, fixture)
    });
    decoders::checkpoint(fixture, scratch.path(), bytes);
});
