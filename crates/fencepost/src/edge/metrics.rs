//! What fencepost counts and times, through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! The library records; it installs no recorder and forces no exporter on its users. Without a
//! recorder every call is a no-op. A program that wants the figures installs a recorder of its
//! choice (the `fencepost` command installs `metrics-exporter-prometheus`'s for
//! `run --metrics-file`) and may call [`describe`] once for the help texts.
//!
//! | name | kind | labels | what |
//! | --- | --- | --- | --- |
//! | [`ACQUIRES`] | counter | `agent`, `outcome` = `granted` / `held` / `error` | lease acquisitions by a [`LeaseKeeper`](crate::keeper::LeaseKeeper) |
//! | [`ACQUIRE_SECONDS`] | histogram | `agent` | time of one acquire call |
//! | [`RENEWALS`] | counter | `agent`, `outcome` = `ok` / `transient_error` / `lost` | renewals by a keeper |
//! | [`RENEW_SECONDS`] | histogram | `agent` | time of one renew call |
//! | [`LEASES_HELD`] | gauge | `agent` | leases this process holds (1 while a keeper holds, 0 after) |
//! | [`LEASE_LOSSES`] | counter | `agent` | leases lost while held (taken, expired, coordinator unreachable) |
//! | [`FENCE_DECISIONS`] | counter | `agent`, `decision` | verdicts of [`Ledger::begin`](crate::ledger::Ledger::begin), the fence and the checks before it: `proceed`, `already_committed`, `stale_epoch`, `not_held`, `in_doubt`, `concurrent_attempt`, `ledger_behind`, `error` |
//! | [`DISPATCHES`] | counter | `agent`, `outcome` | ends of [`dispatch`](crate::dispatch::dispatch) calls: `succeeded`, `failed`, `interrupted`, and the refusals as in [`FENCE_DECISIONS`] |
//! | [`RUNS_LEFT_IN_DOUBT`] | counter | `agent` | dispatches whose effect may or may not have happened (`interrupted`): each leaves a run in doubt |
//! | [`LEDGER_BEHIND`] | counter | `agent` | dispatches refused because this site's ledger lacked records earlier holders published (rule H3) |
//! | [`RELAY_PUSH_SECONDS`], [`RELAY_PUSHED_RECORDS`] | histogram, counter | | a ledger's appends to its relay, and the records stored |
//! | [`RELAY_PULL_SECONDS`], [`RELAY_PULLED_RECORDS`] | histogram, counter | | a ledger's pulls from its relay, and the records they brought |
//!
//! Histograms are in seconds. The `agent` label is the agent id as the caller names it.

/// Counter: lease acquisitions by a keeper; labels `agent`, `outcome`.
pub const ACQUIRES: &str = "fencepost_acquires_total";
/// Histogram (seconds): one acquire call of a keeper; label `agent`.
pub const ACQUIRE_SECONDS: &str = "fencepost_acquire_duration_seconds";
/// Counter: renewals by a keeper; labels `agent`, `outcome`.
pub const RENEWALS: &str = "fencepost_renewals_total";
/// Histogram (seconds): one renew call of a keeper; label `agent`.
pub const RENEW_SECONDS: &str = "fencepost_renew_duration_seconds";
/// Gauge: leases this process holds through keepers; label `agent`.
pub const LEASES_HELD: &str = "fencepost_leases_held";
/// Counter: leases lost while held; label `agent`.
pub const LEASE_LOSSES: &str = "fencepost_lease_losses_total";
/// Counter: verdicts of `Ledger::begin`; labels `agent`, `decision`.
pub const FENCE_DECISIONS: &str = "fencepost_fence_decisions_total";
/// Counter: ends of dispatches; labels `agent`, `outcome`.
pub const DISPATCHES: &str = "fencepost_dispatches_total";
/// Counter: dispatches that left their run in doubt; label `agent`.
pub const RUNS_LEFT_IN_DOUBT: &str = "fencepost_runs_left_in_doubt_total";
/// Counter: dispatches refused because the ledger was behind (rule H3); label `agent`.
pub const LEDGER_BEHIND: &str = "fencepost_ledger_behind_total";
/// Histogram (seconds): a ledger's append to its relay.
pub const RELAY_PUSH_SECONDS: &str = "fencepost_relay_push_duration_seconds";
/// Counter: records a ledger stored in its relay.
pub const RELAY_PUSHED_RECORDS: &str = "fencepost_relay_pushed_records_total";
/// Histogram (seconds): a ledger's pull from its relay.
pub const RELAY_PULL_SECONDS: &str = "fencepost_relay_pull_duration_seconds";
/// Counter: records a ledger's pulls brought.
pub const RELAY_PULLED_RECORDS: &str = "fencepost_relay_pulled_records_total";

/// Registers the help text and unit of every metric above with the installed recorder (call it
/// once, after installing one; without a recorder it does nothing).
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        ACQUIRES,
        "Lease acquisitions by a keeper, by outcome (granted, held, error)."
    );
    describe_histogram!(
        ACQUIRE_SECONDS,
        Unit::Seconds,
        "Time of one acquire call of a keeper."
    );
    describe_counter!(
        RENEWALS,
        "Lease renewals by a keeper, by outcome (ok, transient_error, lost)."
    );
    describe_histogram!(
        RENEW_SECONDS,
        Unit::Seconds,
        "Time of one renew call of a keeper."
    );
    describe_gauge!(LEASES_HELD, "Leases this process holds through keepers.");
    describe_counter!(
        LEASE_LOSSES,
        "Leases lost while held (taken, expired, coordinator unreachable)."
    );
    describe_counter!(
        FENCE_DECISIONS,
        "Verdicts of the dispatch fence and the checks before it, by decision."
    );
    describe_counter!(DISPATCHES, "Ends of dispatches, by outcome.");
    describe_counter!(
        RUNS_LEFT_IN_DOUBT,
        "Dispatches whose effect may or may not have happened: each leaves its run in doubt."
    );
    describe_counter!(
        LEDGER_BEHIND,
        "Dispatches refused because this site's ledger lacked records earlier holders published."
    );
    describe_histogram!(
        RELAY_PUSH_SECONDS,
        Unit::Seconds,
        "Time of a ledger's append to its relay."
    );
    describe_counter!(RELAY_PUSHED_RECORDS, "Records a ledger stored in its relay.");
    describe_histogram!(
        RELAY_PULL_SECONDS,
        Unit::Seconds,
        "Time of a ledger's pull from its relay."
    );
    describe_counter!(RELAY_PULLED_RECORDS, "Records a ledger's pulls brought.");
}

/// The verdicts [`FENCE_DECISIONS`] counts; [`DISPATCHES`] counts them too (but `proceed`),
/// with the ends of a dispatch that ran.
const DECISIONS: [&str; 8] = [
    "proceed",
    "already_committed",
    "stale_epoch",
    "not_held",
    "in_doubt",
    "concurrent_attempt",
    "ledger_behind",
    "error",
];

/// Makes every counter above exist at zero for `agent_id` (those labelled by an outcome or a
/// decision with each of its values), and the [`LEASES_HELD`] gauge at 0 unless set: a textfile
/// written at the end of a process then shows a count that stayed 0 as 0, not as a missing
/// series (alert rules need no `absent()`).
pub fn register_zeros(agent_id: &str) {
    for name in [LEASE_LOSSES, RUNS_LEFT_IN_DOUBT, LEDGER_BEHIND] {
        metrics::counter!(name, "agent" => agent_id.to_owned()).increment(0);
    }
    let zero = |name: &'static str, key: &'static str, value: &'static str| {
        metrics::counter!(name, "agent" => agent_id.to_owned(), key => value).increment(0);
    };
    for outcome in ["granted", "held", "error"] {
        zero(ACQUIRES, "outcome", outcome);
    }
    for outcome in ["ok", "transient_error", "lost"] {
        zero(RENEWALS, "outcome", outcome);
    }
    for decision in DECISIONS {
        zero(FENCE_DECISIONS, "decision", decision);
    }
    let ran = ["succeeded", "failed", "interrupted"];
    for outcome in ran.into_iter().chain(DECISIONS.into_iter().skip(1)) {
        zero(DISPATCHES, "outcome", outcome);
    }
    for name in [RELAY_PUSHED_RECORDS, RELAY_PULLED_RECORDS] {
        metrics::counter!(name).increment(0);
    }
    metrics::gauge!(LEASES_HELD, "agent" => agent_id.to_owned()).increment(0.0);
}

/// Counts one occurrence of a counter with an `agent` label and one more label.
pub(crate) fn count(name: &'static str, agent_id: &str, key: &'static str, value: &'static str) {
    metrics::counter!(name, "agent" => agent_id.to_owned(), key => value).increment(1);
}

/// Counts one occurrence of a counter with only an `agent` label.
pub(crate) fn count_agent(name: &'static str, agent_id: &str) {
    metrics::counter!(name, "agent" => agent_id.to_owned()).increment(1);
}

/// Records a duration, in seconds, into a histogram with an `agent` label.
pub(crate) fn time_agent(name: &'static str, agent_id: &str, elapsed: std::time::Duration) {
    metrics::histogram!(name, "agent" => agent_id.to_owned()).record(elapsed.as_secs_f64());
}

/// Sets the [`LEASES_HELD`] gauge of an agent.
pub(crate) fn set_held(agent_id: &str, held: bool) {
    metrics::gauge!(LEASES_HELD, "agent" => agent_id.to_owned()).set(if held { 1.0 } else { 0.0 });
}

/// Records a relay call: its time and the records it moved.
pub(crate) fn relay_call(
    seconds: &'static str,
    records: &'static str,
    elapsed: std::time::Duration,
    moved: usize,
) {
    metrics::histogram!(seconds).record(elapsed.as_secs_f64());
    metrics::counter!(records).increment(u64::try_from(moved).unwrap_or(u64::MAX));
}
