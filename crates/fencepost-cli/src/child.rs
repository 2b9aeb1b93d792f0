//! The command `fencepost run` starts, and how it is stopped.
//!
//! The command runs in a process group of its own, so that a stop reaches everything it started.
//! It is stopped (SIGTERM to the group, SIGKILL after `--kill-after`) when the lease is lost, when
//! `--timeout` passes, and when `fencepost` itself gets SIGTERM, SIGINT or SIGHUP (forwarded as
//! the same signal). What the command leaves running in its group when it exits is stopped the
//! same way. If `fencepost` dies without a chance to do any of this (SIGKILL), the kernel kills the
//! command (`PR_SET_PDEATHSIG` on Linux), and a [`Watchdog`] process kills the rest of its group.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus};
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

/// Starts `command` in a process group of its own, to be killed when fencepost dies. The
/// `watchdog`, started before, is told the group by the command's own process before it runs the
/// program: from the command's first instruction on, the watchdog knows what to kill.
pub fn spawn(mut command: Command, watchdog: Option<&Watchdog>) -> std::io::Result<std::process::Child> {
    let parent = std::process::id();
    let announce = watchdog.and_then(Watchdog::announce_descriptor);
    // What the command leaves behind when it exits becomes fencepost's child, not init's: fencepost
    // can then reap it (see `stop_leftovers`) whatever init does.
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_child_subreaper(true)?;
    command.process_group(0);
    // SAFETY: between fork and exec the closure calls only async-signal-safe functions (prctl,
    // getppid, getpid, signal, write) and allocates nothing.
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
            if let Some(descriptor) = announce {
                announce_group(descriptor);
            }
            Ok(())
        });
    }
    command.spawn()
}

/// Room for a pid and a newline.
const ANNOUNCE_BYTES: usize = 24;

/// In the command's process, before it runs the program: writes its process group (its pid, see
/// [`spawn`]) and a newline to the watchdog's pipe. Async-signal-safe; no allocation.
fn announce_group(descriptor: std::os::fd::RawFd) {
    use nix::libc;
    // Formatting into a slice of the stack neither allocates nor locks.
    let mut text = [0u8; ANNOUNCE_BYTES];
    let mut rest = &mut text[..];
    if writeln!(rest, "{}", std::process::id()).is_err() {
        return;
    }
    let length = ANNOUNCE_BYTES - rest.len();
    // SAFETY: signal and write are async-signal-safe; the buffer outlives the write.
    unsafe {
        // A watchdog that is gone gets nothing, and its broken pipe must not kill the command
        // before it starts (SIGPIPE is back to its default action here).
        let previous = libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        libc::write(descriptor, text.as_ptr().cast(), length);
        libc::signal(libc::SIGPIPE, previous);
    }
}

/// The name of the watchdog process (`ps`, `top`, and its command line).
pub const WATCHDOG_NAME: &std::ffi::CStr = c"fp-watchdog";

/// A process that kills the command's process group if `fencepost` dies before it could. It is
/// a fork of fencepost that runs no program (it used to run `fencepost __watchdog`: starting that
/// program again cost every run a few milliseconds of a slow machine), started before the command,
/// whose process tells it its group (see [`spawn`]). It reads a pipe from fencepost: the end of its
/// input without `done` means fencepost died. It is named [`WATCHDOG_NAME`], and its command line
/// says so too, so that `pkill -f 'fencepost run'` (which kills fencepost) does not kill it with
/// fencepost.
pub struct Watchdog {
    input: Option<std::fs::File>,
    process: Pid,
    /// Told `done`: it exits by itself, and nobody waits for it.
    disarmed: bool,
}

impl Watchdog {
    /// Starts a watchdog, before the command.
    pub fn start() -> std::io::Result<Self> {
        let title = command_line_area();
        // Both ends close on exec: the command's process writes its group into the pipe before
        // it runs the program, and no program holds the pipe open after.
        let (output, input) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        // SAFETY: the child runs `watch` only, which calls async-signal-safe functions and
        // allocates nothing (fencepost has other threads, whose locks the child must not need),
        // and never returns.
        match unsafe { nix::unistd::fork() }? {
            nix::unistd::ForkResult::Child => watch(output.as_raw_fd(), title),
            nix::unistd::ForkResult::Parent { child } => Ok(Self {
                input: Some(std::fs::File::from(input)),
                process: child,
                disarmed: false,
            }),
        }
    }

    /// The descriptor the command's process tells the watchdog its group through.
    fn announce_descriptor(&self) -> Option<std::os::fd::RawFd> {
        self.input.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// The command's group is done with (or the command never started): the watchdog exits
    /// without killing anything. It is not waited for: it reads `done` from the pipe whenever it
    /// gets to it, even after fencepost has exited.
    pub fn disarm(mut self) {
        if let Some(mut input) = self.input.take() {
            if input.write_all(b"done\n").is_ok() {
                self.disarmed = true;
            }
        }
        let _ = waitpid(self.process, Some(WaitPidFlag::WNOHANG));
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Without `disarm`, closing its input makes the watchdog kill the group.
        drop(self.input.take());
        if !self.disarmed {
            let _ = waitpid(self.process, None);
        }
    }
}

/// Where this process's command line is in its memory (the bytes `/proc/self/cmdline` shows), when
/// that can be told for sure: the watchdog writes its own name there.
fn command_line_area() -> Option<(usize, usize)> {
    #[cfg(target_os = "linux")]
    {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // After "pid (name) ", the fields from the third on; arg_start and arg_end are the 48th
        // and 49th (proc(5)).
        let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
        let start: usize = fields.get(45)?.parse().ok()?;
        let end: usize = fields.get(46)?.parse().ok()?;
        let shown = std::fs::read("/proc/self/cmdline").ok()?;
        if end <= start || end - start != shown.len() {
            return None;
        }
        // SAFETY: the kernel says this process's command line is there, in its memory, and it
        // is read only to be compared with what the kernel shows of it.
        let held = unsafe { std::slice::from_raw_parts(start as *const u8, end - start) };
        (held == shown.as_slice()).then_some((start, end))
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// The watchdog's own work, in the forked child: reads `input` to its end, and kills the group
/// the command's process wrote into it unless fencepost wrote `done` after it; then exits. Only
/// async-signal-safe calls, no allocation.
fn watch(input: std::os::fd::RawFd, title: Option<(usize, usize)>) -> ! {
    use nix::libc;
    // SAFETY: async-signal-safe system calls on this process's own descriptors and signals, and
    // writes into this process's (copied) command line, checked by `command_line_area`.
    unsafe {
        // Its input on 0, and nothing else open: the copies of fencepost's descriptors (its
        // output, a pipe a reader waits on, files and their locks) must not outlive fencepost.
        if libc::dup2(input, 0) == 0 {
            #[cfg(target_os = "linux")]
            let closed = libc::syscall(libc::SYS_close_range, 1u32, u32::MAX, 0u32) == 0;
            #[cfg(not(target_os = "linux"))]
            let closed = false;
            if !closed {
                let mut limit = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                let top = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                    limit.rlim_cur.min(65_536) as i32
                } else {
                    1_024
                };
                for descriptor in 1..top {
                    libc::close(descriptor);
                }
            }
        }
        // Signals as a new program has them: fencepost's handlers are not this process's.
        for signal in FORWARDED {
            libc::signal(signal, libc::SIG_DFL);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // Its own process group: a signal to fencepost's group (a terminal's Ctrl-C) does not end it.
        libc::setpgid(0, 0);
        // Named apart from fencepost, in `ps`, `top` and `pgrep -f`.
        #[cfg(target_os = "linux")]
        libc::prctl(libc::PR_SET_NAME, WATCHDOG_NAME.as_ptr());
        if let Some((start, end)) = title {
            let area = std::slice::from_raw_parts_mut(start as *mut u8, end - start);
            area.fill(0);
            let name = WATCHDOG_NAME.to_bytes();
            let length = name.len().min(area.len().saturating_sub(1));
            area[..length].copy_from_slice(&name[..length]);
        }
    }
    // "<group>\n" from the command's process, then "done\n" from fencepost.
    let mut said = [0u8; 64];
    let mut filled = 0;
    while filled < said.len() {
        let rest = &mut said[filled..];
        // SAFETY: reads into the buffer's free part, of its length.
        let count = unsafe { libc::read(0, rest.as_mut_ptr().cast(), rest.len()) };
        match count {
            0 => break,
            1.. => filled += count as usize,
            _ if nix::errno::Errno::last() == nix::errno::Errno::EINTR => {}
            _ => break,
        }
    }
    let said = &said[..filled];
    let line = said
        .iter()
        .position(|&byte| byte == b'\n')
        .map(|end| (&said[..end], &said[end + 1..]));
    if let Some((group, rest)) = line {
        // Parsing in place allocates nothing.
        let group = std::str::from_utf8(group)
            .ok()
            .and_then(|text| text.parse::<i32>().ok());
        if let Some(group) = group.filter(|group| *group > 1) {
            if !rest.starts_with(b"done") {
                let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
            }
        }
    }
    // SAFETY: ends this process without running fencepost's exit handlers (they are the parent's).
    unsafe { libc::_exit(0) }
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
