//! Sealing with a fresh nonce from the operating system's random source (issue 39): the core
//! seals with a nonce it is given ([`LedgerKey::seal_with_nonce`]), never drawing one itself.

use crate::core::identity::LedgerId;
use crate::core::seal::{LedgerKey, Place, SealError, Sealed};
use crate::oplog::OpRecord;

impl LedgerKey {
    /// Seals `content` at `place` with a fresh random nonce (see
    /// [`seal_with_nonce`](Self::seal_with_nonce)). A record is sealed once: a retry sends the
    /// sealed bytes again, never a second sealing of the same record.
    ///
    /// # Errors
    /// As [`seal_with_nonce`](Self::seal_with_nonce), and [`SealError::Random`] when the
    /// operating system gives no random bytes.
    pub fn seal(&self, place: &Place<'_>, content: &[u8]) -> Result<Sealed, SealError> {
        let mut nonce = [0u8; 24];
        getrandom::fill(&mut nonce).map_err(|error| SealError::Random(error.to_string()))?;
        self.seal_with_nonce(nonce, place, content)
    }
}

impl OpRecord {
    /// This record sealed with `key` for `ledger` under a fresh random nonce (see
    /// [`seal_with_nonce`](Self::seal_with_nonce)).
    ///
    /// # Errors
    /// As [`seal_with_nonce`](Self::seal_with_nonce), and [`SealError::Random`] when the
    /// operating system gives no random bytes.
    pub fn seal(&self, key: &LedgerKey, ledger: LedgerId) -> Result<OpRecord, SealError> {
        let mut nonce = [0u8; 24];
        getrandom::fill(&mut nonce).map_err(|error| SealError::Random(error.to_string()))?;
        self.seal_with_nonce(key, ledger, nonce)
    }
}
