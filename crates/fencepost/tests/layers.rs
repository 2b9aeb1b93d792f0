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

use syn::visit::Visit;

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

/// What a file's code says, parsed with `syn` (comments and doc links are no code): the name
/// after `crate::` of each path into the crate (`crate::{a, b}` names both; in a macro's tokens
/// too), the modules it declares without a body, and its `#[path]` attributes, each with its
/// line.
#[derive(Debug, Default)]
struct Parsed {
    crate_references: Vec<(String, usize)>,
    declared_modules: Vec<(String, usize)>,
    path_attributes: Vec<usize>,
}

fn parse(path: &str, text: &str) -> Parsed {
    let tree = syn::parse_file(text).unwrap_or_else(|error| panic!("{path}: cannot be parsed: {error}"));
    let mut parsed = Parsed::default();
    parsed.visit_file(&tree);
    parsed
}

fn line_of(span: proc_macro2::Span) -> usize {
    span.start().line
}

/// Every path a use tree names, as its segments (`use crate::core::{fence, fold}` is
/// `crate::core::fence` and `crate::core::fold`), each segment with its line.
fn use_paths(tree: &syn::UseTree) -> Vec<Vec<(String, usize)>> {
    match tree {
        syn::UseTree::Path(path) => use_paths(&path.tree)
            .into_iter()
            .map(|mut rest| {
                rest.insert(0, (path.ident.to_string(), line_of(path.ident.span())));
                rest
            })
            .collect(),
        syn::UseTree::Name(name) => vec![vec![(name.ident.to_string(), line_of(name.ident.span()))]],
        syn::UseTree::Rename(rename) => {
            vec![vec![(rename.ident.to_string(), line_of(rename.ident.span()))]]
        }
        syn::UseTree::Glob(_) => vec![Vec::new()],
        syn::UseTree::Group(group) => group.items.iter().flat_map(use_paths).collect(),
    }
}

impl Parsed {
    /// `crate :: NAME` in a macro's tokens (`crate::exit::usage!`'s arguments, `$crate::…`).
    fn scan_tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let tokens: Vec<proc_macro2::TokenTree> = tokens.into_iter().collect();
        for (index, token) in tokens.iter().enumerate() {
            if let proc_macro2::TokenTree::Group(group) = token {
                self.scan_tokens(group.stream());
            }
            let window = tokens.get(index..index + 4);
            if let Some(
                [proc_macro2::TokenTree::Ident(first), proc_macro2::TokenTree::Punct(colon), proc_macro2::TokenTree::Punct(_), proc_macro2::TokenTree::Ident(name)],
            ) = window
            {
                if first == "crate"
                    && colon.as_char() == ':'
                    && colon.spacing() == proc_macro2::Spacing::Joint
                {
                    self.crate_references
                        .push((name.to_string(), line_of(name.span())));
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Parsed {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        let mut segments = path.segments.iter();
        if let (Some(first), Some(second)) = (segments.next(), segments.next()) {
            if first.ident == "crate" {
                self.crate_references
                    .push((second.ident.to_string(), line_of(second.ident.span())));
            }
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        for path in use_paths(&item.tree) {
            if let [(first, _), (name, line), ..] = path.as_slice() {
                if first == "crate" {
                    self.crate_references.push((name.clone(), *line));
                }
            }
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        for attribute in &item.attrs {
            if attribute.path().is_ident("path") {
                self.path_attributes.push(line_of(attribute.pound_token.span));
            }
        }
        if item.content.is_none() {
            self.declared_modules
                .push((item.ident.to_string(), line_of(item.ident.span())));
        }
        syn::visit::visit_item_mod(self, item);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.scan_tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}

/// The layers, lowest first.
const LAYERS: [&str; 3] = ["core", "edge", "tools"];

/// The layer of each root name of the library, from `lib.rs`: the layers themselves, the modules
/// it re-exports from one (`pub use crate::core::{fence, …}`), and a facade module
/// (`pub mod NAME { … }`) as the highest layer it re-exports from.
fn root_layers(lib: &str) -> BTreeMap<String, usize> {
    let tree = syn::parse_file(lib).expect("lib.rs parses");
    let layer_of = |name: &str| LAYERS.iter().position(|layer| *layer == name);
    let mut layers: BTreeMap<String, usize> = LAYERS
        .iter()
        .enumerate()
        .map(|(layer, name)| ((*name).to_owned(), layer))
        .collect();
    for item in &tree.items {
        match item {
            syn::Item::Use(item) => {
                for path in use_paths(&item.tree) {
                    if let [(root, _), (layer, _), (name, _)] = path.as_slice() {
                        if let (true, Some(layer)) = (root == "crate", layer_of(layer)) {
                            layers.insert(name.clone(), layer);
                        }
                    }
                }
            }
            syn::Item::Mod(item) if item.content.is_some() => {
                let mut facade = Parsed::default();
                facade.visit_item_mod(item);
                let highest = facade
                    .crate_references
                    .iter()
                    .filter_map(|(name, _)| layer_of(name))
                    .max();
                if let Some(layer) = highest {
                    layers.insert(item.ident.to_string(), layer);
                }
            }
            _ => {}
        }
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
        for (name, line) in parse(&file.path, &file.text).crate_references {
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
        for line in parse(&file.path, &file.text).path_attributes {
            found.push(format!(
                "{crate_name}/src/{}:{line}: a #[path] attribute (the module tree is the folder tree)",
                file.path
            ));
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
        for (name, line) in parse(&main.path, &main.text).declared_modules {
            imports.entry("main".to_owned()).or_default().insert(name, line);
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
        for (name, line) in parse(&file.path, &file.text).crate_references {
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
    fold.text.push_str("use crate::edge::ledger::Ledger;\n");
    let keeper = library
        .iter_mut()
        .find(|file| file.path == "edge/keeper.rs")
        .expect("edge/keeper.rs");
    keeper.text.push_str(
        "\nfn planted() {\n    let _ = (crate::simulate::Config::new(), crate::lease::Lease::new());\n}\n",
    );
    let oplog = library
        .iter_mut()
        .find(|file| file.path == "core/oplog.rs")
        .expect("core/oplog.rs");
    oplog.text.push_str(
        "\n// crate::ledger in a comment is no import\nuse crate::{\n    clock::Hlc,\n    unheard_of,\n};\n",
    );
    let lines = |file: &Source| file.text.lines().count();
    let (fold_lines, keeper_lines, oplog_lines) = (
        lines(library.iter().find(|file| file.path == "core/fold.rs").unwrap()),
        lines(library.iter().find(|file| file.path == "edge/keeper.rs").unwrap()),
        lines(library.iter().find(|file| file.path == "core/oplog.rs").unwrap()),
    );
    let violations = layer_violations(&lib, &library);
    assert_eq!(
        violations,
        vec![
            format!("src/core/fold.rs:{fold_lines}: `core` imports `crate::edge`, of the layer `edge`"),
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
