//! The architecture, checked against the code.
//!
//! The source is read as text into a [`Tree`] (each `.rs` file's path under
//! `src/` and its text); every rule is a function over a tree, run on the real
//! `src/` and, at the bottom, on copies of it with a violation planted, to show
//! that each rule can fail and says where.
//!
//! **Modules.** A module's children are its files: `name.rs` with everything
//! under `name/`, or `name/mod.rs` with everything under `name/`. The module's
//! own file (`lib.rs`, `read/mod.rs`, `memory.rs`, …) is a node of its level
//! too, shown as `<read/mod.rs>`. An inline `mod tests { … }` belongs to the
//! file it is written in.
//!
//! **What code names.** A file names a module when a path in its code resolves
//! into it: a `use` tree (nested braces, `self`, `as`, globs, `pub(crate) use`)
//! or a path in an expression, a type, a trait or an attribute, written
//! `crate::a::b`, `super::b` (`super::super::…`), `self::b`, or a bare `b::…`
//! where `b` is a child of the module the code is in. Comments (doc comments
//! included), string literals (raw strings included) and char literals are not
//! code. A name a `use` binds is followed where it leads, so `crate::X`
//! re-exported by `lib.rs` from `request` names `request` too (rules 2 and 3).
//!
//! **The rules.**
//! 1. No import cycle at any level: for every module with children, the graph
//!    of its children and its own file, with an edge A → B when code in A
//!    names B (naming an item of the module's own file is an edge to that
//!    file), has no cycle. A cycle is reported with the file and line of each
//!    edge.
//! 2. The read path is a hub and spokes. The hub is `read/mod.rs` and the
//!    hub's own child (`HUB`: `read/hub.rs` and every file under
//!    `read/hub/`, the steps that bring several spokes together); every
//!    other child of `src/read/` is a spoke. No spoke names a sibling, the
//!    hub's child or the hub `read/mod.rs`, except that every spoke may name
//!    a vocabulary file (`VOCABULARY`: the read's data types), which itself
//!    names no sibling. The hub may name every spoke (and rule 1 keeps
//!    `read/mod.rs` from naming its own child's items: that child names
//!    `read/mod.rs`'s).
//! 3. Nothing under `src/read/` names the GraphQL layer (`GRAPHQL_LAYER`) or
//!    `async_graphql`.
//! 4. Every file ARCHITECTURE.md names in backticks exists, and every file
//!    under `src/read/` is mentioned in ARCHITECTURE.md.
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// The files of the read path that hold its data types (`Read`,
/// `UpstreamResponse`): every spoke may name them; they name no sibling.
const VOCABULARY: &[&str] = &["message"];

/// The child of `src/read/` that is the hub's own (with `read/mod.rs`): its
/// files may name every spoke; no spoke names them.
const HUB: &[&str] = &["hub"];

/// The modules above the read path, which nothing under `src/read/` names.
const GRAPHQL_LAYER: &[&str] = &["graphql", "request", "engine", "document", "cost"];

/// Where a path in ARCHITECTURE.md starts from the repository's root.
const TOP_LEVEL_DIRS: &[&str] = &[
    "src/",
    "tests/",
    "benches/",
    "gateway/",
    "testkit/",
    "examples/",
];

/// A source tree: each `.rs` file's path relative to `src/`, and its text.
type Tree = BTreeMap<PathBuf, String>;

// ---------------------------------------------------------------------------
// The rules, on the real tree.

#[test]
fn the_scan_sees_the_code() {
    let tree = real_tree();
    for file in ["lib.rs", "read/mod.rs"] {
        assert!(tree.contains_key(Path::new(file)), "src/{file} was read");
    }
    let scan = Scan::of(&tree);
    let root = level_graph(&scan, &[]);
    let edges: usize = root.values().map(BTreeMap::len).sum();
    assert!(
        edges >= 10,
        "the top-level modules name each other:\n{}",
        outline(&root)
    );
    let read = level_graph(&scan, &["read".to_string()]);
    assert!(
        read["<read/mod.rs>"].len() >= 2,
        "the hub names its spokes:\n{}",
        outline(&read)
    );
}

#[test]
fn no_import_cycle_at_any_level() {
    assert_none("import cycles in src/", import_cycles(&real_tree()));
}

#[test]
fn the_read_path_is_a_hub_and_spokes() {
    assert_none(
        "spokes of src/read/ naming a sibling or the hub",
        spoke_violations(&real_tree()),
    );
}

#[test]
fn the_read_path_does_not_use_the_graphql_layer() {
    assert_none(
        "src/read/ naming the GraphQL layer",
        graphql_layer_violations(&real_tree()),
    );
}

#[test]
fn architecture_md_names_files_that_exist_and_every_file_of_the_read_path() {
    let architecture = std::fs::read_to_string(repository().join("ARCHITECTURE.md")).unwrap();
    assert_none(
        "ARCHITECTURE.md and the files",
        documentation_violations(&architecture, &files_under(&repository())),
    );
}

fn assert_none(rule: &str, violations: Vec<String>) {
    assert!(
        violations.is_empty(),
        "{rule}: {} violation(s)\n\n{}\n",
        violations.len(),
        violations.join("\n\n")
    );
}

// ---------------------------------------------------------------------------
// Rule 1: no import cycle at any level.

/// Every import cycle among the children (and own file) of a module, at
/// every level of the tree.
fn import_cycles(tree: &Tree) -> Vec<String> {
    let scan = Scan::of(tree);
    let mut violations = Vec::new();
    for level in scan.modules.children.keys() {
        let graph = level_graph(&scan, level);
        for component in cyclic_components(&graph) {
            violations.push(describe_cycle(level, &graph, &component));
        }
    }
    violations
}

/// One level's nodes, each with the nodes it names and where.
type Graph = BTreeMap<String, BTreeMap<String, Vec<Site>>>;

/// The graph of a module's children and its own file: A → B when code in A
/// names B.
fn level_graph(scan: &Scan, level: &[String]) -> Graph {
    let own_file = scan.modules.own_file(level);
    let node_of = |path: &[String]| -> Option<String> {
        if !path.starts_with(level) {
            return None;
        }
        match path.get(level.len()) {
            Some(child) if scan.modules.has_child(level, child) => Some(child.clone()),
            _ => Some(own_file.clone()),
        }
    };
    let mut graph: Graph = scan.modules.children[level]
        .iter()
        .chain([&own_file])
        .map(|node| (node.clone(), BTreeMap::new()))
        .collect();
    for reference in &scan.references {
        let from = node_of(&module_of(&reference.site.file));
        let to = node_of(&reference.path);
        if let (Some(from), Some(to)) = (from, to) {
            if from != to {
                let sites = graph.get_mut(&from).unwrap().entry(to).or_default();
                sites.push(reference.site.clone());
            }
        }
    }
    graph
}

/// The sets of nodes that reach each other (strongly connected, more than one).
fn cyclic_components(graph: &Graph) -> Vec<BTreeSet<String>> {
    let reach: BTreeMap<&String, BTreeSet<&String>> = graph
        .keys()
        .map(|node| (node, reachable_from(graph, node)))
        .collect();
    let mut placed = BTreeSet::new();
    let mut components = Vec::new();
    for node in graph.keys() {
        if placed.contains(node) {
            continue;
        }
        let component: BTreeSet<String> = graph
            .keys()
            .filter(|other| {
                *other == node || (reach[node].contains(other) && reach[other].contains(node))
            })
            .cloned()
            .collect();
        if component.len() > 1 {
            placed.extend(component.iter().cloned());
            components.push(component);
        }
    }
    components
}

/// Each node of a graph and the nodes it names, a line each.
fn outline(graph: &Graph) -> String {
    let lines: Vec<String> = graph
        .iter()
        .map(|(node, names)| format!("{node} → {:?}", names.keys().collect::<Vec<_>>()))
        .collect();
    lines.join("\n")
}

/// The nodes reachable from `start` by one edge or more.
fn reachable_from<'g>(graph: &'g Graph, start: &String) -> BTreeSet<&'g String> {
    let mut seen = BTreeSet::new();
    let mut pending: Vec<&String> = graph[start].keys().collect();
    while let Some(node) = pending.pop() {
        if seen.insert(node) {
            pending.extend(graph[node].keys());
        }
    }
    seen
}

/// A shortest way around a component, from its first node back to it.
fn shortest_cycle(graph: &Graph, component: &BTreeSet<String>) -> Vec<String> {
    let start = component.first().unwrap();
    let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for next in graph[node].keys().filter(|next| component.contains(*next)) {
            if next == start {
                let mut way_back = vec![node];
                while *way_back.last().unwrap() != start {
                    way_back.push(came_from[way_back.last().unwrap()]);
                }
                let mut cycle: Vec<String> = way_back.into_iter().rev().cloned().collect();
                cycle.push(start.clone());
                return cycle;
            }
            if !came_from.contains_key(next) {
                came_from.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    unreachable!("a component of a cycle leads back to its start")
}

fn describe_cycle(level: &[String], graph: &Graph, component: &BTreeSet<String>) -> String {
    let where_ = if level.is_empty() {
        "`crate` (src/)".to_string()
    } else {
        format!("`crate::{}` (src/{}/)", level.join("::"), level.join("/"))
    };
    let cycle = shortest_cycle(graph, component);
    let mut text = format!(
        "import cycle among the modules of {where_}: {}\n  the edges between {}:",
        cycle.join(" → "),
        component.iter().cloned().collect::<Vec<_>>().join(", ")
    );
    for from in component {
        for (to, sites) in &graph[from] {
            if component.contains(to) {
                text.push_str(&format!("\n    {from} → {to}: {}", show_sites(sites)));
            }
        }
    }
    text
}

/// Sites, one per line of a file.
fn show_sites(sites: &[Site]) -> String {
    let mut seen = BTreeSet::new();
    sites
        .iter()
        .filter(|site| seen.insert((&site.file, site.line)))
        .map(Site::show)
        .collect::<Vec<_>>()
        .join(", ")
}

// ---------------------------------------------------------------------------
// Rule 2: the read path is a hub and spokes.

/// Every path by which a spoke of `src/read/` names a sibling or the hub.
fn spoke_violations(tree: &Tree) -> Vec<String> {
    let scan = Scan::of(tree);
    let mut violations = Vec::new();
    for reference in &scan.references {
        let module = module_of(&reference.site.file);
        let spoke = match module.as_slice() {
            [read, spoke, ..] if read == "read" && !HUB.contains(&spoke.as_str()) => spoke,
            _ => continue,
        };
        let followed = scan.follow_reexports(&reference.path);
        let problem = spoke_problem(&scan.modules, spoke, &reference.path).or_else(|| {
            spoke_problem(&scan.modules, spoke, &followed).map(|p| through(p, &followed))
        });
        if let Some(problem) = problem {
            violations.push(format!("{} — {problem}", reference.site.show()));
        }
    }
    violations
}

/// Why the spoke `spoke` may not name `path`, if it may not.
fn spoke_problem(modules: &Modules, spoke: &str, path: &[String]) -> Option<String> {
    let read = ["read".to_string()];
    if !path.starts_with(&read) {
        return None;
    }
    match path.get(1) {
        Some(target) if HUB.contains(&target.as_str()) => Some(format!(
            "the spoke `{spoke}` names the hub's `{target}`: the hub uses its spokes, never \
             the other way"
        )),
        Some(target) if modules.has_child(&read, target) => {
            let vocabulary = |name: &str| VOCABULARY.contains(&name);
            if target == spoke || (vocabulary(target) && !vocabulary(spoke)) {
                None
            } else {
                Some(format!(
                    "the spoke `{spoke}` names its sibling `{target}`: a spoke names no sibling \
                     (only the hub read/mod.rs brings spokes together; the read's data types \
                     belong in a vocabulary file: {VOCABULARY:?})"
                ))
            }
        }
        _ => Some(format!(
            "the spoke `{spoke}` names the hub read/mod.rs: the hub uses its spokes, never the \
             other way"
        )),
    }
}

fn through(problem: String, followed: &[String]) -> String {
    format!(
        "{problem} (through a re-export, to `crate::{}`)",
        followed.join("::")
    )
}

// ---------------------------------------------------------------------------
// Rule 3: nothing under src/read/ uses the GraphQL layer.

/// Every path by which code under `src/read/` names the GraphQL layer or
/// async-graphql.
fn graphql_layer_violations(tree: &Tree) -> Vec<String> {
    let scan = Scan::of(tree);
    let under_read = |file: &Path| file.starts_with("read");
    let mut violations = Vec::new();
    for reference in scan.references.iter().filter(|r| under_read(&r.site.file)) {
        let above = |path: &[String]| {
            path.first()
                .is_some_and(|top| GRAPHQL_LAYER.contains(&top.as_str()))
        };
        let followed = scan.follow_reexports(&reference.path);
        let problem = if above(&reference.path) {
            format!("names `crate::{}`", reference.path[0])
        } else if above(&followed) {
            through(format!("names `crate::{}`", followed[0]), &followed)
        } else {
            continue;
        };
        violations.push(format!(
            "{} — the read path {problem}, part of the GraphQL layer {GRAPHQL_LAYER:?}",
            reference.site.show()
        ));
    }
    for (file, tokens) in scan.tokens.iter().filter(|(file, _)| under_read(file)) {
        let mut lines = BTreeSet::new();
        for token in tokens {
            if let Kind::Ident(word) = &token.kind {
                if word.starts_with("async_graphql") && lines.insert(token.line) {
                    violations.push(format!(
                        "src/{}:{} `{word}` — the read path uses async-graphql",
                        file.display(),
                        token.line
                    ));
                }
            }
        }
    }
    violations
}

// ---------------------------------------------------------------------------
// Rule 4: ARCHITECTURE.md and the files.

/// Every file ARCHITECTURE.md names that does not exist, and every file of
/// the read path it does not mention. `repository` holds the repository's
/// files, relative to its root.
fn documentation_violations(architecture: &str, repository: &BTreeSet<PathBuf>) -> Vec<String> {
    let mut violations = Vec::new();
    for (line, span) in code_spans(architecture) {
        if names_a_file(&span) && !exists(&span, repository) {
            violations.push(format!(
                "ARCHITECTURE.md:{line} `{span}` — no such file or directory in the repository"
            ));
        }
    }
    let mut src_file_names: BTreeMap<&std::ffi::OsStr, usize> = BTreeMap::new();
    for file in repository.iter().filter(|f| f.starts_with("src")) {
        *src_file_names.entry(file.file_name().unwrap()).or_default() += 1;
    }
    for file in repository.iter().filter(|f| f.starts_with("src/read")) {
        let unique_name = src_file_names[file.file_name().unwrap()] == 1;
        let ways = ways_to_mention(file, unique_name);
        if !ways.iter().any(|way| mentions(architecture, way)) {
            let ways: Vec<String> = ways.iter().map(|way| format!("`{way}`")).collect();
            violations.push(format!(
                "{} — not mentioned in ARCHITECTURE.md (as {})",
                file.display(),
                ways.join(" or ")
            ));
        }
    }
    violations
}

/// The inline code spans of a Markdown text, with the line each starts on
/// (fenced code blocks are not read).
fn code_spans(markdown: &str) -> Vec<(usize, String)> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
        }
        prose.push('\n');
    }
    let chars: Vec<char> = prose.chars().collect();
    let backticks_at = |at: usize| chars[at..].iter().take_while(|c| **c == '`').count();
    let mut spans = Vec::new();
    let (mut at, mut line) = (0, 1);
    while at < chars.len() {
        match chars[at] {
            '\n' => {
                line += 1;
                at += 1;
            }
            '`' => {
                let opening = backticks_at(at);
                let mut end = at + opening;
                while end < chars.len() && !(chars[end] == '`' && backticks_at(end) == opening) {
                    end += if chars[end] == '`' {
                        backticks_at(end)
                    } else {
                        1
                    };
                }
                if end >= chars.len() {
                    at += opening; // backticks without a closing run are text
                    continue;
                }
                let content: String = chars[at + opening..end].iter().collect();
                spans.push((line, content.trim().to_string()));
                line += content.matches('\n').count();
                at = end + opening;
            }
            _ => at += 1,
        }
    }
    spans
}

/// Whether a code span looks like a source file (or a directory of them).
fn names_a_file(span: &str) -> bool {
    span.chars()
        .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
        && (span.len() > ".rs".len() && (span.ends_with(".rs") || span.ends_with(".lua"))
            || TOP_LEVEL_DIRS.iter().any(|dir| span.starts_with(dir)))
}

/// Whether `name` is a file or directory of the repository: from its root
/// when it starts with a top-level directory (`src/`, `tests/`, …), else
/// anywhere (`read/mod.rs`, `dedup.rs`).
fn exists(name: &str, repository: &BTreeSet<PathBuf>) -> bool {
    let wanted: Vec<&str> = name.split('/').filter(|part| !part.is_empty()).collect();
    let from_root = TOP_LEVEL_DIRS.iter().any(|dir| name.starts_with(dir));
    let matches = |parts: &[&str]| {
        if from_root {
            parts == wanted.as_slice()
        } else {
            parts.ends_with(&wanted)
        }
    };
    repository.iter().any(|file| {
        let parts: Vec<&str> = file.iter().map(|part| part.to_str().unwrap()).collect();
        // the file itself, or one of the directories it is in
        (1..=parts.len()).any(|n| matches(&parts[..n]))
    })
}

/// How ARCHITECTURE.md may mention a file: by its path from the root or any
/// tail of two parts or more (`src/read/budget.rs`, `read/budget.rs`), or by
/// its name alone when no other file of `src/` has it (`budget.rs`).
fn ways_to_mention(file: &Path, unique_name: bool) -> Vec<String> {
    let parts: Vec<&str> = file.iter().map(|part| part.to_str().unwrap()).collect();
    let shortest = if unique_name { 1 } else { 2 };
    (shortest..=parts.len())
        .rev()
        .map(|n| parts[parts.len() - n..].join("/"))
        .collect()
}

/// Whether `text` holds `name` as a whole path (not inside a longer one).
fn mentions(text: &str, name: &str) -> bool {
    let in_path = |c: char| c.is_alphanumeric() || "_-/".contains(c);
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].chars().next();
        !before.is_some_and(|c| in_path(c) || c == '.') && !after.is_some_and(in_path)
    })
}

// ---------------------------------------------------------------------------
// The tree: reading it, its modules, the paths its code names.

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The real `src/`.
fn real_tree() -> Tree {
    let src = repository().join("src");
    files_under(&src)
        .into_iter()
        .filter(|file| file.extension().is_some_and(|e| e == "rs"))
        .map(|file| {
            let text = std::fs::read_to_string(src.join(&file)).unwrap();
            (file, text)
        })
        .collect()
}

/// Every file under `dir`, relative to it (not those under `target/` or `.git/`).
fn files_under(dir: &Path) -> BTreeSet<PathBuf> {
    let mut files = BTreeSet::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        for entry in std::fs::read_dir(dir.join(&relative)).unwrap() {
            let entry = entry.unwrap();
            let path = relative.join(entry.file_name());
            if !entry.file_type().unwrap().is_dir() {
                files.insert(path);
            } else if entry.file_name() != "target" && entry.file_name() != ".git" {
                pending.push(path);
            }
        }
    }
    files
}

/// The module a file is: `lib.rs` → `[]`, `read/mod.rs` → `[read]`,
/// `read/budget.rs` → `[read, budget]`.
fn module_of(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let name = parts.pop().unwrap();
    let stem = name.trim_end_matches(".rs");
    let root = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !root {
        parts.push(stem.to_string());
    }
    parts
}

/// The modules of a tree.
struct Modules {
    /// Each module's own file (`[read]` → `read/mod.rs`).
    files: BTreeMap<Vec<String>, PathBuf>,
    /// Each module with children, and their names.
    children: BTreeMap<Vec<String>, BTreeSet<String>>,
}

impl Modules {
    fn of(tree: &Tree) -> Modules {
        let mut modules = Modules {
            files: BTreeMap::new(),
            children: BTreeMap::new(),
        };
        for file in tree.keys() {
            let module = module_of(file);
            for (depth, name) in module.iter().enumerate() {
                let parent = module[..depth].to_vec();
                modules
                    .children
                    .entry(parent)
                    .or_default()
                    .insert(name.clone());
            }
            modules.files.insert(module, file.clone());
        }
        modules
    }

    fn has_child(&self, module: &[String], name: &str) -> bool {
        self.children.get(module).is_some_and(|c| c.contains(name))
    }

    /// A module's own file as a node of its level: `<read/mod.rs>`.
    fn own_file(&self, module: &[String]) -> String {
        match self.files.get(module) {
            Some(file) => format!("<{}>", file.display()),
            None => format!("<{}>", module.join("/")),
        }
    }
}

/// Where a path is written, and how.
#[derive(Clone, Debug)]
struct Site {
    /// Relative to `src/`.
    file: PathBuf,
    line: usize,
    written: String,
}

impl Site {
    fn show(&self) -> String {
        format!(
            "src/{}:{} `{}`",
            self.file.display(),
            self.line,
            self.written
        )
    }
}

/// What each name a `use` binds in a module leads to, from the crate root:
/// `([], "FanoutContext")` → `[request, FanoutContext]`.
type Bindings = BTreeMap<(Vec<String>, String), Vec<String>>;

/// A path in code that resolves into the crate.
#[derive(Debug)]
struct Reference {
    site: Site,
    /// From the crate root: `super::hosts::HostTable` in `read/budget.rs` is
    /// `[read, hosts, HostTable]`.
    path: Vec<String>,
}

/// What the rules read from a tree.
struct Scan {
    modules: Modules,
    references: Vec<Reference>,
    bindings: Bindings,
    tokens: BTreeMap<PathBuf, Vec<Token>>,
}

impl Scan {
    fn of(tree: &Tree) -> Scan {
        let mut scan = Scan {
            modules: Modules::of(tree),
            references: Vec::new(),
            bindings: BTreeMap::new(),
            tokens: BTreeMap::new(),
        };
        for (file, text) in tree {
            let tokens = tokens(text);
            let (references, bindings) = paths_in(file, &tokens, &scan.modules);
            scan.references.extend(references);
            scan.bindings.extend(bindings);
            scan.tokens.insert(file.clone(), tokens);
        }
        scan
    }

    /// `path` with each name a `use` binds replaced by what it leads to:
    /// `[FanoutContext]` → `[graphql, FanoutContext]` when `lib.rs` has
    /// `pub use graphql::FanoutContext`.
    fn follow_reexports(&self, path: &[String]) -> Vec<String> {
        let mut path = path.to_vec();
        for _ in 0..16 {
            let bound = (0..path.len()).find_map(|at| {
                let key = (path[..at].to_vec(), path[at].clone());
                self.bindings.get(&key).map(|target| (at, target))
            });
            let Some((at, target)) = bound else { break };
            let mut next = target.clone();
            next.extend_from_slice(&path[at + 1..]);
            if next == path {
                break;
            }
            path = next;
        }
        path
    }
}

/// The paths a file's code names that resolve into the crate, and the names
/// its `use` declarations bind (module and name → path).
fn paths_in(file: &Path, tokens: &[Token], modules: &Modules) -> (Vec<Reference>, Bindings) {
    let file_module = module_of(file);
    let mut inline: Vec<(String, usize)> = Vec::new(); // `mod name {`, and the depth inside it
    let mut depth = 0;
    let mut references = Vec::new();
    let mut bindings = Bindings::new();
    let mut at = 0;
    while at < tokens.len() {
        let here: Vec<String> = file_module
            .iter()
            .chain(inline.iter().map(|(name, _)| name))
            .cloned()
            .collect();
        let site = |line: usize, written: String| Site {
            file: file.to_path_buf(),
            line,
            written,
        };
        match &tokens[at].kind {
            Kind::Open => depth += 1,
            Kind::Close => {
                depth = usize::saturating_sub(depth, 1);
                while inline.last().is_some_and(|(_, inside)| *inside > depth) {
                    inline.pop();
                }
            }
            Kind::Ident(word) if word == "mod" => {
                if let (Some(Kind::Ident(name)), Some(Kind::Open)) =
                    (kind(tokens, at + 1), kind(tokens, at + 2))
                {
                    inline.push((name.clone(), depth + 1));
                }
            }
            Kind::Ident(word) if word == "use" => {
                let mut leaves = Vec::new();
                at = use_tree(tokens, at + 1, Vec::new(), &mut leaves);
                for leaf in leaves {
                    let names: Vec<String> =
                        leaf.segments.iter().map(|(name, _)| name.clone()).collect();
                    let Some(path) = resolve(&names, &here, file_module.len(), modules) else {
                        continue;
                    };
                    let line = leaf
                        .segments
                        .last()
                        .map_or(tokens[at - 1].line, |(_, line)| *line);
                    let written = names.join("::").trim_end_matches("::self").to_string()
                        + if leaf.glob { "::*" } else { "" };
                    let bound = leaf
                        .alias
                        .or_else(|| names.iter().rev().find(|n| *n != "self").cloned());
                    if let Some(name) = bound.filter(|name| !leaf.glob && name != "_") {
                        bindings.insert((here.clone(), name), path.clone());
                    }
                    references.push(Reference {
                        site: site(line, written),
                        path,
                    });
                }
                continue;
            }
            Kind::Ident(_) if starts_path(tokens, at) => {
                let (names, end) = expression_path(tokens, at);
                if let Some(path) = resolve(&names, &here, file_module.len(), modules) {
                    references.push(Reference {
                        site: site(tokens[at].line, names.join("::")),
                        path,
                    });
                }
                at = end;
                continue;
            }
            _ => {}
        }
        at += 1;
    }
    (references, bindings)
}

/// The path from the crate root that `segments` names in module `here`, or
/// `None` for a path outside the crate (another crate, a type's item). A
/// bare first segment is a child of `here` or, inside an inline module (the
/// first `file_depth` names of `here` are the file's module), of a module
/// around it (`use super::*` brings those into scope).
fn resolve(
    segments: &[String],
    here: &[String],
    file_depth: usize,
    modules: &Modules,
) -> Option<Vec<String>> {
    let (first, rest) = segments.split_first()?;
    let mut path = match first.as_str() {
        "crate" => Vec::new(),
        "self" => here.to_vec(),
        "super" => here.split_last()?.1.to_vec(),
        name => {
            let scope = (file_depth.min(here.len())..=here.len())
                .rev()
                .map(|depth| &here[..depth])
                .find(|scope| modules.has_child(scope, name))?;
            let mut path = scope.to_vec();
            path.push(name.to_string());
            path
        }
    };
    for segment in rest {
        match segment.as_str() {
            "super" => {
                path.pop()?;
            }
            "self" => {}
            name => path.push(name.to_string()),
        }
    }
    Some(path)
}

/// One path of a `use` tree: its segments (each with its line), the name it
/// is bound to (`as`), and whether it is a glob.
struct UseLeaf {
    segments: Vec<(String, usize)>,
    alias: Option<String>,
    glob: bool,
}

/// Reads the `use` tree starting at `at` under `segments`, adding its paths to
/// `out`; returns where it ends.
fn use_tree(
    tokens: &[Token],
    mut at: usize,
    mut segments: Vec<(String, usize)>,
    out: &mut Vec<UseLeaf>,
) -> usize {
    loop {
        match kind(tokens, at) {
            Some(Kind::PathSep) => {
                if segments.is_empty() {
                    segments.push(("::".to_string(), tokens[at].line)); // `use ::other_crate`
                }
                at += 1;
            }
            Some(Kind::Ident(word)) if word != "as" => {
                segments.push((word.clone(), tokens[at].line));
                at += 1;
            }
            Some(Kind::Star) => {
                out.push(UseLeaf {
                    segments,
                    alias: None,
                    glob: true,
                });
                return at + 1;
            }
            Some(Kind::Open) => {
                at += 1;
                loop {
                    match kind(tokens, at) {
                        None => return at,
                        Some(Kind::Close) => return at + 1,
                        Some(Kind::Comma) => at += 1,
                        Some(_) => at = use_tree(tokens, at, segments.clone(), out).max(at + 1),
                    }
                }
            }
            _ => break,
        }
    }
    let mut alias = None;
    if let (Some(Kind::Ident(word)), Some(Kind::Ident(name))) =
        (kind(tokens, at), kind(tokens, at + 1))
    {
        if word == "as" {
            alias = Some(name.clone());
            at += 2;
        }
    }
    if !segments.is_empty() {
        out.push(UseLeaf {
            segments,
            alias,
            glob: false,
        });
    }
    at
}

/// Whether a path starts at `at`: a name followed by `::`, not itself
/// following a `::`.
fn starts_path(tokens: &[Token], at: usize) -> bool {
    matches!(kind(tokens, at + 1), Some(Kind::PathSep))
        && (at == 0 || !matches!(kind(tokens, at - 1), Some(Kind::PathSep)))
}

/// The names of the path starting at `at` (up to a `::<` or the end), and
/// where it ends.
fn expression_path(tokens: &[Token], mut at: usize) -> (Vec<String>, usize) {
    let mut names = Vec::new();
    while let Some(Kind::Ident(name)) = kind(tokens, at) {
        names.push(name.clone());
        match (kind(tokens, at + 1), kind(tokens, at + 2)) {
            (Some(Kind::PathSep), Some(Kind::Ident(_))) => at += 2,
            _ => return (names, at + 1),
        }
    }
    (names, at)
}

// ---------------------------------------------------------------------------
// The lexer: a Rust file's code as tokens, without comments, strings, chars.

#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Ident(String),
    /// `::`
    PathSep,
    Open,
    Close,
    Comma,
    Star,
    Other,
}

#[derive(Clone, Debug)]
struct Token {
    kind: Kind,
    line: usize,
}

fn kind(tokens: &[Token], at: usize) -> Option<&Kind> {
    tokens.get(at).map(|token| &token.kind)
}

fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut at = 0;
    while at < chars.len() {
        let next = chars.get(at + 1).copied();
        let start_line = line;
        let mut push = |kind: Kind| {
            tokens.push(Token {
                kind,
                line: start_line,
            })
        };
        match chars[at] {
            '\n' => {
                line += 1;
                at += 1;
            }
            c if c.is_whitespace() => at += 1,
            '/' if next == Some('/') => {
                while at < chars.len() && chars[at] != '\n' {
                    at += 1;
                }
            }
            '/' if next == Some('*') => at = skip_block_comment(&chars, at, &mut line),
            '"' => at = skip_string(&chars, at, &mut line),
            '\'' => at = skip_char_or_lifetime(&chars, at),
            c if c.is_ascii_digit() => {
                while at < chars.len() && is_ident(chars[at]) {
                    at += 1;
                }
                push(Kind::Other);
            }
            c if is_ident(c) => {
                let start = at;
                while at < chars.len() && is_ident(chars[at]) {
                    at += 1;
                }
                let word: String = chars[start..at].iter().collect();
                let after = chars.get(at).copied();
                match word.as_str() {
                    "r" | "br" | "cr" if starts_raw_string(&chars, at) => {
                        at = skip_raw_string(&chars, at, &mut line);
                    }
                    "r" if after == Some('#') => at += 1, // a raw identifier: `r#type`
                    "b" | "c" if after == Some('"') => at = skip_string(&chars, at, &mut line),
                    "b" if after == Some('\'') => at = skip_char_or_lifetime(&chars, at),
                    _ => push(Kind::Ident(word)),
                }
            }
            ':' if next == Some(':') => {
                push(Kind::PathSep);
                at += 2;
            }
            c => {
                push(match c {
                    '{' => Kind::Open,
                    '}' => Kind::Close,
                    ',' => Kind::Comma,
                    '*' => Kind::Star,
                    _ => Kind::Other,
                });
                at += 1;
            }
        }
    }
    tokens
}

/// Past a block comment (they nest) starting at `at`.
fn skip_block_comment(chars: &[char], mut at: usize, line: &mut usize) -> usize {
    let mut depth = 0;
    while at < chars.len() {
        match (chars[at], chars.get(at + 1)) {
            ('/', Some('*')) => {
                depth += 1;
                at += 2;
            }
            ('*', Some('/')) => {
                depth -= 1;
                at += 2;
                if depth == 0 {
                    return at;
                }
            }
            (c, _) => {
                *line += usize::from(c == '\n');
                at += 1;
            }
        }
    }
    at
}

/// Past a string literal whose `"` is at `at`.
fn skip_string(chars: &[char], mut at: usize, line: &mut usize) -> usize {
    at += 1;
    while at < chars.len() {
        match chars[at] {
            '\\' => {
                *line += usize::from(chars.get(at + 1) == Some(&'\n'));
                at += 2;
            }
            '"' => return at + 1,
            c => {
                *line += usize::from(c == '\n');
                at += 1;
            }
        }
    }
    at
}

/// Whether a raw string's `#…#"` starts at `at` (after its `r`).
fn starts_raw_string(chars: &[char], at: usize) -> bool {
    let hashes = chars[at..].iter().take_while(|c| **c == '#').count();
    chars.get(at + hashes) == Some(&'"')
}

/// Past a raw string whose `#…#"` starts at `at`.
fn skip_raw_string(chars: &[char], mut at: usize, line: &mut usize) -> usize {
    let hashes = chars[at..].iter().take_while(|c| **c == '#').count();
    at += hashes + 1;
    while at < chars.len() {
        let closes = chars[at] == '"'
            && chars[at + 1..]
                .iter()
                .take(hashes)
                .filter(|c| **c == '#')
                .count()
                == hashes;
        if closes {
            return at + 1 + hashes;
        }
        *line += usize::from(chars[at] == '\n');
        at += 1;
    }
    at
}

/// Past a char literal (`'a'`, `'"'`, `'\''`, `'\u{7f}'`) or the quote of a
/// lifetime (`'a`), starting at `at`.
fn skip_char_or_lifetime(chars: &[char], at: usize) -> usize {
    match (chars.get(at + 1), chars.get(at + 2)) {
        (Some('\\'), _) => {
            let mut end = at + 3; // past the escaped char, which may be a quote
            while end < chars.len() && chars[end] != '\'' {
                end += 1;
            }
            end + 1
        }
        (Some(_), Some('\'')) => at + 3,
        _ => at + 1,
    }
}

// ---------------------------------------------------------------------------
// Each rule fails: a violation planted in a copy of the real tree is caught.

/// Appends `line` to `file` of `tree` and returns where it is (`src/file:N`).
fn plant(tree: &mut Tree, file: &str, line: &str) -> String {
    let text = tree
        .get_mut(Path::new(file))
        .unwrap_or_else(|| panic!("src/{file} is gone: plant this violation in another file"));
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let number = text.lines().count() + 1;
    text.push_str(line);
    text.push('\n');
    format!("src/{file}:{number}")
}

/// Asserts a violation names the planted `location` and says each of `words`.
fn assert_caught(violations: &[String], location: &str, words: &[&str]) {
    let site = format!("{location} `");
    assert!(
        violations
            .iter()
            .any(|v| v.contains(&site) && words.iter().all(|word| v.contains(word))),
        "no violation at {location} saying {words:?}; the violations:\n\n{}",
        violations.join("\n\n")
    );
}

/// The file of a child of `module` in `tree`, the first in order other than `but`.
fn a_child_file(tree: &Tree, module: &str, but: Option<&str>) -> (String, String) {
    let modules = Modules::of(tree);
    let parent = vec![module.to_string()];
    let child = modules.children[&parent]
        .iter()
        .find(|child| Some(child.as_str()) != but)
        .unwrap_or_else(|| panic!("src/{module}/ has two children"))
        .clone();
    let file = modules.files[&[parent, vec![child.clone()]].concat()].clone();
    (child, file.to_string_lossy().into_owned())
}

#[test]
fn a_cycle_between_two_top_level_modules_is_caught() {
    let mut tree = real_tree();
    let from_error = plant(
        &mut tree,
        "error/mod.rs",
        "use crate::request::FanoutRequest;",
    );
    let from_request = plant(
        &mut tree,
        "request.rs",
        "fn planted(_: crate::error::ReadError) {}",
    );
    let cycles = import_cycles(&tree);
    assert_caught(
        &cycles,
        &from_error,
        &["modules of `crate` (src/)", "error → request: "],
    );
    assert_caught(&cycles, &from_request, &["request → error: "]);
}

#[test]
fn a_cycle_inside_graphql_is_caught() {
    let mut tree = real_tree();
    let (a, a_file) = a_child_file(&tree, "graphql", None);
    let (b, b_file) = a_child_file(&tree, "graphql", Some(&a));
    let from_a = plant(&mut tree, &a_file, &format!("use super::{b}::Planted;"));
    let from_b = plant(
        &mut tree,
        &b_file,
        &format!("pub(crate) use crate::graphql::{{{a}::{{self, Planted}}}};"),
    );
    let cycles = import_cycles(&tree);
    assert_caught(
        &cycles,
        &from_a,
        &["`crate::graphql` (src/graphql/)", &format!("{a} → {b}: ")],
    );
    assert_caught(&cycles, &from_b, &[&format!("{b} → {a}: ")]);
}

#[test]
fn a_spoke_and_the_hub_using_each_other_is_a_cycle() {
    let mut tree = real_tree();
    let from_spoke = plant(&mut tree, "read/budget.rs", "use super::Planted;");
    let from_hub = plant(
        &mut tree,
        "read/mod.rs",
        "fn planted() { budget::planted(); }",
    );
    let cycles = import_cycles(&tree);
    assert_caught(&cycles, &from_spoke, &["budget → <read/mod.rs>: "]);
    assert_caught(&cycles, &from_hub, &["<read/mod.rs> → budget: "]);
}

#[test]
fn a_spoke_naming_a_sibling_is_caught() {
    let mut tree = real_tree();
    let planted = plant(
        &mut tree,
        "read/budget.rs",
        "use crate::read::hosts::HostTable;",
    );
    let nested = plant(
        &mut tree,
        "read/budget.rs",
        "use crate::{read::{dedup::{self}}};",
    );
    let violations = spoke_violations(&tree);
    assert_caught(
        &violations,
        &planted,
        &["the spoke `budget` names its sibling `hosts`"],
    );
    assert_caught(&violations, &nested, &["its sibling `dedup`"]);
}

#[test]
fn a_spoke_naming_the_hub_is_caught() {
    let mut tree = real_tree();
    let by_super = plant(&mut tree, "read/hosts.rs", "use super::Upstream;");
    let by_crate = plant(
        &mut tree,
        "read/hosts.rs",
        "fn planted() -> crate::read::Upstream { todo!() }",
    );
    let violations = spoke_violations(&tree);
    for planted in [by_super, by_crate] {
        assert_caught(
            &violations,
            &planted,
            &["the spoke `hosts` names the hub read/mod.rs"],
        );
    }
}

#[test]
fn a_spoke_naming_the_hub_s_steps_is_caught() {
    let mut tree = real_tree();
    let step = format!("read/{}.rs", HUB[0]);
    assert!(tree.contains_key(Path::new(&step)), "src/{step} was read");
    let by_super = plant(
        &mut tree,
        "read/dedup.rs",
        &format!("use super::{}::Planted;", HUB[0]),
    );
    let vocabulary = format!("read/{}.rs", VOCABULARY[0]);
    let from_vocabulary = plant(
        &mut tree,
        &vocabulary,
        &format!("fn planted(_: crate::read::{}::x::Planted) {{}}", HUB[0]),
    );
    let violations = spoke_violations(&tree);
    assert_caught(
        &violations,
        &by_super,
        &[&format!("the spoke `dedup` names the hub's `{}`", HUB[0])],
    );
    assert_caught(
        &violations,
        &from_vocabulary,
        &[&format!("the spoke `{}` names the hub's", VOCABULARY[0])],
    );
}

#[test]
fn the_hub_s_steps_may_name_every_spoke_and_the_hub() {
    let mut tree = real_tree();
    let under = PathBuf::from("read").join(HUB[0]);
    let steps: Vec<String> = (tree.keys())
        .filter(|file| file.starts_with(&under))
        .map(|file| file.to_string_lossy().into_owned())
        .chain([format!("read/{}.rs", HUB[0])])
        .collect();
    assert!(steps.len() >= 2, "the hub's steps were read: {steps:?}");
    let planted: Vec<String> = (steps.iter())
        .map(|step| {
            let line = "use crate::read::{budget::Planted, hosts::HostTable, Upstream};";
            plant(&mut tree, step, line)
        })
        .collect();
    let violations = spoke_violations(&tree);
    for planted in planted {
        assert!(
            !violations
                .iter()
                .any(|v| v.contains(&format!("{planted} `"))),
            "a file of the hub may name the spokes and read/mod.rs: {violations:#?}"
        );
    }
}

#[test]
fn the_hub_naming_its_own_steps_is_a_cycle() {
    let mut tree = real_tree();
    let planted = plant(
        &mut tree,
        "read/mod.rs",
        &format!("use {}::Planted;", HUB[0]),
    );
    let cycles = import_cycles(&tree);
    assert_caught(
        &cycles,
        &planted,
        &[&format!("<read/mod.rs> → {}: ", HUB[0])],
    );
}

#[test]
fn only_the_vocabulary_file_is_shared_by_the_spokes() {
    let mut tree = real_tree();
    let vocabulary = format!("read/{}.rs", VOCABULARY[0]);
    tree.entry(PathBuf::from(&vocabulary))
        .or_insert_with(|| "pub struct Planted;\n".into());
    let allowed = plant(
        &mut tree,
        "read/budget.rs",
        &format!("use super::{}::Planted;", VOCABULARY[0]),
    );
    let refused = plant(&mut tree, &vocabulary, "use super::hosts::HostTable;");
    let violations = spoke_violations(&tree);
    assert!(
        !violations
            .iter()
            .any(|v| v.contains(&format!("{allowed} `"))),
        "a spoke may name the vocabulary file: {violations:#?}"
    );
    assert_caught(&violations, &refused, &["names its sibling `hosts`"]);
}

#[test]
fn the_read_path_naming_the_graphql_layer_is_caught() {
    let mut tree = real_tree();
    let direct = plant(&mut tree, "read/dedup.rs", "use crate::graphql::OrNull;");
    plant(&mut tree, "lib.rs", "pub use request::Planted;");
    let reexported = plant(
        &mut tree,
        "read/dedup.rs",
        "fn planted(_: crate::Planted) {}",
    );
    let violations = graphql_layer_violations(&tree);
    assert_caught(&violations, &direct, &["names `crate::graphql`"]);
    assert_caught(
        &violations,
        &reexported,
        &["names `crate::request`", "through a re-export"],
    );
}

#[test]
fn a_spoke_using_async_graphql_is_caught() {
    let mut tree = real_tree();
    let planted = plant(
        &mut tree,
        "read/transport.rs",
        "fn planted(_: async_graphql::Error) {}",
    );
    let violations = graphql_layer_violations(&tree);
    assert_caught(&violations, &planted, &["uses async-graphql"]);
}

#[test]
fn architecture_md_naming_a_missing_file_is_caught() {
    let architecture = std::fs::read_to_string(repository().join("ARCHITECTURE.md")).unwrap();
    let mut repository = files_under(&repository());
    let planted = format!("{architecture}\nThe `src/read/vanished.rs` and `vanished.rs`.\n");
    repository.insert(PathBuf::from("src/read/planted.rs"));
    let violations = documentation_violations(&planted, &repository);
    let line = planted.lines().count();
    for name in ["`src/read/vanished.rs`", "`vanished.rs`"] {
        let expected = format!("ARCHITECTURE.md:{line} {name} — no such file");
        assert!(
            violations.iter().any(|v| v.starts_with(&expected)),
            "{expected}: {violations:#?}"
        );
    }
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("src/read/planted.rs — not mentioned")),
        "{violations:#?}"
    );
}

// ---------------------------------------------------------------------------
// The scanner, on small trees.

/// The paths `file` of `tree` names, as `line: path`.
fn named_paths(tree: &[(&str, &str)], file: &str) -> Vec<String> {
    let tree: Tree = tree
        .iter()
        .map(|(f, t)| (PathBuf::from(f), t.to_string()))
        .collect();
    Scan::of(&tree)
        .references
        .iter()
        .filter(|r| r.site.file == Path::new(file))
        .map(|r| format!("{}: {}", r.site.line, r.path.join("::")))
        .collect()
}

const SMALL_TREE: [(&str, &str); 7] = [
    ("lib.rs", ""),
    ("a.rs", ""),
    ("b.rs", ""),
    ("b/c.rs", ""),
    ("d/mod.rs", ""),
    ("d/e.rs", ""),
    ("d/f.rs", ""),
];

#[test]
fn comments_strings_and_chars_are_not_code() {
    let text = r####"//! `crate::inner_doc`
/// crate::outer_doc
// crate::line
/* crate::block /* crate::nested */ crate::still_comment */
/** crate::block_doc */
const S: &str = "crate::string \" crate::escaped";
const R: &str = r#"crate::raw "quoted" crate::raw_too"#;
const L: &str = r##"redis.call("GET", "crate::lua") "# still raw"##;
const B: &[u8] = br"crate::raw_bytes";
const Q: char = '"'; fn f<'a>(x: &'a str) -> &'a str { let _ = ('\'', '\u{22}', '\\'); x }
fn g() { crate::b::real(); }
const P: u8 = b'"'; fn h() { crate::a::later(); }
"####;
    let mut tree = SMALL_TREE.to_vec();
    tree.push(("g.rs", text));
    assert_eq!(named_paths(&tree, "g.rs"), ["11: b::real", "12: a::later"]);
}

#[test]
fn use_trees_and_paths_in_code_are_read() {
    let text = "pub(crate) use crate::{a, b::{c::{self, C}, D as E}};
pub use e::Thing;
use self::f::{Other};
use std::sync::Arc;
use ::a::NotOurs;
fn h(x: crate::a::T) -> e::U { let _ = Arc::new(1); <T as crate::b::Tr>::f(); }
#[cfg(test)]
mod tests {
    use super::*;
    use super::super::a::Up;
    fn t() { f::g(); }
}
fn after() { self::e::back(); }
";
    let mut tree = SMALL_TREE.to_vec();
    tree[4] = ("d/mod.rs", text);
    let expected = [
        "1: a",
        "1: b::c",
        "1: b::c::C",
        "1: b::D",
        "2: d::e::Thing",
        "3: d::f::Other",
        "6: a::T",
        "6: d::e::U",
        "6: b::Tr",
        "9: d",
        "10: a::Up",
        "11: d::f::g",
        "13: d::e::back",
    ];
    assert_eq!(named_paths(&tree, "d/mod.rs"), expected);
}

#[test]
fn super_climbs_from_the_file_s_module() {
    let mut tree = SMALL_TREE.to_vec();
    tree.push((
        "d/e/g.rs",
        "use super::super::f::F;\nfn k() { super::super::super::a::x(); super::H::new(); }",
    ));
    assert_eq!(
        named_paths(&tree, "d/e/g.rs"),
        ["1: d::f::F", "2: a::x", "2: d::e::H::new"]
    );
}

#[test]
fn architecture_md_is_read_for_file_names() {
    let repository: BTreeSet<PathBuf> = [
        "src/lib.rs",
        "src/read/mod.rs",
        "src/read/budget.rs",
        "src/read/budget/tests.rs",
        "src/graphql/mod.rs",
        "src/graphql/protocol/tests.rs",
        "tests/budget.rs",
        "gateway/src/app.rs",
    ]
    .into_iter()
    .map(PathBuf::from)
    .collect();
    let doc = "The hub `read/mod.rs`, `budget.rs` (and\n`src/read/budget/tests.rs`),\n\
               `gateway/src/app.rs`, ``gateway/src/``, `fanout_budget::read`, `http.max_bytes`.\n\
               ```text\n`src/fenced.rs`\n```\nGone: `lost.rs`, `src/budget.rs`.\n";
    assert_eq!(
        documentation_violations(doc, &repository),
        [
            "ARCHITECTURE.md:7 `lost.rs` — no such file or directory in the repository",
            "ARCHITECTURE.md:7 `src/budget.rs` — no such file or directory in the repository",
        ]
    );
    let unmentioned = documentation_violations("`src/read/budget.rs`", &repository);
    assert_eq!(
        unmentioned,
        [
            "src/read/budget/tests.rs — not mentioned in ARCHITECTURE.md (as \
             `src/read/budget/tests.rs` or `read/budget/tests.rs` or `budget/tests.rs`)",
            "src/read/mod.rs — not mentioned in ARCHITECTURE.md (as `src/read/mod.rs` or `read/mod.rs`)",
        ]
    );
}
