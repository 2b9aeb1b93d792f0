//! Shared checkpoints: one site's folded ledger, written where every site finds it, so that a
//! new site starts from it and reads only the records that follow it
//! ([`Ledger::compact`](crate::ledger::Ledger::compact)).
//!
//! # What a checkpoint holds
//!
//! A checkpoint is a [snapshot](crate::snapshot) that no site owns: the fold's entry of every
//! run of every agent (the oracle of every committed run, rule F6, and who holds each run now,
//! F5), every agent's fencing epoch (F4), the runs in doubt and their attempts (D2), the records
//! of the other surfaces, and every device's head: the seq and id of the last record it covers,
//! which chain to every record before it (rule O1). It is a SQLite file, so that a site that
//! starts from it copies it and then looks runs up in it without loading them, and it carries
//! the relay's cursor where those heads end.
//!
//! Its **id** is the SHA-256 digest of its saved state, which holds the digest of each page of
//! its buckets' checksums, which hold each bucket's checksum: a hash tree over everything it
//! says. The id is part of the file's name, `checkpoint-<records>-<id>.sqlite`, in the relay's
//! [checkpoints folder](crate::relay::Relay::checkpoints_dir) (a ledger folder's `checkpoints/`,
//! a SQLite ledger's `FILE.checkpoints/`; a ledger in PostgreSQL keeps them in its tables, and
//! each site copies the ones it uses into a folder of its own, [`Relay::checkpoint_store`](crate::relay::Relay::checkpoint_store)).
//!
//! # Rules (the contract's K1–K4)
//!
//! * **K1, nothing committed is lost.** A checkpoint holds the fold of every record up to its
//!   heads, written by a site that read and checked every one of them (a damaged ledger is not
//!   compacted); a site that starts from it folds every record after them. The fold is a merge
//!   (rule F3), so the result is the fold of everything, whatever other sites appended while the
//!   checkpoint was written.
//! * **K2, epochs never regress.** It carries every agent's fencing epoch; a site that starts
//!   from it has them, and raises its coordinator's floor from them as from the records.
//! * **K3, a checkpoint is verifiable.** A site that starts from one checks its id against its
//!   name and every page and bucket against the id while copying it: a damaged one is reported
//!   like a damaged device (nothing is dispatched on it) and never used. Its heads are checked
//!   against the ledger's files (the relay [resumes](crate::relay::Relay::resume) at its cursor
//!   only where the same records are): one that the files do not reach or match is not used,
//!   and what it covers is checked like the seen file's memory: the site reads the whole ledger
//!   and dispatches nothing while a device has fewer records than the checkpoint covers (a
//!   synced folder that has not brought them yet, a file that shrank) or other ones there. [`Ledger::verify_checkpoints`](crate::ledger::Ledger::verify_checkpoints) (`fencepost
//!   ledger verify`) folds the records a checkpoint covers again and compares: a forged one (its
//!   digests computed again over a changed content) is found there.
//! * **K4, concurrent compaction is safe.** Each checkpoint is written under a new name and
//!   moved into place whole; two sites that compact at once write two checkpoints, each the
//!   fold of what its site had read, and a site that starts from either one reads the records
//!   after it. Starting sites take the one that covers the most records (then the greatest id);
//!   the first processes of one new site wait for one copy (a lock file beside its snapshot).
//!
//! # Retention of the oracle (off by default)
//!
//! Every checkpoint carries the compactions of its line: when each was written (by the
//! compacting site's clock) and how many records of each device it covered.
//! [`Ledger::compact_with`](crate::ledger::Ledger::compact_with) with a
//! [`Retention`](crate::ledger::Retention) takes the newest of them that is old enough as the
//! anchor of a [`Forgetting`](crate::fold::Forgetting) rule and leaves out of the checkpoint the
//! committed runs the anchor already covered (of the agents named, or all): an exception to
//! rule F6 that an operator makes for run ids that can never be asked for again (a salt that
//! names a date). Age is the ledger's order, never a record's stamp: a writer whose clock is
//! behind cannot make a fresh commit look old, and a compaction never takes a time earlier than
//! the line before it or the newest record it covers (nor, with
//! [`CompactOptions::clock_floor_ms`](crate::ledger::CompactOptions::clock_floor_ms), any time
//! when its clock is not set yet). The compacting site's clock is trusted: one that is wrong by
//! E makes commits forgotten up to E early. The compactions are taken only from a checkpoint
//! whose content matches its name and this ledger's records; like the rest of a checkpoint's
//! content, a line changed with the digests computed again is trusted. Runs in doubt are never left out, and the
//! fencing epochs are kept whole (K2). The rule is part of the checkpoint's content (so of its
//! id) and the anchor's time of its name (`checkpoint-<records>-<id>-forgets-<ms>.sqlite`); a
//! name that says another is damage. A site whose snapshot forgets less moves to such a checkpoint at its next open, once
//! its snapshot has read every record the checkpoint covers and no other process has it open,
//! so that its state stops growing too. `verify_checkpoints` applies the same rule to the fold
//! of the covered records. A site that reads every record (the `ledger` subcommands, a site
//! without a snapshot) still sees the forgotten runs while their records are in the relay.
//!
//! # What it does not do yet
//!
//! The records a checkpoint covers stay in the relay: checkpoints make a new site fast and,
//! with retention, bound each site's state, but they do not yet bound the ledger's size. A checkpoint whose content was changed and its digests
//! computed again is trusted by a site that starts from it, as a device file changed that way
//! is by a site that reads it for the first time: the folder is trusted to hold what sites
//! wrote. `ledger verify` finds it while the records are there.

use std::path::{Path, PathBuf};

mod shared;

pub use shared::sealed_geneses;
pub(crate) use shared::{io_error, parse_sealed_name, unique, OpenBlobError, SharedPlace, SEALED_EXTENSION};

/// A checkpoint written by [`Ledger::compact`](crate::ledger::Ledger::compact).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Its file.
    pub path: PathBuf,
    /// Its id: the lowercase hex of its digest.
    pub id: String,
    /// How many records it covers (every device's, from seq 0 to its head).
    pub records: u64,
    /// How many devices it covers.
    pub devices: usize,
    /// How many runs it holds.
    pub runs: u64,
    /// The committed runs it leaves out (the oracle's retention), if any.
    pub forgotten: Option<crate::fold::Forgetting>,
    /// How many runs the compaction that wrote it left out (0 when read back by [`inspect`]:
    /// a checkpoint keeps its cut-off, not the runs it forgot).
    pub forgotten_runs: u64,
    /// How many records of this device's own log the compaction removed from the relay
    /// ([`CompactOptions::prune`](crate::ledger::CompactOptions::prune)); 0 otherwise.
    pub pruned: u64,
}

/// Why a checkpoint file cannot be used ([`inspect`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("checkpoint {}: {detail}", path.display())]
pub struct CheckpointError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub detail: String,
}

/// Reads the checkpoint file at `path` whole and checks it as a site that starts from it does
/// (rule K3): its saved state against its id, and when the file has a checkpoint's name, the id
/// and the records count against the name; every page of checksums and every bucket of runs
/// against the saved state; every run decoded; and SQLite's own check of its pages.
///
/// # Errors
/// [`CheckpointError`] when the file cannot be read or is damaged.
pub fn inspect(path: &Path) -> Result<CheckpointInfo, CheckpointError> {
    let failed = |detail: String| CheckpointError {
        path: path.to_path_buf(),
        detail,
    };
    let mut file = crate::snapshot::CheckpointFile::open(path).map_err(|error| failed(error.to_string()))?;
    file.check_pages().map_err(|error| failed(error.to_string()))?;
    let id = file.id();
    let records = file.base().records();
    let devices = file.base().heads.len();
    if let Some(named) = path
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(parse_file_name)
    {
        if let Some(detail) = named.mismatch(&file) {
            return Err(failed(detail));
        }
    }
    let mut runs = 0u64;
    file.for_each_run(|_, _, _| runs += 1)
        .map_err(|error| failed(error.to_string()))?;
    if runs != file.runs() {
        return Err(failed(format!(
            "it holds {runs} runs, not the {} it says",
            file.runs()
        )));
    }
    Ok(CheckpointInfo {
        path: path.to_path_buf(),
        id: id_hex(&id),
        records,
        devices,
        runs,
        forgotten: file.base().forgotten.clone(),
        forgotten_runs: 0,
        pruned: 0,
    })
}

/// The prefix of a checkpoint's file name.
const PREFIX: &str = "checkpoint-";
/// The extension of a checkpoint's file name.
const EXTENSION: &str = ".sqlite";

/// What a checkpoint's file name says ([`file_name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CheckpointName {
    /// The records it covers.
    pub(crate) records: u64,
    /// Its id.
    pub(crate) id: [u8; 32],
    /// The cut-off of the committed runs it left out
    /// (the time of its anchor, [`Forgetting::anchor_written_at_ms`](crate::fold::Forgetting)), if it forgets any: in the
    /// name, so that a site sees without opening it that a checkpoint forgets more than its own
    /// snapshot does (and must match the content, like the id).
    pub(crate) forgets_before_ms: Option<u64>,
}

impl CheckpointName {
    /// What `file`'s content says otherwise than this name (its id, the records it covers, the
    /// anchor of the runs it forgot); `None` when they agree (rule K3).
    pub(crate) fn mismatch(&self, file: &crate::snapshot::CheckpointFile) -> Option<String> {
        let covered = file.base().records();
        if file.id() != self.id {
            Some("its content does not match the id in its name".to_owned())
        } else if covered != self.records {
            Some(format!(
                "it covers {covered} records, not the {} its name says",
                self.records
            ))
        } else if file.base().forgets_before_ms() != self.forgets_before_ms {
            Some("the committed runs it leaves out are not the ones its name says".to_owned())
        } else {
            None
        }
    }
}

/// The marker of a checkpoint's cut-off in its name.
const FORGETS: &str = "-forgets-";

/// The file name of a checkpoint covering `records` records with id `id` (lowercase hex),
/// forgetting the committed runs before `forgets_before_ms` if given:
/// `checkpoint-<records>-<id>[-forgets-<ms>].sqlite`.
pub(crate) fn file_name(records: u64, id: &str, forgets_before_ms: Option<u64>) -> String {
    match forgets_before_ms {
        None => format!("{PREFIX}{records}-{id}{EXTENSION}"),
        Some(before) => format!("{PREFIX}{records}-{id}{FORGETS}{before}{EXTENSION}"),
    }
}

/// What a checkpoint file's name says; `None` for another name.
pub(crate) fn parse_file_name(name: &str) -> Option<CheckpointName> {
    let stem = name.strip_prefix(PREFIX)?.strip_suffix(EXTENSION)?;
    let (records, rest) = stem.split_once('-')?;
    let (id, forgets_before_ms) = match rest.split_once(FORGETS) {
        None => (rest, None),
        Some((id, before)) => (id, Some(decimal(before)?)),
    };
    Some(CheckpointName {
        records: decimal(records)?,
        id: crate::hex::decode_lower_hex::<32>(id)?,
        forgets_before_ms,
    })
}

/// A number written in decimal digits only (no sign, no space).
fn decimal(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The checkpoints in `dir`, the one covering the most records first (then, of the same
/// records, the one forgetting up to the latest anchor, then the greatest id).
/// A missing folder has none; other names are not checkpoints.
pub(crate) fn list(dir: &Path) -> std::io::Result<Vec<(CheckpointName, PathBuf)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        if let Some(named) = name.to_str().and_then(parse_file_name) {
            found.push((named, entry.path()));
        }
    }
    found.sort_by_key(|(named, _)| rank(named));
    Ok(found)
}

/// The order sites choose among checkpoints by (the first is used): the one covering the most
/// records first, then of the same records the one forgetting up to the latest anchor, then the
/// greatest id.
pub(crate) fn rank(named: &CheckpointName) -> impl Ord {
    std::cmp::Reverse((named.records, named.forgets_before_ms, named.id))
}

/// Removes the files in `dir` whose names start with one of `prefixes` and that are an hour old
/// at least: what processes killed while writing a checkpoint (or a copy of one) left behind. A
/// process still writing one is not disturbed.
pub(crate) fn remove_leftovers(dir: &Path, prefixes: &[&str]) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !prefixes.iter().any(|prefix| name.starts_with(prefix)) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|metadata| metadata.modified())
            .ok()
            .and_then(|modified| modified.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(3600));
        if old {
            if let Err(error) = std::fs::remove_file(entry.path()) {
                tracing::debug!(file = %entry.path().display(), %error, "cannot remove a leftover");
            }
        }
    }
}

/// The lowercase hex of an id.
pub(crate) fn id_hex(id: &[u8; 32]) -> String {
    let mut text = String::with_capacity(64);
    crate::hex::push_lower_hex(&mut text, id);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k3_a_checkpoint_file_name_round_trips_and_other_names_are_not_checkpoints() {
        let id = [0xab; 32];
        let name = file_name(42, &id_hex(&id), None);
        let named = |forgets_before_ms| CheckpointName {
            records: 42,
            id,
            forgets_before_ms,
        };
        assert_eq!(parse_file_name(&name), Some(named(None)));
        let name = file_name(42, &id_hex(&id), Some(1_700_000_000_000));
        assert!(name.ends_with("-forgets-1700000000000.sqlite"), "{name}");
        assert_eq!(parse_file_name(&name), Some(named(Some(1_700_000_000_000))));
        for other in [
            "checkpoint-42-abababababababababababababababababababababababababababababababab-forgets-.sqlite",
            "checkpoint-42-abababababababababababababababababababababababababababababababab-forgets--1.sqlite",
            "checkpoint-42-abababababababababababababababababababababababababababababababab-forgets-1x.sqlite",
            "checkpoint-42-ab.sqlite",
            "checkpoint--abab.sqlite",
            "checkpoint-+4-abababababababababababababababababababababababababababababababab.sqlite",
            "checkpoint-42-ABABABABABABABABABABABABABABABABABABABABABABABABABABABABABABABAB.sqlite",
            "checkpoint-42-abababababababababababababababababababababababababababababababab.sqlite-wal",
            ".checkpoint-42-abababababababababababababababababababababababababababababababab.sqlite",
        ] {
            assert_eq!(parse_file_name(other), None, "{other}");
        }
    }
}
