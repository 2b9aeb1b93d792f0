//! Exit statuses (the table of docs/running.md), usage errors, and an error's one line.

/// Ran the command, and it succeeded.
pub const EXIT_RAN_OK: i32 = 0;
/// Ran the command, and it failed (or `ledger verify` found damage).
pub const EXIT_RAN_FAILED: i32 = 1;
/// A malformed command line.
pub const EXIT_USAGE: i32 = 2;
/// Did not run: this occurrence already committed (here or on another host).
pub const EXIT_ALREADY_COMMITTED: i32 = 3;
/// Did not run: another host (or another process of this host) holds the agent's lease.
pub const EXIT_HELD_ELSEWHERE: i32 = 4;
/// Did not run: an earlier attempt of this occurrence started and never recorded an outcome.
pub const EXIT_IN_DOUBT: i32 = 5;
/// The lease was lost (taken, or the coordinator was unreachable too long): before the command
/// started (not run), or while it ran (it was stopped and recorded failed).
pub const EXIT_LEASE_LOST: i32 = 6;
/// Did not run: this host's ledger has not received (within `--wait`) every record that the
/// agent's earlier holders published (rule H3).
pub const EXIT_LEDGER_BEHIND: i32 = 7;
/// An error: unreachable coordinator, unusable or damaged ledger, bad settings.
pub const EXIT_ERROR: i32 = 10;

/// A command line that asks for something fencepost refuses (exit 2), found after parsing.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Returns a usage error (exit 2) from a command.
macro_rules! usage {
    ($($arg:tt)*) => {
        return Err(anyhow::Error::new($crate::exit::UsageError(format!($($arg)*))))
    };
}
pub(crate) use usage;

/// An error and its causes in one line, as `{:#}` writes them, without a cause whose words the
/// line already holds (an error whose message includes its source would say it twice).
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// The exit status of a command that failed: 2 for a usage error, else 10.
pub fn exit_status_of_error(error: &anyhow::Error) -> i32 {
    if error.downcast_ref::<UsageError>().is_some() {
        EXIT_USAGE
    } else {
        EXIT_ERROR
    }
}
