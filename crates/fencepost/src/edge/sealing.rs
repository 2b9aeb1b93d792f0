//! Sealing with a fresh nonce from the operating system's random source (issue 39): the core
//! seals with a nonce it is given ([`LedgerKey::seal_with_nonce`]), never drawing one itself.

use crate::core::identity::LedgerId;
use crate::core::seal::{LedgerKey, Place, SealError, Sealed};
use crate::oplog::OpRecord;
use crate::wrap::WrapError;

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

    /// [`seal`](Self::seal), an intent of one size (see
    /// [`seal_named_with_nonce`](Self::seal_named_with_nonce)): what a ledger writes.
    ///
    /// # Errors
    /// As [`seal`](Self::seal).
    pub fn seal_named(&self, key: &LedgerKey, ledger: LedgerId) -> Result<OpRecord, SealError> {
        let mut nonce = [0u8; 24];
        getrandom::fill(&mut nonce).map_err(|error| SealError::Random(error.to_string()))?;
        self.seal_named_with_nonce(key, ledger, nonce)
    }
}

/// `key` wrapped for `recipient` in `ledger` at `generation` (see
/// [`wrap_with_seed`](crate::wrap::wrap_with_seed)), with an ephemeral key drawn from the
/// operating system.
///
/// # Errors
/// As [`wrap_with_seed`](crate::wrap::wrap_with_seed), and [`WrapError::Random`] when the
/// operating system gives no random bytes.
pub fn wrap(
    key: &[u8; 32],
    ledger: &LedgerId,
    generation: u32,
    recipient: &crate::id::DeviceId,
    public: &crate::identity::PublicIdentity,
) -> Result<crate::wrap::Wrapped, WrapError> {
    let mut seed = zeroize::Zeroizing::new([0u8; 32]);
    getrandom::fill(&mut *seed).map_err(|error| WrapError::Random(error.to_string()))?;
    crate::wrap::wrap_with_seed(key, ledger, generation, recipient, public, *seed)
}
