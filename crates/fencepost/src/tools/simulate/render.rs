//! The report as a table and as an SVG timeline: pure functions of a [`SimReport`].

use std::fmt::Write as _;

use super::{Cause, Fault, ModeReport, SimReport};

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
            "{:<6} hand-off: {} {} for the ledger (median {median} ms, max {max} ms); per effect: {:.2} publish_frontier, {:.2} published_frontier, {:.2} current, {:.2} renew, {:.2} acquire",
            mode.mode.name(),
            waits.len(),
            if waits.len() == 1 { "wait" } else { "waits" },
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

/// A skew as a label: "skew −56 ms" (a true minus sign), "skew +12 ms", "skew 0 ms".
fn skew_label(skew_ms: i64) -> String {
    match skew_ms {
        0 => "skew 0 ms".to_owned(),
        skew if skew < 0 => format!("skew \u{2212}{} ms", skew.unsigned_abs()),
        skew => format!("skew +{skew} ms"),
    }
}

/// The spacing of the time axis's ticks: a round step giving at most 12 ticks over `total_ms`.
fn tick_step_ms(total_ms: u64) -> u64 {
    const STEPS: [u64; 14] = [
        1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 60_000,
    ];
    STEPS
        .iter()
        .copied()
        .find(|step| total_ms / step <= 12)
        .unwrap_or(total_ms.div_ceil(12).max(1))
}

/// The legend: each swatch drawn first, its text after it, left to right, on as many rows as
/// it takes.
struct Legend {
    svg: String,
    x: f64,
    y: f64,
    right: f64,
}

impl Legend {
    /// The width a text of `text` takes at font size 11, roughly.
    fn text_width(text: &str) -> f64 {
        6.2 * text.chars().count() as f64
    }

    /// Adds one entry: `swatch` is drawn at `(x, y)` (the swatch's left end, its middle line)
    /// and is `width` wide; the text follows it.
    fn entry(&mut self, width: f64, text: &str, swatch: impl FnOnce(f64, f64) -> String) {
        let needed = width + 4.0 + Self::text_width(text);
        if self.x + needed > self.right && self.x > 10.0 {
            self.x = 10.0;
            self.y += 18.0;
        }
        self.svg.push_str(&swatch(self.x, self.y));
        let _ = write!(
            self.svg,
            r#"<text x="{}" y="{}">{}</text>"#,
            self.x + width + 4.0,
            self.y + 4.0,
            escape(text)
        );
        self.x += needed + 16.0;
    }
}

/// An SVG timeline of a report: one panel per mode, one lane per site (labelled with its clock
/// skew), a time axis in seconds (or milliseconds) under each panel. Lease tenures are bars
/// (one colour per agent; hover for the epoch), pauses grey, crashes black, partitioned sites
/// shaded red, effects as dots in their agent's colour, duplicates as red crosses (hover for the
/// cause), and in `token` mode the effects the resource refused as orange squares (a stale token,
/// or a run it had applied: a duplicate stopped).
pub fn render_svg(report: &SimReport) -> String {
    let frame = Frame {
        report,
        total: (report.config.run_ms + report.config.settle_ms).max(1),
    };
    // The legend first: its height decides the picture's.
    let legend = legend(report.config.agents);
    let legend_rows = legend.y / 18.0 + 1.0;
    let legend_top = 50.0 + frame.panel_height() * report.modes.len() as f64;
    let height = legend_top + 18.0 * legend_rows + 10.0;
    let config = &report.config;
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
        let top = 40.0 + frame.panel_height() * panel as f64;
        let _ = write!(
            svg,
            r#"<text x="10" y="{}" font-size="13" font-weight="bold">{}: {} effects, {} duplicates, {} refused by the resource</text>"#,
            top + 16.0,
            mode.mode.name(),
            mode.effects,
            mode.duplicates,
            mode.refused_at_resource
        );
        frame.lanes_and_axis(&mut svg, top);
        frame.faults(&mut svg, top);
        frame.marks(&mut svg, top, mode);
    }
    let _ = write!(
        svg,
        r#"<g font-size="11" transform="translate(0 {legend_top})">{}</g>"#,
        legend.svg
    );
    svg.push_str("</svg>\n");
    svg
}

/// Where the timeline's margin ends, and its width, in the picture's units.
const LEFT: f64 = 150.0;
const WIDTH: f64 = 1000.0;
/// A site's lane, and the time axis under them.
const LANE: f64 = 26.0;
const AXIS: f64 = 26.0;

/// An agent's colour.
fn agent_colour(agent: usize) -> &'static str {
    const AGENT_COLOURS: [&str; 4] = ["#4c78a8", "#b279a2", "#72b7b2", "#9d755d"];
    AGENT_COLOURS[agent % AGENT_COLOURS.len()]
}

/// The legend: a lease per agent, then each mark.
fn legend(agents: usize) -> Legend {
    let mut legend = Legend {
        svg: String::new(),
        x: 10.0,
        y: 0.0,
        right: LEFT + WIDTH,
    };
    for agent in 0..agents {
        let colour = agent_colour(agent);
        legend.entry(14.0, &format!("lease held by agent-{agent}"), |lx, ly| {
            format!(
                r#"<rect x="{lx}" y="{}" width="14" height="5" fill="{colour}"/>"#,
                ly - 2.5
            )
        });
    }
    legend.entry(8.0, "effect (in its agent's colour)", |lx, ly| {
        format!(
            r##"<circle cx="{}" cy="{ly}" r="3" fill="{}" stroke="#222222" stroke-width="0.8"/>"##,
            lx + 4.0,
            agent_colour(0)
        )
    });
    legend.entry(8.0, "duplicate", |lx, ly| {
        format!(
            r##"<g stroke="#d62728" stroke-width="2"><line x1="{lx}" y1="{}" x2="{}" y2="{}"/><line x1="{lx}" y1="{}" x2="{}" y2="{}"/></g>"##,
            ly - 4.0,
            lx + 8.0,
            ly + 4.0,
            ly + 4.0,
            lx + 8.0,
            ly - 4.0
        )
    });
    legend.entry(8.0, "refused by the resource (token mode)", |lx, ly| {
        format!(
            r##"<rect x="{lx}" y="{}" width="8" height="8" fill="none" stroke="#e6550d" stroke-width="1.5"/>"##,
            ly - 4.0
        )
    });
    legend.entry(14.0, "paused", |lx, ly| {
        format!(
            r##"<rect x="{lx}" y="{}" width="14" height="6" fill="#888888"/>"##,
            ly - 3.0
        )
    });
    legend.entry(14.0, "crashed", |lx, ly| {
        format!(
            r##"<rect x="{lx}" y="{}" width="14" height="6" fill="#222222"/>"##,
            ly - 3.0
        )
    });
    legend.entry(14.0, "partitioned", |lx, ly| {
        format!(
            r##"<rect x="{lx}" y="{}" width="14" height="12" fill="#e45756" fill-opacity="0.18"/>"##,
            ly - 6.0
        )
    });
    legend.entry(6.0, "coordinator lost its state", |lx, ly| {
        format!(
            r##"<line x1="{x}" x2="{x}" y1="{}" y2="{}" stroke="#f58518" stroke-width="2" stroke-dasharray="4 2"/>"##,
            ly - 6.0,
            ly + 6.0,
            x = lx + 3.0
        )
    });
    legend
}

/// The scale of one picture: the report and its whole time span.
struct Frame<'a> {
    report: &'a SimReport,
    total: u64,
}

impl Frame<'_> {
    /// Where `ms` is on the time axis.
    fn x(&self, ms: u64) -> f64 {
        LEFT + WIDTH * ms as f64 / self.total as f64
    }

    /// The height of one mode's panel.
    fn panel_height(&self) -> f64 {
        30.0 + LANE * self.report.config.sites as f64 + AXIS
    }

    /// The top of `site`'s lane in the panel at `top`.
    fn lane_top(&self, top: f64, site: usize) -> f64 {
        top + 26.0 + LANE * site as f64
    }

    /// The sites' lanes (with their clock skews) and the time axis under them.
    fn lanes_and_axis(&self, svg: &mut String, top: f64) {
        let total = self.total;
        let step_ms = tick_step_ms(total);
        let in_seconds = step_ms >= 1_000;
        for site in 0..self.report.config.sites {
            let y = self.lane_top(top, site);
            let _ = write!(
                svg,
                r##"<rect x="{LEFT}" y="{y}" width="{WIDTH}" height="{h}" fill="#f4f4f4"/><text x="10" y="{ty}">site-{site}  {skew}</text>"##,
                h = LANE - 4.0,
                ty = y + 15.0,
                skew = escape(&skew_label(
                    self.report.schedule.skew_ms.get(site).copied().unwrap_or(0)
                ))
            );
        }
        // The time axis, under the lanes.
        let axis_y = self.lane_top(top, self.report.config.sites);
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" x2="{}" y1="{axis_y}" y2="{axis_y}" stroke="#444444"/><text x="10" y="{}">time ({})</text>"##,
            LEFT + WIDTH,
            axis_y + 14.0,
            if in_seconds { "s" } else { "ms" }
        );
        let mut tick = 0;
        while tick <= total {
            let tx = self.x(tick);
            let label = if in_seconds {
                let seconds = tick as f64 / 1000.0;
                if tick % 1_000 == 0 {
                    format!("{}", tick / 1_000)
                } else {
                    format!("{seconds:.1}")
                }
            } else {
                tick.to_string()
            };
            let _ = write!(
                svg,
                r##"<line x1="{tx}" x2="{tx}" y1="{axis_y}" y2="{}" stroke="#444444"/><text x="{tx}" y="{}" text-anchor="middle" font-size="10">{label}</text>"##,
                axis_y + 4.0,
                axis_y + 14.0
            );
            tick += step_ms;
        }
    }

    /// The faults: partitions, pauses, crashes, a coordinator's lost state.
    fn faults(&self, svg: &mut String, top: f64) {
        for fault in &self.report.schedule.faults {
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
                            self.x(*at_ms),
                            self.lane_top(top, *site),
                            (self.x(*until_ms) - self.x(*at_ms)).max(1.0),
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
                        self.x(*at_ms),
                        self.lane_top(top, *site) + LANE - 10.0,
                        (self.x(at_ms + duration_ms) - self.x(*at_ms)).max(1.0),
                        duration_ms,
                        at_ms
                    );
                }
                Fault::Crash { site, at_ms, down_ms } => {
                    let _ = write!(
                        svg,
                        r##"<rect x="{}" y="{}" width="{}" height="6" fill="#222222"><title>crashed at {} ms, down {} ms</title></rect>"##,
                        self.x(*at_ms),
                        self.lane_top(top, *site) + LANE - 10.0,
                        (self.x(at_ms + down_ms) - self.x(*at_ms)).max(1.0),
                        at_ms,
                        down_ms
                    );
                }
                Fault::CoordinatorLoss { at_ms } => {
                    let _ = write!(
                        svg,
                        r##"<line x1="{x}" x2="{x}" y1="{}" y2="{}" stroke="#f58518" stroke-width="2" stroke-dasharray="4 2"><title>coordinator state lost at {} ms</title></line>"##,
                        self.lane_top(top, 0) - 4.0,
                        self.lane_top(top, self.report.config.sites) - 4.0,
                        at_ms,
                        x = self.x(*at_ms)
                    );
                }
            }
        }
    }

    /// One mode's leases, effects (duplicates marked) and the resource's refusals.
    fn marks(&self, svg: &mut String, top: f64, mode: &ModeReport) {
        for tenure in &mode.tenures {
            let colour = agent_colour(tenure.agent);
            let y = self.lane_top(top, tenure.site) + 2.0 + 6.0 * (tenure.agent % 2) as f64;
            let width = (self.x(tenure.until_ms) - self.x(tenure.from_ms)).max(1.0);
            let _ = write!(
                svg,
                r#"<rect x="{}" y="{y}" width="{width}" height="5" fill="{colour}"><title>agent-{} epoch {} held {}..{} ms</title></rect>"#,
                self.x(tenure.from_ms),
                tenure.agent,
                tenure.epoch,
                tenure.from_ms,
                tenure.until_ms
            );
        }
        for effect in &mode.effect_log {
            let cx = self.x(effect.at_ms);
            let cy = self.lane_top(top, effect.site) + 16.0;
            let colour = agent_colour(effect.agent);
            match effect.duplicate {
                None => {
                    let _ = write!(
                        svg,
                        r##"<circle cx="{cx}" cy="{cy}" r="3" fill="{colour}" stroke="#222222" stroke-width="0.8"><title>agent-{} occurrence {} at epoch {}, {} ms</title></circle>"##,
                        effect.agent, effect.occurrence, effect.epoch, effect.at_ms
                    );
                }
                Some(cause) => {
                    let _ = write!(
                        svg,
                        r##"<g><title>DUPLICATE agent-{} occurrence {} at epoch {}, {} ms: {}</title><circle cx="{cx}" cy="{cy}" r="3" fill="{colour}"/><g stroke="#d62728" stroke-width="2"><line x1="{}" y1="{}" x2="{}" y2="{}"/><line x1="{}" y1="{}" x2="{}" y2="{}"/></g></g>"##,
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
        for refused in &mode.refusal_log {
            let cx = self.x(refused.at_ms);
            let cy = self.lane_top(top, refused.site) + 16.0;
            let why = match refused.reason {
                "already_applied" => "the run was applied before: a duplicate stopped",
                "stale_epoch" => "a stale fencing token",
                _ => "an epoch no coordinator minted",
            };
            let _ = write!(
                svg,
                r##"<rect x="{}" y="{}" width="8" height="8" fill="none" stroke="#e6550d" stroke-width="1.5"><title>REFUSED by the resource: agent-{} occurrence {} at epoch {}, {} ms: {why}</title></rect>"##,
                cx - 4.0,
                cy - 4.0,
                refused.agent,
                refused.occurrence,
                refused.epoch,
                refused.at_ms
            );
        }
    }
}
