//! The command `fencepost run` starts, and how it is stopped.
//!
//! The command runs in a process group of its own, so that a stop reaches everything it started.
//! It is stopped (SIGTERM to the group, SIGKILL after `--kill-after`) when the lease is lost, when
//! `--timeout` passes, and when `fencepost` itself gets SIGTERM, SIGINT or SIGHUP (forwarded as
//! the same signal). What the command leaves running in its group when it exits is stopped the
//! same way. If `fencepost` dies without a chance to do any of this (SIGKILL), the kernel kills the
//! command (`PR_SET_PDEATHSIG` on Linux), and a [`Watchdog`] process kills the rest of its group.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// How often the supervisor looks at the command, the lease and the signals.
const POLL: Duration = Duration::from_millis(10);
/// The first pause of [`supervise`] (doubled after each, up to [`POLL`]).
const FIRST_POLL: Duration = Duration::from_micros(500);

/// Signals that `fencepost run` forwards to its command instead of dying of them.
const FORWARDED: [i32; 3] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGHUP,
];

/// The last forwarded signal `fencepost` received (0: none), set by the signal handlers.
pub struct Signals {
    received: Arc<AtomicUsize>,
    released: Arc<AtomicBool>,
}

impl Signals {
    /// Catches SIGTERM, SIGINT and SIGHUP from now on (they no longer end `fencepost` at once),
    /// until [`release`](Self::release).
    pub fn catch() -> std::io::Result<Self> {
        let received = Arc::new(AtomicUsize::new(0));
        let released = Arc::new(AtomicBool::new(false));
        for signal in FORWARDED {
            // Once released, the signal ends fencepost as it would have without us.
            signal_hook::flag::register_conditional_default(signal, Arc::clone(&released))?;
            // The handler records which signal came; the supervisor forwards it.
            signal_hook::flag::register_usize(signal, Arc::clone(&received), signal as usize)?;
        }
        Ok(Self { received, released })
    }

    /// The command is over: these signals end fencepost again (its outcome is recorded, or about
    /// to be; a signal now is the operator's wish to stop waiting, for example on a stuck stderr).
    pub fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    /// A test of whether one of these signals came (and was not taken), for a wait elsewhere
    /// that should end when one comes (the acquisition of the lease).
    pub fn came(&self) -> impl Fn() -> bool + Send + 'static {
        let received = Arc::clone(&self.received);
        move || received.load(Ordering::SeqCst) != 0
    }

    /// The signal received, if any (and forgets it).
    fn take(&self) -> Option<Signal> {
        match self.received.swap(0, Ordering::SeqCst) {
            0 => None,
            number => Signal::try_from(number as i32).ok(),
        }
    }

    /// The signal that came and has not been taken, if any (it stays pending).
    pub fn pending(&self) -> Option<Signal> {
        match self.received.load(Ordering::SeqCst) {
            0 => None,
            number => Signal::try_from(number as i32).ok(),
        }
    }
}

/// Why the command ended.
#[derive(Debug)]
pub enum Ending {
    /// It exited by itself (or of a signal not sent by fencepost).
    Exited(ExitStatus),
    /// It was stopped because the lease was lost.
    LeaseLost(ExitStatus),
    /// It was stopped because `--timeout` passed.
    TimedOut(ExitStatus),
    /// `fencepost` got this signal and forwarded it; then the command ended.
    Interrupted(Signal, ExitStatus),
}

/// How to supervise the command.
pub struct Supervision<'a> {
    /// Whether the lease is still held (polled).
    pub holds: &'a dyn Fn() -> bool,
    /// Stop the command after this long.
    pub timeout: Option<Duration>,
    /// After SIGTERM, SIGKILL after this long.
    pub kill_after: Duration,
    /// The signals fencepost caught.
    pub signals: &'a Signals,
}

/// Starts `command` in a process group of its own, to be killed when fencepost dies.
pub fn spawn(mut command: Command) -> std::io::Result<std::process::Child> {
    let parent = std::process::id();
    // What the command leaves behind when it exits becomes fencepost's child, not init's: fencepost
    // can then reap it (see `stop_leftovers`) whatever init does.
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_child_subreaper(true)?;
    command.process_group(0);
    // SAFETY: between fork and exec the closure calls only async-signal-safe functions (prctl,
    // getppid, kill through nix's thin wrappers) and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            #[cfg(target_os = "linux")]
            {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // fencepost may have died before the line above: then nobody would kill us.
                if nix::unistd::getppid().as_raw() as u32 != parent {
                    return Err(std::io::Error::other(
                        "fencepost exited before the command started",
                    ));
                }
            }
            #[cfg(not(target_os = "linux"))]
            let _ = parent;
            Ok(())
        });
    }
    command.spawn()
}

/// The hidden subcommand that runs a [`Watchdog`].
pub const WATCHDOG_COMMAND: &str = "__watchdog";

/// A process that kills the command's process group if `fencepost` dies before it could (reads
/// its standard input, a pipe from fencepost: end of input without `done` means fencepost died).
pub struct Watchdog {
    input: Option<ChildStdin>,
    process: Child,
    /// Told `done`: it exits by itself, and nobody waits for it.
    disarmed: bool,
}

impl Watchdog {
    /// Starts a watchdog of process group `group`.
    pub fn start(group: u32) -> std::io::Result<Self> {
        // /proc/self/exe runs this very binary, even if it was replaced on disk meanwhile.
        let program = if cfg!(target_os = "linux") {
            std::path::PathBuf::from("/proc/self/exe")
        } else {
            std::env::current_exe()?
        };
        let mut process = Command::new(program)
            .args([WATCHDOG_COMMAND, &group.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()?;
        let input = process.stdin.take();
        Ok(Self {
            input,
            process,
            disarmed: false,
        })
    }

    /// The command's group is done with: the watchdog exits without killing anything. It is
    /// not waited for: it reads `done` from the pipe whenever it gets to it, even after
    /// fencepost has exited (waiting cost every run the start of a process, ~10 ms on a slow
    /// machine: the watchdog of a short command is often still starting).
    pub fn disarm(mut self) {
        if let Some(mut input) = self.input.take() {
            if input.write_all(b"done\n").is_ok() {
                self.disarmed = true;
            }
        }
        let _ = self.process.try_wait();
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Without `disarm`, closing its input makes the watchdog kill the group.
        drop(self.input.take());
        if !self.disarmed {
            let _ = self.process.wait();
        }
    }
}

/// The watchdog's own work (`fencepost __watchdog GROUP`): waits for the end of its input, then
/// kills `group` with SIGKILL unless told `done`.
pub fn watchdog(group: i32) -> i32 {
    let mut said = Vec::new();
    let _ = std::io::stdin().take(64).read_to_end(&mut said);
    if !said.starts_with(b"done") && group > 1 {
        let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
    }
    0
}

/// Stops what is left in `group` once its leader has exited: SIGTERM, then SIGKILL after
/// `kill_after` if anything is still there.
pub fn stop_leftovers(group: u32, kill_after: Duration) {
    let group = Pid::from_raw(group as i32);
    // The group's orphans are fencepost's children (see `spawn`): reap those that exited, so
    // that a zombie does not count as left over.
    let reap = || {
        while let Ok(status) = waitpid(Pid::from_raw(-group.as_raw()), Some(WaitPidFlag::WNOHANG)) {
            if status == WaitStatus::StillAlive {
                break;
            }
        }
    };
    reap();
    if killpg(group, None).is_err() {
        return; // nothing left
    }
    let _ = killpg(group, Signal::SIGTERM);
    tracing::info!("stopping what the command left running in its process group");
    let give_up = Instant::now() + kill_after;
    while Instant::now() < give_up {
        reap();
        if killpg(group, None).is_err() {
            return;
        }
        std::thread::sleep(POLL);
    }
    let _ = killpg(group, Signal::SIGKILL);
    reap();
}

/// Waits for the command, stopping it as the module docs say.
pub fn supervise(child: &mut std::process::Child, supervision: &Supervision<'_>) -> std::io::Result<Ending> {
    let group = Pid::from_raw(child.id() as i32);
    let started = Instant::now();
    // Why fencepost stopped the command, and when it sent SIGKILL or will.
    let mut stopping: Option<(Reason, Instant)> = None;
    let mut killed = false;
    // Short pauses first, so that a command that ends at once is not kept waiting for a whole
    // POLL; then every POLL.
    let mut pause = FIRST_POLL;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(match stopping {
                None => Ending::Exited(status),
                Some((reason, _)) => {
                    // Whatever the command left in its group goes too: its lease or time is over.
                    let _ = killpg(group, Signal::SIGKILL);
                    match reason {
                        Reason::LeaseLost => Ending::LeaseLost(status),
                        Reason::TimedOut => Ending::TimedOut(status),
                        Reason::Signal(signal) => Ending::Interrupted(signal, status),
                    }
                }
            });
        }
        let now = Instant::now();
        if let Some(signal) = supervision.signals.take() {
            let _ = killpg(group, signal);
            tracing::info!(%signal, "forwarded a signal to the command");
            if stopping.is_none() {
                stopping = Some((Reason::Signal(signal), now + supervision.kill_after));
            }
        }
        if stopping.is_none() {
            let reason = if !(supervision.holds)() {
                Some(Reason::LeaseLost)
            } else if supervision
                .timeout
                .is_some_and(|timeout| now.duration_since(started) >= timeout)
            {
                Some(Reason::TimedOut)
            } else {
                None
            };
            if let Some(reason) = reason {
                let _ = killpg(group, Signal::SIGTERM);
                tracing::warn!(
                    ?reason,
                    "stopping the command (sent SIGTERM to its process group)"
                );
                stopping = Some((reason, now + supervision.kill_after));
            }
        }
        if let Some((_, kill_at)) = stopping {
            if !killed && now >= kill_at {
                let _ = killpg(group, Signal::SIGKILL);
                tracing::warn!("the command outlived --kill-after: sent SIGKILL to its process group");
                killed = true;
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(POLL);
    }
}

#[derive(Debug, Clone, Copy)]
enum Reason {
    LeaseLost,
    TimedOut,
    Signal(Signal),
}
