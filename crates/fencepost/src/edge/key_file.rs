//! A device's key file (issue 39, rule I1): made once per device id, on first use, readable by
//! its owner only, and never made again while it exists.
//!
//! The file is written whole under a temporary name (mode 0600, synced) and then linked to its
//! name, which fails when the name exists: processes that race to make the key of one device id
//! end with one key, the first one linked, and every one of them reads it. A file that exists
//! but cannot be read as a key (truncated, altered, another device's, readable by others) is an
//! error that names it and what is wrong; it is never replaced.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use thiserror::Error;
use zeroize::Zeroizing;

use crate::core::identity::{DeviceKey, KeyTextError};
use crate::id::DeviceId;

/// The key files' extension.
const KEY_EXTENSION: &str = ".key";

/// Where the key of `device` lives in `folder`: its name is the device's log file name with
/// `.key` for `.jsonl` (`host%41.key`), so that every device id has its own file.
pub fn key_path(folder: &Path, device: &DeviceId) -> PathBuf {
    let log_name = crate::edge::relay::device_file_name(device);
    let stem = log_name.strip_suffix(".jsonl").unwrap_or(&log_name);
    folder.join(format!("{stem}{KEY_EXTENSION}"))
}

/// The key of `device` in `folder` ([`key_path`]), made when there is none. Returns it and
/// whether this call made it.
///
/// # Errors
/// [`KeyFileError`]: the folder or the file could not be made or read, or the file is not
/// `device`'s key.
pub fn load_or_create(folder: &Path, device: &DeviceId) -> Result<(DeviceKey, bool), KeyFileError> {
    match load(folder, device) {
        Err(KeyFileError::Missing { .. }) => {}
        other => return other.map(|key| (key, false)),
    }
    let path = key_path(folder, device);
    create_owner_only_dir(folder).map_err(|source| KeyFileError::Io {
        path: folder.to_path_buf(),
        action: "create the folder of",
        source,
    })?;
    let key = generate(device.clone()).map_err(|source| KeyFileError::Io {
        path: path.clone(),
        action: "draw random bytes for",
        source,
    })?;
    if write_new(&path, &key.to_file_text())? {
        return Ok((key, true));
    }
    // Another process linked its key first: that one is the device's key.
    load(folder, device).map(|key| (key, false))
}

/// The key of `device` in `folder`, which must exist.
///
/// # Errors
/// [`KeyFileError::Missing`] when there is none; the other variants as [`load_or_create`].
pub fn load(folder: &Path, device: &DeviceId) -> Result<DeviceKey, KeyFileError> {
    load_file(&key_path(folder, device), device)
}

/// The key of `device` in the file `path` (a ledger's recovery key, say, whose device id is
/// [`RECOVERY`](crate::membership::RECOVERY)), with the checks of [`load`] on the file and its
/// folder.
///
/// # Errors
/// As [`load`].
pub fn load_file(path: &Path, device: &DeviceId) -> Result<DeviceKey, KeyFileError> {
    let path = path.to_path_buf();
    let folder = match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let io = |source: std::io::Error| KeyFileError::Io {
        path: path.clone(),
        action: "read",
        source,
    };
    let mut file = match open_no_follow(&path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(KeyFileError::Missing { path });
        }
        Err(_) if is_symbolic_link(&path) => return Err(KeyFileError::NotAFile { path }),
        other => other.map_err(io)?,
    };
    // Checked on the handle opened, not on the name again (found by a review: a name checked
    // and then opened again can be swapped between the two).
    let metadata = file.metadata().map_err(io)?;
    if !metadata.is_file() {
        return Err(KeyFileError::NotAFile { path });
    }
    check_owner_only(&path, &metadata)?;
    check_folder(&folder)?;
    let mut bytes = Zeroizing::new(Vec::with_capacity(512));
    std::io::Read::read_to_end(&mut file, &mut bytes).map_err(io)?;
    let text = std::str::from_utf8(&bytes).map_err(|_| KeyFileError::Malformed {
        path: path.clone(),
        source: KeyTextError::Line {
            line: 1,
            detail: "the file is not UTF-8 text".to_owned(),
        },
    })?;
    let key = DeviceKey::from_file_text(text).map_err(|source| KeyFileError::Malformed {
        path: path.clone(),
        source,
    })?;
    if key.device() != device {
        return Err(KeyFileError::OtherDevice {
            path,
            found: key.device().to_string(),
        });
    }
    Ok(key)
}

/// Writes `key` to a new file at `path` (mode 0600, in a folder made 0700 when missing), never
/// over an existing one: a ledger's recovery key, say. Returns `false`, writing nothing, when
/// `path` exists.
///
/// # Errors
/// [`KeyFileError::Io`] when the folder or the file could not be made.
pub fn save_new(path: &Path, key: &DeviceKey) -> Result<bool, KeyFileError> {
    if let Some(folder) = path.parent() {
        create_owner_only_dir(folder).map_err(|source| KeyFileError::Io {
            path: folder.to_path_buf(),
            action: "create the folder of",
            source,
        })?;
    }
    write_new(path, &key.to_file_text())
}

/// Fresh keys for `device` from the operating system's random source.
fn generate(device: DeviceId) -> std::io::Result<DeviceKey> {
    let mut signing = Zeroizing::new([0u8; 32]);
    let mut agreement = Zeroizing::new([0u8; 32]);
    getrandom::fill(&mut *signing).map_err(std::io::Error::from)?;
    getrandom::fill(&mut *agreement).map_err(std::io::Error::from)?;
    Ok(DeviceKey::from_secrets(device, *signing, *agreement))
}

/// Writes `text` to a new temporary file beside `path` (mode 0600, synced) and links it to
/// `path`. Returns `false`, leaving `path` as it was, when `path` exists.
fn write_new(path: &Path, text: &str) -> Result<bool, KeyFileError> {
    let io = |action: &'static str| {
        move |source: std::io::Error| KeyFileError::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    };
    let folder = path.parent().unwrap_or(Path::new("."));
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(|error| io("draw random bytes for")(std::io::Error::from(error)))?;
    let mut temporary_name = String::from(".new-");
    crate::hex::push_lower_hex(&mut temporary_name, &random);
    let temporary = folder.join(temporary_name);
    let result = (|| {
        let mut file = open_owner_only(&temporary).map_err(io("create"))?;
        file.write_all(text.as_bytes()).map_err(io("write"))?;
        file.sync_all().map_err(io("write"))?;
        match std::fs::hard_link(&temporary, path) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
            Err(error) => return Err(io("create")(error)),
        }
        // Best effort: the link is durable once the folder is synced (and the folder's own
        // entry, when this call made it).
        for directory in [Some(folder), folder.parent()].into_iter().flatten() {
            if let Ok(directory) = std::fs::File::open(directory) {
                let _ = directory.sync_all();
            }
        }
        Ok(true)
    })();
    let _ = std::fs::remove_file(&temporary);
    result
}

/// Creates `folder` and its parents; the folder itself is for its owner only (0700 on Unix).
fn create_owner_only_dir(folder: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(folder)
}

#[cfg(unix)]
fn open_owner_only(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

#[cfg(not(unix))]
fn open_owner_only(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

/// Opens `path` for reading without following a symbolic link, and without waiting on a FIFO.
#[cfg(unix)]
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

fn is_symbolic_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|metadata| metadata.file_type().is_symlink())
}

/// Refuses a key file that others than its owner may read or write, or that another user owns
/// (as ssh does).
#[cfg(unix)]
fn check_owner_only(path: &Path, metadata: &std::fs::Metadata) -> Result<(), KeyFileError> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::TooOpen {
            path: path.to_path_buf(),
            mode,
        });
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let user = unsafe { libc::geteuid() };
    if metadata.uid() != user {
        return Err(KeyFileError::OtherOwner {
            path: path.to_path_buf(),
            owner: metadata.uid(),
            user,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_owner_only(_: &Path, _: &std::fs::Metadata) -> Result<(), KeyFileError> {
    Ok(())
}

/// Refuses a keys folder that others may write (they could put another key in a file's place).
#[cfg(unix)]
fn check_folder(folder: &Path) -> Result<(), KeyFileError> {
    use std::os::unix::fs::PermissionsExt as _;
    let metadata = std::fs::metadata(folder).map_err(|source| KeyFileError::Io {
        path: folder.to_path_buf(),
        action: "read the folder of",
        source,
    })?;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(KeyFileError::TooOpen {
            path: folder.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_folder(_: &Path) -> Result<(), KeyFileError> {
    Ok(())
}

/// A device's key file could not be made or read.
#[derive(Debug, Error)]
pub enum KeyFileError {
    /// There is no key file.
    #[error("there is no device key at {}", path.display())]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The operating system refused.
    #[error("cannot {action} the device key {}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// What the system said.
        source: std::io::Error,
    },
    /// Something other than a file is where the key should be.
    #[error("the device key {} is not a file", path.display())]
    NotAFile {
        /// Where.
        path: PathBuf,
    },
    /// Others than its owner may read or write it (or, for the folder, write it).
    #[error(
        "the device key {} has mode {mode:03o}: only its owner may read it, and only its owner may write its folder (chmod 600 a key file, 700 its folder; make a new key if others may have read it)",
        path.display()
    )]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// It cannot be read as a key.
    #[error("the device key {} is damaged: {source}; it is left as it is (restore it from a backup)", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: KeyTextError,
    },
    /// Another user owns it.
    #[error("the device key {} belongs to user {owner}, not to this user ({user}): a key file is read only by its owner", path.display())]
    OtherOwner {
        /// The file.
        path: PathBuf,
        /// Its owner's user id.
        owner: u32,
        /// This process's effective user id.
        user: u32,
    },
    /// It is the key of another device id.
    #[error("the device key {} belongs to device {found:?}, not this one", path.display())]
    OtherDevice {
        /// The file.
        path: PathBuf,
        /// The device it names.
        found: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str) -> DeviceId {
        DeviceId::new(name).unwrap()
    }

    #[test]
    fn i1_a_key_is_made_once_and_read_back_the_same() {
        let folder = tempfile::tempdir().unwrap();
        let (made, created) = load_or_create(folder.path(), &device("laptop")).unwrap();
        assert!(created);
        let (read, created) = load_or_create(folder.path(), &device("laptop")).unwrap();
        assert!(!created);
        assert_eq!(read.public(), made.public());
        let (other, _) = load_or_create(folder.path(), &device("phone")).unwrap();
        assert_ne!(other.public(), made.public());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let path = key_path(folder.path(), &device("laptop"));
            let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        let names: Vec<_> = std::fs::read_dir(folder.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "no temporary file is left: {names:?}");
    }

    #[test]
    fn i1_threads_racing_to_make_one_device_key_end_with_one_key() {
        let folder = tempfile::tempdir().unwrap();
        let publics: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        load_or_create(folder.path(), &device("laptop"))
                            .unwrap()
                            .0
                            .public()
                    })
                })
                .collect();
            handles.into_iter().map(|handle| handle.join().unwrap()).collect()
        });
        assert!(publics.windows(2).all(|pair| pair[0] == pair[1]));
    }

    #[test]
    fn i1_a_damaged_open_or_foreign_key_file_is_an_error_and_is_left_as_it_is() {
        let folder = tempfile::tempdir().unwrap();
        let laptop = device("laptop");
        load_or_create(folder.path(), &laptop).unwrap();
        let path = key_path(folder.path(), &laptop);
        let text = std::fs::read_to_string(&path).unwrap();
        let truncated = &text[..text.len() - 20];
        std::fs::write(&path, truncated).unwrap();
        let error = load_or_create(folder.path(), &laptop).unwrap_err();
        assert!(matches!(error, KeyFileError::Malformed { .. }), "{error}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            truncated,
            "the file was replaced"
        );
        std::fs::write(&path, text.replace("device laptop", "device phone")).unwrap();
        let error = load(folder.path(), &laptop).unwrap_err();
        assert!(
            matches!(error, KeyFileError::OtherDevice { ref found, .. } if found == "phone"),
            "{error}"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::write(&path, &text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let error = load_or_create(folder.path(), &laptop).unwrap_err();
            assert!(
                matches!(error, KeyFileError::TooOpen { mode: 0o644, .. }),
                "{error}"
            );
            assert!(error.to_string().contains("chmod 600"));
        }
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let error = load_or_create(folder.path(), &laptop).unwrap_err();
        assert!(matches!(error, KeyFileError::NotAFile { .. }), "{error}");
    }

    /// I1 (found by a review): the key is read from the handle opened, never through a
    /// symbolic link or from a FIFO (no hang), and a file another user owns or a folder others
    /// may write is refused.
    #[cfg(unix)]
    #[test]
    fn i1_a_linked_foreign_or_exposed_key_file_is_refused_without_waiting() {
        use std::os::unix::fs::PermissionsExt as _;
        let folder = tempfile::tempdir().unwrap();
        let keys = folder.path().join("keys");
        let laptop = device("laptop");
        load_or_create(&keys, &laptop).unwrap();
        let path = key_path(&keys, &laptop);
        let moved = folder.path().join("elsewhere.key");
        std::fs::rename(&path, &moved).unwrap();
        std::os::unix::fs::symlink(&moved, &path).unwrap();
        let error = load_or_create(&keys, &laptop).unwrap_err();
        assert!(matches!(error, KeyFileError::NotAFile { .. }), "{error}");
        std::fs::remove_file(&path).unwrap();
        let fifo = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string and mode.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let error = load_or_create(&keys, &laptop).unwrap_err();
        assert!(matches!(error, KeyFileError::NotAFile { .. }), "{error}");
        std::fs::remove_file(&path).unwrap();
        std::fs::rename(&moved, &path).unwrap();
        assert!(load(&keys, &laptop).is_ok());
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = load(&keys, &laptop).unwrap_err();
        assert!(
            matches!(error, KeyFileError::TooOpen { mode: 0o777, .. }),
            "{error}"
        );
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o700)).unwrap();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let file = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
            // SAFETY: a valid C string; root may give the file away.
            assert_eq!(unsafe { libc::chown(file.as_ptr(), 4242, 4242) }, 0);
            let error = load(&keys, &laptop).unwrap_err();
            assert!(
                matches!(error, KeyFileError::OtherOwner { owner: 4242, .. }),
                "{error}"
            );
        }
    }

    #[test]
    fn key_files_of_ids_that_differ_only_in_case_or_bytes_are_different_files() {
        let folder = Path::new("/keys");
        assert_ne!(
            key_path(folder, &device("Host")),
            key_path(folder, &device("host"))
        );
        assert_eq!(key_path(folder, &device("host-a")), folder.join("host-a.key"));
    }
}
