//! Concurrent prunes on one shared ledger folder (issue 37, case 2) through the built binary:
//! hosts that each run their own agent and `ledger compact --prune` in loops never see
//! ordinary work refused as damage (exit 10), and nothing runs twice.

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::{text, Shared};

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

/// What one host saw: its runs' and its compactions' refusals (exit 10), with their messages.
#[derive(Default)]
struct Seen {
    runs: usize,
    compactions: usize,
    refused: Vec<String>,
}

fn host_loop(shared: &Shared, device: &str, until: Instant) -> Seen {
    let mut seen = Seen::default();
    let agent = format!("agent-{device}");
    let effect = format!(
        "echo \"$FENCEPOST_RUN_ID $FENCEPOST_DEVICE\" >> '{}'",
        shared.path("effects").display()
    );
    let mut index = 0;
    while Instant::now() < until {
        let salt = format!("{device}-{index}");
        index += 1;
        let output = shared.run(
            device,
            &[
                "run", "--agent", &agent, "--intent", "job", "--salt", &salt, "--ttl", "5s", "--wait", "20s",
                "--", "sh", "-c", &effect,
            ],
        );
        seen.runs += 1;
        if code(&output) != 0 {
            seen.refused.push(format!(
                "run {salt} exit {}: {}",
                code(&output),
                text(&output.stderr)
            ));
        }
        let output = shared.run(device, &["ledger", "compact", "--prune"]);
        seen.compactions += 1;
        if code(&output) != 0 {
            seen.refused.push(format!(
                "compact exit {}: {}",
                code(&output),
                text(&output.stderr)
            ));
        }
    }
    seen
}

/// K5/K6, issue 37 case 2: three hosts on one folder, each running its own agent and pruning
/// in a loop for 30 s: every run exits 0, every compaction exits 0, `ledger verify` finds the
/// ledger intact, and every effect ran once.
#[test]
fn k6_concurrent_prunes_on_one_folder_refuse_no_run_and_no_compaction() {
    let shared = Shared::sqlite();
    let until = Instant::now() + Duration::from_secs(30);
    let devices = ["north", "south", "east"];
    let seen: Vec<Seen> = std::thread::scope(|scope| {
        let handles: Vec<_> = devices
            .iter()
            .map(|device| {
                let shared = &shared;
                scope.spawn(move || host_loop(shared, device, until))
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    let runs: usize = seen.iter().map(|host| host.runs).sum();
    let compactions: usize = seen.iter().map(|host| host.compactions).sum();
    let refused: Vec<&String> = seen.iter().flat_map(|host| &host.refused).collect();
    assert!(
        runs >= 30 && compactions >= 30,
        "too few loops to mean anything: {runs} runs, {compactions} compactions"
    );
    assert!(
        refused.is_empty(),
        "{} of {runs} runs and {compactions} compactions refused: {refused:#?}",
        refused.len()
    );
    let effects = shared.effects();
    let mut ids: Vec<&str> = effects
        .iter()
        .map(|line| line.split(' ').next().unwrap_or(""))
        .collect();
    assert_eq!(ids.len(), runs, "every run ran its command once");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), runs, "an effect ran twice");
    let output = shared.run("north", &["ledger", "verify"]);
    assert_eq!(
        code(&output),
        0,
        "{}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
}
