//! A PostgreSQL server for the benchmarks: the one `FENCEPOST_POSTGRES_URL` names (with its
//! pooler at `FENCEPOST_PGBOUNCER_TRANSACTION_URL`), or a throw-away one that
//! `scripts/postgres-sandbox` starts and that is stopped at the end; and the timing helpers of
//! the benchmarks that interleave operations against it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs each of `others` then `measured`, `iterations` times; returns the time spent in `measured`
/// (operations interleaved, so that drift in fsync latency hits them alike).
pub fn timed(iterations: u64, others: &[&dyn Fn()], measured: &dyn Fn()) -> Duration {
    let mut elapsed = Duration::ZERO;
    for _ in 0..iterations {
        for other in others {
            other();
        }
        let started = Instant::now();
        measured();
        elapsed += started.elapsed();
    }
    elapsed
}

/// The median of `samples` (sorted in place), in µs.
pub fn median_us(samples: &mut [Duration]) -> f64 {
    samples.sort_unstable();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

/// A throw-away server, stopped on drop.
pub struct Sandbox {
    script: PathBuf,
    folder: tempfile::TempDir,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .arg("stop")
            .arg(self.folder.path())
            .status();
    }
}

/// The server's URL and the transaction pooler's.
pub fn server() -> (String, String, Option<Sandbox>) {
    if let (Ok(url), Ok(pooled)) = (
        std::env::var("FENCEPOST_POSTGRES_URL"),
        std::env::var("FENCEPOST_PGBOUNCER_TRANSACTION_URL"),
    ) {
        return (url, pooled, None);
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/postgres-sandbox");
    let folder = tempfile::tempdir().unwrap();
    let mut permissions = std::fs::metadata(folder.path()).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(folder.path(), permissions).unwrap();
    let output = Command::new(&script)
        .arg("start")
        .arg(folder.path())
        .output()
        .unwrap();
    let sandbox = Sandbox { script, folder };
    assert!(
        output.status.success(),
        "could not start a PostgreSQL server: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let exports = String::from_utf8(output.stdout).unwrap();
    let export = |name: &str| {
        exports
            .lines()
            .find_map(|line| line.strip_prefix(&format!("export {name}='")))
            .and_then(|rest| rest.strip_suffix('\''))
            .expect("the sandbox prints its URLs")
            .to_owned()
    };
    (
        export("FENCEPOST_POSTGRES_URL"),
        export("FENCEPOST_PGBOUNCER_TRANSACTION_URL"),
        Some(sandbox),
    )
}
