//! Fuzz target: see `crates/fencepost/tests/support/decoders.rs` (`device_file`).
#![no_main]

#[path = "../../crates/fencepost/tests/support/decoders.rs"]
mod decoders;

use std::sync::OnceLock;

/// One scratch folder for the whole run: each input overwrites the device file.
static FOLDER: OnceLock<tempfile::TempDir> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    let folder = FOLDER.get_or_init(|| tempfile::tempdir().expect("a scratch folder"));
    decoders::device_file(folder.path(), bytes);
});
