//! `docs/RULES.md` stays true (issue 15, item 6): every rule in its table is named by a test of
//! the workspace (a test of rule L5 is called `l5_…`, or `…_l5_…` when it checks several), and
//! every test the table names exists.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.push(path);
        }
    }
}

/// The names of the functions the workspace's tests define or run: `fn name` in the test
/// folders, in the conformance suite (whose checks the coordinator tests run), in
/// `#[cfg(test)]` modules of the sources and in their `tests.rs` files.
fn test_functions() -> BTreeSet<String> {
    let mut files = Vec::new();
    for krate in ["fencepost", "fencepost-cli"] {
        sources(&workspace().join("crates").join(krate).join("tests"), &mut files);
        sources(&workspace().join("crates").join(krate).join("src"), &mut files);
    }
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let suite = file.ends_with("src/tools/conformance/mod.rs");
        // A test folder, or a module's tests in a file of their own (`roster/tests.rs`).
        let in_tests = file.components().any(|part| part.as_os_str() == "tests")
            || file.file_name().is_some_and(|name| name == "tests.rs");
        // In other sources, only what follows a `#[cfg(test)]` counts.
        let from = if suite || in_tests {
            0
        } else {
            match text.find("#[cfg(test)]") {
                Some(at) => at,
                None => continue,
            }
        };
        for piece in text[from..].split("fn ").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|character| character.is_ascii_alphanumeric() || *character == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

/// The table's rows: the rule id and the backquoted names in its last column.
fn rules() -> Vec<(String, Vec<String>)> {
    let text = std::fs::read_to_string(workspace().join("docs/RULES.md")).unwrap();
    text.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // "| L1 | statement | enforced by | checked by |" splits into 6 cells.
            let id = *cells.get(1)?;
            let is_rule = id.len() == 2
                && id.starts_with(|character: char| character.is_ascii_uppercase())
                && id.ends_with(|character: char| character.is_ascii_digit());
            if !is_rule || cells.len() != 6 {
                return None;
            }
            let tests = cells[4]
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect();
            Some((id.to_owned(), tests))
        })
        .collect()
}

#[test]
fn every_rule_in_rules_md_is_named_by_a_test_and_every_test_it_names_exists() {
    let functions = test_functions();
    let rules = rules();
    assert!(
        rules.len() >= 22,
        "the table of docs/RULES.md was not read: {rules:?}"
    );
    let mut problems = Vec::new();
    for (id, named) in &rules {
        let prefix = format!("{}_", id.to_lowercase());
        let infix = format!("_{prefix}");
        if !functions
            .iter()
            .any(|name| name.starts_with(&prefix) || name.contains(&infix))
        {
            problems.push(format!(
                "rule {id} is named by no test (no fn {prefix}… anywhere)"
            ));
        }
        if named.is_empty() {
            problems.push(format!("rule {id} lists no test"));
        }
        for test in named {
            if !functions.contains(test) {
                problems.push(format!("rule {id} names {test}, which no test defines"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/RULES.md is out of step:\n{}",
        problems.join("\n")
    );
}
