//! What fencepost writes for a person: lines on stdout and stderr that never panic (a closed
//! pipe) and never block for long (a pipe nobody reads), or log events under `--log-format json`.

/// `println!` that never panics: a closed standard output (`fencepost ledger runs | head`) must not
/// turn a recorded outcome into a panic and exit 101.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that never panics (a closed standard error) and never blocks for long (a pipe
/// that nobody reads): see [`write_stderr`].
macro_rules! err {
    ($($arg:tt)*) => {{
        $crate::output::write_stderr(format!($($arg)*));
    }};
}

/// `print!` that never panics.
macro_rules! out_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

/// The target of the messages of [`err!`] as log events (`--log-format json`).
pub const MESSAGE_TARGET: &str = "fencepost::message";

/// Whether messages are written as JSON log events.
pub(crate) static JSON_MESSAGES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a line to stderr did not get through in time: later ones are not tried.
static STDERR_STUCK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes one line to stderr from a helper thread, waiting at most two seconds for it: a full
/// pipe that nobody reads must not keep fencepost from exiting with its status (the outcome is
/// recorded and the lease released before the last lines are written). After a line that did not
/// get through, later ones are dropped.
pub fn write_stderr(line: String) {
    use std::sync::atomic::Ordering;
    if JSON_MESSAGES.load(Ordering::SeqCst) {
        // A log event: the subscriber's writer never blocks (it drops what does not fit).
        // Messages say what did not go as asked (not run, failed, damaged): WARN, unless they
        // are the ordinary outcomes of a job on several hosts (INFO), or the command's error.
        let text = line.strip_prefix("fencepost: ").unwrap_or(&line);
        const ORDINARY: [&str; 2] = [
            "already committed; not running it again",
            "waiting for this host's ledger",
        ];
        if let Some(error) = text.strip_prefix("error: ") {
            tracing::error!(target: MESSAGE_TARGET, "{error}");
        } else if ORDINARY.iter().any(|ordinary| text.contains(ordinary)) {
            tracing::info!(target: MESSAGE_TARGET, "{text}");
        } else {
            let text = text.strip_prefix("warning: ").unwrap_or(text);
            tracing::warn!(target: MESSAGE_TARGET, "{text}");
        }
        return;
    }
    if STDERR_STUCK.load(Ordering::SeqCst) {
        return;
    }
    let (done, wait) = std::sync::mpsc::channel();
    let writer = std::thread::Builder::new().spawn(move || {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "{line}");
        let _ = done.send(());
    });
    if writer.is_err() || wait.recv_timeout(std::time::Duration::from_secs(2)).is_err() {
        STDERR_STUCK.store(true, Ordering::SeqCst);
    }
}
