//! The snapshot's store needs SQLite: this build has no `sqlite` feature, so a ledger opened with
//! [`LedgerOptions::snapshot`](crate::ledger::LedgerOptions::snapshot) says so in its log and
//! reads the whole ledger, as without one.

use std::path::Path;

use super::{SnapshotBase, SnapshotError};
use crate::fold::RunSummary;
use crate::oplog::HeadMark;

/// No snapshot can be opened in this build: the type has no values.
#[derive(Debug)]
pub(crate) enum Snapshot {}

/// No save can start in this build.
pub(crate) enum Save {}

impl Snapshot {
    pub(crate) fn open(_path: &Path, _device_id: &str) -> Result<Self, SnapshotError> {
        Err(SnapshotError::Other(
            "fencepost was built without the sqlite feature, which snapshots need".to_owned(),
        ))
    }

    pub(crate) fn remove(_path: &Path) {}

    pub(crate) fn path(&self) -> &Path {
        match *self {}
    }

    pub(crate) fn base(&self) -> Result<Option<SnapshotBase>, SnapshotError> {
        match *self {}
    }

    pub(crate) fn run(&self, _agent_id: &str, _run_id: &str) -> Result<Option<RunSummary>, SnapshotError> {
        match *self {}
    }

    pub(crate) fn for_each_run(
        &self,
        _each: impl FnMut(&str, &str, &RunSummary),
    ) -> Result<(), SnapshotError> {
        match *self {}
    }

    pub(crate) fn checkpoint(&self) -> Result<(), SnapshotError> {
        match *self {}
    }

    pub(crate) fn export(&self, _dest: &Path) -> Result<CheckpointFile, SnapshotError> {
        match *self {}
    }

    pub(crate) fn install_checkpoint(
        _path: &Path,
        _device_id: &str,
        _checkpoint: &Path,
        _id: &[u8; 32],
    ) -> Result<(), SnapshotError> {
        Err(SnapshotError::Other(
            "fencepost was built without the sqlite feature, which checkpoints need".to_owned(),
        ))
    }

    pub(crate) fn begin_save(
        &mut self,
        _contains: impl FnOnce(&[HeadMark]) -> bool,
        _runs_hint: usize,
    ) -> Result<Option<Save>, SnapshotError> {
        match *self {}
    }
}

impl Save {
    pub(crate) fn put_run(
        &mut self,
        _agent_id: &str,
        _run_id: &str,
        _summary: &RunSummary,
    ) -> Result<(), SnapshotError> {
        match *self {}
    }

    pub(crate) fn finish(self, _base: &SnapshotBase) -> Result<(), SnapshotError> {
        match self {}
    }
}

/// No checkpoint can be opened in this build: the type has no values.
#[derive(Debug)]
pub(crate) enum CheckpointFile {}

impl CheckpointFile {
    pub(crate) fn open(_path: &Path) -> Result<Self, SnapshotError> {
        Err(SnapshotError::Other(
            "fencepost was built without the sqlite feature, which checkpoints need".to_owned(),
        ))
    }

    pub(crate) fn id(&self) -> [u8; 32] {
        match *self {}
    }

    pub(crate) fn base(&self) -> &SnapshotBase {
        match *self {}
    }

    pub(crate) fn runs(&self) -> u64 {
        match *self {}
    }

    pub(crate) fn check_pages(&self) -> Result<(), SnapshotError> {
        match *self {}
    }

    pub(crate) fn for_each_run(
        &mut self,
        _each: impl FnMut(&str, &str, &RunSummary),
    ) -> Result<(), SnapshotError> {
        match *self {}
    }
}
