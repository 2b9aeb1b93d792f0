//! The coordinator a `--coordinator` spec names: SQLite (one host) or PostgreSQL (many hosts),
//! opened with the checks the command line adds (a shared file, an absolute path, the schema).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use fencepost::backend::sqlite::{SqliteConfig, SqliteLeaseCoordinator};
use fencepost::clock::{system_clock, WallClock};
use fencepost::lease::{Lease, LeaseCoordinator, LeaseError};

/// The clock of the SQLite coordinator, shared by every process of the host, and its time line.
///
/// On Linux: milliseconds of `CLOCK_BOOTTIME` (it counts through suspend, and neither an NTP step
/// nor a VM's wall-clock jump moves it), with the boot id as its time line, so that a reboot
/// expires every lease. Elsewhere, or when those cannot be read: the wall clock.
fn host_clock() -> (WallClock, Option<String>) {
    #[cfg(target_os = "linux")]
    {
        use nix::time::{clock_gettime, ClockId};
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|id| id.trim().to_owned())
            .filter(|id| !id.is_empty());
        if let (Some(boot_id), Ok(_)) = (boot_id, clock_gettime(ClockId::CLOCK_BOOTTIME)) {
            let clock: WallClock = Arc::new(|| {
                clock_gettime(ClockId::CLOCK_BOOTTIME)
                    .map(|time| {
                        let seconds = u64::try_from(time.tv_sec()).unwrap_or(0);
                        let millis = u64::try_from(time.tv_nsec()).unwrap_or(0) / 1_000_000;
                        seconds.saturating_mul(1_000).saturating_add(millis)
                    })
                    .unwrap_or(0)
            });
            return (clock, Some(format!("boot:{boot_id}")));
        }
    }
    (system_clock(), None)
}

/// A coordinator named by a `--coordinator` spec.
pub enum Backend {
    Sqlite(Arc<SqliteLeaseCoordinator>),
    #[cfg(feature = "postgres")]
    Postgres(Arc<fencepost::backend::postgres::PostgresLeaseCoordinator>),
}

/// What opening a coordinator does about its schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Schema {
    /// Check it (PostgreSQL: one read; SQLite creates its own file's schema).
    Check,
    /// Create or upgrade it.
    Migrate,
}

impl Backend {
    /// Opens the coordinator `spec` names; a SQLite coordinator's folder is made only when it
    /// is `data_dir`, this user's data directory.
    pub(crate) fn open(spec: &str, schema: Schema, data_dir: Option<&Path>) -> Result<Self> {
        if let Some(path) = spec.strip_prefix("sqlite:") {
            // SQLite opens a private, throw-away database for these: every process would have a
            // coordinator of its own, and every host would run the command.
            let private = path.trim().is_empty()
                || path.contains(":memory:")
                || path.contains("mode=memory")
                || path.starts_with("file:");
            if private {
                crate::exit::usage!(
                    "--coordinator {spec:?} gives every process a private coordinator, so several could run one occurrence; use sqlite:PATH with a file every process on this host shares"
                );
            }
            let path = PathBuf::from(path);
            if path.is_relative() {
                crate::exit::usage!(
                    "--coordinator {spec:?}: the path must be absolute; a relative one names another file in each working directory, and processes started in different folders would each have a coordinator of their own"
                );
            }
            if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
                if !parent.exists() {
                    if Some(parent) == data_dir {
                        std::fs::create_dir_all(parent)?;
                    } else {
                        bail!(
                            "the folder of the SQLite coordinator {} does not exist: create it, or pass another --coordinator",
                            path.display()
                        );
                    }
                }
            }
            let (clock, clock_timeline) = host_clock();
            let config = SqliteConfig {
                clock_timeline,
                ..SqliteConfig::default()
            };
            let coordinator = SqliteLeaseCoordinator::open_with(&path, clock, config)
                .with_context(|| format!("cannot open the SQLite coordinator {}", path.display()))?;
            return Ok(Backend::Sqlite(Arc::new(coordinator)));
        }
        if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
            #[cfg(feature = "postgres")]
            {
                use fencepost::backend::postgres::{PostgresConfig, PostgresLeaseCoordinator};
                let config = PostgresConfig::new(spec);
                if config.url.contains("operation_timeout=") {
                    crate::exit::usage!(
                        "--coordinator: operation_timeout= must be given once, as a duration such as 5000 (milliseconds), 500ms or 5s, at most 2147483647 ms"
                    );
                }
                let coordinator = PostgresLeaseCoordinator::connect(config)
                    .context("cannot connect to the PostgreSQL coordinator (check the URL, the password, and that the server runs)")?;
                match schema {
                    Schema::Check => coordinator.check_schema()?,
                    Schema::Migrate => coordinator
                        .migrate()
                        .context("fencepost admin migrate failed (it runs as a role that may create the schema in the database, or as the schema's owner)")?,
                }
                return Ok(Backend::Postgres(Arc::new(coordinator)));
            }
            #[cfg(not(feature = "postgres"))]
            {
                let _ = schema; // Only PostgreSQL's is checked or made here.
                bail!("this fencepost was built without PostgreSQL support (feature `postgres`)");
            }
        }
        crate::exit::usage!("--coordinator must be sqlite:PATH or a postgres:// URL, not {spec:?}")
    }

    /// The coordinator clock's reading, which leases' `expires_at_ms` are on (for PostgreSQL, the
    /// server's clock is not at hand: this host's wall clock stands in).
    pub fn now_ms(&self) -> u64 {
        match self {
            Backend::Sqlite(coordinator) => coordinator.now_ms(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => system_clock()(),
        }
    }

    /// Every agent with a register in the coordinator (held or not), in order.
    pub fn agents(&self) -> Result<Vec<String>, LeaseError> {
        match self {
            Backend::Sqlite(coordinator) => coordinator.agents(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(coordinator) => coordinator.agents(),
        }
    }

    /// Every lease with a holder, in agent order.
    pub fn list(&self) -> Result<Vec<Lease>, LeaseError> {
        match self {
            Backend::Sqlite(coordinator) => coordinator.list(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(coordinator) => coordinator.list(),
        }
    }

    /// The coordinator, to hand to a keeper.
    pub fn shared(&self) -> Arc<dyn LeaseCoordinator> {
        match self {
            Backend::Sqlite(coordinator) => Arc::clone(coordinator) as Arc<dyn LeaseCoordinator>,
            #[cfg(feature = "postgres")]
            Backend::Postgres(coordinator) => Arc::clone(coordinator) as Arc<dyn LeaseCoordinator>,
        }
    }
}

/// A backend is its coordinator: every method of the trait is the backend's own (no forwarding
/// list to keep up, where a missing entry would silently fall back to a trait default, as the
/// combined calls of the hand-off once did: two round trips instead of one).
impl std::ops::Deref for Backend {
    type Target = dyn LeaseCoordinator;

    fn deref(&self) -> &Self::Target {
        match self {
            Backend::Sqlite(coordinator) => &**coordinator,
            #[cfg(feature = "postgres")]
            Backend::Postgres(coordinator) => &**coordinator,
        }
    }
}
