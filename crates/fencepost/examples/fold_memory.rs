//! Peak memory of folding the DESIGN §7 workload (1.9 M intent records), with the records held in
//! memory: `cargo run --release -p fencepost --example fold_memory`. Linux only (reads
//! /proc/self/status).

// A harness measures real time; the rule that only `fencepost::clock` reads the OS clock is
// the library's (crates/fencepost/clippy.toml).
#![allow(clippy::disallowed_methods)]

#[path = "../benches/support/workload.rs"]
mod workload;

use std::time::Instant;

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

fn main() {
    let started = Instant::now();
    let workload = workload::build();
    let built = started.elapsed();
    println!(
        "built {} records in {:.2} s; peak RSS {:.0} MB (records only)",
        workload.ops.len(),
        built.as_secs_f64(),
        peak_rss_mb()
    );
    let started = Instant::now();
    let state = fencepost::fold::fold(&workload.ops);
    let folded = started.elapsed();
    let runs: usize = state.agents().iter().map(|(_, agent)| agent.runs().len()).sum();
    println!(
        "folded in {:.3} s ({:.2} M ops/s); {} agents, {} runs; peak RSS {:.0} MB (records + state)",
        folded.as_secs_f64(),
        workload.ops.len() as f64 / folded.as_secs_f64() / 1e6,
        state.agents().len(),
        runs,
        peak_rss_mb()
    );
    println!("state hash {}", state.state_hash());
}
