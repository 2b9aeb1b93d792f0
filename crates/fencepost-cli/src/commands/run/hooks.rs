//! What `run` does as its run session goes: the report, the holder file, what it waits for, and
//! the outcome stored before the release.

use super::*;

/// What `run` does as the run session goes ([`RunHooks`]): it reports, records the holder,
/// says what it waits for, and stores the outcome before the release.
pub(super) struct CliHooks<'a, 'r> {
    pub(super) settings: &'a Settings,
    pub(super) args: &'a RunArgs,
    pub(super) report: &'a RefCell<&'r mut RunReport>,
    pub(super) signals: &'a Signals,
    pub(super) span: &'a tracing::Span,
    pub(super) run_id: &'a str,
    pub(super) deadline: Instant,
    /// Names this process as the holder, for `status` and for the refusals of other processes
    /// of this host (exit 4); removed when the run ends.
    pub(super) holding: Option<crate::holder::Holding>,
    pub(super) dispatched: bool,
    pub(super) stored: Option<Result<Stored>>,
    pub(super) release: Option<Release>,
}

/// What the release said, when it was not a plain release.
pub(super) enum Release {
    Failed(String),
    Lost(fencepost::keeper::Loss),
}

impl RunHooks for CliHooks<'_, '_> {
    fn acquiring(&mut self) {
        self.report.borrow_mut().started_acquiring();
    }

    fn stale_grant(&mut self, epoch: fencepost::id::Epoch, why: &StaleGrant) {
        err!(
            "fencepost: warning: the coordinator granted epoch {epoch} of {}, {} (it lost or rolled back its state); acquiring again above it",
            self.args.agent,
            stale_why(why, &self.settings.device)
        );
    }

    fn acquire_ended(&mut self) {
        self.report.borrow_mut().acquired();
    }

    fn granted(&mut self, _keeper: &LeaseKeeper) {
        // A seam for the tests (debug builds only): hold the window just after the grant open,
        // before the ledger is synced and the grant checked, so that a signal, or records
        // another host wrote, can arrive in it.
        #[cfg(debug_assertions)]
        if let Some(pause) = std::env::var("FENCEPOST_TEST_PAUSE_AFTER_ACQUIRE_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
        {
            std::thread::sleep(Duration::from_millis(pause));
        }
    }

    fn holding(&mut self, keeper: &LeaseKeeper) {
        let epoch = keeper.epoch();
        self.span.record("epoch", epoch);
        self.report.borrow_mut().epoch = Some(epoch);
        self.holding = Some(crate::holder::Holding::record(
            self.settings,
            &self.args.agent,
            epoch,
            self.run_id,
        ));
    }

    fn waiting_for_ledger(&mut self, missing: &[MissingRecords]) {
        metrics::counter!(crate::report::LEDGER_WAITS, "agent" => self.args.agent.clone()).increment(1);
        err!(
            "fencepost: waiting for this host's ledger to receive what the previous holder of {} recorded: {}",
            self.args.agent,
            describe_missing(missing)
        );
    }

    fn ledger_wait_ended(&mut self) {
        self.report.borrow_mut().waited_for_ledger();
    }

    fn dispatching(&mut self) {
        self.dispatched = true;
    }

    fn before_release(&mut self, ledger: &mut Ledger, end: SessionEnd) {
        // What the run recorded and could not store yet (its outcome; or, when nothing ran, its
        // `pending` and the `failed` that settles it) is written, or queued on this host, before
        // the release, so that the release publishes it (rule H2), and with the signals still
        // caught: one that comes meanwhile queues it at once (it used to end fencepost and lose
        // the outcome).
        if self.dispatched {
            let wait = match end {
                SessionEnd::Aborted => remaining_ms(self.deadline),
                _ => self.args.outcome_wait,
            };
            self.stored = Some(store_outcome(self.settings, ledger, wait, self.signals));
        }
    }

    fn released(&mut self, shutdown: &Result<Shutdown, KeeperError>) {
        self.release = match shutdown {
            Err(error) => Some(Release::Failed(format!("{error:#}"))),
            Ok(Shutdown::Lost(loss)) => Some(Release::Lost(loss.clone())),
            Ok(_) => None,
        };
    }
}

/// Why a grant was stale, in words.
pub(super) fn stale_why(why: &StaleGrant, device: &str) -> String {
    match why {
        StaleGrant::BelowLedger { fencing_epoch } => format!("below the ledger's epoch {fencing_epoch}"),
        StaleGrant::HeldBy { device_id } => format!("already held by {device_id}"),
        _ => format!("already used by device id {device} (another process sharing it, or an earlier run)"),
    }
}
