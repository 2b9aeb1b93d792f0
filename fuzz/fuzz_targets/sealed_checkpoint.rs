//! Fuzz target: see `crates/fencepost/tests/support/decoders.rs` (`sealed_checkpoint`).
#![no_main]

#[path = "../../crates/fencepost/tests/support/decoders.rs"]
mod decoders;

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| decoders::sealed_checkpoint(bytes));
