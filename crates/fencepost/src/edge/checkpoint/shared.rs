//! The place where a protected ledger's sealed checkpoints are shared ([`SharedPlace`]: the
//! relay's folder or its database), and what anyone can read of them there: the geneses their
//! headers name ([`sealed_geneses`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::remove_leftovers;
use crate::relay::{CheckpointStore, RelayError};

/// A relay's error for a file-system failure.
pub(crate) fn io_error(operation: &'static str, path: &Path, source: std::io::Error) -> RelayError {
    RelayError::Io {
        operation,
        path: path.to_path_buf(),
        source,
    }
}

/// A name no other process or call of this host uses, for a file being written.
pub(crate) fn unique(prefix: &str) -> String {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{prefix}{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// The extension of a sealed checkpoint's name (a protected ledger's: see
/// [`crate::protected::checkpoint`]).
pub(crate) const SEALED_EXTENSION: &str = ".sealed";

/// Where the sealed checkpoints are shared.
pub(crate) enum SharedPlace<'a> {
    /// A folder every site reads (a synced ledger folder, a SQLite ledger's).
    Folder(PathBuf),
    /// A database.
    Store(&'a dyn CheckpointStore),
}

impl<'a> SharedPlace<'a> {
    /// Where `relay` shares its checkpoints, if it does.
    pub(crate) fn of(relay: &'a dyn crate::relay::Relay) -> Option<Self> {
        match relay.checkpoint_store() {
            Some(store) => Some(SharedPlace::Store(store)),
            None => relay.checkpoints_dir().map(SharedPlace::Folder),
        }
    }

    pub(crate) fn list(&self) -> Result<Vec<String>, RelayError> {
        let names = match self {
            SharedPlace::Store(store) => store.names()?,
            SharedPlace::Folder(dir) => match std::fs::read_dir(dir) {
                Ok(entries) => entries
                    .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                    .collect(),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(error) => return Err(io_error("list", dir, error)),
            },
        };
        // Only names of sealed checkpoints (a database's rows name anything: found by a
        // cryptography review, a name with a path in it had files written outside the copies).
        Ok(names
            .into_iter()
            .filter(|name| parse_sealed_name(name).is_some())
            .collect())
    }

    /// What tells whether the sealed checkpoint `name` changed since it was looked at: a
    /// folder's file's length and time of change (a sync tool may still be writing it); the
    /// same for every one a database stores (whole or not at all). `None` when there is none.
    pub(crate) fn stamp(&self, name: &str) -> Option<String> {
        match self {
            SharedPlace::Store(_) => Some("stored".to_owned()),
            SharedPlace::Folder(dir) => {
                let metadata = std::fs::symlink_metadata(dir.join(name)).ok()?;
                let changed = metadata
                    .modified()
                    .ok()
                    .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |since| since.as_nanos());
                Some(format!("{} {changed}", metadata.len()))
            }
        }
    }

    /// The sealed checkpoint `name`, to read: a folder's file opened as it is (never through a
    /// symbolic link, never a FIFO or a device that would block or never end), a database's
    /// copied into a file of `scratch` (removed once open). `Ok(None)` when there is none; an
    /// error line when it is not a file.
    pub(crate) fn open(&self, name: &str, scratch: &Path) -> Result<Option<std::fs::File>, OpenBlobError> {
        match self {
            SharedPlace::Store(store) => {
                std::fs::create_dir_all(scratch)
                    .map_err(|error| OpenBlobError::Io(io_error("create", scratch, error)))?;
                let path = scratch.join(unique(".fetching-"));
                let fetched = (|| {
                    let mut file = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create_new(true)
                        .open(&path)
                        .map_err(|error| io_error("create", &path, error))?;
                    let mut writer = std::io::BufWriter::new(&mut file);
                    if !store.download(name, &mut writer)? {
                        return Ok(None);
                    }
                    writer.flush().map_err(|error| io_error("write", &path, error))?;
                    drop(writer);
                    Ok(Some(file))
                })();
                let _ = std::fs::remove_file(&path);
                let file = fetched.map_err(OpenBlobError::Io)?;
                match file {
                    Some(mut file) => {
                        std::io::Seek::rewind(&mut file)
                            .map_err(|error| OpenBlobError::Io(io_error("read", &path, error)))?;
                        Ok(Some(file))
                    }
                    None => Ok(None),
                }
            }
            SharedPlace::Folder(dir) => {
                use std::os::unix::fs::OpenOptionsExt;
                let path = dir.join(name);
                let opened = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                    .open(&path);
                let file = match opened {
                    Ok(file) => file,
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(error) if error.raw_os_error() == Some(libc::ELOOP) => {
                        return Err(OpenBlobError::NotAFile("it is a symbolic link".to_owned()))
                    }
                    Err(error) => return Err(OpenBlobError::Io(io_error("open", &path, error))),
                };
                let kind = file
                    .metadata()
                    .map_err(|error| OpenBlobError::Io(io_error("read", &path, error)))?;
                if !kind.is_file() {
                    return Err(OpenBlobError::NotAFile("it is not a regular file".to_owned()));
                }
                Ok(Some(file))
            }
        }
    }

    /// Shares the file at `path` as `name`: whole, or not at all.
    pub(crate) fn put(&self, name: &str, path: &Path) -> Result<(), RelayError> {
        match self {
            SharedPlace::Store(store) => store.upload(name, path),
            SharedPlace::Folder(dir) => {
                std::fs::create_dir_all(dir).map_err(|error| io_error("create", dir, error))?;
                remove_leftovers(dir, &[".writing-sealed-"]);
                let writing = dir.join(unique(".writing-sealed-"));
                let placed = std::fs::copy(path, &writing)
                    .and_then(|_| std::fs::File::open(&writing)?.sync_all())
                    .and_then(|()| std::fs::rename(&writing, dir.join(name)))
                    .and_then(|()| std::fs::File::open(dir)?.sync_all());
                if let Err(error) = placed {
                    let _ = std::fs::remove_file(&writing);
                    return Err(io_error("write a checkpoint into", dir, error));
                }
                Ok(())
            }
        }
    }

    pub(crate) fn delete(&self, name: &str) -> Result<(), RelayError> {
        match self {
            SharedPlace::Store(store) => store.remove(name),
            SharedPlace::Folder(dir) => match std::fs::remove_file(dir.join(name)) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    Err(io_error("remove", &dir.join(name), error))
                }
                _ => Ok(()),
            },
        }
    }
}

/// What a sealed checkpoint's name says: the records it covers, its digest, its cut-off.
pub(crate) fn parse_sealed_name(name: &str) -> Option<(u64, [u8; 32], Option<u64>)> {
    let plain = format!("{}.sqlite", name.strip_suffix(SEALED_EXTENSION)?);
    let named = super::parse_file_name(&plain)?;
    Some((named.records, named.id, named.forgets_before_ms))
}

/// Why a shared sealed checkpoint cannot be read ([`SharedPlace::open`]).
pub(crate) enum OpenBlobError {
    /// It is no regular file (a symbolic link, a FIFO, a folder): for good.
    NotAFile(String),
    /// The store or the file system failed: perhaps for now.
    Io(RelayError),
}

/// The geneses that the headers of the sealed checkpoints in `relay`'s shared place name (in
/// the clear, as the founder's log does): where a device joining a ledger whose founder's first
/// records were pruned finds the genesis its fingerprint names. Nothing in them is trusted: a
/// joining device takes the one whose id its fingerprint names. Checkpoints that cannot be read
/// are passed over.
pub fn sealed_geneses(relay: &dyn crate::relay::Relay) -> Vec<crate::genesis::Genesis> {
    let Some(shared) = SharedPlace::of(relay) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    // A few are enough (each names the genesis): anyone can put many there.
    for name in shared.list().unwrap_or_default().into_iter().take(16) {
        let Ok(Some(file)) = shared.open(&name, &std::env::temp_dir()) else {
            continue;
        };
        let mut input = std::io::BufReader::new(file);
        let Ok(header) = crate::core::protected::checkpoint::read_any_header(&mut input) else {
            continue;
        };
        for origin in header.roster.origins() {
            if let crate::protected::Origin::Genesis(genesis) = origin {
                if !found.contains(&genesis) {
                    found.push(genesis);
                }
            }
        }
    }
    found
}
