//! The shape ARCHITECTURE.md promises, checked against the source:
//!
//! - no import cycle between the library's modules (a module is `src/x.rs`
//!   with everything under `src/x/`; an edge is any `crate::x` path in code,
//!   comments excluded), so every step of the read path uses only the steps
//!   below it;
//! - the files one read passes through, as ARCHITECTURE.md lists them: at
//!   most 8, each once, each a file that exists.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`lib` for `src/lib.rs`).
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The code of a file without its comments (line comments, doc comments).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules `code` names: `crate::x` and `use crate::{x, y::z}`.
fn named_modules(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name = ident(item.trim());
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name = ident(after);
            if !name.is_empty() {
                out.insert(name);
            }
        }
        rest = after;
    }
    out
}

fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let module = module_of(&src, &file);
        let text = std::fs::read_to_string(&file).unwrap();
        let edges = graph.entry(module.clone()).or_default();
        for named in named_modules(&code(&text)) {
            if named != module && named != "self" {
                edges.insert(named);
            }
        }
    }
    // `lib.rs` declares and re-exports everything: it is the root, not a step.
    graph.remove("lib");
    graph
}

/// A cycle in `graph`, if there is one (as the path around it).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path.iter().position(|n| n == node).unwrap();
                let mut cycle = path[start..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn the_library_has_no_import_cycle() {
    let graph = module_graph();
    assert!(graph.len() > 10, "the scan found the modules: {graph:?}");
    assert!(
        graph["upstream"].contains("dedup") && graph["request"].contains("upstream"),
        "the scan sees `use crate::…` edges: {graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle in src/: {}", cycle.join(" → "));
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    graph.entry("c".into()).or_default();
    assert_eq!(find_cycle(&graph), None);
    graph.get_mut("c").unwrap().insert("a".into());
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let code = code("use crate::{a, b::C};\n// crate::doc\nlet x = crate::c::f();");
    let named: Vec<_> = named_modules(&code).into_iter().collect();
    assert_eq!(named, ["a", "b", "c"]);
}

/// The files ARCHITECTURE.md's walk lists: the numbered items of its
/// "files one read passes through" section, each naming its file first.
fn walk_files() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("The files one read passes through"))
        .expect("ARCHITECTURE.md has the section");
    section
        .lines()
        .filter(|line| line.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .filter_map(|line| {
            let start = line.find('`')? + 1;
            let end = start + line[start..].find('`')?;
            Some(line[start..end].to_string())
        })
        .collect()
}

#[test]
fn one_read_passes_through_at_most_eight_files_each_once() {
    let files = walk_files();
    assert!(files.len() >= 5, "the walk lists its files: {files:?}");
    assert!(files.len() <= 8, "{} files: {files:?}", files.len());
    let unique: BTreeSet<_> = files.iter().collect();
    assert_eq!(unique.len(), files.len(), "a file listed twice: {files:?}");
    for file in &files {
        assert!(root().join(file).is_file(), "{file} does not exist");
    }
}
