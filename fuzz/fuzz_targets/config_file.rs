//! Fuzz target: see `crates/fencepost-cli/src/config.rs` (`check_decoder`).
#![no_main]

#[path = "../../crates/fencepost-cli/src/config.rs"]
mod config;

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| config::check_decoder(bytes));
