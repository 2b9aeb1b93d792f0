//! `fencepost simulate`: the simulator's table and its timeline as SVG or PNG.

use super::*;

/// `fencepost simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// The seed: the same seed replays the same run exactly.
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// How many seeds to run, from --seed on; the table then sums them.
    #[arg(long, default_value_t = 1)]
    pub(super) seeds: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub(super) json: bool,
    /// Write an SVG timeline of the (first) seed: per site (with its clock skew), leases held,
    /// pauses, crashes, partitions, effects (in their agent's colour), duplicates, and the
    /// effects the resource refused, over a time axis.
    #[arg(long, value_name = "FILE")]
    pub(super) svg: Option<std::path::PathBuf>,
    /// Write the same timeline as a PNG picture.
    #[arg(long, value_name = "FILE")]
    pub(super) png: Option<std::path::PathBuf>,
    /// Run the coordinator in SQLite databases (in a temporary folder) instead of in memory.
    #[arg(long)]
    pub(super) sqlite: bool,
}

/// Renders an SVG picture into a PNG file (text in the system's fonts).
pub(super) fn write_png(svg: &str, path: &Path) -> Result<()> {
    let mut options = resvg::usvg::Options::default();
    let fonts = options.fontdb_mut();
    fonts.load_system_fonts();
    // The picture asks for `sans-serif`: the first of these families that is installed, else
    // any installed family (the generic names' defaults are not Linux fonts).
    let families: Vec<String> = fonts
        .faces()
        .flat_map(|face| face.families.iter().map(|(family, _)| family.clone()))
        .collect();
    let chosen = ["DejaVu Sans", "Liberation Sans", "Noto Sans", "FreeSans", "Arial"]
        .iter()
        .find(|wanted| families.iter().any(|family| family == *wanted))
        .map(|family| (*family).to_owned())
        .or_else(|| families.first().cloned());
    match chosen {
        Some(family) => fonts.set_sans_serif_family(family),
        None => err!("fencepost: warning: no fonts are installed, so the PNG has no text (the SVG has it)"),
    }
    let tree = resvg::usvg::Tree::from_str(svg, &options).context("cannot read the timeline back as SVG")?;
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .context("cannot make a picture of the timeline's size")?;
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    let png = pixmap.encode_png().context("cannot encode the timeline as PNG")?;
    std::fs::write(path, png).with_context(|| format!("cannot write {}", path.display()))
}

pub fn simulate(args: SimulateArgs) -> Result<i32> {
    use fencepost::simulate::{compare, render_svg, render_table, SimConfig};
    if args.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    let folder = if args.sqlite {
        Some(tempfile::tempdir().context("cannot create a temporary folder for the SQLite coordinator")?)
    } else {
        None
    };
    let config = |seed| SimConfig {
        sqlite_folder: folder.as_ref().map(|folder| folder.path().to_path_buf()),
        ..SimConfig::new(seed)
    };
    let first = compare(&config(args.seed));
    if args.svg.is_some() || args.png.is_some() {
        let svg = render_svg(&first);
        if let Some(path) = &args.svg {
            std::fs::write(path, &svg).with_context(|| format!("cannot write {}", path.display()))?;
        }
        if let Some(path) = &args.png {
            write_png(&svg, path)?;
        }
    }
    if args.seeds == 1 {
        if args.json {
            out!("{}", serde_json::to_string_pretty(&first)?);
        } else {
            out_raw!("{}", render_table(&first));
        }
        return Ok(EXIT_RAN_OK);
    }
    let progress = indicatif::ProgressBar::new(args.seeds);
    progress.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} seeds, {eta} left")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    progress.inc(1);
    let mut sum = first.clone();
    for seed in args.seed + 1..args.seed.saturating_add(args.seeds) {
        let report = compare(&config(seed));
        for (total, mode) in sum.modes.iter_mut().zip(&report.modes) {
            total.occurrences += mode.occurrences;
            total.effects += mode.effects;
            total.duplicates += mode.duplicates;
            total.never_executed += mode.never_executed;
            total.in_doubt += mode.in_doubt;
            total.in_doubt_retried += mode.in_doubt_retried;
            total.in_doubt_resolved += mode.in_doubt_resolved;
            total.refused_at_fence += mode.refused_at_fence;
            total.refused_at_resource += mode.refused_at_resource;
            total.converged &= mode.converged;
            total.ledger_wait_ms.extend(&mode.ledger_wait_ms);
            for (call, count) in &mode.coordinator_calls {
                *total.coordinator_calls.entry(call.clone()).or_insert(0) += count;
            }
            for (cause, count) in &mode.duplicates_by_cause {
                *total.duplicates_by_cause.entry(*cause).or_insert(0) += count;
            }
        }
        sum.schedule.faults.extend(report.schedule.faults);
        progress.inc(1);
    }
    progress.finish_and_clear();
    if args.json {
        let modes: Vec<_> = sum
            .modes
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?;
        out!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"first_seed": args.seed, "seeds": args.seeds, "modes": modes})
            )?
        );
    } else {
        let table = render_table(&sum);
        let body = table.split_once('\n').map_or(table.as_str(), |(_, rest)| rest);
        out!(
            "seeds {}..{}: {} faults in all",
            args.seed,
            args.seed + args.seeds - 1,
            sum.schedule.faults.len()
        );
        out_raw!("{body}");
    }
    Ok(EXIT_RAN_OK)
}
