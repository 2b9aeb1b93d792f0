//! A protected ledger's checkpoints (issue 39): the shared place (the ledger folder's
//! `checkpoints/`, a SQLite ledger's `FILE.checkpoints/`, a database's table) holds them sealed
//! ([`crate::protected::checkpoint`]), named `checkpoint-<records>-<digest of the sealed
//! bytes>[-forgets-<ms>].sealed`; this host keeps opened copies in a folder of its own
//! ([`LedgerOptions::checkpoint_copies`](crate::ledger::LedgerOptions::checkpoint_copies)),
//! named as any checkpoint is. [`SealedStore`] stands between the two as a
//! [`CheckpointStore`], so the code that ranks, starts from, removes and verifies checkpoints
//! works on the copies as it does for a database's.
//!
//! A sealed checkpoint that does not open (not sealed with a generation this device holds,
//! written by a device that was no member where it ends its log, altered, another ledger's) is
//! never used, and stops nothing: anyone who can write the shared place can put one there, as
//! they can a log under a non-member's id. `ledger verify` reports it.

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::super::Protected;
use crate::checkpoint::{
    self, io_error, parse_sealed_name, unique, OpenBlobError, SharedPlace, SEALED_EXTENSION,
};
use crate::core::protected::checkpoint::{open_checkpoint, read_header, seal_checkpoint, SealedHeader};
use crate::core::protected::checkpoint::{
    sealed_length, BlobDigest, SEALED_CHECKPOINT_FORMAT, STREAM_NONCE_BYTES,
};
use crate::relay::{CheckpointStore, RelayError};
use crate::roster::KeyId;
use crate::seal::LedgerKey;
use crate::snapshot::CheckpointFile;

/// The folder, among the copies, that says which sealed checkpoint each copy was opened from:
/// a file per sealed name, holding the copy's name.
const OPENED_DIR: &str = ".opened";
/// The folder, among the copies, of the sealed checkpoints that do not open for good: a file
/// per sealed name, holding why.
const REFUSED_DIR: &str = ".refused";
/// What follows a refusal's reason in its note when its writer was revoked: the writer.
const WRITER_NOTE: &str = "\nrevoked writer ";

/// Why a sealed checkpoint does not open, and whether for good (its bytes), while its writer
/// stays revoked (`revoked`: the writer), or for now (the store away, a generation this device
/// has not been given yet).
struct Refusal {
    why: String,
    lasting: bool,
    revoked: Option<String>,
}

impl Refusal {
    fn lasting(why: String) -> Self {
        Self {
            why,
            lasting: true,
            revoked: None,
        }
    }

    /// Refused because `writer` was revoked: looked at again once the revocation stops
    /// counting ([`SealedStore::refuse_revoked`]; found by a cryptography review: a checkpoint
    /// refused because a thief revoked its writer stayed refused after the recovery key cut
    /// the thief).
    fn revoked(why: String, writer: &str) -> Self {
        Self {
            why,
            lasting: true,
            revoked: Some(writer.to_owned()),
        }
    }

    fn passing(why: String) -> Self {
        Self {
            why,
            lasting: false,
            revoked: None,
        }
    }
}

impl From<String> for Refusal {
    fn from(why: String) -> Self {
        Self::lasting(why)
    }
}

/// The sealed checkpoints of a protected ledger, as a store of opened copies.
pub(in crate::edge::ledger) struct SealedStore<'a> {
    /// The ledger's relay: the records after a checkpoint are read to judge it.
    pub(in crate::edge::ledger) relay: &'a dyn crate::relay::Relay,
    pub(in crate::edge::ledger) shared: SharedPlace<'a>,
    /// This host's folder of opened copies.
    pub(in crate::edge::ledger) copies: PathBuf,
    pub(in crate::edge::ledger) protected: &'a Protected,
    /// The generation this device seals with now, if it holds one.
    pub(in crate::edge::ledger) seal_key: Option<LedgerKey>,
    /// Sealed checkpoints that did not open, and why (for `ledger verify`).
    pub(in crate::edge::ledger) unopened: &'a Mutex<Vec<(String, String)>>,
    /// The membership changes this host's reading read: a checkpoint is judged with them too.
    pub(in crate::edge::ledger) known: Vec<crate::roster::MembershipChange>,
    /// The devices revoked, and those only a void admit admitted, as this host's reading reads
    /// the roster: their checkpoints are never used, even those opened before.
    pub(in crate::edge::ledger) revoked: Vec<String>,
}

impl SealedStore<'_> {
    fn opened_dir(&self) -> PathBuf {
        self.copies.join(OPENED_DIR)
    }

    /// Per sealed name, the name of the copy opened from it (as this host's copies say).
    /// Per sealed name, the name of the copy opened from it and its writer.
    fn opened(&self) -> Vec<(String, String, String)> {
        let Ok(entries) = std::fs::read_dir(self.opened_dir()) else {
            return Vec::new();
        };
        entries
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let sealed = entry.file_name().into_string().ok()?;
                let noted = std::fs::read_to_string(entry.path()).ok()?;
                let (copy, writer) = noted.split_once('\n')?;
                (parse_sealed_name(&sealed).is_some() && checkpoint::parse_file_name(copy).is_some())
                    .then(|| (sealed, copy.to_owned(), writer.to_owned()))
            })
            .collect()
    }

    /// Notes the checkpoints opened here whose writer is revoked as refused, while it stays
    /// revoked: no open of this host uses them again. Forgets the refusals of writers whose
    /// revocation this reading holds and finds counting no more (the recovery key cut their
    /// revoker before it): the next open judges them again. A reading that does not hold the
    /// revocation (a copy that lacks the revoker's log) forgets nothing.
    pub(in crate::edge::ledger) fn refuse_revoked(&self) {
        if let Ok(entries) = std::fs::read_dir(self.copies.join(REFUSED_DIR)) {
            for entry in entries.flatten() {
                let noted = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let writer = noted.rsplit_once(WRITER_NOTE).map(|(_, writer)| writer);
                if writer.is_some_and(|writer| self.revocation_stopped_counting(writer)) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        for (sealed, _, writer) in self.opened() {
            if self.revoked.contains(&writer) {
                self.note_refused(&sealed, &revoked_writer(&writer), Some(&writer));
                let _ = std::fs::remove_file(self.opened_dir().join(&sealed));
            }
        }
    }

    /// Whether this reading holds a revocation of `writer` and `writer` is revoked no more.
    fn revocation_stopped_counting(&self, writer: &str) -> bool {
        let read = self.known.iter().any(|known| {
            matches!(&known.change, crate::roster::Change::Revoke { device, .. } if device.as_str() == writer)
        });
        read && !self.revoked.iter().any(|revoked| revoked == writer)
    }

    /// Removes the shared sealed checkpoints whose writer is revoked and whose records a
    /// checkpoint this device wrote contains (`contained`, given each one's heads): every
    /// reader that read the revocation refuses them for good (rule S6), so they are of no use,
    /// and `ledger verify` would report them for ever (found by an adversary: a device revoked
    /// while it compacted left one that no compaction removed, since none was ever opened).
    pub(in crate::edge::ledger) fn remove_revoked_contained(
        &self,
        contained: impl Fn(&[(String, u64, crate::oplog::OpId)]) -> bool,
    ) {
        if self.revoked.is_empty() {
            return;
        }
        // One this host opened names its writer in its note: one whose writer counts is not
        // fetched (from a database, a whole checkpoint) to read its header again.
        let counted: std::collections::BTreeSet<String> = self
            .opened()
            .into_iter()
            .filter(|(_, _, writer)| !self.revoked.contains(writer))
            .map(|(sealed, _, _)| sealed)
            .collect();
        for sealed in self.shared.list().unwrap_or_default() {
            if counted.contains(&sealed) {
                continue;
            }
            let Ok(Some(file)) = self.shared.open(&sealed, &self.copies) else {
                continue;
            };
            let Ok((header, _)) = read_header(&mut BufReader::new(file), &self.protected.ledger) else {
                continue;
            };
            if !self.revoked.contains(&header.writer) || !contained(&header.heads) {
                continue;
            }
            match self.shared.delete(&sealed) {
                Ok(()) => tracing::info!(
                    checkpoint = sealed,
                    writer = header.writer,
                    "removed a checkpoint of a revoked device that this one contains"
                ),
                Err(error) => {
                    tracing::warn!(checkpoint = sealed, %error, "cannot remove a checkpoint of a revoked device")
                }
            }
            let _ = std::fs::remove_file(self.opened_dir().join(&sealed));
        }
    }

    /// Notes that the copy `copy` was opened from the sealed `sealed`, which `writer` wrote
    /// (written whole).
    fn note_opened(&self, sealed: &str, copy: &str, writer: &str) {
        let dir = self.opened_dir();
        let temp = dir.join(unique(".noting-"));
        let noted = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&temp, format!("{copy}\n{writer}")))
            .and_then(|()| std::fs::rename(&temp, dir.join(sealed)));
        if let Err(error) = noted {
            let _ = std::fs::remove_file(&temp);
            tracing::debug!(checkpoint = sealed, %error, "cannot note which copy a sealed checkpoint opened to; it is opened again next time");
        }
    }

    /// The refusal noted of the sealed checkpoint `sealed`, if one was and it has not changed
    /// since ([`SharedPlace::stamp`]).
    fn refused(&self, sealed: &str) -> Option<String> {
        let noted = std::fs::read_to_string(self.copies.join(REFUSED_DIR).join(sealed)).ok()?;
        let (stamp, why) = noted.split_once('\n')?;
        let why = why.rsplit_once(WRITER_NOTE).map_or(why, |(why, _)| why);
        (Some(stamp) == self.shared.stamp(sealed).as_deref()).then(|| why.to_owned())
    }

    /// Notes that `sealed` does not open, for good while it does not change (a sealed
    /// checkpoint never changes: its name holds its digest) and, when refused because its
    /// writer `revoked` was, while that writer stays revoked, so that it is not read again on
    /// every open.
    fn note_refused(&self, sealed: &str, why: &str, revoked: Option<&str>) {
        let Some(stamp) = self.shared.stamp(sealed) else {
            return;
        };
        let writer = revoked.map_or_else(String::new, |writer| format!("{WRITER_NOTE}{writer}"));
        let dir = self.copies.join(REFUSED_DIR);
        let temp = dir.join(unique(".noting-"));
        let noted = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&temp, format!("{stamp}\n{why}{writer}")))
            .and_then(|()| std::fs::rename(&temp, dir.join(sealed)));
        if noted.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
    }

    /// Opens the sealed checkpoint `sealed` into the file `into`; returns the name its copy
    /// takes. See [`crate::protected::checkpoint`] for what is checked.
    fn open_sealed(&self, sealed: &str, into: &Path) -> Result<Option<(String, String)>, Refusal> {
        let Some((records, digest, forgets)) = parse_sealed_name(sealed) else {
            return Err(Refusal::lasting(
                "its name is not a sealed checkpoint's".to_owned(),
            ));
        };
        if let Err(error) = std::fs::create_dir_all(&self.copies) {
            return Err(Refusal::passing(format!(
                "cannot create {}: {error}",
                self.copies.display()
            )));
        }
        let file = match self.shared.open(sealed, &self.copies) {
            Ok(Some(file)) => file,
            Ok(None) => return Ok(None),
            Err(OpenBlobError::NotAFile(why)) => return Err(Refusal::lasting(why)),
            Err(OpenBlobError::Io(error)) => {
                return Err(Refusal::passing(format!("cannot be read: {error}")))
            }
        };
        let opened = self.open_file(file, into, (records, digest, forgets)).map(Some);
        if opened.is_err() {
            crate::snapshot::Snapshot::remove(into);
        }
        opened
    }

    /// Opens the sealed checkpoint `file`, named `named`, into `into`.
    fn open_file(
        &self,
        mut file: std::fs::File,
        into: &Path,
        named: (u64, BlobDigest, Option<u64>),
    ) -> Result<(String, String), Refusal> {
        let ledger = self.protected.ledger;
        let length = file
            .metadata()
            .map_err(|error| Refusal::passing(error.to_string()))?
            .len();
        let (header, line) = read_header(&mut BufReader::new(&mut file), &ledger)?;
        // Its length follows from its header: a shorter file may be one a sync tool is still
        // writing (looked at again once it changes), a longer one is not what its writer wrote.
        let expected = sealed_length(line.len(), header.plain_bytes);
        if expected.is_none_or(|expected| length > expected) {
            return Err(Refusal::lasting(format!(
                "it is {length} bytes, more than its header says"
            )));
        }
        if let Some(expected) = expected.filter(|expected| length < *expected) {
            return Err(Refusal::passing(format!(
                "it is cut short: {length} of {expected} bytes (a sync still copying it?)"
            )));
        }
        if (header.records, header.forgets_before_ms) != (named.0, named.2) {
            return Err(Refusal::lasting(
                "its header does not say what its name says".to_owned(),
            ));
        }
        header.roster.check_proofs(&ledger)?;
        let mut devices: Vec<&str> = header
            .heads
            .iter()
            .map(|(device, _, _)| device.as_str())
            .collect();
        devices.sort_unstable();
        if devices.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(Refusal::lasting(
                "its header names a device's head twice".to_owned(),
            ));
        }
        let settled = header.heads.iter().cloned();
        let mut logs = self.protected.restore_from(&header.roster, settled)?;
        // Every change this host read counts too: a header that leaves out a revocation of its
        // writer (found by a cryptography review) is judged with it.
        logs.admit(self.known.iter().cloned());
        // The changes after it count too: a revocation of its writer from before where the
        // checkpoint ends its log, the admission that gave this device its keys.
        let mut after = crate::relay::Frontier::new();
        for (device, count, last) in &header.heads {
            after.raise_to(device, *count, Some(*last));
        }
        let read = self.relay.pull_in_batches(&after, &mut |batch| {
            let mut batch = batch.into_iter().peekable();
            while let Some(first) = batch.next() {
                let mut run = vec![first];
                while let Some(next) = batch.next_if(|op| op.device_id == run[0].device_id) {
                    run.push(next);
                }
                logs.offer_all(run);
            }
        });
        // The ledger's own reading starts afresh (a folder's relay resumes at a cursor only
        // before it read anything).
        self.relay.read_from_start();
        read.map_err(|error| Refusal::passing(format!("the records after it cannot be read: {error}")))?;
        // A checkpoint is in no log: one written before its writer's revocation cannot be told
        // from one a thief wrote after it. A revoked device's are never used (nor, once this
        // host reads the revocation, one opened before: `names`).
        let refused = logs.protection().roster().refuses_checkpoint_of(
            &header.writer,
            KeyId(header.writer_origin.0),
            header.writer_count(),
        );
        if let Some(why) = refused {
            // Refused because its writer was revoked (a cut, or admitted only by a void admit):
            // for as long as it stays so.
            let revoked = logs
                .protection()
                .roster()
                .revoked()
                .any(|device| device.as_str() == header.writer);
            return Err(match revoked {
                true => Refusal::revoked(why, &header.writer),
                false => Refusal::lasting(why),
            });
        }
        let writer = match logs.origin_of(&header.writer) {
            Some(Ok((id, origin))) if *id == header.writer_origin => *origin.signer(),
            _ => {
                return Err(Refusal::lasting(format!(
                    "it does not give its writer {:?}'s record 0",
                    header.writer
                )))
            }
        };
        let keys: Vec<&LedgerKey> = logs
            .protection()
            .keys()
            .filter(|key| key.generation() == header.generation)
            .collect();
        if keys.is_empty() {
            // An admission of this device not read yet may give it.
            return Err(Refusal::passing(format!(
                "it is sealed with generation {} of the ledger key, which no change it carries gives this device",
                header.generation
            )));
        }
        let mut why = String::new();
        for key in keys {
            std::io::Seek::rewind(&mut file).map_err(|error| Refusal::passing(error.to_string()))?;
            let mut input = BufReader::new(&mut file);
            let (_, again) = read_header(&mut input, &ledger)?;
            if again != line {
                return Err(Refusal::passing("it changed while it was read".to_owned()));
            }
            let mut out = std::fs::File::create(into).map_err(|error| error.to_string())?;
            let mut writer_out = std::io::BufWriter::new(&mut out);
            match open_checkpoint(&header, &line, key, &writer, &ledger, &mut input, &mut writer_out) {
                Ok(digest) if digest != named.1 => {
                    return Err(Refusal::lasting(
                        "its bytes do not match the digest in its name".to_owned(),
                    ))
                }
                Ok(_) => {
                    writer_out.flush().map_err(|error| error.to_string())?;
                    drop(writer_out);
                    out.sync_all().map_err(|error| error.to_string())?;
                    return Ok((self.check_opened(&header, into)?, header.writer.clone()));
                }
                Err(error) => why = error,
            }
        }
        Err(Refusal::lasting(why))
    }

    /// The opened file at `into` says what `header` says; the name its copy takes.
    fn check_opened(&self, header: &SealedHeader, into: &Path) -> Result<String, String> {
        let file =
            CheckpointFile::open(into).map_err(|error| format!("its content does not read: {error}"))?;
        let base = file.base();
        let heads: Vec<(String, u64, crate::oplog::OpId)> = base
            .heads
            .iter()
            .filter_map(|head| Some((head.device_id.clone(), head.next_seq, head.last?.0)))
            .collect();
        let same_roster = base
            .protected
            .as_ref()
            .is_some_and(|mark| mark.same_roster(&header.roster));
        if heads != header.heads
            || base.records() != header.records
            || base.forgets_before_ms() != header.forgets_before_ms
            || !same_roster
        {
            return Err("its content does not say what its header says".to_owned());
        }
        let id = checkpoint::id_hex(&file.id());
        Ok(checkpoint::file_name(
            header.records,
            &id,
            header.forgets_before_ms,
        ))
    }
}

impl CheckpointStore for SealedStore<'_> {
    /// The copies' names of the sealed checkpoints shared: each one not opened here yet is
    /// opened now, into the copies; one that does not open is left out (and noted).
    fn names(&self) -> Result<Vec<String>, RelayError> {
        let shared = self.shared.list()?;
        // What processes killed while they opened, sealed or noted one left (an hour old).
        checkpoint::remove_leftovers(&self.copies, &[".fetching-", ".opening-", ".sealing-"]);
        for dir in [OPENED_DIR, REFUSED_DIR] {
            checkpoint::remove_leftovers(&self.copies.join(dir), &[".noting-"]);
        }
        let opened = self.opened();
        for (sealed, _, _) in &opened {
            if !shared.contains(sealed) {
                let _ = std::fs::remove_file(self.opened_dir().join(sealed));
            }
        }
        let mut names = Vec::new();
        for sealed in shared {
            let mut noted = self.refused(&sealed);
            if let Some((_, copy, writer)) = opened.iter().find(|(name, _, _)| *name == sealed) {
                // Judged again: a writer revoked since it was opened (found by a cryptography
                // review: a copy opened before was used after the revocation was read).
                if self.revoked.iter().any(|revoked| revoked == writer) {
                    let why = revoked_writer(writer);
                    self.note_refused(&sealed, &why, Some(writer));
                    let _ = std::fs::remove_file(self.opened_dir().join(&sealed));
                    noted = Some(why);
                } else if self.copies.join(copy).exists() {
                    names.push(copy.clone());
                    continue;
                }
            }
            let into = self.copies.join(unique(".opening-"));
            let opened = match &noted {
                Some(why) => Err(Refusal::lasting(why.clone())),
                None => self.open_sealed(&sealed, &into),
            };
            match opened {
                Ok(Some((copy, writer))) => {
                    let placed = std::fs::rename(&into, self.copies.join(&copy));
                    if let Err(error) = placed {
                        crate::snapshot::Snapshot::remove(&into);
                        return Err(io_error("place an opened checkpoint in", &self.copies, error));
                    }
                    self.note_opened(&sealed, &copy, &writer);
                    // Refused before under another roster.
                    let _ = std::fs::remove_file(self.copies.join(REFUSED_DIR).join(&sealed));
                    names.push(copy);
                }
                Ok(None) => {}
                Err(Refusal {
                    why,
                    lasting,
                    revoked,
                }) => {
                    if noted.is_none() {
                        tracing::warn!(checkpoint = sealed.as_str(), %why, "a sealed checkpoint of the ledger does not open: not used");
                    }
                    if lasting && noted.is_none() {
                        self.note_refused(&sealed, &why, revoked.as_deref());
                    }
                    if let Ok(mut unopened) = self.unopened.lock() {
                        unopened.retain(|(name, _)| *name != sealed);
                        unopened.push((sealed, why));
                    }
                }
            }
        }
        Ok(names)
    }

    /// Opens afresh the sealed checkpoint that `name`'s copy was opened from, into `to`.
    fn download(&self, name: &str, to: &mut dyn Write) -> Result<bool, RelayError> {
        let Some((sealed, _, _)) = self.opened().into_iter().find(|(_, copy, _)| copy == name) else {
            return Ok(false);
        };
        let into = self.copies.join(unique(".opening-"));
        let opened = self.open_sealed(&sealed, &into);
        let copied = match opened {
            Ok(Some((copy, _))) if copy == name => std::fs::File::open(&into)
                .and_then(|mut file| std::io::copy(&mut file, to))
                .map(|_| true)
                .map_err(|error| io_error("read", &into, error)),
            Ok(_) => Ok(false),
            Err(refusal) => Err(RelayError::Unsupported(format!(
                "the sealed checkpoint {sealed} does not open: {}",
                refusal.why
            ))),
        };
        crate::snapshot::Snapshot::remove(&into);
        copied
    }

    /// Seals the checkpoint's file at `path` with this device's generation, signs it and shares
    /// it.
    fn upload(&self, name: &str, path: &Path) -> Result<(), RelayError> {
        // The same records compacted again make the same file (named by its digest): the sealed
        // one shared for it stays, rather than another of it under a new nonce (found by an
        // adversary: each compaction of a quiet ledger added one, and none went).
        let shared = self.shared.list()?;
        if self.opened().iter().any(|(sealed, copy, writer)| {
            copy == name && shared.contains(sealed) && !self.revoked.contains(writer)
        }) {
            return Ok(());
        }
        let refused =
            |detail: String| RelayError::Unsupported(format!("cannot seal the checkpoint: {detail}"));
        let key = self
            .seal_key
            .as_ref()
            .ok_or_else(|| refused("this device holds no generation of the ledger key".to_owned()))?;
        let file = CheckpointFile::open(path).map_err(|error| refused(error.to_string()))?;
        let base = file.base();
        let roster = base
            .protected
            .as_ref()
            .ok_or_else(|| refused("it holds no protected reading".to_owned()))?
            .roster_part();
        let header = SealedHeader {
            format: SEALED_CHECKPOINT_FORMAT.to_owned(),
            ledger: {
                let mut hex = String::new();
                crate::core::hex::push_lower_hex(&mut hex, &self.protected.ledger.0);
                hex
            },
            writer: self.protected.device_key.device().as_str().to_owned(),
            writer_origin: self.protected.origin_id(),
            generation: key.generation(),
            records: base.records(),
            forgets_before_ms: base.forgets_before_ms(),
            heads: base.compaction_heads(),
            roster,
            plain_bytes: std::fs::metadata(path)
                .map_err(|error| io_error("read", path, error))?
                .len(),
            nonce: String::new(),
        };
        drop(file);
        let mut nonce = [0u8; STREAM_NONCE_BYTES];
        getrandom::fill(&mut nonce).map_err(|error| refused(format!("no randomness: {error}")))?;
        std::fs::create_dir_all(&self.copies).map_err(|error| io_error("create", &self.copies, error))?;
        let sealing = self.copies.join(unique(".sealing-"));
        let sealed = (|| -> Result<BlobDigest, String> {
            let mut plain = BufReader::new(std::fs::File::open(path).map_err(|error| error.to_string())?);
            let mut file = std::fs::File::create(&sealing).map_err(|error| error.to_string())?;
            let mut out = std::io::BufWriter::new(&mut file);
            let ledger = self.protected.ledger;
            let digest = seal_checkpoint(
                header,
                nonce,
                key,
                &self.protected.device_key,
                &ledger,
                &mut plain,
                &mut out,
            )?;
            out.flush().map_err(|error| error.to_string())?;
            Ok(digest)
        })();
        let shared = sealed.map_err(refused).and_then(|digest| {
            let named = checkpoint::parse_file_name(name)
                .ok_or_else(|| refused(format!("{name} is not a checkpoint's name")))?;
            let sealed_name = format!(
                "{}{SEALED_EXTENSION}",
                checkpoint::file_name(
                    named.records,
                    &checkpoint::id_hex(&digest),
                    named.forgets_before_ms
                )
                .trim_end_matches(".sqlite")
            );
            self.shared.put(&sealed_name, &sealing)?;
            self.note_opened(&sealed_name, name, self.protected.device_key.device().as_str());
            Ok(())
        });
        let _ = std::fs::remove_file(&sealing);
        shared
    }

    /// Removes the sealed checkpoints `name`'s copy was opened from.
    fn remove(&self, name: &str) -> Result<(), RelayError> {
        for (sealed, copy, _) in self.opened() {
            if copy == name {
                self.shared.delete(&sealed)?;
                let _ = std::fs::remove_file(self.opened_dir().join(&sealed));
            }
        }
        Ok(())
    }
}

/// Why a checkpoint of `writer`, a revoked device, is refused.
fn revoked_writer(writer: &str) -> String {
    format!("its writer {writer:?} was revoked (or admitted only after its admitter's cut)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_name_reads_as_a_checkpoint_name_does() {
        let digest = [0xab; 32];
        let name = format!("checkpoint-12-{}-forgets-99.sealed", checkpoint::id_hex(&digest));
        assert_eq!(parse_sealed_name(&name), Some((12, digest, Some(99))));
        assert_eq!(parse_sealed_name(&name.replace(".sealed", ".sqlite")), None);
    }
}
