//! Runs the built `fencepost` binary as hosts sharing a coordinator and a ledger folder.

#![allow(dead_code)]

pub mod postgres;
pub mod proxy;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A coordinator spec and a ledger folder that several "hosts" (processes with their own device
/// ids) share, and a file the test commands append to.
pub struct Shared {
    pub folder: tempfile::TempDir,
    pub coordinator: String,
    /// The agent of the daily-report runs (unique per test where the coordinator is shared).
    pub agent: String,
    /// Whether the hosts name no ledger (with a PostgreSQL coordinator, the ledger is then in its
    /// database); else they share the folder `ledger`.
    pub database_ledger: bool,
    /// The ledger the hosts name instead of the folder `ledger` (`sqlite:PATH`, say).
    pub ledger_spec: Option<String>,
}

impl Shared {
    pub fn sqlite() -> Self {
        let folder = tempfile::tempdir().unwrap();
        let coordinator = format!("sqlite:{}", folder.path().join("leases.db").display());
        Self::with(folder, coordinator, "reports")
    }

    pub fn with(folder: tempfile::TempDir, coordinator: String, agent: &str) -> Self {
        std::fs::create_dir(folder.path().join("ledger")).unwrap();
        Self {
            folder,
            coordinator,
            agent: agent.to_owned(),
            database_ledger: false,
            ledger_spec: None,
        }
    }

    /// Hosts sharing a SQLite coordinator and a SQLite ledger (`ledger.db`) beside it.
    pub fn sqlite_ledger() -> Self {
        let shared = Self::sqlite();
        let spec = format!("sqlite:{}", shared.path("ledger.db").display());
        Self {
            ledger_spec: Some(spec),
            ..shared
        }
    }

    /// Hosts that share only the coordinator's URL: no ledger is named (with a PostgreSQL
    /// coordinator, the ledger is in its database).
    pub fn database_only(folder: tempfile::TempDir, coordinator: String, agent: &str) -> Self {
        Self {
            database_ledger: true,
            ..Self::with(folder, coordinator, agent)
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.folder.path().join(name)
    }

    /// The file of `device`'s log in the shared ledger folder.
    pub fn device_file(&self, device: &str) -> PathBuf {
        self.path("ledger")
            .join("devices")
            .join(fencepost::relay::device_file_name(device))
    }

    /// `fencepost ARGS` as host `device`, with no config file or data directory of the user's.
    pub fn command(&self, device: &str, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_fencepost"));
        command
            .args(args)
            .env("FENCEPOST_COORDINATOR", &self.coordinator)
            .env("FENCEPOST_LEDGER", self.path("ledger"))
            .env("FENCEPOST_DEVICE", device)
            .env("HOME", self.folder.path())
            .env("XDG_DATA_HOME", self.path("data"))
            .env("XDG_CONFIG_HOME", self.path("config"))
            .env_remove("FENCEPOST_CONFIG")
            .env_remove("RUST_LOG");
        if self.database_ledger {
            command.env_remove("FENCEPOST_LEDGER");
        } else if let Some(spec) = &self.ledger_spec {
            command.env("FENCEPOST_LEDGER", spec);
        }
        command
    }

    /// `fencepost ARGS` as host `device` with a data directory of its own (`data-DEVICE`), as
    /// real hosts have: its keys and its membership of a protected ledger are its own.
    pub fn host(&self, device: &str, args: &[&str]) -> Output {
        self.command(device, args)
            .env("XDG_DATA_HOME", self.path(&format!("data-{device}")))
            .output()
            .unwrap()
    }

    pub fn run(&self, device: &str, args: &[&str]) -> Output {
        self.command(device, args).output().unwrap()
    }

    pub fn spawn(&self, device: &str, args: &[&str]) -> Child {
        self.command(device, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The lines the test commands appended to `effects`.
    pub fn effects(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("effects"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// A `run` of the daily report for `salt`, appending the device to `effects` and sleeping.
    pub fn report_args(&self, salt: &str, extra: &[&str], sleep: &str) -> Vec<String> {
        let mut args: Vec<String> = [
            "run",
            "--agent",
            &self.agent,
            "--intent",
            "daily report",
            "--salt",
            salt,
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(extra.iter().map(|arg| arg.to_string()));
        args.push("--".into());
        args.extend(["sh", "-c"].map(str::to_owned));
        args.push(format!(
            "echo \"$FENCEPOST_DEVICE $FENCEPOST_EPOCH\" >> '{}'; sleep {sleep}",
            self.path("effects").display()
        ));
        args
    }
}

/// The id of the run `ledger runs --json` shows in doubt, as `device` reads the ledger.
pub fn in_doubt_run(shared: &Shared, device: &str) -> String {
    let runs: serde_json::Value =
        serde_json::from_slice(&shared.run(device, &["ledger", "runs", "--json"]).stdout).unwrap();
    runs.as_array()
        .unwrap()
        .iter()
        .find(|run| run["status"] == "in-doubt")
        .and_then(|run| run["run_id"].as_str())
        .unwrap_or_else(|| panic!("no run in doubt: {runs}"))
        .to_owned()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Waits until `path` exists (real time, at most 20 s).
pub fn wait_for_file(path: &Path) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Three hosts run the same occurrence at once; returns their exit codes.
pub fn three_hosts_at_once(shared: &Shared, salt: &str, extra: &[&str]) -> Vec<i32> {
    let args = shared.report_args(salt, extra, "0.3");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let children: Vec<Child> = ["host-1", "host-2", "host-3"]
        .iter()
        .map(|device| shared.spawn(device, &args))
        .collect();
    children
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            let code = output.status.code().unwrap();
            assert!([0, 3, 4].contains(&code), "exit {code}: {}", text(&output.stderr));
            code
        })
        .collect()
}

/// Starts `fencepost run ARGS -- sh -c SCRIPT` as `device`; once the command has run `script`,
/// kills fencepost with SIGKILL (no release, no outcome), then the orphaned command.
pub fn kill_mid_command(shared: &Shared, device: &str, run_args: &[&str], script: &str) {
    let pid_file = shared.path("command.pid");
    let _ = std::fs::remove_file(&pid_file);
    // The pid file appears whole (renamed into place) once `script` has run.
    let script = format!(
        "echo $$ > '{pid}.tmp'; {script}; mv '{pid}.tmp' '{pid}'; exec sleep 60",
        pid = pid_file.display()
    );
    let mut args = run_args.to_vec();
    args.extend(["--", "sh", "-c", &script]);
    let mut doomed = shared.spawn(device, &args);
    wait_for_file(&pid_file);
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    let command_pid = std::fs::read_to_string(&pid_file).unwrap();
    let _ = Command::new("kill").args(["-9", command_pid.trim()]).status();
}

/// A host killed with SIGKILL while its command runs leaves the run in doubt; the next host is
/// told so (exit 5), and runs it again only with --retry-in-doubt.
pub fn killed_host_leaves_an_in_doubt_run(shared: &Shared, salt: &str) {
    let agent = shared.agent.as_str();
    let effect = format!(
        "echo \"$FENCEPOST_DEVICE $FENCEPOST_EPOCH\" >> '{}'",
        shared.path("effects").display()
    );
    kill_mid_command(
        shared,
        "host-1",
        &[
            "run",
            "--agent",
            agent,
            "--intent",
            "daily report",
            "--salt",
            salt,
            "--ttl",
            "1s",
        ],
        &effect,
    );
    assert_eq!(
        shared.effects().len(),
        1,
        "the effect happened once, and its host died"
    );

    // While the dead host's lease is live, the run shows as running; then as in doubt.
    let runs = shared.run("host-2", &["ledger", "runs", "--agent", agent]);
    assert!(runs.status.success(), "{}", text(&runs.stderr));
    let listing = text(&runs.stdout);
    assert!(
        listing.contains("running") && listing.contains("by host-1"),
        "{listing}"
    );
    std::thread::sleep(Duration::from_millis(1_100));
    let runs = shared.run("host-2", &["ledger", "runs", "--agent", agent]);
    let listing = text(&runs.stdout);
    assert!(
        listing.contains("in-doubt") && listing.contains("by host-1"),
        "{listing}"
    );

    // The next host waits out the dead host's lease, then is told the run is in doubt.
    let next = shared.report_args(salt, &["--wait", "10s"], "0");
    let next: Vec<&str> = next.iter().map(String::as_str).collect();
    let refused = shared.run("host-2", &next);
    assert_eq!(refused.status.code(), Some(5), "{}", text(&refused.stderr));
    let message = text(&refused.stderr);
    assert!(
        message.contains("in doubt") && message.contains("--retry-in-doubt"),
        "{message}"
    );
    assert_eq!(shared.effects().len(), 1, "not run again without a decision");

    // The operator decides to run it again.
    let mut retry = next.clone();
    retry.insert(1, "--retry-in-doubt");
    let retried = shared.run("host-2", &retry);
    assert_eq!(retried.status.code(), Some(0), "{}", text(&retried.stderr));
    assert_eq!(shared.effects().len(), 2);
    let runs = text(&shared.run("host-3", &["ledger", "runs", "--agent", agent]).stdout);
    assert!(runs.contains("committed") && !runs.contains("in-doubt"), "{runs}");
    // And no host runs it a third time.
    let again = shared.run("host-3", &next);
    assert_eq!(again.status.code(), Some(3), "{}", text(&again.stderr));
}

/// Every form in which `secret` could lie in stored bytes: as text, as hex (lower and upper
/// case), and as base64 (standard and URL-safe alphabets, at each of the three alignments it can
/// have inside a longer encoded string: the characters that depend on its bytes alone).
pub fn stored_forms(secret: &[u8]) -> Vec<String> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    use base64::Engine;
    let mut forms = vec![String::from_utf8_lossy(secret).into_owned()];
    let hex: String = secret.iter().map(|byte| format!("{byte:02x}")).collect();
    forms.push(hex.to_uppercase());
    forms.push(hex);
    for offset in 0..3usize {
        let mut padded = vec![0u8; offset];
        padded.extend_from_slice(secret);
        let (start, end) = ((8 * offset).div_ceil(6), 8 * padded.len() / 6);
        for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
            let encoded = engine.encode(&padded);
            forms.push(encoded[start..end].to_owned());
        }
    }
    forms.sort();
    forms.dedup();
    forms
}

/// The secrets of `secrets` found in `stored` in any [stored form](stored_forms), with the form.
pub fn secrets_found(stored: &[u8], secrets: &[String]) -> Vec<(String, String)> {
    let stored = String::from_utf8_lossy(stored);
    secrets
        .iter()
        .flat_map(|secret| {
            stored_forms(secret.as_bytes())
                .into_iter()
                .filter(|form| stored.contains(form.as_str()))
                .map(move |form| (secret.clone(), form))
        })
        .collect()
}

/// Makes `shared`'s ledger protected: `host-1` runs `ledger init` and admits each of `others`,
/// which join first. Returns the fingerprint.
pub fn protect(shared: &Shared, others: &[&str]) -> String {
    let init = shared.run("host-1", &["ledger", "init"]);
    assert!(init.status.success(), "{}", text(&init.stderr));
    let fingerprint = text(&init.stdout).trim().to_owned();
    for host in others {
        join_and_admit(shared, host, &fingerprint);
    }
    fingerprint
}

/// `host` joins `shared`'s protected ledger `fingerprint`, and `host-1` admits it.
pub fn join_and_admit(shared: &Shared, host: &str, fingerprint: &str) {
    let key = text(&shared.run(host, &["device", "key"]).stdout)
        .trim()
        .to_owned();
    let join = shared.run(host, &["device", "join", fingerprint]);
    assert!(join.status.success(), "{}", text(&join.stderr));
    let admit = shared.run("host-1", &["device", "admit", &key, "--device", host]);
    assert!(admit.status.success(), "{}", text(&admit.stderr));
}

/// A protected ledger's record line (format 4: `4 "DEVICE" SEQ GENERATION BODY`) taken apart
/// as the format is written down: the seq, the generation, the body as it is written and the
/// content the body carries (after the flags byte and `prev`, before the head).
pub struct SealedLine {
    pub seq: u64,
    pub generation: u32,
    pub body: String,
    pub content: Vec<u8>,
}

pub fn sealed_line(line: &str) -> SealedLine {
    use base64::Engine;
    let mut fields = line.rsplitn(4, ' ');
    let body = fields.next().expect("a body").to_owned();
    let generation = fields.next().expect("a generation").parse().unwrap();
    let seq = fields.next().expect("a seq").parse().unwrap();
    assert!(
        fields.next().is_some_and(|start| start.starts_with("4 \"")),
        "format 4: {line}"
    );
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&body)
        .unwrap();
    let start = 1 + if bytes[0] & 1 != 0 { 32 } else { 0 };
    let end = bytes.len() - if bytes[0] & 2 != 0 { 64 } else { 0 };
    SealedLine {
        seq,
        generation,
        body,
        content: bytes[start..end].to_vec(),
    }
}
