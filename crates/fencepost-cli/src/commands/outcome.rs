//! A run's outcome written to the ledger: retried within a bound, else queued on this host (never
//! dropped) for its next command or `fencepost ledger flush`.

use super::*;

/// Where [`store_outcome`] put the records of a run.
pub(super) enum Stored {
    /// In the ledger (or there was nothing to write).
    Written,
    /// On this host, in the outbox, for the next command (the ledger could not be written);
    /// `passes`: whether the cause may pass by itself (else the ledger needs repair first).
    Queued {
        count: usize,
        path: PathBuf,
        cause: String,
        passes: bool,
        /// A signal that came meanwhile (the write was given up for it).
        signal: Option<nix::sys::signal::Signal>,
    },
}

/// Writes the records of the run that are not in the ledger yet (its outcome), trying again
/// for `wait_ms` while the failure may pass by itself, through this ledger and then through
/// the ledger opened again (this one may no longer continue the device's log: another process
/// of this device id appended and a prune removed those records since it read: found by a
/// flaky test, the outcome of a run was lost); then queues them on this host (the outbox). A
/// signal given to fencepost meanwhile stops the tries: the records are queued at once.
pub(super) fn store_outcome(
    settings: &Settings,
    ledger: &mut Ledger,
    wait_ms: u64,
    signals: &Signals,
) -> Result<Stored> {
    if ledger.unsent() == 0 {
        return Ok(Stored::Written);
    }
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let within = |deadline: Instant| deadline.saturating_duration_since(Instant::now());
    let no_signal = || signals.pending().is_none();
    let (mut cause, mut passes) = match ledger.flush_while(within(deadline), no_signal) {
        Ok(_) => return Ok(Stored::Written),
        Err(error) => (error.to_string(), error.is_transient()),
    };
    // A failure that passes (the time is up) or a signal: queued at once. Another (a device
    // file pruned meanwhile) may be cured by reading the ledger again.
    if passes || !no_signal() {
        return queue(ledger, cause, passes, signals.pending());
    }
    err!("fencepost: warning: could not write the outcome ({cause}); trying through the ledger opened again");
    let mut pause = Duration::from_millis(100);
    loop {
        match open_ledger_with(settings, Access::Write, false, true) {
            Ok(mut fresh) => {
                // The records move to `fresh`, and stay in its queue if it cannot write them.
                let written = match ledger.flush_through(&mut fresh) {
                    Err(error) if error.is_transient() => fresh.flush_while(within(deadline), no_signal),
                    other => other,
                };
                return match written {
                    Ok(_) => {
                        tracing::info!("stored the outcome through the ledger opened again");
                        Ok(Stored::Written)
                    }
                    Err(error) => queue(
                        &mut fresh,
                        error.to_string(),
                        error.is_transient(),
                        signals.pending(),
                    ),
                };
            }
            Err(error) if transient(&error) && no_signal() && Instant::now() + pause < deadline => {
                (cause, passes) = (crate::exit::one_line(&error), true);
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(error) => {
                if transient(&error) {
                    (cause, passes) = (crate::exit::one_line(&error), true);
                }
                return queue(ledger, cause, passes, signals.pending());
            }
        }
    }
}

/// Queues the ledger's unwritten records on this host ([`Ledger::queue_unsent`]).
pub(super) fn queue(
    ledger: &mut Ledger,
    cause: String,
    passes: bool,
    signal: Option<nix::sys::signal::Signal>,
) -> Result<Stored> {
    let Some(path) = ledger.outbox_file().map(Path::to_path_buf) else {
        bail!("the ledger could not be written ({cause}), and it has no outbox to queue the records in");
    };
    let count = ledger
        .queue_unsent()
        .with_context(|| format!("the ledger could not be written ({cause})"))?;
    Ok(Stored::Queued {
        count,
        path,
        cause,
        passes,
        signal,
    })
}
