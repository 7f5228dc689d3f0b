//! Review rules the compiler cannot check, kept as tests.
//!
//! No write into JSON through indexing (SPEC P4): `value["k"] = …`, `&mut value["k"]` or
//! `value["k"].as_object_mut()` panic when `value` is not an object (or, with `[0]`, not an
//! array that long), and the JSON sluice edits comes from clients and providers. Reading with
//! `value["k"]` is fine (serde_json answers `Null`); writes go through `sluice::json`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

use std::path::Path;

/// The non-test part of every source file under `dir`.
fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("read src").flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let code = text.split("#[cfg(test)]").next().unwrap_or("").to_string();
            out.push((path.display().to_string(), code));
        }
    }
}

/// Whether a line writes through a literal JSON index (`["key"]` or `[0]` after an expression).
fn writes_through_index(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    let bytes = code.as_bytes();
    let is_index = |open: usize, close: usize| {
        let inner = &code[open + 1..close];
        let literal = (inner.len() >= 2
            && inner.starts_with('"')
            && inner.ends_with('"')
            && !inner[1..inner.len() - 1].contains('"'))
            || (!inner.is_empty() && inner.bytes().all(|b| b.is_ascii_digit()));
        let after_expression = open > 0
            && (bytes[open - 1].is_ascii_alphanumeric()
                || matches!(bytes[open - 1], b'_' | b']' | b')'));
        literal && after_expression
    };
    let mut at = 0;
    while let Some(open) = code[at..].find('[').map(|i| i + at) {
        let Some(close) = code[open..].find(']').map(|i| i + open) else {
            break;
        };
        if is_index(open, close) {
            // Past any further indexing of the same expression.
            let mut end = close + 1;
            while code[end..].starts_with('[') {
                match code[end..].find(']') {
                    Some(i) => end += i + 1,
                    None => break,
                }
            }
            let tail = code[end..].trim_start();
            let assigns =
                tail.starts_with('=') && !tail.starts_with("==") && !tail.starts_with("=>");
            let mutates = [
                ".as_object_mut()",
                ".as_array_mut()",
                ".take()",
                ".pointer_mut(",
            ]
            .iter()
            .any(|m| tail.starts_with(m));
            let borrowed = code[..open]
                .trim_end_matches(|c: char| c.is_alphanumeric() || c == '_' || c == '.')
                .ends_with("&mut ");
            if assigns || mutates || borrowed {
                return true;
            }
            at = end;
        } else {
            at = open + 1;
        }
    }
    false
}

#[test]
fn no_write_into_json_through_indexing_p4() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 20, "found the sources");
    let mut found = Vec::new();
    for (path, code) in &files {
        for (n, line) in code.lines().enumerate() {
            if writes_through_index(line) {
                found.push(format!("{path}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "writes through a JSON index (use sluice::json::set / member_mut):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_rule_sees_what_it_forbids() {
    for bad in [
        r#"value["k"] = 1;"#,
        r#"chunk["choices"][0]["delta"] = delta;"#,
        r#"let m = &mut last["choices"][0];"#,
        r#"if let Some(l) = block["citations"].as_array_mut() {"#,
        r#"x[0] = y;"#,
    ] {
        assert!(writes_through_index(bad), "{bad}");
    }
    for fine in [
        r#"let t = value["k"].as_str();"#,
        r#"if data["type"] == "message_delta" {"#,
        r#"match v["k"] { _ => 1 }"#,
        r#"json::set(&mut data, "usage", total);"#,
        r#"decisions[i] = Decision::Pruned;"#,
    ] {
        assert!(!writes_through_index(fine), "{fine}");
    }
}
