//! The torture test: many `fencepost run` processes of the built binary, on several device ids
//! (some shared by several processes), fire the occurrences of three agents against one coordinator
//! and one ledger folder, while a nemesis pauses them past their TTL (SIGSTOP), kills them
//! mid-command (SIGKILL) and asks them to stop (SIGTERM). Each command applies its effect through
//! a fenced reference resource (a file under a lock) that refuses a stale epoch, and only that.
//!
//! Checked afterwards: no run's effect was applied twice; every run whose effect was applied is
//! `committed` or in doubt in `ledger runs` (an effect is never lost from the ledger), every
//! committed run's effect was applied, every run in the ledger ended committed, failed or in doubt,
//! and `ledger verify` passes. The counts are printed.
//!
//! `FENCEPOST_TORTURE_SECS` sets how long the nemesis runs (default 60).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{text, Shared};

const AGENTS: [&str; 3] = ["torture-0", "torture-1", "torture-2"];
/// One device id per worker process slot; host-a and host-b are shared by several at once.
const DEVICES: [&str; 8] = [
    "host-a", "host-a", "host-a", "host-b", "host-b", "host-c", "host-d", "host-e",
];
/// Each slot of this many milliseconds is one occurrence per agent.
const SLOT_MS: u128 = 1_500;
const EFFECT_DIR: &str = "FENCEPOST_TORTURE_DIR";

/// splitmix64, seeded from the clock and printed, so a failing run can be told apart.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

/// Writes a line to the test's standard error directly, past the harness's capture, so that the
/// counts show in the test log of a passing run too.
fn report(line: String) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

fn nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// The child: the effect, applied through the fenced resource in `$FENCEPOST_TORTURE_DIR`.
/// Started by `fencepost run` in the torture tests, never on its own.
#[test]
#[ignore = "the command the torture tests run; it needs their environment"]
fn torture_effect_child() {
    let Ok(dir) = std::env::var(EFFECT_DIR) else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap();
    let (agent, run, epoch, device) = (
        var("FENCEPOST_AGENT"),
        var("FENCEPOST_RUN_ID"),
        var("FENCEPOST_EPOCH").parse::<u64>().unwrap(),
        var("FENCEPOST_DEVICE"),
    );
    let mut rng = Rng::new(nanos() ^ u64::from(std::process::id()));
    std::thread::sleep(Duration::from_millis(rng.below(400)));
    let dir = Path::new(&dir);
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("effects.lock"))
        .unwrap();
    lock.lock().unwrap();
    let applied = std::fs::read_to_string(dir.join("effects")).unwrap_or_default();
    let highest = applied
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            (fields[0] == agent).then(|| fields[2].parse::<u64>().unwrap())
        })
        .max()
        .unwrap_or(0);
    let line = format!("{agent} {run} {epoch} {device}\n");
    let (file, code) = if epoch < highest {
        ("refused", 3)
    } else {
        ("effects", 0)
    };
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(file))
        .unwrap();
    out.write_all(line.as_bytes()).unwrap();
    out.sync_data().unwrap();
    drop(lock);
    std::thread::sleep(Duration::from_millis(rng.below(200)));
    std::process::exit(code);
}

/// The fencepost processes running now, by a test-wide id.
type Running = Arc<Mutex<BTreeMap<u64, Child>>>;

#[derive(Debug, Default)]
struct Counts {
    fired: u64,
    exits: BTreeMap<i32, u64>,
    paused: u64,
    killed: u64,
    terminated: u64,
}

fn torture(shared: &Shared) {
    let seconds: u64 = std::env::var("FENCEPOST_TORTURE_SECS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(60);
    let seed = nanos();
    report(format!(
        "torture: {seconds} s, seed {seed}, coordinator {}",
        shared.coordinator
    ));
    let effect_exe = std::env::current_exe().unwrap();
    let dir = shared.folder.path().to_path_buf();
    let running: Running = Arc::new(Mutex::new(BTreeMap::new()));
    let counts = Arc::new(Mutex::new(Counts::default()));
    let fired = Arc::new(Mutex::new(BTreeSet::<(String, String)>::new()));
    let next_id = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);

    std::thread::scope(|scope| {
        for (worker, device) in DEVICES.iter().enumerate() {
            let (running, counts, fired, next_id) = (&running, &counts, &fired, &next_id);
            let (effect_exe, dir) = (&effect_exe, &dir);
            scope.spawn(move || {
                let mut rng = Rng::new(seed ^ (worker as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407));
                // Like a cron line per agent: each worker fires each occurrence once.
                let mut mine = BTreeSet::new();
                while Instant::now() < deadline {
                    let slot = started.elapsed().as_millis() / SLOT_MS;
                    let agent = AGENTS[rng.below(AGENTS.len() as u64) as usize];
                    let salt = format!("slot-{slot}");
                    if !mine.insert((agent, slot)) {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    let mut command = shared.command(
                        device,
                        &[
                            "run",
                            "--agent",
                            agent,
                            "--intent",
                            "torture",
                            "--salt",
                            &salt,
                            "--ttl",
                            "1s",
                            "--wait",
                            "2s",
                            "--kill-after",
                            "500ms",
                            "--",
                        ],
                    );
                    command
                        .arg(effect_exe)
                        .args(["torture_effect_child", "--exact", "--ignored", "--nocapture"])
                        .env(EFFECT_DIR, dir)
                        .stdout(Stdio::null())
                        .stderr(Stdio::piped());
                    let child = command.spawn().unwrap();
                    fired.lock().unwrap().insert((agent.to_owned(), salt));
                    let id = next_id.fetch_add(1, Ordering::SeqCst);
                    running.lock().unwrap().insert(id, child);
                    // Reap only under the lock, so the nemesis never signals a reaped (reusable) pid.
                    let status = loop {
                        std::thread::sleep(Duration::from_millis(20));
                        let mut running = running.lock().unwrap();
                        let child = running.get_mut(&id).unwrap();
                        if child.try_wait().unwrap().is_some() {
                            let child = running.remove(&id).unwrap();
                            drop(running);
                            // Already reaped: this returns at once, with its status and stderr.
                            let output = child.wait_with_output().unwrap();
                            let (status, stderr) = (output.status, text(&output.stderr));
                            let code = status.code().unwrap_or(-1);
                            // 143: a SIGTERM of the nemesis that came while fencepost waited, or
                            // between the fence and the command's start (it then records `failed`).
                            assert!(
                                [-1, 0, 1, 3, 4, 5, 6, 143].contains(&code),
                                "fencepost exited {code}: {stderr}"
                            );
                            break status;
                        }
                    };
                    let mut counts = counts.lock().unwrap();
                    counts.fired += 1;
                    *counts.exits.entry(status.code().unwrap_or(-1)).or_default() += 1;
                }
            });
        }
        // The nemesis.
        let (running, counts, done) = (&running, &counts, &done);
        scope.spawn(move || {
            let mut rng = Rng::new(seed);
            while Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(150 + rng.below(350)));
                let pick = {
                    let mut running = running.lock().unwrap();
                    let ids: Vec<u64> = running.keys().copied().collect();
                    if ids.is_empty() {
                        continue;
                    }
                    let id = ids[rng.below(ids.len() as u64) as usize];
                    let child = running.get_mut(&id).unwrap();
                    if child.try_wait().unwrap().is_some() {
                        continue; // exited; its worker reaps it
                    }
                    let pid = child.id();
                    let action = rng.below(3);
                    let signal = ["STOP", "KILL", "TERM"][action as usize];
                    let sent = std::process::Command::new("kill")
                        .args([&format!("-{signal}"), &pid.to_string()])
                        .status()
                        .unwrap()
                        .success();
                    sent.then_some((id, action))
                };
                let Some((id, action)) = pick else { continue };
                let mut tally = counts.lock().unwrap();
                match action {
                    0 => tally.paused += 1,
                    1 => tally.killed += 1,
                    _ => tally.terminated += 1,
                }
                drop(tally);
                if action == 0 {
                    // Past the 1 s TTL, then resume (unless it was reaped meanwhile: it cannot be).
                    std::thread::sleep(Duration::from_millis(1_200 + rng.below(800)));
                    let running = running.lock().unwrap();
                    if let Some(child) = running.get(&id) {
                        let _ = std::process::Command::new("kill")
                            .args(["-CONT", &child.id().to_string()])
                            .status();
                    }
                }
            }
            done.store(true, Ordering::SeqCst);
        });
    });
    assert!(done.load(Ordering::SeqCst));
    std::thread::sleep(Duration::from_millis(1_200)); // every dead holder's lease runs out

    // What the resource applied.
    let effects = std::fs::read_to_string(dir.join("effects")).unwrap_or_default();
    let refused = std::fs::read_to_string(dir.join("refused")).unwrap_or_default();
    let mut applied: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in effects.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        applied
            .entry(fields[1].to_owned())
            .or_default()
            .push(line.to_owned());
    }
    let twice: Vec<_> = applied.values().filter(|lines| lines.len() > 1).collect();
    assert!(twice.is_empty(), "effects applied twice (seed {seed}): {twice:?}");

    // What the ledger says.
    let runs = shared.run("checker", &["ledger", "runs", "--json"]);
    assert!(runs.status.success(), "{}", text(&runs.stderr));
    let runs: serde_json::Value = serde_json::from_slice(&runs.stdout).unwrap();
    let status: BTreeMap<String, String> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|run| {
            (
                run["run_id"].as_str().unwrap().to_owned(),
                run["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (run, state) in &status {
        assert!(
            ["committed", "failed", "in-doubt"].contains(&state.as_str()),
            "{run} ended {state} (seed {seed})"
        );
        if state == "committed" {
            assert!(
                applied.contains_key(run),
                "{run} committed, but no effect was applied (seed {seed})"
            );
        }
    }
    for run in applied.keys() {
        let state = status.get(run).map(String::as_str);
        assert!(
            matches!(state, Some("committed" | "in-doubt")),
            "{run}'s effect was applied, but the ledger says {state:?} (seed {seed})"
        );
    }
    // Every run the ledger knows was fired (the runs it knows all ended, checked above).
    let fired = fired.lock().unwrap();
    let fired_runs: BTreeSet<String> = fired
        .iter()
        .map(|(agent, salt)| fencepost::run_id::deterministic_run_id(agent, "torture", salt).unwrap())
        .collect();
    for run in status.keys() {
        assert!(
            fired_runs.contains(run),
            "{run} in the ledger was never fired (seed {seed})"
        );
    }
    let verify = shared.run("checker", &["ledger", "verify"]);
    assert!(
        verify.status.success(),
        "{}{}",
        text(&verify.stdout),
        text(&verify.stderr)
    );

    let counts = counts.lock().unwrap();
    let count = |wanted: &str| status.values().filter(|state| *state == wanted).count();
    report(format!(
        "torture: {} firings of {} occurrences; exits {:?}; nemesis: {} paused past the TTL, {} killed, {} terminated",
        counts.fired,
        fired.len(),
        counts.exits,
        counts.paused,
        counts.killed,
        counts.terminated
    ));
    report(format!(
        "torture: {} effects applied (none twice), {} refused by the resource (stale epoch); ledger: {} runs, {} committed, {} failed, {} in doubt",
        applied.len(),
        refused.lines().count(),
        status.len(),
        count("committed"),
        count("failed"),
        count("in-doubt")
    ));
    assert!(
        counts.killed > 0 && counts.paused > 0 && counts.terminated > 0,
        "the nemesis acted"
    );
    assert!(count("committed") > 0, "work got done");
}

/// The torture test on one SQLite coordinator and one ledger folder.
#[test]
fn torture_sqlite_no_effect_twice_none_lost_under_stop_kill_and_term() {
    torture(&Shared::sqlite());
}

/// The torture test on PostgreSQL (`scripts/test` runs it against its throw-away server).
#[test]
#[ignore = "needs a PostgreSQL server: FENCEPOST_POSTGRES_URL (scripts/test provides one)"]
fn torture_postgres_no_effect_twice_none_lost_under_stop_kill_and_term() {
    let url = std::env::var("FENCEPOST_POSTGRES_URL")
        .expect("FENCEPOST_POSTGRES_URL must name a server (scripts/test starts one)");
    // The schema is an explicit admin step (the hosts only check it).
    let admin = Shared::with(tempfile::tempdir().unwrap(), url.clone(), "admin");
    let migrated = admin.run("admin-host", &["admin", "migrate"]);
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let folder = tempfile::tempdir().unwrap();
    let shared = Shared::with(folder, url, "torture");
    torture(&shared);
}
