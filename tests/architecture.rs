//! The structure rules of docs/architecture.md, checked on the sources (architecture issue):
//! - no import cycle among the top-level modules of `src/` (read from `crate::` paths outside
//!   comments and unit tests);
//! - the pure core, `src/projection/`, uses none of the runtime and I/O crates and no module of
//!   sluice but the leaves it is allowed;
//! - no source file has more than 600 lines of code;
//! - every source file opens with a `//!` line.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES_OF_CODE: usize = 600;
/// What the core may not use: the runtime, caches, stores, HTTP and configuration loading.
const NOT_IN_CORE: &[&str] = &[
    "tokio", "moka", "redb", "redis", "hyper", "reqwest", "figment",
];
/// The modules of sluice the core may use: leaves with no I/O.
const CORE_MAY_USE: &[&str] = &["projection", "json", "tenant", "image", "audio", "tokens"];

struct Source {
    path: PathBuf,
    /// Top-level module: `src/<top>.rs` or `src/<top>/…`.
    top: String,
    text: String,
}

impl Source {
    /// The file without its unit tests (a trailing `#[cfg(test)]` module, or a `tests.rs`) and
    /// without comments: what the module itself depends on.
    fn code(&self) -> String {
        if self.path.file_name().is_some_and(|n| n == "tests.rs") {
            return String::new();
        }
        let body = self.text.split("#[cfg(test)]").next().unwrap_or("");
        body.lines()
            .map(|line| match line.find("//") {
                // Not inside a string on that line (an URL): an even number of quotes before.
                Some(at) if line[..at].matches('"').count() % 2 == 0 => &line[..at],
                _ => line,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn sources() -> Vec<Source> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    walk(&src, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let rel = path.strip_prefix(&src).unwrap();
            let first = rel.components().next().unwrap().as_os_str();
            let top = first.to_string_lossy().trim_end_matches(".rs").to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            Source { path, top, text }
        })
        .collect()
}

/// The top-level modules named by `crate::` paths in `code`, braces included
/// (`crate::{a, b::c}` names `a` and `b`).
fn crate_modules(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start => {
                        out.insert(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty() && m != "self");
    out
}

/// The import graph of the top-level modules (`lib` and `main` left out: they name everything).
fn graph(sources: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in sources {
        if s.top == "lib" || s.top == "main" {
            continue;
        }
        let deps = graph.entry(s.top.clone()).or_default();
        for m in crate_modules(&s.code()) {
            if m != s.top {
                deps.insert(m);
            }
        }
    }
    graph
}

/// A cycle of the graph, if it has one (depth-first search).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let from = path.iter().position(|n| n == next).unwrap_or(0);
                    let mut cycle = path[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(cycle) = visit(next, graph, state, path) {
                        return Some(cycle);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if state.get(node.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(cycle) = visit(node, graph, &mut state, &mut Vec::new()) {
                return Some(cycle);
            }
        }
    }
    None
}

#[test]
fn the_cycle_finder_finds_cycles_and_the_parser_reads_groups() {
    let g = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(find_cycle(&g(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    assert_eq!(
        find_cycle(&g(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let found = crate_modules("use crate::{a::{x, y}, b, c::D};\nlet z = crate::d::f();");
    assert_eq!(
        found,
        BTreeSet::from(["a", "b", "c", "d"].map(String::from))
    );
}

#[test]
fn no_import_cycle_among_top_level_modules() {
    let graph = graph(&sources());
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle: {}\n(every module's imports: {graph:#?})",
            cycle.join(" → ")
        );
    }
}

#[test]
fn the_core_uses_no_runtime_crate_and_only_leaf_modules() {
    let mut wrong = Vec::new();
    for s in sources().iter().filter(|s| s.top == "projection") {
        let code = s.code();
        for krate in NOT_IN_CORE {
            let used = code.match_indices(&format!("{krate}::")).any(|(at, _)| {
                at == 0 || {
                    let before = code.as_bytes()[at - 1];
                    !(before.is_ascii_alphanumeric() || before == b'_' || before == b':')
                }
            });
            if used {
                wrong.push(format!("{} uses {krate}", s.path.display()));
            }
        }
        for m in crate_modules(&code) {
            if !CORE_MAY_USE.contains(&m.as_str()) {
                wrong.push(format!("{} uses crate::{m}", s.path.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the core is not pure:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_source_file_is_over_600_lines_of_code() {
    let long: Vec<String> = sources()
        .iter()
        .map(|s| {
            let code = s
                .text
                .lines()
                .filter(|l| {
                    let t = l.trim();
                    !t.is_empty() && !t.starts_with("//")
                })
                .count();
            (s, code)
        })
        .filter(|(_, code)| *code > MAX_LINES_OF_CODE)
        .map(|(s, code)| format!("{}: {code} lines of code", s.path.display()))
        .collect();
    assert!(long.is_empty(), "split these:\n{}", long.join("\n"));
}

#[test]
fn every_source_file_opens_with_a_module_doc_line() {
    let bare: Vec<String> = sources()
        .iter()
        .filter(|s| !s.text.starts_with("//!"))
        .map(|s| s.path.display().to_string())
        .collect();
    assert!(bare.is_empty(), "no `//!` line first:\n{}", bare.join("\n"));
}

/// Field names only one provider's wire API uses, by dialect (WIRE.md). Outside
/// `src/dialect/`, code names none of them: a provider's shapes are read and written in its own
/// module, behind the dialect layer's traits. Words every API shares (`role`, `content`,
/// `type`, `text`) are not listed: they say nothing about which provider is meant.
const PROVIDER_FIELDS: &[(&str, &[&str])] = &[
    (
        "openai-chat",
        &[
            "tool_calls",
            "tool_call_id",
            "image_url",
            "input_audio",
            "finish_reason",
            "prompt_tokens",
            "completion_tokens",
        ],
    ),
    (
        "openai-responses",
        &[
            "function_call",
            "function_call_output",
            "call_id",
            "input_text",
            "input_image",
            "output_text",
            "sequence_number",
            "output_index",
            "input_tokens_details",
        ],
    ),
    (
        "anthropic-messages",
        &[
            "tool_use",
            "tool_result",
            "tool_use_id",
            "cache_control",
            "content_block",
            "input_schema",
            "media_type",
            "message_delta",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ],
    ),
];

/// Files that still name a provider's fields outside `src/dialect/` (docs/architecture.md, "Not
/// there yet"). The list only shrinks: a file that no longer needs its entry fails the test
/// until the entry goes, and a file not listed fails at its first provider field.
const NOT_YET_MOVED: &[&str] = &[];

/// Whether `word` occurs in `code` as a whole identifier or string (not inside a longer name).
fn names(code: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(word).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

fn provider_fields_outside_dialect(sources: &[Source]) -> BTreeMap<String, Vec<&'static str>> {
    let mut found = BTreeMap::new();
    for s in sources.iter().filter(|s| s.top != "dialect") {
        let code = s.code();
        let named: Vec<&'static str> = PROVIDER_FIELDS
            .iter()
            .flat_map(|(_, fields)| fields.iter().copied())
            .filter(|f| names(&code, f))
            .collect();
        if !named.is_empty() {
            let rel = s.path.to_string_lossy();
            let rel = rel.split("/src/").last().unwrap_or(&rel).to_string();
            found.insert(format!("src/{rel}"), named);
        }
    }
    found
}

#[test]
fn the_field_finder_finds_whole_names_in_code_only() {
    assert!(names(r#"x["tool_use_id"]"#, "tool_use_id"));
    assert!(!names(r#"x["tool_use_id"]"#, "tool_use"));
    assert!(!names("my_tool_calls_total", "tool_calls"));
    let s = Source {
        path: PathBuf::from("/r/src/server/x.rs"),
        top: "server".into(),
        text: "//! a\n// \"tool_calls\" in a comment\nlet a = 1;\nlet b = \"call_id\";\n".into(),
    };
    let found = provider_fields_outside_dialect(std::slice::from_ref(&s));
    assert_eq!(found.get("src/server/x.rs"), Some(&vec!["call_id"]));
}

#[test]
fn provider_fields_are_named_only_in_the_dialect_layer() {
    let found = provider_fields_outside_dialect(&sources());
    let new: Vec<String> = found
        .iter()
        .filter(|(path, _)| !NOT_YET_MOVED.contains(&path.as_str()))
        .map(|(path, fields)| format!("{path}: {}", fields.join(", ")))
        .collect();
    let moved: Vec<&str> = NOT_YET_MOVED
        .iter()
        .copied()
        .filter(|p| !found.contains_key(*p))
        .collect();
    assert!(
        new.is_empty(),
        "provider fields outside src/dialect/ (move them behind the dialect traits):\n{}",
        new.join("\n")
    );
    assert!(
        moved.is_empty(),
        "no provider field left here; take it off NOT_YET_MOVED: {moved:?}"
    );
}

/// The rule ids (`T3`, `A9`, …) that `text` cites.
fn rule_ids(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut out = BTreeSet::new();
    for (at, c) in text.char_indices() {
        if !"PTMACSO".contains(c) || (at > 0 && bytes[at - 1].is_ascii_alphanumeric()) {
            continue;
        }
        let digits: String = text[at + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let after = text[at + 1 + digits.len()..].chars().next();
        if (1..=2).contains(&digits.len())
            && !after.is_some_and(|a| a.is_ascii_alphanumeric() || a == '_')
        {
            out.insert(format!("{c}{digits}"));
        }
    }
    out
}

#[test]
fn the_rule_finder_reads_ids_and_not_names() {
    let found = rule_ids("(A9, C3) T3: S5 but not SHA256, O2x, MT5 or A100");
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        ["A9", "C3", "S5", "T3"]
    );
}

/// Every rule id the sources cite is defined in docs/rules.md (a `**ID.**` entry).
#[test]
fn every_rule_the_code_cites_is_defined_in_docs_rules() {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/rules.md"))
        .expect("docs/rules.md");
    let undefined: Vec<String> = sources()
        .iter()
        .flat_map(|s| {
            rule_ids(&s.text)
                .into_iter()
                .filter(|id| !doc.contains(&format!("**{id}.**")))
                .map(|id| format!("{}: {id}", s.path.display()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        undefined.is_empty(),
        "cited but not defined in docs/rules.md:\n{}",
        undefined.join("\n")
    );
}
