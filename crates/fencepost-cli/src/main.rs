//! The `fencepost` command.
//!
//! For now it answers `--help` and `--version`; the `run`, `lease`, `ledger` and `simulate`
//! subcommands arrive with the library pieces they drive.

use clap::Parser;

/// Run each side effect once across hosts: execution leases with fencing tokens, a convergent
/// intent ledger and a dispatch fence.
///
/// The same job on several hosts (a cron line on three machines, an agent on a laptop, a phone and
/// a server) must act once per occurrence. fencepost gives each occurrence a deterministic run id,
/// records intents in a hash-chained ledger that every host folds the same way, and checks, right
/// before acting, that the run has not committed elsewhere and that this host still holds the
/// agent's lease at its epoch.
#[derive(Debug, Parser)]
#[command(name = "fencepost", version, about, long_about)]
struct Cli {}

fn main() {
    let Cli {} = Cli::parse();
    // No subcommand exists yet: say what to do instead of silently succeeding.
    eprintln!("fencepost: no command given; see `fencepost --help`");
    std::process::exit(2);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
