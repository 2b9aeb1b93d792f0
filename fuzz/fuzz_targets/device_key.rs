//! Fuzz target: see `crates/fencepost/tests/support/decoders.rs` (`device_key`).
#![no_main]

#[path = "../../crates/fencepost/tests/support/decoders.rs"]
mod decoders;

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| decoders::device_key(bytes));
