//! The architecture invariants of ARCHITECTURE.md, checked on the sources (issue 38, item 3):
//!
//! * the module tree is the folder tree: no `#[path]` in either crate's `src/`;
//! * the library's layers: `core` imports nothing from `edge` or `tools`, `edge` nothing from
//!   `tools` (a root module that `lib.rs` re-exports counts as the layer it comes from; the
//!   `clock` facade, which joins the core's time and the edge's reads of the OS clock, as `edge`);
//! * the CLI's modules import each other without a cycle (`main.rs` declares them; none imports
//!   from it).
//!
//! Each violation is named with its file and line. The checker is tried on planted violations
//! too, so that it is known to find them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A source file: its path relative to its crate's `src/`, and its text.
struct Source {
    path: String,
    text: String,
}

fn sources(src: &Path) -> Vec<Source> {
    let mut found = Vec::new();
    let mut folders = vec![src.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                found.push(Source {
                    path: path
                        .strip_prefix(src)
                        .unwrap()
                        .to_string_lossy()
                        .replace('\\', "/"),
                    text: std::fs::read_to_string(&path).unwrap(),
                });
            }
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// The text with comments blanked (line structure kept): doc links may point anywhere.
fn code_of(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_string = false;
        let mut previous = ' ';
        let mut cut = line.len();
        for (index, character) in line.char_indices() {
            if character == '"' && previous != '\\' {
                in_string = !in_string;
            }
            if !in_string && character == '/' && previous == '/' {
                cut = index - 1;
                break;
            }
            previous = character;
        }
        code.push_str(&line[..cut]);
        code.push('\n');
    }
    code
}

/// A path into the crate's root: the first segment after `crate::` (or each first segment of a
/// `crate::{…}` group), with its line (1-based).
fn crate_references(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let line_of = |offset: usize| code[..offset].matches('\n').count() + 1;
    let mut from = 0;
    while let Some(at) = code[from..].find("crate::") {
        let start = from + at;
        from = start + "crate::".len();
        let before = code[..start].chars().next_back();
        if before.is_some_and(|character| character.is_alphanumeric() || character == '_') {
            continue; // `my_crate::`, not this crate
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut segment_start = true;
            let mut offset = from + 1;
            for (index, character) in group.char_indices() {
                match character {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => segment_start = true,
                    character if segment_start && (character.is_alphabetic() || character == '_') => {
                        segment_start = false;
                        let name: String = group[index..]
                            .chars()
                            .take_while(|character| character.is_alphanumeric() || *character == '_')
                            .collect();
                        found.push((name, line_of(from + 1 + index)));
                    }
                    _ => {}
                }
                offset = from + 1 + index;
            }
            from = offset;
        } else {
            let name: String = rest
                .chars()
                .take_while(|character| character.is_alphanumeric() || *character == '_')
                .collect();
            if !name.is_empty() {
                found.push((name, line_of(start)));
            }
        }
    }
    found
}

/// The layers, lowest first.
const LAYERS: [&str; 3] = ["core", "edge", "tools"];

/// The layer of each root name of the library, from `lib.rs`: the layers themselves, the modules
/// it re-exports from one, and a facade module (`pub mod NAME { … }`) as the highest layer it
/// re-exports from.
fn root_layers(lib: &str) -> BTreeMap<String, usize> {
    let code = code_of(lib);
    let mut layers: BTreeMap<String, usize> = LAYERS
        .iter()
        .enumerate()
        .map(|(layer, name)| ((*name).to_owned(), layer))
        .collect();
    for statement in code.split(';') {
        let statement = statement.trim();
        let Some(at) = statement.find("use crate::") else {
            continue;
        };
        let path = &statement[at + "use crate::".len()..];
        let Some(layer) = LAYERS
            .iter()
            .position(|name| path.starts_with(&format!("{name}::")))
        else {
            continue;
        };
        let names = &path[LAYERS[layer].len() + 2..];
        if names.contains("::") {
            continue; // inside a facade: `crate::core::clock::{…}`
        }
        for name in names
            .trim_matches(|character| character == '{' || character == '}')
            .split(',')
        {
            let name = name.trim();
            if !name.is_empty() {
                layers.insert(name.to_owned(), layer);
            }
        }
    }
    let mut from = 0;
    while let Some(at) = code[from..].find("pub mod ") {
        let start = from + at + "pub mod ".len();
        let name: String = code[start..]
            .chars()
            .take_while(|character| character.is_alphanumeric() || *character == '_')
            .collect();
        let Some(open) = code[start + name.len()..]
            .find(|character: char| !character.is_whitespace())
            .filter(|open| code[start + name.len() + open..].starts_with('{'))
            .map(|open| name.len() + open)
        else {
            from = start;
            continue; // `pub mod NAME;`
        };
        let mut depth = 0;
        let close = code[start + open..]
            .char_indices()
            .find(|(_, character)| {
                match character {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map_or(code.len(), |(close, _)| start + open + close);
        let body = &code[start + open..close];
        let highest = LAYERS
            .iter()
            .enumerate()
            .filter(|(_, layer)| body.contains(&format!("crate::{layer}::")))
            .map(|(layer, _)| layer)
            .max();
        if let Some(layer) = highest {
            layers.insert(name, layer);
        }
        from = close;
    }
    layers
}

/// The violations of the library's layer rules in `files` (paths relative to `src/`).
fn layer_violations(lib: &str, files: &[Source]) -> Vec<String> {
    let layers = root_layers(lib);
    let mut violations = Vec::new();
    for file in files {
        let Some(layer) = LAYERS
            .iter()
            .position(|name| file.path.starts_with(&format!("{name}/")))
        else {
            continue; // lib.rs: the root joins the layers
        };
        let code = code_of(&file.text);
        for (name, line) in crate_references(&code) {
            match layers.get(&name) {
                Some(used) if *used > layer => violations.push(format!(
                    "src/{}:{line}: `{}` imports `crate::{name}`, of the layer `{}`",
                    file.path, LAYERS[layer], LAYERS[*used]
                )),
                Some(_) => {}
                None => violations.push(format!(
                    "src/{}:{line}: `crate::{name}`: no layer known for it (re-export it in lib.rs from its layer)",
                    file.path
                )),
            }
        }
    }
    violations
}

/// Every `#[path]` attribute in `files`.
fn path_attributes(crate_name: &str, files: &[Source]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        for (index, line) in code_of(&file.text).lines().enumerate() {
            if line.trim_start().starts_with("#[path") {
                found.push(format!(
                    "{crate_name}/src/{}:{}: a #[path] attribute (the module tree is the folder tree)",
                    file.path,
                    index + 1
                ));
            }
        }
    }
    found
}

/// The import cycles among the CLI's modules (each file of `src/` but `main.rs` a module named
/// after it): one message per cycle found, naming each import with its file and line.
fn cli_cycles(files: &[Source]) -> Vec<String> {
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|file| file.path.strip_suffix(".rs"))
        .filter(|name| !name.contains('/'))
        .map(str::to_owned)
        .collect();
    // module -> (imported module -> the first line that imports it); `main` declares each.
    let mut imports: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    if let Some(main) = files.iter().find(|file| file.path == "main.rs") {
        for (index, line) in code_of(&main.text).lines().enumerate() {
            let declared = line.trim_start().strip_prefix("mod ").or_else(|| {
                line.trim_start()
                    .strip_prefix("pub mod ")
                    .or_else(|| line.trim_start().strip_prefix("pub(crate) mod "))
            });
            if let Some(name) = declared.and_then(|rest| rest.strip_suffix(';')) {
                imports
                    .entry("main".to_owned())
                    .or_default()
                    .insert(name.trim().to_owned(), index + 1);
            }
        }
    }
    for file in files {
        let module = file
            .path
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_owned();
        let code = code_of(&file.text);
        for (name, line) in crate_references(&code) {
            let target = if modules.contains(&name) {
                name
            } else {
                "main".to_owned()
            };
            if target != module {
                imports
                    .entry(module.clone())
                    .or_default()
                    .entry(target)
                    .or_insert(line);
            }
        }
    }
    let mut cycles = Vec::new();
    let mut reported = BTreeSet::new();
    for start in imports.keys() {
        // A path back to `start`, breadth first.
        let mut queue = std::collections::VecDeque::from([vec![start.clone()]]);
        let mut seen = BTreeSet::new();
        while let Some(path) = queue.pop_front() {
            let last = path.last().unwrap();
            for next in imports.get(last).map(|next| next.keys()).into_iter().flatten() {
                if next == start {
                    let mut members: Vec<String> = path.clone();
                    members.sort();
                    if reported.insert(members) {
                        let mut closed = path.clone();
                        closed.push(start.clone());
                        let steps: Vec<String> = closed
                            .windows(2)
                            .map(|pair| {
                                let line = imports[&pair[0]][&pair[1]];
                                format!("{}.rs:{line} imports {}", pair[0], pair[1])
                            })
                            .collect();
                        cycles.push(format!("an import cycle: {}", steps.join(", ")));
                    }
                } else if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    queue.push_back(longer);
                }
            }
        }
    }
    cycles
}

fn library_sources() -> (String, Vec<Source>) {
    let src = workspace().join("crates/fencepost/src");
    (
        std::fs::read_to_string(src.join("lib.rs")).unwrap(),
        sources(&src),
    )
}

#[test]
fn layers_the_module_tree_is_the_folder_tree() {
    let (_, library) = library_sources();
    let cli = sources(&workspace().join("crates/fencepost-cli/src"));
    assert!(library.len() > 40 && cli.len() > 5, "the sources were not read");
    let mut found = path_attributes("crates/fencepost", &library);
    found.extend(path_attributes("crates/fencepost-cli", &cli));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn layers_core_imports_nothing_from_edge_or_tools_and_edge_nothing_from_tools() {
    let (lib, library) = library_sources();
    let layers = root_layers(&lib);
    for (name, layer) in [
        ("lease", 0),
        ("fold", 0),
        ("ledger", 1),
        ("clock", 1),
        ("simulate", 2),
    ] {
        assert_eq!(
            layers.get(name),
            Some(&layer),
            "lib.rs was not read as expected: {layers:?}"
        );
    }
    let violations = layer_violations(&lib, &library);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn layers_the_cli_has_no_import_cycle() {
    let cli = sources(&workspace().join("crates/fencepost-cli/src"));
    let cycles = cli_cycles(&cli);
    assert!(cycles.is_empty(), "{}", cycles.join("\n"));
}

/// The checker finds what it is for: an `edge` import added to the core, a `tools` import in
/// the edge, a `#[path]`, an unknown root name, and a cycle of the CLI.
#[test]
fn layers_the_checker_names_planted_violations_with_their_file_and_line() {
    let (lib, mut library) = library_sources();
    let fold = library
        .iter_mut()
        .find(|file| file.path == "core/fold.rs")
        .expect("core/fold.rs");
    fold.text = format!("use crate::edge::ledger::Ledger;\n{}", fold.text);
    let keeper = library
        .iter_mut()
        .find(|file| file.path == "edge/keeper.rs")
        .expect("edge/keeper.rs");
    keeper
        .text
        .push_str("\nfn planted() {\n    let _ = crate::{simulate::Config, lease::Lease};\n}\n");
    let oplog = library
        .iter_mut()
        .find(|file| file.path == "core/oplog.rs")
        .expect("core/oplog.rs");
    oplog.text.push_str(
        "\n// crate::ledger in a comment is no import\nuse crate::{\n    clock::Hlc,\n    unheard_of,\n};\n",
    );
    let lines = |file: &Source| file.text.lines().count();
    let (keeper_lines, oplog_lines) = (
        lines(library.iter().find(|file| file.path == "edge/keeper.rs").unwrap()),
        lines(library.iter().find(|file| file.path == "core/oplog.rs").unwrap()),
    );
    let violations = layer_violations(&lib, &library);
    assert_eq!(
        violations,
        vec![
            "src/core/fold.rs:1: `core` imports `crate::edge`, of the layer `edge`".to_owned(),
            format!(
                "src/core/oplog.rs:{}: `core` imports `crate::clock`, of the layer `edge`",
                oplog_lines - 2
            ),
            format!(
                "src/core/oplog.rs:{}: `crate::unheard_of`: no layer known for it (re-export it in lib.rs from its layer)",
                oplog_lines - 1
            ),
            format!(
                "src/edge/keeper.rs:{}: `edge` imports `crate::simulate`, of the layer `tools`",
                keeper_lines - 1
            ),
        ]
    );
    let planted = [Source {
        path: "relay.rs".to_owned(),
        text: "#[path = \"other.rs\"]\nmod relay;\n".to_owned(),
    }];
    assert_eq!(
        path_attributes("x", &planted),
        vec!["x/src/relay.rs:1: a #[path] attribute (the module tree is the folder tree)"]
    );
    let cli = [
        Source {
            path: "main.rs".to_owned(),
            text: "mod a;\nmod b;\nfn main() { a::go() }\n".to_owned(),
        },
        Source {
            path: "a.rs".to_owned(),
            text: "use crate::b::helper;\n".to_owned(),
        },
        Source {
            path: "b.rs".to_owned(),
            text: "\n\nuse crate::{a::go, EXIT_OK};\n".to_owned(),
        },
    ];
    let cycles = cli_cycles(&cli);
    assert!(
        cycles.contains(&"an import cycle: a.rs:1 imports b, b.rs:3 imports a".to_owned()),
        "{cycles:?}"
    );
    assert!(
        cycles.contains(&"an import cycle: b.rs:3 imports main, main.rs:2 imports b".to_owned()),
        "{cycles:?}"
    );
}
