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
//! One host, `host-lag`, has a copy of the folder of its own, synced both ways at random delays
//! (files and checkpoints one at a time, in random order, as a sync tool does: [`LaggingSync`]),
//! and prunes its file in a loop while `host-e` prunes its own in the shared folder (issue 37,
//! acceptance): once the copies have caught up, every host runs a new occurrence (none stuck on
//! exit 10) and both copies verify.
//!
//! `FENCEPOST_TORTURE_SECS` sets how long the nemesis runs (default 60).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{text, Shared};

const AGENTS: [&str; 3] = ["torture-0", "torture-1", "torture-2"];
/// One device id per worker process slot; host-a and host-b are shared by several at once.
const DEVICES: [&str; 9] = [
    "host-a", "host-a", "host-a", "host-b", "host-b", "host-c", "host-d", "host-e", LAGGING,
];
/// The device whose ledger is its own copy of the folder ([`LaggingSync`]); it prunes its file.
const LAGGING: &str = "host-lag";
/// A device of the shared folder that prunes its file.
const PRUNING: &str = "host-e";
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

/// A two-way sync between the shared ledger folder and [`LAGGING`]'s copy, as a sync tool does
/// it: a device file goes from the copy its device writes to the other; a checkpoint written on
/// one side goes to the other, and one removed on a side where both had it is removed on the
/// other. Each file is copied whole (a temporary file, then a rename), one at a time, in random
/// order, at random pauses: a file may arrive before the checkpoint that covers what was pruned
/// from it, or after.
struct LaggingSync {
    shared: PathBuf,
    copy: PathBuf,
    /// The checkpoints both sides have held (a checkpoint's name is its content): one of them
    /// missing on a side was removed there, and is removed on the other, never copied back
    /// (CI saw a copy racing a removal bring an old checkpoint back for good).
    both: BTreeSet<String>,
}

/// One step of a pass of [`LaggingSync`].
enum Step {
    Copy(PathBuf, PathBuf),
    Remove(PathBuf),
}

/// The names of the files in `dir` that `keep` keeps.
fn names(dir: &Path, keep: impl Fn(&str) -> bool) -> BTreeSet<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| keep(name))
        .collect()
}

impl LaggingSync {
    fn new(shared: &Path, copy: &Path) -> Self {
        for sub in ["devices", "checkpoints"] {
            std::fs::create_dir_all(shared.join(sub)).unwrap();
            std::fs::create_dir_all(copy.join(sub)).unwrap();
        }
        Self {
            shared: shared.to_path_buf(),
            copy: copy.to_path_buf(),
            both: BTreeSet::new(),
        }
    }

    /// One pass over every file, in random order, with pauses of up to `pause_ms` between files.
    fn pass(&mut self, rng: &mut Rng, pause_ms: u64) {
        let mut steps = Vec::new();
        let lagging = format!("{LAGGING}.jsonl");
        for (from, to, ours) in [
            (&self.shared, &self.copy, false),
            (&self.copy, &self.shared, true),
        ] {
            for name in names(&from.join("devices"), |name| name.ends_with(".jsonl")) {
                if (name == lagging) == ours {
                    steps.push(Step::Copy(
                        from.join("devices").join(&name),
                        to.join("devices").join(&name),
                    ));
                }
            }
        }
        let checkpoint = |name: &str| name.starts_with("checkpoint-") && name.ends_with(".sqlite");
        let (here, there) = (self.shared.join("checkpoints"), self.copy.join("checkpoints"));
        let (in_here, in_there) = (names(&here, checkpoint), names(&there, checkpoint));
        for name in in_here.symmetric_difference(&in_there) {
            let (has, lacks) = if in_here.contains(name) {
                (&here, &there)
            } else {
                (&there, &here)
            };
            steps.push(if self.both.contains(name) {
                Step::Remove(has.join(name))
            } else {
                Step::Copy(has.join(name), lacks.join(name))
            });
        }
        for index in (1..steps.len()).rev() {
            steps.swap(index, rng.below(index as u64 + 1) as usize);
        }
        for step in steps {
            std::thread::sleep(Duration::from_millis(rng.below(pause_ms + 1)));
            match step {
                Step::Copy(from, to) => {
                    if to.parent() != Some(self.copy.join("devices").as_path())
                        && to.parent() != Some(self.shared.join("devices").as_path())
                    {
                        self.both
                            .insert(to.file_name().unwrap().to_string_lossy().into_owned());
                    }
                    copy_whole(&from, &to);
                }
                Step::Remove(path) => {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        self.both.extend(
            names(&here, checkpoint)
                .intersection(&names(&there, checkpoint))
                .cloned(),
        );
    }
}

/// Copies `from` over `to` whole, unless they hold the same bytes (a file removed meanwhile is
/// left for the next pass).
fn copy_whole(from: &Path, to: &Path) {
    let Ok(bytes) = std::fs::read(from) else {
        return;
    };
    if std::fs::read(to).is_ok_and(|old| old == bytes) {
        return;
    }
    let temporary = to.with_file_name(format!(".sync-{}", to.file_name().unwrap().to_string_lossy()));
    std::fs::write(&temporary, &bytes).unwrap();
    std::fs::rename(&temporary, to).unwrap();
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

/// Where a firing finds its effect and its ledger.
struct Places<'a> {
    effect_exe: &'a Path,
    dir: &'a Path,
    /// [`LAGGING`]'s copy of the ledger folder.
    copy: &'a Path,
}

impl Places<'_> {
    /// `fencepost run` of `agent`'s occurrence `salt` on `device`, the effect through the fenced
    /// resource, standard error piped.
    fn firing(
        &self,
        shared: &Shared,
        device: &str,
        agent: &str,
        salt: &str,
        wait: &str,
    ) -> std::process::Command {
        let mut command = shared.command(
            device,
            &[
                "run",
                "--agent",
                agent,
                "--intent",
                "torture",
                "--salt",
                salt,
                "--ttl",
                "1s",
                "--wait",
                wait,
                "--kill-after",
                "500ms",
                "--",
            ],
        );
        command
            .arg(self.effect_exe)
            .args(["torture_effect_child", "--exact", "--ignored", "--nocapture"])
            .env(EFFECT_DIR, self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if device == LAGGING {
            command.env("FENCEPOST_LEDGER", self.copy);
        }
        command
    }
}

/// Once the storm is over and while the copies catch up: every host runs a new occurrence
/// (none is stuck on exit 10, or 7), and the lagging host and a host of the shared folder each
/// refuse the other's (exit 3).
fn caught_up(shared: &Shared, places: &Places, fired: &Mutex<BTreeSet<(String, String)>>) {
    let mut hosts: Vec<&str> = DEVICES.to_vec();
    hosts.dedup();
    let fire = |device: &str, salt: &str| {
        fired
            .lock()
            .unwrap()
            .insert((AGENTS[0].to_owned(), salt.to_owned()));
        let output = places
            .firing(shared, device, AGENTS[0], salt, "20s")
            .output()
            .unwrap();
        (output.status.code(), text(&output.stderr))
    };
    for device in &hosts {
        let (code, stderr) = fire(device, &format!("final-{device}"));
        assert_eq!(code, Some(0), "{device}, once the copies caught up: {stderr}");
    }
    for (device, salt) in [(LAGGING, "final-host-a"), ("host-a", "final-host-lag")] {
        let (code, stderr) = fire(device, salt);
        assert_eq!(code, Some(3), "{device}, {salt}: {stderr}");
    }
}

/// Clears its flag when dropped, on a panic too.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
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
    /// The exits of the prunes (`ledger compact --prune`), and what the first refusals said.
    prunes: BTreeMap<i32, u64>,
    refusals: Vec<String>,
    /// Firings that waited for a checkpoint the sync had not brought, and the lagging host's
    /// firings and effects.
    waited_for_checkpoint: u64,
    lagging: (u64, u64),
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
    let copy = shared.path("ledger-lag");
    let sync = Mutex::new(LaggingSync::new(&shared.path("ledger"), &copy));
    let syncing = AtomicBool::new(true);
    let running: Running = Arc::new(Mutex::new(BTreeMap::new()));
    let counts = Arc::new(Mutex::new(Counts::default()));
    let fired = Arc::new(Mutex::new(BTreeSet::<(String, String)>::new()));
    let next_id = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);

    std::thread::scope(|scope| {
        let mut storm = Vec::new();
        for (worker, device) in DEVICES.iter().enumerate() {
            let (running, counts, fired, next_id) = (&running, &counts, &fired, &next_id);
            let (effect_exe, dir, copy) = (&effect_exe, &dir, &copy);
            storm.push(scope.spawn(move || {
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
                    let places = Places {
                        effect_exe,
                        dir,
                        copy,
                    };
                    let mut command = places.firing(shared, device, agent, &salt, "2s");
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
                            // 7: the copies had not caught up within --wait.
                            assert!(
                                [-1, 0, 1, 3, 4, 5, 6, 7, 143].contains(&code),
                                "fencepost exited {code}: {stderr}"
                            );
                            let mut counts = counts.lock().unwrap();
                            counts.waited_for_checkpoint +=
                                u64::from(stderr.contains("waiting for it while --wait lasts"));
                            if *device == LAGGING {
                                counts.lagging.0 += 1;
                                counts.lagging.1 += u64::from(code == 0 || code == 1);
                            }
                            break status;
                        }
                    };
                    let mut counts = counts.lock().unwrap();
                    counts.fired += 1;
                    *counts.exits.entry(status.code().unwrap_or(-1)).or_default() += 1;
                }
            }));
        }
        // The sync, until the end of the last runs (or a panic of this thread: the scope would
        // wait for the sync for ever).
        let (sync, syncing) = (&sync, &syncing);
        let _stop_syncing = StopOnDrop(syncing);
        scope.spawn(move || {
            let mut rng = Rng::new(seed ^ 0x5EED_5EED);
            while syncing.load(Ordering::SeqCst) {
                sync.lock().unwrap().pass(&mut rng, 200);
                std::thread::sleep(Duration::from_millis(rng.below(600)));
            }
        });
        // The prunes: the lagging host's in its copy, another host's in the shared folder.
        let (copy, counts) = (&copy, &counts);
        storm.push(scope.spawn(move || {
            let mut rng = Rng::new(seed ^ 0x0091_217E);
            while Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(600 + rng.below(900)));
                for (device, ledger) in [(LAGGING, copy.clone()), (PRUNING, shared.path("ledger"))] {
                    let output = shared
                        .command(device, &["ledger", "compact", "--prune"])
                        .env("FENCEPOST_LEDGER", ledger)
                        .output()
                        .unwrap();
                    let code = output.status.code().unwrap_or(-1);
                    let mut counts = counts.lock().unwrap();
                    *counts.prunes.entry(code).or_default() += 1;
                    if code != 0 && counts.refusals.len() < 3 {
                        counts
                            .refusals
                            .push(format!("{device}: {}", text(&output.stderr)));
                    }
                }
            }
        }));
        // The nemesis.
        let (running, done) = (&running, &done);
        storm.push(scope.spawn(move || {
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
        }));
        for thread in storm {
            thread.join().unwrap();
        }
        std::thread::sleep(Duration::from_millis(1_200)); // every dead holder's lease runs out
        let places = Places {
            effect_exe: &effect_exe,
            dir: &dir,
            copy,
        };
        caught_up(shared, &places, &fired);
    });
    assert!(done.load(Ordering::SeqCst));
    // The last files and checkpoints, and the removals seen meanwhile.
    let mut rng = Rng::new(seed);
    for _ in 0..2 {
        sync.lock().unwrap().pass(&mut rng, 0);
    }

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
    for ledger in [shared.path("ledger"), copy.clone()] {
        let verify = shared
            .command("checker", &["ledger", "verify"])
            .env("FENCEPOST_LEDGER", &ledger)
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "{}: {}{}",
            ledger.display(),
            text(&verify.stdout),
            text(&verify.stderr)
        );
    }

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
        "torture: prunes exited {:?}; the first refusals: {:?}; {} firings waited for a checkpoint the sync had not brought; {LAGGING} fired {} times, ran {}",
        counts.prunes, counts.refusals, counts.waited_for_checkpoint, counts.lagging.0, counts.lagging.1
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
