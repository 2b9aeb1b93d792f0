//! The command, run as the effect of the run session: started with the fencing token in its
//! environment, supervised, and how it ended.

use super::*;

/// The command, run as the effect of the session: supervised, and how it ended.
#[derive(Default)]
pub(super) struct CommandRun {
    pub(super) ending: Option<Ending>,
    /// A signal that came before the command started (it did not run).
    pub(super) stopped_before_start: Option<nix::sys::signal::Signal>,
    /// The lease was lost before the command started (it did not run).
    pub(super) lost_before_start: bool,
}

impl CommandRun {
    /// Starts the command with the run's token in its environment and supervises it.
    pub(super) fn run(
        &mut self,
        settings: &Settings,
        args: &RunArgs,
        signals: &Signals,
        report: &RefCell<&mut RunReport>,
        context: &EffectContext<'_>,
    ) -> EffectOutcome<(), String> {
        // Should fencepost die, the watchdog kills what the command started. It starts before the
        // command, whose process tells it its group before it runs the program, and before the
        // last looks below, so that nothing but the start follows them (a fork and its reads of
        // /proc are no part of that window).
        let watchdog = match Watchdog::start() {
            Ok(watchdog) => Some(watchdog),
            Err(error) => {
                tracing::warn!(%error, "cannot start the watchdog of the command's process group");
                None
            }
        };
        // The command did not start: the watchdog has nothing to kill.
        let stand_down = |watchdog: Option<Watchdog>| {
            if let Some(watchdog) = watchdog {
                watchdog.disarm();
            }
        };
        // A seam for the tests (debug builds only): hold the window between the fence and the
        // start open, so that a signal can be sent into it.
        #[cfg(debug_assertions)]
        if let Some(pause) = std::env::var("FENCEPOST_TEST_PAUSE_BEFORE_COMMAND_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
        {
            std::thread::sleep(Duration::from_millis(pause));
        }
        if let Some(signal) = signals.pending() {
            self.stopped_before_start = Some(signal);
            stand_down(watchdog);
            return EffectOutcome::Failed(format!("fencepost got {signal} before the command started"));
        }
        // The last look before the start, with no I/O: fencepost may have been stopped (SIGSTOP,
        // a suspended machine) since the fence, past its renew deadline.
        if !context.holds() {
            self.lost_before_start = true;
            stand_down(watchdog);
            return EffectOutcome::Failed("the lease was lost before the command started".to_owned());
        }
        let token = context.token();
        let mut command = Command::new(&args.command[0]);
        command
            .args(&args.command[1..])
            .env("FENCEPOST_AGENT", &token.agent_id)
            .env("FENCEPOST_RUN_ID", &token.run_id)
            .env("FENCEPOST_EPOCH", token.epoch.to_string())
            .env("FENCEPOST_DEVICE", &settings.device);
        report.borrow_mut().command_started();
        let mut child = match child::spawn(command, watchdog.as_ref()) {
            Ok(child) => child,
            Err(error) => {
                stand_down(watchdog);
                return EffectOutcome::Failed(format!("cannot start {:?}: {error}", args.command[0]));
            }
        };
        let holds = || context.holds();
        let supervision = Supervision {
            holds: &holds,
            timeout: args.timeout.map(Duration::from_millis),
            kill_after: Duration::from_millis(args.kill_after),
            signals,
        };
        let end = child::supervise(&mut child, &supervision);
        report.borrow_mut().command_ended();
        let end = match end {
            Ok(end) => end,
            Err(error) => return EffectOutcome::Unknown(format!("cannot wait for the command: {error}")),
        };
        child::stop_leftovers(child.id(), Duration::from_millis(args.kill_after));
        if let Some(watchdog) = watchdog {
            watchdog.disarm();
        }
        let outcome = effect_of(&end, args.timeout);
        self.ending = Some(end);
        outcome
    }
}

/// A command that exits by itself reports its outcome; one that fencepost had to stop may have
/// done part of its effect, or all of it: the run stays in doubt unless it exits 0.
pub(super) fn effect_of(end: &Ending, timeout: Option<u64>) -> EffectOutcome<(), String> {
    match end {
        Ending::Exited(status) if status.success() => EffectOutcome::Succeeded(()),
        // Killed by a signal fencepost did not send (an operator, the OOM killer): it did not
        // finish, and it may have done part of its effect.
        Ending::Exited(status) if status.code().is_none() => {
            EffectOutcome::Unknown(format!("the command was killed ({status})"))
        }
        Ending::Exited(status) => EffectOutcome::Failed(format!("the command exited with {status}")),
        Ending::LeaseLost(status) | Ending::TimedOut(status) | Ending::Interrupted(_, status)
            if status.success() =>
        {
            EffectOutcome::Succeeded(())
        }
        Ending::LeaseLost(status) => EffectOutcome::Unknown(format!(
            "the lease was lost while the command ran, so it was stopped ({status})"
        )),
        Ending::TimedOut(status) => EffectOutcome::Unknown(format!(
            "the command timed out after {} ms and was stopped ({status})",
            timeout.unwrap_or_default()
        )),
        Ending::Interrupted(signal, status) => EffectOutcome::Unknown(format!(
            "fencepost got {signal} and forwarded it to the command, which ended with {status}"
        )),
    }
}
