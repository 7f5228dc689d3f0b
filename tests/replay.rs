//! `sluice replay` (SPEC 9.1, docs/inspector.md) on the example traces: each report the README
//! shows is what the binary prints, byte for byte (the README's `<!-- replay: ARGS -->` blocks
//! name the arguments); the JSON report agrees; a bad trace line is named, with its number.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

use std::process::Command;

use serde_json::Value;

fn replay(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("replay")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("SLUICE_CONFIG")
        .output()
        .expect("run sluice replay")
}

/// The README's replay blocks: (arguments, the report shown).
fn readme_reports() -> Vec<(Vec<String>, String)> {
    let readme = include_str!("../README.md");
    let mut out = Vec::new();
    for (at, _) in readme.match_indices("<!-- replay: ") {
        let rest = &readme[at + "<!-- replay: ".len()..];
        let args = rest[..rest.find(" -->").unwrap()]
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let block = &rest[rest.find("```text\n").unwrap() + "```text\n".len()..];
        out.push((args, block[..block.find("```").unwrap()].to_string()));
    }
    out
}

#[test]
fn the_readme_shows_what_replay_prints_for_each_example_trace() {
    let reports = readme_reports();
    assert!(reports.len() >= 3, "the README shows the example reports");
    for (args, shown) in reports {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = replay(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            printed, shown,
            "sluice replay {args:?} no longer prints what the README shows"
        );
    }
}

/// The JSON report's totals add up, and pricing edits (docs/cache.md) bills the browser trace
/// less than pruning eagerly did, though it forwards more tokens.
#[test]
fn the_json_report_has_the_same_totals_and_priced_edits_bill_less_than_eager_ones() {
    let report = |args: &[&str]| -> Value {
        let out = replay(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let priced = report(&["--json", "examples/browser-session.jsonl"]);
    let eager = report(&[
        "--json",
        "--config",
        "examples/browser.toml",
        "examples/browser-session.jsonl",
    ]);
    for r in [&priced, &eager] {
        let totals = &r["totals"];
        assert_eq!(r["requests"], 21);
        assert_eq!(totals["turns"], 21);
        assert_eq!(r["failed"], serde_json::json!([]));
        assert!(totals["forwarded_tokens"].as_u64() < totals["received_tokens"].as_u64());
        let turns = r["sessions"][0]["turns"].as_array().unwrap();
        let sum: u64 = turns
            .iter()
            .map(|t| t["received_tokens"].as_u64().unwrap())
            .sum();
        assert_eq!(Some(sum), totals["received_tokens"].as_u64());
        assert!(totals["images"]["placeholder"].as_u64().unwrap() > 0);
    }
    let cost = |r: &Value| r["totals"]["cost_forwarded"].as_f64().unwrap();
    let tokens = |r: &Value| r["totals"]["forwarded_tokens"].as_u64().unwrap();
    assert!(
        cost(&priced) < cost(&eager),
        "{} vs {}",
        cost(&priced),
        cost(&eager)
    );
    assert!(tokens(&priced) > tokens(&eager));
}

#[test]
fn a_bad_trace_line_is_named_and_nothing_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("bad.jsonl");
    std::fs::write(
        &trace,
        "{\"path\":\"/v1/messages\",\"body\":{\"model\":\"m\",\"messages\":[]}}\n{\"path\":\"/v1/messages\"}\n",
    )
    .unwrap();
    let out = replay(&[trace.to_str().unwrap()]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("line 2") && said.contains("body"), "{said}");
    let out = replay(&["/nonexistent/trace.jsonl"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}
