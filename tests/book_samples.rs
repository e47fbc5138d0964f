//! The guide's samples stay true: every TOML sample in `book/src/*.md` and
//! `README.md` parses as a [`Config`] (and validates, but for what names the
//! machine's files and environment); the configuration chapter's table
//! lists exactly the keys `Config` accepts, each with the code's default; the README's Rust sample is the one the
//! book compiles; and every chapter with a Rust sample is compiled as a
//! doctest (`src/book.rs`).

use fanout_budget::config::{HostConfig, UpstreamTable};
use fanout_budget::Config;
use std::path::{Path, PathBuf};

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `book/src/*.md`, sorted.
fn chapters() -> Vec<PathBuf> {
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(repository().join("book/src"))
        .expect("book/src")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    chapters.sort();
    chapters
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fenced code block: its info string (`rust,no_run`), the line its fence
/// opens on (1-based) and its text.
struct Block {
    info: String,
    line: usize,
    text: String,
}

/// The fenced blocks of a markdown text, fences of three backticks at the
/// start of a line.
fn blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (n, line) in markdown.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    info: info.trim().to_string(),
                    line: n + 1,
                    text: String::new(),
                })
            }
            (Some(_), Some(rest)) if rest.trim().is_empty() => blocks.push(open.take().unwrap()),
            (Some(block), _) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    blocks
}

fn language(block: &Block) -> &str {
    block.info.split([',', ' ']).next().unwrap_or("")
}

/// Every `toml` block of the book and the README, with where it is.
fn toml_samples() -> Vec<(String, Block)> {
    let mut files = chapters();
    files.push(repository().join("README.md"));
    let mut samples = Vec::new();
    for file in files {
        let name = file
            .strip_prefix(repository())
            .unwrap()
            .display()
            .to_string();
        for block in blocks(&read(&file)) {
            if language(&block) == "toml" {
                samples.push((name.clone(), block));
            }
        }
    }
    samples
}

#[test]
fn every_toml_sample_parses_as_a_config() {
    let samples = toml_samples();
    assert!(
        samples.len() >= 8,
        "only {} TOML samples found: is the extraction broken?",
        samples.len()
    );
    let mut failures = Vec::new();
    for (file, block) in &samples {
        let at = format!("{file}:{}", block.line);
        // Unknown keys and wrong types: every section denies unknown fields.
        let mut config: Config = match toml::from_str(&block.text) {
            Ok(config) => config,
            Err(e) => {
                failures.push(format!("{at}: {e}"));
                continue;
            }
        };
        // Impossible values, but for what names this machine's environment
        // and files (a registry's password variable, its secrets, its CA).
        for table in config.upstreams.values_mut() {
            *table = table.clone().password_env("").password_file("").ca_file("");
        }
        if let Err(e) = config.validate() {
            failures.push(format!("{at}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The configuration chapter's table: (key, default) per row.
fn config_table() -> Vec<(String, String)> {
    let chapter = read(&repository().join("book/src/configuration.md"));
    chapter
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.strip_prefix("| `")?.splitn(3, " | ").collect();
            let key = cells.first()?.strip_suffix('`')?;
            Some((key.to_string(), cells.get(1)?.trim().to_string()))
        })
        .collect()
}

#[test]
fn the_configuration_table_gives_the_code_s_defaults() {
    let rows = config_table();
    assert!(rows.len() > 60, "only {} rows found", rows.len());
    let mut seen = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for (key, default) in &rows {
        if !seen.insert(key) {
            failures.push(format!("{key}: listed twice"));
        }
        if default == "unset" {
            continue; // an `Option` left out
        }
        // `section.key`, or `hosts.<host>.key` / `upstreams.<name>.key`.
        let (table, expected, field) = match key.split('.').collect::<Vec<_>>()[..] {
            ["hosts", "<host>", field] => (
                "[hosts.\"registry:5000\"]".to_string(),
                Config::default().host("registry:5000", HostConfig::default()),
                field,
            ),
            ["upstreams", "<name>", field] => (
                "[upstreams.\"registry\"]".to_string(),
                Config::default().upstream_named("registry", UpstreamTable::default()),
                field,
            ),
            [section, field] => (format!("[{section}]"), Config::default(), field),
            _ => {
                failures.push(format!("{key}: not `section.key`"));
                continue;
            }
        };
        let text = format!("{table}\n{field} = {default}\n");
        match toml::from_str::<Config>(&text) {
            Ok(parsed) if parsed == expected => {}
            Ok(_) => failures.push(format!("{key}: the default is not {default}")),
            Err(e) => failures.push(format!("{key} = {default}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The keys the table that `header` opens accepts (`header` = "" for the
/// top level), read from the code itself: every config struct is
/// `deny_unknown_fields`, and serde's error for a key it does not accept
/// names every key it does (`expected one of …`).
fn accepted(header: &str) -> std::collections::BTreeSet<String> {
    let text = format!("{header}\nzz_not_a_key = 1\n");
    let err = toml::from_str::<Config>(&text).expect_err("an unknown key is refused");
    let message = err.message();
    let expected = message
        .split("expected ")
        .nth(1)
        .unwrap_or_else(|| panic!("serde names the keys: {message}"));
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_configuration_table_lists_exactly_the_keys_config_accepts() {
    let mut accepted_keys = std::collections::BTreeSet::new();
    for section in accepted("") {
        let (header, placeholder) = match section.as_str() {
            "hosts" => ("[hosts.\"registry:5000\"]".to_string(), ".<host>"),
            "upstreams" => ("[upstreams.\"registry\"]".to_string(), ".<name>"),
            _ => (format!("[{section}]"), ""),
        };
        for key in accepted(&header) {
            accepted_keys.insert(format!("{section}{placeholder}.{key}"));
        }
    }
    let listed: std::collections::BTreeSet<String> =
        config_table().into_iter().map(|(key, _)| key).collect();
    let missing: Vec<_> = accepted_keys.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&accepted_keys).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "keys Config accepts that the table does not list: {missing:?}; \
         keys it lists that Config does not accept: {unknown:?}"
    );
}

/// A Rust block's lines as mdBook shows them: without the hidden `# ` lines.
fn shown(block: &Block) -> Vec<&str> {
    block
        .text
        .lines()
        .filter(|line| {
            let trimmed = line.trim_start();
            !(trimmed == "#" || trimmed.starts_with("# "))
        })
        .collect()
}

fn trim_blank(mut lines: Vec<&str>) -> Vec<&str> {
    while lines.first().is_some_and(|l| l.trim().is_empty()) {
        lines.remove(0);
    }
    while lines.last().is_some_and(|l| l.trim().is_empty()) {
        lines.pop();
    }
    lines
}

#[test]
fn the_readme_s_rust_sample_is_the_one_the_book_compiles() {
    let readme: Vec<Block> = blocks(&read(&repository().join("README.md")))
        .into_iter()
        .filter(|b| language(b) == "rust")
        .collect();
    let book: Vec<Block> = blocks(&read(&repository().join("book/src/integrations.md")))
        .into_iter()
        .filter(|b| language(b) == "rust")
        .collect();
    assert_eq!(readme.len(), 1, "the README has one Rust sample");
    let readme = trim_blank(readme[0].text.lines().collect());
    assert!(
        book.iter().any(|b| trim_blank(shown(b)) == readme),
        "README.md's Rust sample is not a sample of book/src/integrations.md as shown"
    );
}

#[test]
fn every_chapter_with_a_rust_sample_is_compiled() {
    let compiled = read(&repository().join("src/book.rs"));
    for chapter in chapters() {
        let text = read(&chapter);
        let name = chapter.file_name().unwrap().to_str().unwrap();
        for block in blocks(&text) {
            // rustdoc runs an untagged block as Rust; mdBook shows it as Rust.
            assert!(
                !block.info.is_empty(),
                "{name}:{}: a code block without a language (```text if it is not Rust)",
                block.line
            );
        }
        let has_rust = blocks(&text).iter().any(|b| language(b) == "rust");
        let included = compiled.contains(&format!("include_str!(\"../book/src/{name}\")"));
        assert_eq!(
            has_rust, included,
            "{name}: a chapter is in src/book.rs exactly when it has a Rust sample"
        );
    }
}
