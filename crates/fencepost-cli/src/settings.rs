//! Where state lives: the coordinator, the ledger folder and this host's device id, from flags,
//! environment variables, a config file and defaults, in that order.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::config::without_password;
use crate::config::{is_postgres_url, ConfigFile};
use crate::coordinator::{Backend, Schema};
use anyhow::{bail, Context, Result};
use fencepost::id::{validate_id, IdKind};
use fencepost::relay::{FsRelay, Relay, SqliteRelay};
use sha2::{Digest, Sha256};

/// Where state lives: the options of the commands that use a coordinator, a ledger and a device
/// id (every command but `simulate`). They are taken after the subcommand (`fencepost run
/// --ledger …`, `fencepost ledger show --ledger …`) and, on the command line only, before it
/// (`fencepost --ledger … run`), where one after the subcommand wins. The variables
/// (`FENCEPOST_COORDINATOR`, …) are read by [`Settings::resolve`], after every flag.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Global {
    /// Where leases live: `sqlite:PATH` (one host; the default is `sqlite:<data dir>/leases.db`)
    /// or a `postgres://` URL (many hosts). Also FENCEPOST_COORDINATOR.
    #[arg(long, global = true, value_name = "SPEC")]
    pub coordinator: Option<String>,
    /// Where intents live: a folder (one file per device; may be a synced folder every host
    /// shares), `sqlite:PATH` (a SQLite file: the processes of one host) or a `postgres://` URL
    /// (tables beside a PostgreSQL coordinator's: many hosts). Default: with a PostgreSQL
    /// coordinator, its database; else the folder `<data dir>/ledger`. Also FENCEPOST_LEDGER.
    #[arg(long, global = true, value_name = "DIR|sqlite:PATH|URL")]
    pub ledger: Option<PathBuf>,
    /// This host's device id. Default: the host name and a hash of the machine id, stable across
    /// runs. Also FENCEPOST_DEVICE.
    #[arg(long, global = true, value_name = "ID")]
    pub device: Option<String>,
    /// The fingerprint of the protected ledger the ledger must be (what `ledger init` printed):
    /// this host refuses to read or write it until it has joined that ledger, whatever the
    /// ledger holds (an empty or unprotected one included). Also FENCEPOST_PROTECTED.
    #[arg(long, global = true, value_name = "FINGERPRINT")]
    pub protected: Option<String>,
    /// A TOML file with `coordinator`, `ledger`, `device` and `protected` keys, used where a flag or variable
    /// does not say. Default: `<config dir>/fencepost/config.toml` when it exists. Also
    /// FENCEPOST_CONFIG.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl Global {
    /// These options, completed by `before` (the same options given before the subcommand).
    pub fn or(self, before: Global) -> Global {
        Global {
            coordinator: self.coordinator.or(before.coordinator),
            ledger: self.ledger.or(before.ledger),
            device: self.device.or(before.device),
            protected: self.protected.or(before.protected),
            config: self.config.or(before.config),
        }
    }

    /// These options, completed by the `FENCEPOST_*` variables (an empty one counts as unset).
    fn or_environment(self) -> Global {
        let variable = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
        Global {
            coordinator: self.coordinator.or_else(|| {
                variable("FENCEPOST_COORDINATOR").map(|value| value.to_string_lossy().into_owned())
            }),
            ledger: self
                .ledger
                .or_else(|| variable("FENCEPOST_LEDGER").map(PathBuf::from)),
            device: self
                .device
                .or_else(|| variable("FENCEPOST_DEVICE").map(|value| value.to_string_lossy().into_owned())),
            protected: self.protected.or_else(|| {
                variable("FENCEPOST_PROTECTED").map(|value| value.to_string_lossy().into_owned())
            }),
            config: self
                .config
                .or_else(|| variable("FENCEPOST_CONFIG").map(PathBuf::from)),
        }
    }
}

/// The resolved settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub coordinator: String,
    /// The ledger folder, or the ledger's SQLite file (`ledger_kind`); for a ledger in PostgreSQL,
    /// its URL (`ledger_label` names it without the password).
    pub ledger: PathBuf,
    /// What `ledger` is.
    pub ledger_kind: LedgerKind,
    /// Whether the ledger folder was named (flag, variable, file): a named folder must exist.
    pub ledger_named: bool,
    pub device: String,
    /// The protected ledger the ledger must be (`--protected`), if one is named.
    pub protected: Option<fencepost::genesis::Fingerprint>,
}

/// What a command does with the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads it (and may record an operator's decision in an existing one).
    ReadOnly,
    /// Writes to it (`run`, `lease acquire`): a SQLite ledger file is created when missing.
    Write,
}

/// Where the ledger lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerKind {
    /// A folder of device files (`FsRelay`), possibly synced between hosts.
    Folder,
    /// A SQLite file (`SqliteRelay`, `--ledger sqlite:PATH`): the processes of one host.
    Sqlite,
    /// Tables in PostgreSQL (`PostgresRelay`, `--ledger postgres://…`, or the PostgreSQL
    /// coordinator's database when no ledger is named): many hosts.
    Postgres,
}

/// `<data dir>/fencepost`, where this host keeps its defaults and its memory of the ledger.
pub fn data_dir() -> Result<PathBuf> {
    dirs::data_dir()
        .map(|dir| dir.join("fencepost"))
        .context("cannot find a data directory (no HOME?): pass --coordinator and --ledger")
}

/// `<data dir>/keys`, where this host keeps its devices' keys (one file per device id).
pub fn keys_dir() -> Result<PathBuf> {
    Ok(data_dir()?.join("keys"))
}

impl Settings {
    pub fn resolve(global: &Global) -> Result<Self> {
        let global = global.clone().or_environment();
        let file = read_config(global.config.as_deref())?;
        let coordinator = match global.coordinator.clone().or(file.coordinator) {
            Some(spec) => spec,
            None => format!("sqlite:{}", data_dir()?.join("leases.db").display()),
        };
        let coordinator = match coordinator.strip_prefix("sqlite:") {
            Some(path) => format!("sqlite:{}", expand_home(Path::new(path)).display()),
            None => coordinator,
        };
        let (ledger, ledger_named) = match global.ledger.clone().or(file.ledger) {
            Some(dir) => (dir, true),
            // One URL for the whole deployment: the ledger beside the leases.
            None if is_postgres_url(&coordinator) => (PathBuf::from(&coordinator), false),
            None => (data_dir()?.join("ledger"), false),
        };
        let (ledger, ledger_kind) = ledger_of_spec(&ledger, &coordinator)?;
        let device = match global.device.clone().or(file.device) {
            Some(device) => device,
            None => default_device()?,
        };
        if let Err(error) = validate_id(IdKind::Device, &device) {
            crate::exit::usage!("device id {device:?}: {error}");
        }
        // Set and empty (a template that expanded an unset variable) is no ledger named: an
        // error, not the unprotected default (found by an adversary).
        if global.protected.is_none()
            && std::env::var_os("FENCEPOST_PROTECTED").is_some_and(|value| value.is_empty())
        {
            crate::exit::usage!(
                "FENCEPOST_PROTECTED is set and empty: set it to the protected ledger's fingerprint, or unset it"
            );
        }
        let protected = match global.protected.clone().or(file.protected) {
            Some(text) => match text.parse() {
                Ok(fingerprint) => Some(fingerprint),
                Err(error) => crate::exit::usage!("the protected ledger's fingerprint {text:?}: {error}"),
            },
            None => None,
        };
        Ok(Self {
            coordinator,
            ledger,
            ledger_kind,
            ledger_named,
            device,
            protected,
        })
    }

    /// These settings with another ledger, named by `spec` as `--ledger` names one.
    pub fn with_ledger(&self, spec: &Path) -> Result<Self> {
        let (ledger, ledger_kind) = ledger_of_spec(spec, &self.coordinator)?;
        Ok(Self {
            ledger,
            ledger_kind,
            ledger_named: true,
            ..self.clone()
        })
    }

    /// These settings with another coordinator, named by `spec` as `--coordinator` names one.
    pub fn with_coordinator(&self, spec: &str) -> Self {
        let coordinator = match spec.strip_prefix("sqlite:") {
            Some(path) => format!("sqlite:{}", expand_home(Path::new(path)).display()),
            None => spec.to_owned(),
        };
        Self {
            coordinator,
            ..self.clone()
        }
    }

    /// With a ledger in PostgreSQL (the default with a PostgreSQL coordinator, or named), a
    /// ledger folder left in the data directory by an earlier fencepost (whose default it was)
    /// holds records that the database lacks. Returns that folder when it has device files, or
    /// when it cannot tell (a link to a share that is not mounted, an unreadable folder).
    pub fn folder_left_behind(&self) -> Option<PathBuf> {
        if self.ledger_kind != LedgerKind::Postgres {
            return None;
        }
        let folder = data_dir().ok()?.join("ledger");
        std::fs::symlink_metadata(&folder).ok()?;
        match std::fs::metadata(&folder) {
            Err(_) => return Some(folder), // a dangling link, or unreadable
            Ok(metadata) if !metadata.is_dir() => return None,
            Ok(_) => {}
        }
        match std::fs::read_dir(folder.join("devices")) {
            Ok(mut devices) => devices.next().is_some().then_some(folder),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(_) => Some(folder),
        }
    }

    /// Opens the ledger: a folder (a named one must exist; the default one is created) or a
    /// SQLite file (created in an existing folder, by a command that writes to it; a command that
    /// only reads refuses a missing one, which is a mistyped path more often than a new ledger).
    pub fn relay(&self, access: Access) -> Result<Arc<dyn Relay>> {
        if self.ledger_kind == LedgerKind::Postgres {
            return self.postgres_relay();
        }
        if self.ledger_kind == LedgerKind::Sqlite {
            if access == Access::ReadOnly && !self.ledger.exists() {
                bail!(
                    "no ledger at {}: nothing was recorded there yet (a mistyped path?); `fencepost run` creates it",
                    self.ledger.display()
                );
            }
            if self.ledger.is_dir() {
                bail!(
                    "--ledger sqlite:{}: that is a folder; name the ledger's SQLite file (for example {})",
                    self.ledger.display(),
                    self.ledger.join("ledger.db").display()
                );
            }
            let relay = match access {
                // Reading changes nothing: a file that holds no ledger is refused, not made one.
                Access::ReadOnly => SqliteRelay::open_existing(&self.ledger),
                Access::Write => SqliteRelay::open(&self.ledger),
            };
            return Ok(Arc::new(relay.with_context(|| {
                format!("cannot open the ledger {}", self.ledger.display())
            })?));
        }
        Ok(Arc::new(self.folder_relay()?))
    }

    /// Connects to the ledger in PostgreSQL and checks its schema (made by `fencepost admin
    /// migrate`, with the coordinator's).
    fn postgres_relay(&self) -> Result<Arc<dyn Relay>> {
        #[cfg(feature = "postgres")]
        {
            use fencepost::backend::postgres::PostgresConfig;
            use fencepost::relay::PostgresRelay;
            let url = self.ledger.to_string_lossy();
            let relay = PostgresRelay::connect(PostgresConfig::new(url.as_ref())).with_context(|| {
                format!(
                    "cannot connect to the ledger in PostgreSQL ({}): check the URL, the password, and that the server runs",
                    self.ledger_label()
                )
            })?;
            // In the coordinator's database (the default), the coordinator checks the schema.
            if url != self.coordinator.as_str() {
                relay.check_schema()?;
            }
            // The ledger's checkpoints are in the database; this host's copies of the ones it
            // uses are in the data directory (shared by its processes).
            Ok(Arc::new(relay.with_checkpoint_mirror(self.checkpoint_copies()?)))
        }
        #[cfg(not(feature = "postgres"))]
        bail!("this fencepost was built without PostgreSQL support (feature `postgres`)")
    }

    /// The ledger as messages name it: its folder or file, or its URL without the password.
    pub fn ledger_label(&self) -> String {
        match self.ledger_kind {
            LedgerKind::Postgres => format!(
                "the PostgreSQL database {}",
                without_password(&self.ledger.to_string_lossy())
            ),
            LedgerKind::Folder | LedgerKind::Sqlite => self.ledger.display().to_string(),
        }
    }

    /// How to repair a damaged device of this ledger; when the damage is a database that went
    /// back (`ProblemKind::WentBack`), what docs/deployment.md says to do then.
    pub fn repair_hint(&self, went_back: bool) -> &'static str {
        if went_back {
            return "This host read records that the database no longer holds: see \"Restores and fail-overs\" in docs/deployment.md (a host that read none of them cannot know, and runs them again)";
        }
        match self.ledger_kind {
            LedgerKind::Folder => "Restore the device's file from a backup or another host's copy",
            LedgerKind::Sqlite => "Restore the ledger's file from a backup",
            LedgerKind::Postgres => "Restore the device's rows from a backup of the database",
        }
    }

    fn folder_relay(&self) -> Result<FsRelay> {
        if self.ledger.exists() && !self.ledger.is_dir() {
            bail!(
                "the ledger {} is not a folder: point --ledger at the folder every host shares",
                self.ledger.display()
            );
        }
        if self.ledger_named {
            if !self.ledger.is_dir() {
                bail!(
                    "ledger folder {} does not exist: create it (mkdir -p {}), or point --ledger at the folder every host shares",
                    self.ledger.display(),
                    self.ledger.display()
                );
            }
        } else {
            std::fs::create_dir_all(&self.ledger)
                .with_context(|| format!("cannot create the ledger folder {}", self.ledger.display()))?;
        }
        FsRelay::open(&self.ledger)
            .with_context(|| format!("cannot open the ledger folder {}", self.ledger.display()))
    }

    /// Where this site remembers what it has seen of the ledger (per ledger folder and device), so
    /// that a device file that later shrinks or is replaced counts as damage.
    pub fn seen_file(&self) -> Result<PathBuf> {
        let hex = self.ledger_key();
        let folder = data_dir()?.join("seen");
        std::fs::create_dir_all(&folder).with_context(|| {
            format!(
                "cannot create {}, where this host remembers what it saw of the ledger (to notice a ledger file that shrinks)",
                folder.display()
            )
        })?;
        Ok(folder.join(format!(
            "{hex}-{}",
            fencepost::relay::device_file_name(&self.device)
        )))
    }

    /// The outbox's key: [`ledger_key`](Self::ledger_key), of the database's identity for a
    /// ledger in PostgreSQL.
    fn outbox_key(&self) -> String {
        #[cfg(feature = "postgres")]
        if self.ledger_kind == LedgerKind::Postgres {
            let config = fencepost::backend::postgres::PostgresConfig::new(self.ledger.to_string_lossy());
            if let Some(identity) = config.database_identity() {
                return short_key(&[identity.as_bytes()]);
            }
        }
        self.ledger_key()
    }

    /// The name of this host's files about the ledger and device (the seen file's).
    fn site_file_name(&self) -> Result<String> {
        Ok(self
            .seen_file()?
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default())
    }

    /// This device's outbox files of other ledgers (or of this one named otherwise: another
    /// host name for the server), with what they hold, or why they cannot be read: `status`,
    /// `ledger flush`, `run` and `ledger resolve` look at them.
    pub fn other_outboxes(&self) -> Vec<(PathBuf, Result<Vec<fencepost::ledger::QueuedRecord>, String>)> {
        let Ok(own) = self.outbox_file() else {
            return Vec::new();
        };
        let suffix = format!("-{}", fencepost::relay::device_file_name(&self.device));
        let Some(entries) = own.parent().and_then(|folder| std::fs::read_dir(folder).ok()) else {
            return Vec::new();
        };
        let mut found: Vec<_> = entries
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| *path != own && path.to_string_lossy().ends_with(&suffix))
            .map(|path| {
                let records = fencepost::ledger::read_outbox(&path).map_err(|error| error.to_string());
                (path, records)
            })
            .filter(|(_, records)| records.as_ref().map_or(true, |records| !records.is_empty()))
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found
    }

    /// The outbox file of another ledger key that holds an outcome of `run` of `agent` (see
    /// [`other_outboxes`](Self::other_outboxes)): deciding on the run here would ignore it.
    pub fn queued_elsewhere(&self, agent: &str, run: &str) -> Option<PathBuf> {
        self.other_outboxes().into_iter().find_map(|(path, records)| {
            records
                .ok()?
                .iter()
                .filter_map(fencepost::ledger::QueuedRecord::intent)
                .any(|intent| intent.agent_id == agent && intent.run_id == run)
                .then_some(path)
        })
    }

    /// Where this site keeps the records it could not store in the ledger yet (the outcome of a
    /// command that ran while the database was away), per ledger and device, until a command
    /// stores them (`run`, `ledger flush`).
    /// Named by the database's identity, not by the URL's spelling (found by an adversarial
    /// test: a URL with an option, or `postgresql://`, did not find what this host had queued).
    pub fn outbox_file(&self) -> Result<PathBuf> {
        let key = self.outbox_key();
        let name = format!("{key}-{}", fencepost::relay::device_file_name(&self.device));
        let folder = data_dir()?.join("outbox");
        std::fs::create_dir_all(&folder).with_context(|| {
            format!(
                "cannot create {}, where this host keeps outcomes it could not write to the ledger yet",
                folder.display()
            )
        })?;
        Ok(folder.join(name))
    }

    /// Where this host keeps what it knows of the protected ledger it joined (or founded) at
    /// this location: its fingerprint and genesis. While the file exists, the ledger is read
    /// as protected; deleting it never makes the ledger unprotected (its sealed records are
    /// then damage).
    pub fn membership_file(&self) -> Result<PathBuf> {
        Ok(data_dir()?
            .join("ledgers")
            .join(format!("{}.protected", self.ledger_key())))
    }

    /// A short name of the ledger for this host's files about it: the first 8 bytes of the
    /// SHA-256 of its folder or file (canonical) or its URL without the password, in hex.
    /// The folder of this host's copies of the ledger's checkpoints (a database's, or the
    /// ones a protected ledger opened).
    pub fn checkpoint_copies(&self) -> Result<PathBuf> {
        Ok(data_dir()?.join("checkpoints").join(self.ledger_key()))
    }

    fn ledger_key(&self) -> String {
        let ledger = match self.ledger_kind {
            LedgerKind::Postgres => PathBuf::from(self.ledger_label()),
            LedgerKind::Folder | LedgerKind::Sqlite => {
                std::fs::canonicalize(&self.ledger).unwrap_or_else(|_| self.ledger.clone())
            }
        };
        short_key(&[ledger.as_os_str().as_encoded_bytes()])
    }

    /// Where this site keeps its snapshot of the ledger (per ledger and device), so that a
    /// command reads only the records added since the last one.
    /// `None` (said on stderr) when the folder cannot be made: the command then reads the whole
    /// ledger, as it would without a snapshot.
    pub fn snapshot_file(&self) -> Result<Option<PathBuf>> {
        let name = self.site_file_name()?;
        let folder = data_dir()?.join("snapshots");
        if let Err(error) = std::fs::create_dir_all(&folder) {
            tracing::warn!(folder = %folder.display(), %error, "cannot create the folder of this host's snapshots of ledgers; reading the whole ledger");
            return Ok(None);
        }
        Ok(Some(
            folder.join(format!("{}.sqlite", name.trim_end_matches(".jsonl"))),
        ))
    }

    /// Connects to the coordinator; for PostgreSQL, checks that the schema exists at the version
    /// this fencepost needs (one read; creating it is `fencepost admin migrate`).
    pub fn coordinator(&self) -> Result<Arc<Backend>> {
        Backend::open(&self.coordinator, Schema::Check, data_dir().ok().as_deref()).map(Arc::new)
    }

    /// Connects to the coordinator and creates or upgrades its schema (`fencepost admin migrate`).
    pub fn migrate_coordinator(&self) -> Result<Arc<Backend>> {
        Backend::open(&self.coordinator, Schema::Migrate, data_dir().ok().as_deref()).map(Arc::new)
    }
}

/// A short name for this host's files about something: the first 8 bytes of the SHA-256 of
/// `parts` joined by 0x1F, in hex.
pub fn short_key(parts: &[&[u8]]) -> String {
    let mut digest = Sha256::new();
    for (index, part) in parts.iter().enumerate() {
        if index > 0 {
            digest.update([0x1f]);
        }
        digest.update(part);
    }
    digest.finalize()[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The ledger a `--ledger` spec names: `sqlite:PATH`, a `postgres://` URL, or a folder; checked
/// against the coordinator's spec (a SQLite ledger needs a file of its own).
fn ledger_of_spec(spec: &Path, coordinator: &str) -> Result<(PathBuf, LedgerKind)> {
    let text = spec.to_str();
    let (ledger, ledger_kind) = match text.and_then(|text| text.strip_prefix("sqlite:")) {
        Some(path) => (expand_home(Path::new(path)), LedgerKind::Sqlite),
        None if text.is_some_and(is_postgres_url) => (spec.to_path_buf(), LedgerKind::Postgres),
        None => (expand_home(spec), LedgerKind::Folder),
    };
    if ledger_kind == LedgerKind::Sqlite {
        // The coordinator refuses a database with tables of another application's, and
        // the relay's tables would be that.
        let folder = ledger.parent().filter(|folder| !folder.as_os_str().is_empty());
        if folder.is_some_and(|folder| std::fs::canonicalize(folder).is_err()) {
            crate::exit::usage!(
                "--ledger sqlite:{}: its folder does not exist (SQLite would resolve the path its own way); create it, or name the file by a path without `..`",
                ledger.display()
            );
        }
        let coordinator_file = coordinator.strip_prefix("sqlite:").map(Path::new);
        let same = coordinator_file.is_some_and(|file| same_file(file, &ledger));
        if same {
            crate::exit::usage!(
                "--ledger sqlite:{}: that is the coordinator's file; give the ledger a file of its own (for example {})",
                ledger.display(),
                ledger.with_file_name("ledger.db").display()
            );
        }
    }
    if ledger_kind != LedgerKind::Postgres && ledger.is_relative() {
        crate::exit::usage!(
            "--ledger {}: the path must be absolute; a relative one names another folder in each working directory, and processes started in different folders would each have a ledger of their own",
            ledger.display()
        );
    }
    Ok((ledger, ledger_kind))
}

/// `~/x` as `$HOME/x` (a config file is read by no shell); anything else as it is.
fn expand_home(path: &Path) -> PathBuf {
    match (path.strip_prefix("~"), dirs::home_dir()) {
        (Ok(rest), Some(home)) => home.join(rest),
        _ => path.to_path_buf(),
    }
}

fn read_config(named: Option<&Path>) -> Result<ConfigFile> {
    let path = match named {
        Some(path) => path.to_path_buf(),
        None => match dirs::config_dir().map(|dir| dir.join("fencepost").join("config.toml")) {
            Some(path) if path.is_file() => path,
            _ => return Ok(ConfigFile::default()),
        },
    };
    let bytes =
        std::fs::read(&path).with_context(|| format!("cannot read config file {}", path.display()))?;
    ConfigFile::parse(&bytes, &path)
}

/// The host name and 8 hex digits of a hash of the machine id: stable for the machine, and not the
/// machine id itself.
fn default_device() -> Result<String> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty());
    let machine = std::fs::read_to_string("/etc/machine-id")
        .or_else(|_| std::fs::read_to_string("/var/lib/dbus/machine-id"))
        .ok()
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty());
    let suffix = machine.map(|id| {
        let digest = Sha256::digest(id.as_bytes());
        digest[..4]
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect::<String>()
    });
    match (host, suffix) {
        (Some(host), Some(suffix)) => Ok(format!("{host}-{suffix}")),
        (Some(host), None) => Ok(host),
        (None, Some(suffix)) => Ok(format!("host-{suffix}")),
        (None, None) => bail!("cannot derive a device id (no host name, no machine id): pass --device ID"),
    }
}

/// Whether `a` and `b` name one file: the same device and inode (a hard link, a symbolic link,
/// `..` in the path), or, for a file not yet created, the same canonical folder and name.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if a == b {
        return true;
    }
    if let (Ok(a), Ok(b)) = (std::fs::metadata(a), std::fs::metadata(b)) {
        return a.dev() == b.dev() && a.ino() == b.ino();
    }
    let canonical = |path: &Path| -> Option<PathBuf> {
        let folder = path
            .parent()
            .filter(|folder| !folder.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        Some(std::fs::canonicalize(folder).ok()?.join(path.file_name()?))
    };
    canonical(a).is_some_and(|a| canonical(b).is_some_and(|b| a == b))
}

/// [`parse_duration_ms`] of a duration that must not be zero (`--timeout`: a command stopped
/// before it could start would leave its run in doubt for nothing).
pub fn parse_nonzero_duration_ms(text: &str) -> Result<u64, String> {
    match parse_duration_ms(text)? {
        0 => Err(format!(
            "{text:?}: must be longer than 0 (leave the option out for no limit)"
        )),
        ms => Ok(ms),
    }
}

/// [`parse_duration_ms`] of the oracle's retention (`ledger compact --forget-commits-older-than`):
/// a day at least, so that a slip (`60` for sixty days) cannot forget yesterday's runs.
pub fn parse_retention_ms(text: &str) -> Result<u64, String> {
    const DAY_MS: u64 = 86_400_000;
    match parse_duration_ms(text)? {
        ms if ms < DAY_MS => Err(format!(
            "{text:?}: a retention must be 1d or longer (committed runs younger than that are always kept)"
        )),
        ms if ms > 36_500 * DAY_MS => Err(format!("{text:?}: a retention must be 36500d or shorter")),
        ms => Ok(ms),
    }
}

/// Parses a duration: a number with `ms`, `s`, `m`, `h` or `d` (a bare number is seconds).
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 30s, 5m or 1h"))?;
    let scale = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?}: the unit must be ms, s, m, h or d")),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too long"))
}
