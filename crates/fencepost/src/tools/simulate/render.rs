//! The report as a table and as an SVG timeline: pure functions of a [`SimReport`].

use std::fmt::Write as _;

use super::{Cause, Fault, SimReport};

/// The comparison table of a report, as plain text.
pub fn render_table(report: &SimReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "seed {}: {} sites, {} agents, {} occurrences, {} faults",
        report.config.seed,
        report.config.sites,
        report.config.agents,
        report.modes.first().map_or(0, |mode| mode.occurrences),
        report.schedule.faults.len()
    );
    let _ = writeln!(
        out,
        "{:<6} {:>8} {:>11} {:>11} {:>9} {:>8} {:>9} {:>6} {:>9} {:>9}  duplicates by cause",
        "mode",
        "effects",
        "duplicates",
        "never ran",
        "in doubt",
        "retried",
        "resolved",
        "fence",
        "resource",
        "converged"
    );
    for mode in &report.modes {
        let causes: Vec<String> = mode
            .duplicates_by_cause
            .iter()
            .map(|(cause, count)| format!("{}={count}", cause_name(*cause)))
            .collect();
        let _ = writeln!(
            out,
            "{:<6} {:>8} {:>11} {:>11} {:>9} {:>8} {:>9} {:>6} {:>9} {:>9}  {}",
            mode.mode.name(),
            mode.effects,
            mode.duplicates,
            mode.never_executed,
            mode.in_doubt,
            mode.in_doubt_retried,
            mode.in_doubt_resolved,
            mode.refused_at_fence,
            mode.refused_at_resource,
            if mode.converged { "yes" } else { "NO" },
            if causes.is_empty() {
                "-".to_owned()
            } else {
                causes.join(" ")
            }
        );
    }
    for mode in report.modes.iter().filter(|mode| {
        !mode.ledger_wait_ms.is_empty() || mode.coordinator_calls.contains_key("publish_frontier")
    }) {
        let mut waits = mode.ledger_wait_ms.clone();
        waits.sort_unstable();
        let median = waits.get(waits.len() / 2).copied().unwrap_or(0);
        let max = waits.last().copied().unwrap_or(0);
        let per_effect = |call: &str| {
            let count = mode.coordinator_calls.get(call).copied().unwrap_or(0);
            count as f64 / mode.effects.max(1) as f64
        };
        let _ = writeln!(
            out,
            "{:<6} hand-off: {} wait(s) for the ledger (median {median} ms, max {max} ms); per effect: {:.2} publish_frontier, {:.2} published_frontier, {:.2} current, {:.2} renew, {:.2} acquire",
            mode.mode.name(),
            waits.len(),
            per_effect("publish_frontier"),
            per_effect("published_frontier"),
            per_effect("current"),
            per_effect("renew"),
            per_effect("acquire"),
        );
    }
    out
}

/// A cause's name in tables and JSON.
pub fn cause_name(cause: Cause) -> &'static str {
    match cause {
        Cause::NoGuard => "no_guard",
        Cause::NoFence => "no_fence",
        Cause::PauseAfterFence => "pause_after_fence",
        Cause::LeaseLostInFlight => "lease_lost_in_flight",
        Cause::LedgerLag => "ledger_lag",
        Cause::FrontierLost => "frontier_lost",
        Cause::Unexplained => "unexplained",
    }
}

/// Escapes text for SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An SVG timeline of a report: one panel per mode, one lane per site. Lease tenures are bars
/// labelled with their epoch (one colour per agent), pauses grey, crashes black, partitioned sites
/// shaded red, effects as dots, duplicates as red crosses (hover for the cause).
pub fn render_svg(report: &SimReport) -> String {
    const LEFT: f64 = 110.0;
    const WIDTH: f64 = 1000.0;
    const LANE: f64 = 26.0;
    const AGENT_COLOURS: [&str; 4] = ["#4c78a8", "#72b7b2", "#b279a2", "#9d755d"];
    let config = &report.config;
    let total_ms = (config.run_ms + config.settle_ms).max(1) as f64;
    let x = |ms: u64| LEFT + WIDTH * ms as f64 / total_ms;
    let panel_height = 30.0 + LANE * config.sites as f64 + 14.0;
    let height = 60.0 + panel_height * report.modes.len() as f64 + 40.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" viewBox="0 0 {w} {height}" font-family="sans-serif" font-size="11">"#,
        w = LEFT + WIDTH + 20.0
    );
    let _ = write!(svg, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let _ = write!(
        svg,
        r#"<text x="10" y="20" font-size="14" font-weight="bold">fencepost simulate --seed {}: {} sites, {} agents, {} faults (faults end at {} ms)</text>"#,
        config.seed,
        config.sites,
        config.agents,
        report.schedule.faults.len(),
        config.run_ms
    );
    for (panel, mode) in report.modes.iter().enumerate() {
        let top = 40.0 + panel_height * panel as f64;
        let _ = write!(
            svg,
            r#"<text x="10" y="{}" font-size="13" font-weight="bold">{}: {} effects, {} duplicates</text>"#,
            top + 16.0,
            mode.mode.name(),
            mode.effects,
            mode.duplicates
        );
        let lane_top = |site: usize| top + 26.0 + LANE * site as f64;
        for site in 0..config.sites {
            let y = lane_top(site);
            let _ = write!(
                svg,
                r##"<rect x="{LEFT}" y="{y}" width="{WIDTH}" height="{h}" fill="#f4f4f4"/><text x="10" y="{ty}">site-{site} ({skew:+} ms)</text>"##,
                h = LANE - 4.0,
                ty = y + 15.0,
                skew = report.schedule.skew_ms.get(site).copied().unwrap_or(0)
            );
        }
        for fault in &report.schedule.faults {
            match fault {
                Fault::Partition {
                    at_ms,
                    until_ms,
                    side,
                } => {
                    for site in side {
                        let _ = write!(
                            svg,
                            r##"<rect x="{}" y="{}" width="{}" height="{}" fill="#e45756" fill-opacity="0.18"><title>partitioned {}..{} ms</title></rect>"##,
                            x(*at_ms),
                            lane_top(*site),
                            (x(*until_ms) - x(*at_ms)).max(1.0),
                            LANE - 4.0,
                            at_ms,
                            until_ms
                        );
                    }
                }
                Fault::Pause {
                    site,
                    at_ms,
                    duration_ms,
                } => {
                    let _ = write!(
                        svg,
                        r##"<rect x="{}" y="{}" width="{}" height="6" fill="#888888"><title>paused {} ms at {} ms</title></rect>"##,
                        x(*at_ms),
                        lane_top(*site) + LANE - 10.0,
                        (x(at_ms + duration_ms) - x(*at_ms)).max(1.0),
                        duration_ms,
                        at_ms
                    );
                }
                Fault::Crash { site, at_ms, down_ms } => {
                    let _ = write!(
                        svg,
                        r##"<rect x="{}" y="{}" width="{}" height="6" fill="#222222"><title>crashed at {} ms, down {} ms</title></rect>"##,
                        x(*at_ms),
                        lane_top(*site) + LANE - 10.0,
                        (x(at_ms + down_ms) - x(*at_ms)).max(1.0),
                        at_ms,
                        down_ms
                    );
                }
                Fault::CoordinatorLoss { at_ms } => {
                    let _ = write!(
                        svg,
                        r##"<line x1="{x}" x2="{x}" y1="{}" y2="{}" stroke="#f58518" stroke-width="2" stroke-dasharray="4 2"><title>coordinator state lost at {} ms</title></line>"##,
                        lane_top(0) - 4.0,
                        lane_top(config.sites) - 4.0,
                        at_ms,
                        x = x(*at_ms)
                    );
                }
            }
        }
        for tenure in &mode.tenures {
            let colour = AGENT_COLOURS[tenure.agent % AGENT_COLOURS.len()];
            let y = lane_top(tenure.site) + 2.0 + 6.0 * (tenure.agent % 2) as f64;
            let width = (x(tenure.until_ms) - x(tenure.from_ms)).max(1.0);
            let _ = write!(
                svg,
                r#"<rect x="{}" y="{y}" width="{width}" height="5" fill="{colour}"><title>agent-{} epoch {} held {}..{} ms</title></rect>"#,
                x(tenure.from_ms),
                tenure.agent,
                tenure.epoch,
                tenure.from_ms,
                tenure.until_ms
            );
        }
        for effect in &mode.effect_log {
            let cx = x(effect.at_ms);
            let cy = lane_top(effect.site) + 16.0;
            match effect.duplicate {
                None => {
                    let _ = write!(
                        svg,
                        r##"<circle cx="{cx}" cy="{cy}" r="2.5" fill="#54a24b"><title>agent-{} occurrence {} at epoch {}, {} ms</title></circle>"##,
                        effect.agent, effect.occurrence, effect.epoch, effect.at_ms
                    );
                }
                Some(cause) => {
                    let _ = write!(
                        svg,
                        r##"<g stroke="#d62728" stroke-width="2"><title>DUPLICATE agent-{} occurrence {} at epoch {}, {} ms: {}</title><line x1="{}" y1="{}" x2="{}" y2="{}"/><line x1="{}" y1="{}" x2="{}" y2="{}"/></g>"##,
                        effect.agent,
                        effect.occurrence,
                        effect.epoch,
                        effect.at_ms,
                        escape(cause_name(cause)),
                        cx - 4.0,
                        cy - 4.0,
                        cx + 4.0,
                        cy + 4.0,
                        cx - 4.0,
                        cy + 4.0,
                        cx + 4.0,
                        cy - 4.0
                    );
                }
            }
        }
    }
    let legend_y = height - 20.0;
    let _ = write!(
        svg,
        r##"<g font-size="11"><rect x="10" y="{ly}" width="14" height="5" fill="{a0}"/><text x="28" y="{ty}">lease held (agent-0 / agent-1)</text><rect x="210" y="{ly}" width="14" height="5" fill="{a1}"/><circle cx="400" cy="{cy}" r="3" fill="#54a24b"/><text x="408" y="{ty}">effect</text><g stroke="#d62728" stroke-width="2"><line x1="470" y1="{y1}" x2="478" y2="{y2}"/><line x1="470" y1="{y2}" x2="478" y2="{y1}"/></g><text x="484" y="{ty}">duplicate</text><rect x="560" y="{ly}" width="14" height="6" fill="#888888"/><text x="578" y="{ty}">paused</text><rect x="640" y="{ly}" width="14" height="6" fill="#222222"/><text x="658" y="{ty}">crashed</text><rect x="720" y="{ly2}" width="14" height="12" fill="#e45756" fill-opacity="0.18"/><text x="738" y="{ty}">partitioned</text><line x1="830" x2="830" y1="{ly2}" y2="{ty}" stroke="#f58518" stroke-width="2" stroke-dasharray="4 2"/><text x="836" y="{ty}">coordinator lost its state</text></g>"##,
        ly = legend_y - 4.0,
        ly2 = legend_y - 9.0,
        ty = legend_y + 2.0,
        cy = legend_y - 1.0,
        y1 = legend_y - 5.0,
        y2 = legend_y + 3.0,
        a0 = AGENT_COLOURS[0],
        a1 = AGENT_COLOURS[1]
    );
    svg.push_str("</svg>\n");
    svg
}
