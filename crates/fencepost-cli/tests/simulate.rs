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
    // A SQLite coordinator gives the same outcome as the in-memory one.
    assert_eq!(
        simulate(&["--seed", "44", "--sqlite"]).stdout,
        simulate(&["--seed", "44"]).stdout
    );
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
