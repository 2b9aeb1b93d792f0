//! `fencepost simulate`: the table, replay by seed, JSON, and the SVG timeline (parsed, and
//! rendered to PNG).

mod common;

use std::process::Command;

fn simulate(args: &[&str]) -> std::process::Output {
    let output = Command::new(env!("CARGO_BIN_EXE_fencepost"))
        .arg("simulate")
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn simulate_prints_the_comparison_and_replays_a_seed_byte_for_byte() {
    let first = simulate(&["--seed", "44"]);
    let second = simulate(&["--seed", "44"]);
    assert_eq!(first.stdout, second.stdout, "the same seed, the same output");
    let table = String::from_utf8(first.stdout).unwrap();
    for mode in ["none", "lease", "fence", "token"] {
        assert!(table.lines().any(|line| line.starts_with(mode)), "{table}");
    }
    let json = simulate(&["--seed", "44", "--json"]);
    assert_eq!(json.stdout, simulate(&["--seed", "44", "--json"]).stdout);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["config"]["seed"], 44);
    assert_eq!(report["modes"][3]["mode"], "token");
    assert_eq!(report["modes"][3]["duplicates"], 0);
    // A SQLite coordinator gives the same effects, duplicates (by cause), losses, doubts and
    // convergence as the in-memory one. Its refusals may differ: a new SQLite database (the
    // coordinator's state lost) mints epochs from the clock, above every earlier one, where a
    // new in-memory one starts from the floor the sites' ledgers raise (seed 44: one effect
    // fewer refused at the resource).
    let sqlite: serde_json::Value =
        serde_json::from_slice(&simulate(&["--seed", "44", "--sqlite", "--json"]).stdout).unwrap();
    for (memory, sqlite) in report["modes"]
        .as_array()
        .unwrap()
        .iter()
        .zip(sqlite["modes"].as_array().unwrap())
    {
        for column in [
            "effects",
            "duplicates",
            "duplicates_by_cause",
            "never_executed",
            "in_doubt",
            "converged",
        ] {
            assert_eq!(memory[column], sqlite[column], "{} {column}", memory["mode"]);
        }
    }
    let many = String::from_utf8(simulate(&["--seed", "0", "--seeds", "5"]).stdout).unwrap();
    assert!(many.starts_with("seeds 0..4"), "{many}");
}

#[test]
fn simulate_writes_an_svg_timeline_that_parses_and_renders() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("timeline.svg");
    simulate(&["--seed", "3", "--svg", path.to_str().unwrap()]);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("DUPLICATE"), "duplicates are marked");
    let options = resvg::usvg::Options::default();
    let tree = resvg::usvg::Tree::from_str(&text, &options).expect("a valid SVG");
    let size = tree.size().to_int_size();
    assert!(size.width() > 1000 && size.height() > 300, "{size:?}");
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    let png = pixmap.encode_png().unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    // Something other than the white background was drawn.
    assert!(pixmap
        .pixels()
        .iter()
        .any(|pixel| pixel.red() < 200 && pixel.green() > 100));
    if let Ok(out) = std::env::var("FENCEPOST_SVG_PNG") {
        std::fs::write(out, &png).unwrap();
    }
}

#[test]
fn simulate_timeline_has_a_time_axis_skews_agents_refusals_and_a_png() {
    let folder = tempfile::tempdir().unwrap();
    let svg_path = folder.path().join("timeline.svg");
    let png_path = folder.path().join("timeline.png");
    // Seed 55: the resource refuses effects in `token` mode.
    let output = simulate(&[
        "--seed",
        "55",
        "--svg",
        svg_path.to_str().unwrap(),
        "--png",
        png_path.to_str().unwrap(),
    ]);
    let table = String::from_utf8(output.stdout).unwrap();
    let refused: u64 = table
        .lines()
        .find(|line| line.starts_with("token"))
        .and_then(|line| line.split_whitespace().nth(8))
        .and_then(|count| count.parse().ok())
        .unwrap();
    assert!(refused > 0, "{table}");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    // A time axis with its unit under each of the four panels.
    assert_eq!(svg.matches("time (s)</text>").count(), 4, "a time axis per mode");
    // Each site's lane names its skew, with a true minus sign for a site behind.
    assert!(svg.contains("site-0  skew "), "skews are labelled");
    assert!(svg.contains("skew \u{2212}"), "seed 55 has a site behind");
    // Each refusal of the resource is drawn (and only in token mode, which has them).
    assert_eq!(
        svg.matches("<title>REFUSED by the resource").count() as u64,
        refused,
        "every refusal is drawn"
    );
    // Effects say their agent, in its colour; every legend swatch comes before its text.
    assert!(svg.contains(r##"fill="#4c78a8" stroke="#222222" stroke-width="0.8"><title>agent-0"##));
    assert!(svg.contains(r##"fill="#b279a2" stroke="#222222" stroke-width="0.8"><title>agent-1"##));
    let legend = &svg[svg.rfind("<g font-size=\"11\" transform").unwrap()..];
    for element in legend.split('<').filter(|element| element.starts_with("text ")) {
        let x: f64 = element
            .split("x=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            x > 10.0,
            "text at the left edge: a swatch must come before it: {element}"
        );
    }
    let png = std::fs::read(&png_path).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    let options = resvg::usvg::Options::default();
    let size = resvg::usvg::Tree::from_str(&svg, &options)
        .unwrap()
        .size()
        .to_int_size();
    // The PNG's width and height (its IHDR chunk) are the SVG's.
    assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), size.width());
    assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), size.height());
}
