//! Fuzz target: see `crates/fencepost/tests/support/decoders.rs` (`record_line`).
#![no_main]

#[path = "../../crates/fencepost/tests/support/decoders.rs"]
mod decoders;

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| decoders::record_line(bytes));
