//! The `fencepost` command: run a command once across hosts, manage leases, inspect the ledger.

#[macro_use]
mod output;

mod child;
mod commands;
mod config;
mod coordinator;
mod exit;
mod holder;
mod membership;
mod report;
mod settings;
mod status;

use clap::{Parser, Subcommand};

use crate::exit::{exit_status_of_error, one_line, UsageError};
use crate::output::{JSON_MESSAGES, MESSAGE_TARGET};
use crate::settings::{Global, Settings};

/// Run each side effect once across hosts: execution leases with fencing tokens, a convergent
/// intent ledger and a dispatch fence.
///
/// The same job on several hosts (a cron line on three machines, an agent on a laptop, a phone and
/// a server) must act once per occurrence. fencepost gives each occurrence a deterministic run id,
/// records intents in a hash-chained ledger that every host folds the same way, and checks, right
/// before acting, that the run has not committed elsewhere and that this host still holds the
/// agent's lease at its epoch.
///
/// Where state lives: --coordinator (leases; sqlite:PATH on one host, a postgres:// URL for
/// many), --ledger (with a PostgreSQL coordinator, its database by default; else a folder every
/// host shares, e.g. a synced folder) and --device (this host).
/// Each can also come from FENCEPOST_COORDINATOR, FENCEPOST_LEDGER, FENCEPOST_DEVICE or a config
/// file; the defaults live in the user's data directory.
#[derive(Debug, Parser)]
#[command(name = "fencepost", version, about, long_about)]
struct Cli {
    /// Where state lives, given before the subcommand (the same options after it win).
    #[command(flatten)]
    before: Global,
    /// More log output on stderr (`-v` info, `-vv` debug); `RUST_LOG` works too.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// How log lines and messages on stderr are written: `text`, or `json` (one JSON object a
    /// line, for log shippers). Colour only on a terminal, and never with NO_COLOR set.
    #[arg(
        long,
        global = true,
        env = "FENCEPOST_LOG_FORMAT",
        value_enum,
        default_value = "text",
        value_name = "FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// The options of [`Global`] before the subcommand are that command's only: a subcommand that
/// has no use for them (`simulate`) neither shows nor takes them.
const LOCATION_OPTIONS: [&str; 4] = ["coordinator", "ledger", "device", "config"];

/// How stderr is written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Lines for people.
    Text,
    /// One JSON object a line (tracing-subscriber's JSON layout), messages included.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command once per occurrence across every host that runs the same line.
    #[command(
        long_about = "Run a command once per occurrence across every host that runs the same line.\n\n\
The occurrence is named by --agent, --intent and --salt (for example the date of a daily job): \
every host computes the same run id. fencepost takes the agent's lease, reads the ledger, and runs \
the command only if no host has committed this run and this host holds the lease. The command \
sees FENCEPOST_AGENT, FENCEPOST_RUN_ID, FENCEPOST_EPOCH (the fencing token: pass it to services \
that can reject stale writers) and FENCEPOST_DEVICE. Its exit status is recorded as committed \
(0) or failed (anything else); then the lease is released.\n\n\
The command runs in a process group of its own. It is stopped (SIGTERM to the group, SIGKILL \
--kill-after later) when the lease is lost while it runs (exit 6) or when --timeout passes (exit \
1). SIGTERM, SIGINT and SIGHUP to fencepost are forwarded to the group (exit 1 unless the command \
then exits 0). A command that fencepost stopped may have done its effect, or part of it: unless it \
exits 0, no outcome is recorded and the run is in doubt (see exit 5); so is a command killed by \
a signal that fencepost did not send. If fencepost itself is killed (SIGKILL), the kernel kills \
the command, and the run is in doubt as well. Then the lease is released.",
        after_help = "Exit status:\n  \
0   ran, and the command succeeded\n  \
1   ran, and the command failed; or it was stopped by --timeout or a forwarded signal (then the \
run is in doubt)\n  \
2   usage error (a bad flag or value: an empty --salt, a --ttl below 1s, an invalid id, a \
coordinator spec every process would have privately)\n  \
3   not run: this occurrence already committed (here or on another host)\n  \
4   not run: another host, or another process of this host, holds the agent's lease (the \
holder is named, a process of this host by its pid; see --wait); also when --wait ran out after \
a refusal and the last attempt then failed\n  \
5   not run: in doubt, an earlier attempt started and never recorded an outcome (its host \
may have died mid-command), or another process with the same device id started it just before; \
check whether the effect happened, then rerun with --retry-in-doubt, \
or record it with `fencepost ledger resolve`\n  \
6   the lease was lost: before the command could start (not run), or while it ran (it was \
stopped, and the run is in doubt)\n  \
7   not run: this host's ledger has not yet received what the previous holder recorded (the \
devices and records missing are named); fencepost waits for it within --wait, holding the lease. \
Every holder publishes, with its lease, how far it wrote its ledger before each command and after \
it; a new holder runs nothing until its ledger has caught up, so a ledger that lags (a synced \
folder still copying, a host whose FENCEPOST_LEDGER is not shared) makes a wait, never a second \
run\n  \
10  error (a coordinator or ledger database that no attempt reached, an unusable or damaged \
ledger, an outcome that could not be written)\n\n\
Example, the same line in the crontab of three hosts whose FENCEPOST_COORDINATOR is one \
PostgreSQL URL (leases and ledger in one database):\n  \
0 9 * * * fencepost run --agent reports --intent 'daily report' --salt \"$(date +\\%F)\" --wait 2m -- ./send-report.sh"
    )]
    Run(commands::RunArgs),
    /// Who holds what, what runs, what is in doubt, and whether the ledger is healthy.
    #[command(
        long_about = "Who holds what, what runs, what is in doubt, and whether the ledger is healthy.\n\n\
Per agent: its lease (holder, epoch, time left; a holder on this host is named with its \
process), its runs running and in doubt, and the most recently committed ones. Then the \
ledger's health: damaged devices, and devices whose records the agents' holders published but \
this host's ledger has not received yet. Also where this host keeps its state (the data \
directory), the coordinator, the ledger and the device id in use. Exit 0 when the ledger is \
healthy, 1 when it is damaged or behind, 10 when the coordinator or the ledger cannot be read."
    )]
    Status(status::StatusArgs),
    /// Inspect and operate leases directly (acquire, renew, release, current, list).
    Lease {
        #[command(flatten)]
        global: Global,
        #[command(subcommand)]
        command: commands::LeaseCommand,
    },
    /// Inspect the ledger: agents, runs, in-doubt runs, damaged devices.
    Ledger {
        #[command(flatten)]
        global: Global,
        #[command(subcommand)]
        command: commands::LedgerCommand,
    },
    /// This device's identity: `device key` prints its public key.
    Device {
        #[command(flatten)]
        global: Global,
        #[command(subcommand)]
        command: commands::DeviceCommand,
    },
    /// Administration: create or upgrade the coordinator's schema.
    Admin {
        #[command(flatten)]
        global: Global,
        #[command(subcommand)]
        command: commands::AdminCommand,
    },
    /// Run the protocol through a deterministic chaos simulation and count what each layer prevents.
    #[command(
        long_about = "Run the protocol through a deterministic chaos simulation and count what each layer prevents.\n\n\
Sites fire the scheduled occurrences of a few agents while they pause past their TTL (also between \
the fence and the effect), crash and restart, drift apart in clock, lose and delay relay records, \
are partitioned, and the coordinator loses its state once. The same seed and fault schedule runs \
under four guard modes: none (every site fires), lease (the lease holder fires), fence (lease, a \
pending intent and the dispatch fence) and token (fence, and a resource that refuses stale \
fencing tokens and repeated run ids). The table counts effects, duplicates (with their cause), \
occurrences never run, runs in doubt, refusals at the fence and at the resource, and whether every \
site's ledger converged. The same seed prints the same output, byte for byte."
    )]
    Simulate(commands::SimulateArgs),
}

/// Logs to stderr through a background thread, so that a full or closed stderr (a pipe nobody
/// reads) never blocks or panics the process: a stop of the command, a lease loss, a timeout must
/// not wait for a log line. Lines that do not fit are dropped. The guard flushes at exit.
/// Colour only when stderr is a terminal and NO_COLOR is unset or empty. In JSON, the messages
/// of [`err!`] are events too ([`MESSAGE_TARGET`]), shown at every verbosity.
fn init_tracing(verbose: u8, format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    use std::io::IsTerminal as _;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // The picture renderer's complaints (a missing font, said for every text) are not ours.
    if let Ok(directive) = "usvg=error".parse() {
        filter = filter.add_directive(directive);
    }
    if format == LogFormat::Json {
        if let Ok(directive) = format!("{MESSAGE_TARGET}=info").parse() {
            filter = filter.add_directive(directive);
        }
        JSON_MESSAGES.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    let colour =
        std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    // A short queue: the default (128 000 lines) costs every run megabytes of memory to set up,
    // and fencepost says a few lines at most.
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .lossy(true)
        .finish(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(colour);
    let _ = match format {
        LogFormat::Text => builder.with_target(false).try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    guard
}

/// How many log lines wait for a slow stderr before lines are dropped.
const LOG_QUEUE_LINES: usize = 1_024;

fn main() {
    // Arguments need not be UTF-8 (a command's, after `--`): `std::env::args` would panic.
    let arguments: Vec<String> = std::env::args_os()
        .map(|argument| argument.to_string_lossy().into_owned())
        .collect();
    use clap::{CommandFactory as _, FromArgMatches as _};
    // The location options before the subcommand belong to the top level alone (see
    // `LOCATION_OPTIONS`); after it, each subcommand that uses them has its own.
    let command = Cli::command().mut_args(|arg| {
        if LOCATION_OPTIONS.contains(&arg.get_id().as_str()) {
            arg.global(false)
        } else {
            arg
        }
    });
    let parsed = command
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(error) => {
            use clap::error::ErrorKind;
            let shown = matches!(
                error.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            );
            if !shown {
                // `run --json` and `--metrics-file` report every usage error (issue 37).
                report::report_unparsed_run(&arguments, &error.render().to_string());
            }
            if shown || !json_asked(&arguments) {
                error.exit()
            }
            // A usage error as a JSON log line, as every other line of stderr is then.
            let logging = init_tracing(0, LogFormat::Json);
            let text = error.render().to_string();
            tracing::error!(target: MESSAGE_TARGET, "{}", text.trim());
            drop(logging);
            std::process::exit(error.exit_code());
        }
    };
    let logging = init_tracing(cli.verbose, cli.log_format);
    let before = cli.before;
    let outcome = match cli.command {
        // Needs no coordinator, ledger or device of this host.
        Command::Simulate(args) => {
            if before.coordinator.is_some()
                || before.ledger.is_some()
                || before.device.is_some()
                || before.config.is_some()
            {
                Err(anyhow::Error::new(UsageError(
                    "simulate uses no coordinator, ledger, device or config file of this host: leave out --coordinator, --ledger, --device and --config".to_owned(),
                )))
            } else {
                commands::simulate(args)
            }
        }
        Command::Run(mut args) => {
            args.global = std::mem::take(&mut args.global).or(before);
            commands::run_reporting(args)
        }
        Command::Status(mut args) => {
            args.global = std::mem::take(&mut args.global).or(before);
            in_span("status", &args.global, |settings| status::status(settings, &args))
        }
        Command::Lease { global, command } => in_span("lease", &global.or(before), |settings| {
            commands::lease(settings, command)
        }),
        Command::Ledger { global, command } => in_span("ledger", &global.or(before), |settings| {
            commands::ledger(settings, command)
        }),
        Command::Device {
            global,
            command:
                commands::DeviceCommand::Admit {
                    key,
                    recovery_key_file,
                },
        } => {
            // `device admit KEY --device ID`: the --device after the subcommand names the
            // admitted device; this host's id comes from before it, the variable or the config.
            // (clap hands a global option given after the subcommand to the top level too.)
            let admitted = global.device.clone();
            let before = settings::Global {
                device: before.device.filter(|device| Some(device) != admitted.as_ref()),
                ..before
            };
            let host = settings::Global {
                device: None,
                ..global
            }
            .or(before);
            in_span("device", &host, |settings| {
                commands::admit(settings, &key, admitted.as_deref(), recovery_key_file.as_deref())
            })
        }
        Command::Device { global, command } => in_span("device", &global.or(before), |settings| {
            commands::device(settings, command)
        }),
        Command::Admin { global, command } => in_span("admin", &global.or(before), |settings| {
            commands::admin(settings, command)
        }),
    };
    let code = finish(outcome);
    drop(logging);
    std::process::exit(code)
}

/// Resolves the settings and runs `command` in a span that names it and the device (`run` has
/// a span of its own, with the run's fields).
fn in_span(
    name: &'static str,
    global: &Global,
    command: impl FnOnce(&Settings) -> anyhow::Result<i32>,
) -> anyhow::Result<i32> {
    let settings = Settings::resolve(global)?;
    let span = tracing::error_span!("command", command = name, device = %settings.device);
    let _entered = span.enter();
    command(&settings)
}

/// The exit status of `outcome`, its error said on stderr (before the log writer is flushed and
/// closed: in JSON, the error is a log event, and one written after that was lost).
fn finish(outcome: anyhow::Result<i32>) -> i32 {
    match outcome {
        Ok(code) => code,
        Err(error) => {
            if JSON_MESSAGES.load(std::sync::atomic::Ordering::SeqCst) {
                err!("fencepost: error: {}", one_line(&error));
            } else {
                err!("fencepost: {}", one_line(&error));
            }
            exit_status_of_error(&error)
        }
    }
}

/// Whether the command line or the environment asks for JSON logs (for the errors of the
/// command line itself, found before the logs are set up).
fn json_asked(arguments: &[String]) -> bool {
    let flagged = arguments
        .windows(2)
        .any(|pair| pair[0] == "--log-format" && pair[1] == "json")
        || arguments.iter().any(|argument| argument == "--log-format=json");
    flagged || std::env::var("FENCEPOST_LOG_FORMAT").is_ok_and(|format| format == "json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::parse_duration_ms;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn cli_an_error_line_says_each_cause_once() {
        // An error whose message includes its source (a relay's I/O error) said it twice.
        let source = std::io::Error::other("this file holds no fencepost ledger");
        let error = anyhow::Error::new(fencepost::relay::RelayError::Io {
            operation: "open",
            path: "/tmp/ledger.db".into(),
            source,
        })
        .context("cannot open the ledger /tmp/ledger.db");
        assert_eq!(
            one_line(&error),
            "cannot open the ledger /tmp/ledger.db: open /tmp/ledger.db: this file holds no fencepost ledger"
        );
        assert_eq!(format!("{error:#}").matches("no fencepost ledger").count(), 2);
    }

    #[test]
    fn cli_durations_take_units_and_refuse_nonsense() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_duration_ms("45"), Ok(45_000));
        assert!(parse_duration_ms("soon").is_err());
        assert!(parse_duration_ms("5 parsecs").is_err());
        assert!(parse_duration_ms("99999999999999999999h").is_err());
    }
}
