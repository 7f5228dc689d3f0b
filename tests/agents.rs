//! Real agents through sluice (issue "real wire", #40): Claude Code, Codex CLI and Gemini CLI,
//! pinned and installed by `tests/agents/run.sh` from the npm registry, run against sluice and the mock
//! model. The model runs the agent's own shell tool (`seq 1 N`), sluice spills the long result
//! (T3) and offers its read tool (C1), the model reads on through it (C2), the agent gets one
//! well-formed answer, and the agent's next turn carries the hidden round spliced back (C3).
//! Once with the provider answering uncompressed, once gzip (P3, A9).
//!
//! Every agent runs with HOME and its config under the test's temp dir, telemetry, update checks
//! and non-essential traffic off; its only network is sluice on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{config_for, guard_routes, metric, MockUpstream, Sluice};
use serde_json::Value;

/// The agents' npm install (tests/agents/node_modules/.bin).
fn bin(name: &str) -> PathBuf {
    let dir = std::env::var("SLUICE_AGENTS_BIN").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/agents/node_modules/.bin"
        )
        .to_string()
    });
    let path = Path::new(&dir).join(name);
    assert!(
        path.exists(),
        "{} is missing: run tests/agents/run.sh",
        path.display()
    );
    path
}

/// Runs `command` to its end or `limit`, whichever comes first; (success, stdout, stderr).
fn run(mut command: Command, limit: Duration) -> (bool, String, String) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the agent");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    (status.is_some_and(|s| s.success()), out, err)
}

/// The environment every agent gets: its own HOME, no telemetry, no updates.
fn quiet(command: &mut Command, home: &Path) {
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("TMPDIR", home.join("tmp"))
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("NO_UPDATE_NOTIFIER", "1")
        .env("CODEX_HOME", home.join(".codex"))
        .env("NO_COLOR", "1");
    std::fs::create_dir_all(home.join("tmp")).unwrap();
    std::fs::create_dir_all(home.join(".codex")).unwrap();
}

/// The requests the mock saw on `path`.
fn on(mock: &MockUpstream, path: &str) -> Vec<Value> {
    mock.requests()
        .iter()
        .filter(|r| r.uri.split('?').next() == Some(path))
        .map(common::mock::Recorded::json)
        .collect()
}

/// A request's history as text, tools left out.
fn history(request: &Value) -> String {
    let mut r = request.clone();
    if let Some(o) = r.as_object_mut() {
        o.remove("tools");
        o.remove("instructions");
        o.remove("system");
    }
    r.to_string()
}

/// The request that showed the model the spilled first page (with the read tool offered last),
/// after checking that the model then read the next page through it (T3, C1, C2).
fn spilled_and_read<'a>(requests: &'a [Value], case: &str) -> &'a Value {
    let spilled = requests
        .iter()
        .find(|r| history(r).contains("[sluice: lines 1-1999 of "))
        .unwrap_or_else(|| {
            let notices: Vec<String> = requests
                .iter()
                .map(history)
                .flat_map(|h| {
                    h.match_indices("[sluice:")
                        .map(|(i, _)| h[i..(i + 120).min(h.len())].to_string())
                        .collect::<Vec<_>>()
                })
                .collect();
            panic!("{case}: no spilled page reached the model: {notices:?}")
        });
    let last = spilled["tools"].as_array().unwrap().last().unwrap().clone();
    let name = last["name"]
        .as_str()
        .or(last["function"]["name"].as_str())
        .map(str::to_string)
        .or_else(|| last_declared(spilled)["name"].as_str().map(str::to_string));
    assert_eq!(name.as_deref(), Some("sluice_read"), "{case}");
    assert!(
        requests
            .iter()
            .any(|r| history(r).contains("sluice: lines 2000-")),
        "{case}: the model read the next page"
    );
    spilled
}

/// Every request of the agent's next turn carries the hidden round (the read call and the page
/// it read) spliced back where the agent's copy of the answer stands (C3).
fn spliced(next: &[Value], case: &str) {
    assert!(!next.is_empty(), "{case}: no second turn reached the model");
    for r in next {
        let h = history(r);
        assert!(
            h.contains("\"name\":\"sluice_read\"") && h.contains("sluice: lines 2000-"),
            "{case}: the hidden round is spliced back"
        );
    }
}

const PROMPT: &str =
    "Count to 5000 with the shell and tell me what you saw. mock:shell=5000 mock:read=1";

#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn claude_code_reads_a_spilled_bash_result_through_sluice() {
    // Claude Code accepts `gzip, deflate, br, zstd`.
    for coding in [None, Some("gzip"), Some("br"), Some("zstd")] {
        let mock = MockUpstream::start();
        mock.compress(coding);
        let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
        let home = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let claude = |args: &[&str]| {
            let mut command = Command::new(bin("claude"));
            quiet(&mut command, home.path());
            command
                .current_dir(work.path())
                .env("ANTHROPIC_BASE_URL", sluice.url(""))
                .env("ANTHROPIC_API_KEY", "sk-ant-test")
                .args(args)
                .args([
                    "--output-format",
                    "stream-json",
                    "--verbose",
                    "--allowedTools",
                    "Bash",
                    "--model",
                    "claude-sonnet-4-5",
                ]);
            run(command, Duration::from_secs(120))
        };
        let (ok, out, err) = claude(&["-p", PROMPT]);
        let case = format!("coding {coding:?}");
        println!("--- claude ({case}) stdout:\n{out}\n--- stderr:\n{err}");
        assert!(ok, "{case}: claude failed");
        let events: Vec<Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let result = events
            .iter()
            .find(|e| e["type"] == "result")
            .unwrap_or_else(|| panic!("{case}: no result event"));
        assert_eq!(result["is_error"], false, "{case}: {result}");
        assert_eq!(result["result"], "Read 1 pages.", "{case}: {result}");
        assert!(!out.contains("sluice_read"), "{case}: the read call leaked");
        spilled_and_read(&on(&mock, "/v1/messages"), &case);
        // The next turn carries the hidden round (the read call and its page) spliced back.
        let before = mock.requests().len();
        let (ok, out, err) = claude(&["-p", "And now? mock:read=1", "--continue"]);
        println!("--- claude --continue ({case}) stdout:\n{out}\n--- stderr:\n{err}");
        assert!(ok, "{case}: claude --continue failed");
        let next: Vec<Value> = mock.requests()[before..]
            .iter()
            .filter(|r| r.uri.starts_with("/v1/messages?") || r.uri == "/v1/messages")
            .map(common::mock::Recorded::json)
            .filter(|m| history(m).contains("And now?"))
            .collect();
        spliced(&next, &case);
        let m = futures_executor(sluice.metrics());
        assert_eq!(
            metric(&m, "sluice_commits_total{outcome=\"discarded\"}"),
            0.0,
            "{case}"
        );
    }
}

/// Runs a future to completion on a small runtime (the agent tests are synchronous).
fn futures_executor<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn codex_reads_a_spilled_exec_result_through_sluice() {
    // Codex accepts `zstd,gzip`.
    for coding in [None, Some("gzip"), Some("zstd")] {
        let mock = MockUpstream::start();
        mock.compress(coding);
        // Codex shortens a long command output itself (head and tail, about 2,200 lines of
        // `seq 1 5000`): still over sluice's 2,000-line page.
        let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
        let home = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        codex_config(home.path(), &sluice, "");
        let codex = |args: &[&str]| codex(home.path(), work.path(), args);
        let case = format!("coding {coding:?}");
        let (ok, out, err) = codex(&[PROMPT]);
        println!("--- codex ({case}) stdout:\n{out}\n--- stderr:\n{err}");
        assert!(ok, "{case}: codex failed");
        assert!(out.contains("Read 1 pages."), "{case}: no answer");
        assert!(!out.contains("sluice_read"), "{case}: the read call leaked");
        let responses = on(&mock, "/v1/responses");
        let spilled = spilled_and_read(&responses, &case);
        assert!(
            history(spilled).contains("\\\"analytics_enabled\\\":false"),
            "{case}: Codex analytics are off"
        );
        let before = mock.requests().len();
        let (ok, out, err) = codex(&["resume", "--last", "And now? mock:read=1"]);
        println!("--- codex resume ({case}) stdout:\n{out}\n--- stderr:\n{err}");
        assert!(ok, "{case}: codex resume failed");
        let next: Vec<Value> = mock.requests()[before..]
            .iter()
            .filter(|r| r.uri == "/v1/responses")
            .map(common::mock::Recorded::json)
            .collect();
        spliced(&next, &case);
    }
}

/// Codex's config under `home`: the mock provider through sluice (Responses), analytics and
/// update checks off, and `extra` TOML.
fn codex_config(home: &Path, sluice: &Sluice, extra: &str) {
    std::fs::create_dir_all(home.join(".codex")).unwrap();
    std::fs::write(
        home.join(".codex/config.toml"),
        format!(
            r#"model = "gpt-5"
model_provider = "mock"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.mock]
name = "mock"
base_url = "{}"
wire_api = "responses"
env_key = "MOCK_API_KEY"
request_max_retries = 0
stream_max_retries = 0
{extra}
"#,
            sluice.url("/v1")
        ),
    )
    .unwrap();
}

/// Runs `codex exec` (non-interactive, JSON events, no sandbox: Codex refuses MCP calls under
/// `approval_policy = never` otherwise) with `args` after its flags.
fn codex(home: &Path, work: &Path, args: &[&str]) -> (bool, String, String) {
    let mut command = Command::new(bin("codex"));
    quiet(&mut command, home);
    let (resume, args) = match args {
        ["resume", "--last", rest @ ..] => (true, rest),
        _ => (false, args),
    };
    command
        .current_dir(work)
        .env("MOCK_API_KEY", "sk-test")
        .arg("exec");
    if resume {
        command.args(["resume", "--last"]);
    }
    command
        .args([
            "--json",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
        ])
        .args(args);
    run(command, Duration::from_secs(180))
}

/// The python that has the MCP SDK (tests/agents/run.sh puts it in the repo's .venv).
fn mcp_python() -> String {
    std::env::var("SLUICE_AGENTS_PYTHON")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python").to_string())
}

const SCREENSHOTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/screenshots.py");

/// Image parts in a request (Anthropic `image` blocks, Responses `input_image` parts).
fn image_parts(request: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    let mut stack = vec![request.clone()];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => {
                if matches!(
                    map.get("type").and_then(Value::as_str),
                    Some("image" | "input_image")
                ) || map.contains_key("inlineData")
                {
                    out.push(Value::Object(map));
                } else {
                    stack.extend(map.into_iter().map(|(_, v)| v));
                }
            }
            _ => {}
        }
    }
    out
}

/// Tool results in a request's history.
fn results(request: &Value) -> usize {
    let h = history(request);
    h.matches("\"type\":\"tool_result\"").count()
        + h.matches("\"type\":\"function_call_output\"").count()
        + h.matches("\"functionResponse\"").count()
}

/// For each count of screenshot results 1, 2, …: the images the model was shown then.
fn pattern(requests: &[Value]) -> Vec<usize> {
    let mut seen = std::collections::BTreeMap::new();
    for r in requests {
        let k = results(r);
        if k > 0 {
            seen.entry(k).or_insert_with(|| image_parts(r).len());
        }
    }
    seen.into_values().collect()
}

/// `recent` screenshots (3 kept, pruned 2 at a time, SPEC A4 as written: `policy = "eager"`)
/// over 8 turns, then 4 more.
const RECENT: [usize; 12] = [1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2];

/// The default (economic) policy's promise (docs/cache.md): every request shows at least the
/// `recent_count` (3) newest screenshots, and never more than were taken.
fn keeps_recent(pattern: &[usize]) -> bool {
    pattern
        .iter()
        .enumerate()
        .all(|(i, &n)| n >= (i + 1).min(3) && n <= i + 1)
}

#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn claude_code_screenshots_keep_the_newest_three_on_every_request() {
    let mock = MockUpstream::start();
    // The inspector on, and a provider cache that reports usage: the session's records are
    // checked at the end.
    mock.prompt_cache(true);
    let sluice = Sluice::start(&config_for(
        &mock.base_url(),
        "[inspector]\nenabled = true\n",
    ));
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let mcp = serde_json::json!({"mcpServers": {"shots": {"command": mcp_python(), "args": [SCREENSHOTS]}}});
    let claude = |args: &[&str]| {
        let mut command = Command::new(bin("claude"));
        quiet(&mut command, home.path());
        command
            .current_dir(work.path())
            .env("ANTHROPIC_BASE_URL", sluice.url(""))
            .env("ANTHROPIC_API_KEY", "sk-ant-test")
            .args(args)
            // MCP tools in the request's tools, not behind Claude Code's tool search.
            .env("ENABLE_TOOL_SEARCH", "false")
            .args(["--output-format", "stream-json", "--verbose"])
            .args(["--mcp-config", &mcp.to_string()])
            .args(["--allowedTools", "mcp__shots__browser_take_screenshot"])
            .args(["--model", "claude-sonnet-4-5"]);
        run(command, Duration::from_secs(180))
    };
    let (ok, out, err) = claude(&["-p", "Watch the page. mock:screenshots=8"]);
    println!("--- claude stdout:\n{out}\n--- stderr:\n{err}");
    assert!(ok, "claude failed");
    assert!(out.contains("Took 8 screenshots."));
    let turns: Vec<Value> = on(&mock, "/v1/messages")
        .into_iter()
        .filter(|r| r.to_string().contains("browser_take_screenshot"))
        .collect();
    let shown = pattern(&turns);
    assert_eq!(shown.len(), 8, "{shown:?}");
    assert!(keeps_recent(&shown), "images shown per turn: {shown:?}");
    let (ok, out, err) = claude(&["-p", "Keep watching. mock:screenshots=12", "--continue"]);
    println!("--- claude --continue stdout:\n{out}\n--- stderr:\n{err}");
    assert!(ok, "claude --continue failed");
    let turns: Vec<Value> = on(&mock, "/v1/messages")
        .into_iter()
        .filter(|r| r.to_string().contains("browser_take_screenshot"))
        .collect();
    let shown = pattern(&turns);
    assert_eq!(shown.len(), 12, "{shown:?}");
    assert!(
        keeps_recent(&shown),
        "the next prompt keeps the promise: {shown:?}"
    );
    // Claude Code's three breakpoints and at most one of sluice's: never past four.
    for r in on(&mock, "/v1/messages") {
        let markers = r.to_string().matches("\"cache_control\"").count();
        assert!(markers <= 4, "{markers} breakpoints");
    }
    inspected_screenshots(&sluice, "sk-ant-test");
}

/// The inspector's record of a real agent's screenshot session (docs/inspector.md): every
/// screenshot turn is there, streamed, with its images' fates, the provider's usage, and a
/// cacheable prefix the provider's count confirms.
fn inspected_screenshots(sluice: &Sluice, key: &str) {
    let get = |path: String| {
        futures_executor(async {
            common::get_as(sluice, &path, key)
                .await
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    let list = get("/v1/sluice/sessions".into());
    let sessions = list["sessions"].as_array().unwrap();
    let busiest = sessions
        .iter()
        .max_by_key(|s| s["turns"].as_u64().unwrap_or(0))
        .unwrap_or_else(|| panic!("no session recorded: {list}"));
    let id = busiest["id"].as_str().unwrap();
    let record = get(format!("/v1/sluice/sessions/{id}"));
    let turns = record["turns"].as_array().unwrap();
    let shots: Vec<&Value> = turns
        .iter()
        .filter(|t| !t["images"].as_array().unwrap().is_empty())
        .collect();
    assert!(
        shots.len() >= 12,
        "{} screenshot turns recorded",
        shots.len()
    );
    let fates: Vec<String> = shots
        .iter()
        .flat_map(|t| t["images"].as_array().unwrap())
        .map(|i| i["fate"].as_str().unwrap().to_string())
        .collect();
    // Placeholders only once a prune paid (docs/cache.md): not every 12-turn session has one.
    assert!(fates.iter().any(|f| f == "embedded"));
    let mut ratios = Vec::new();
    for t in &shots {
        assert_eq!(t["stream"], true, "{t}");
        assert_eq!(t["complete"], true, "{t}");
        let cached = t["usage"]["cached"]
            .as_f64()
            .unwrap_or_else(|| panic!("no usage: {t}"));
        let estimate = t["prefix"]["forwarded_tokens"].as_f64().unwrap();
        if cached > 0.0 && estimate > 0.0 {
            ratios.push(cached / estimate);
        }
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "Claude Code screenshots: {} turns; provider-reported cached / estimated prefix {:.3}-{:.3}",
        shots.len(),
        ratios.first().unwrap_or(&0.0),
        ratios.last().unwrap_or(&0.0)
    );
    assert!(
        !ratios.is_empty(),
        "the provider never reported a cache hit"
    );
    let totals = &busiest["totals"];
    println!("Claude Code screenshots, session totals: {totals}");
    assert_eq!(totals["completed"], busiest["turns"], "{totals}");
    assert!(
        totals["images_embedded"].as_u64().unwrap() >= 12,
        "{totals}"
    );
}

#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn codex_screenshots_follow_the_recent_pattern_with_detail_kept() {
    let mock = MockUpstream::start();
    // A4's batches as written; the Claude Code test runs the default (economic) policy.
    let sluice = Sluice::start(&common::on_every_route(
        &config_for(&mock.base_url(), ""),
        "cache.policy = \"eager\"",
    ));
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let server = format!(
        // `required`: the first turn waits for the server (a loaded machine starts it slowly).
        "[mcp_servers.shots]\ncommand = {:?}\nargs = [{:?}]\nrequired = true\nstartup_timeout_sec = 60\n",
        mcp_python(),
        SCREENSHOTS
    );
    codex_config(home.path(), &sluice, &server);
    let (ok, out, err) = codex(
        home.path(),
        work.path(),
        &["Watch the page. mock:screenshots=8"],
    );
    println!("--- codex stdout:\n{out}\n--- stderr:\n{err}");
    assert!(ok, "codex failed");
    assert!(out.contains("Took 8 screenshots."));
    let turns = || -> Vec<Value> {
        on(&mock, "/v1/responses")
            .into_iter()
            .filter(|r| r.to_string().contains("browser_take_screenshot"))
            .collect()
    };
    assert_eq!(pattern(&turns()), RECENT[..8], "images shown per turn");
    let (ok, out, err) = codex(
        home.path(),
        work.path(),
        &["resume", "--last", "Keep watching. mock:screenshots=12"],
    );
    println!("--- codex resume stdout:\n{out}\n--- stderr:\n{err}");
    assert!(ok, "codex resume failed");
    assert_eq!(
        pattern(&turns()),
        RECENT,
        "the next prompt continues the pattern"
    );
    // Codex sends its MCP images with `detail`; every image sluice embeds keeps it (P2).
    let shown: Vec<Value> = turns().iter().flat_map(image_parts).collect();
    assert!(!shown.is_empty());
    for part in &shown {
        assert_eq!(
            part["detail"],
            "high",
            "{}",
            &part.to_string()[..200.min(part.to_string().len())]
        );
    }
}

#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn node_sdks_get_one_response_while_the_model_reads_on() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("output.txt");
    std::fs::write(&file, common::tool_output(150_000)).unwrap();
    // Node's fetch sends `gzip, deflate`; the provider answers in each in turn.
    for coding in [None, Some("gzip"), Some("deflate")] {
        let mock = MockUpstream::start();
        mock.compress(coding);
        // The script checks that the rounds' usage is summed: each round reports the mock's
        // fixed usage, not a prompt cache's count.
        mock.prompt_cache(false);
        let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
        let mut command = Command::new("node");
        command
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents"))
            .arg("sdk.mjs")
            .arg(sluice.url("/v1"))
            .arg(sluice.url(""))
            .arg(&file);
        let (ok, out, err) = run(command, Duration::from_secs(120));
        println!("--- node SDKs ({coding:?}):\n{out}{err}");
        assert!(ok && out.contains("6 passed, 0 failed"), "{coding:?}");
        if let Some(coding) = coding {
            let accepted: Vec<String> = mock
                .requests()
                .iter()
                .map(|r| format!("{} {:?}", r.uri, r.headers.get("accept-encoding")))
                .collect();
            assert!(accepted.iter().all(|a| a.contains(coding)), "{accepted:#?}");
        }
        let m = futures_executor(sluice.metrics());
        // 3 dialects x (non-streamed, streamed) x 3 pages.
        let pages = metric(&m, "sluice_read_calls_total{outcome=\"page\"}");
        assert_eq!(pages, 18.0, "{coding:?}");
    }
}

/// The context guard with a real Claude Code session (docs/context-guard.md): the model runs
/// twelve long counts in one session. Measured without a window first, the session's last
/// request is past the window chosen here; with the mock enforcing that window and the guard on,
/// every request fits, older results are retired, and Claude Code finishes normally.
#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn claude_code_keeps_working_past_its_window_under_the_context_guard() {
    const CALLS: usize = 12;
    let prompt = format!("Run the counts. mock:shells={CALLS}");
    let claude = |sluice: &Sluice, home: &Path, work: &Path| {
        let mut command = Command::new(bin("claude"));
        quiet(&mut command, home);
        command
            .current_dir(work)
            .env("ANTHROPIC_BASE_URL", sluice.url(""))
            .env("ANTHROPIC_API_KEY", "sk-ant-test")
            .args(["-p", &prompt])
            .args(["--output-format", "stream-json", "--verbose"])
            .args(["--allowedTools", "Bash", "--model", "claude-sonnet-4-5"]);
        let (ok, out, err) = run(command, Duration::from_secs(180));
        println!("--- claude stdout:\n{out}\n--- stderr:\n{err}");
        let result = out
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["type"] == "result");
        (ok, result)
    };
    let session = |requests: Vec<Value>| -> Vec<Value> {
        requests
            .into_iter()
            .filter(|r| history(r).contains("mock:shells="))
            .collect()
    };
    // Without a window: how large the session grows, as the mock counts it.
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
    let (home, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ok, result) = claude(&sluice, home.path(), work.path());
    assert!(ok, "claude without a window");
    assert_eq!(result.unwrap()["result"], format!("Ran {CALLS} commands."));
    let requests = session(on(&mock, "/v1/messages"));
    let (first, last) = (requests.first().unwrap(), requests.last().unwrap());
    let output = last["max_tokens"].as_u64().unwrap();
    let (small, large) = (
        common::mock::anthropic_tokens(first),
        common::mock::anthropic_tokens(last),
    );
    let window = output + small + (large - small) / 2;
    assert!(large + output > window, "the session passes the window");
    println!("Claude Code: first request {small} tokens, last {large}, max_tokens {output}; window {window}");
    // The same session with the mock enforcing that window, through the guard.
    let mock = MockUpstream::start();
    mock.context_window(Some(window));
    let guarded = guard_routes(
        &config_for(&mock.base_url(), ""),
        &format!("window_tokens = {window}\n"),
    );
    let sluice = Sluice::start(&guarded);
    let (home, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ok, result) = claude(&sluice, home.path(), work.path());
    assert!(ok, "claude under the guard");
    let result = result.unwrap();
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(result["result"], format!("Ran {CALLS} commands."));
    let requests = session(on(&mock, "/v1/messages"));
    for r in &requests {
        assert!(
            common::mock::anthropic_tokens(r) + output <= window,
            "every request fits"
        );
    }
    let retired = history(requests.last().unwrap())
        .matches("tool output retired")
        .count();
    println!(
        "Claude Code under the guard: {} requests, all within {window}; {retired} results retired on the last",
        requests.len()
    );
    assert!(retired >= 2, "older results retired ({retired})");
    let m = futures_executor(sluice.metrics());
    assert_eq!(
        metric(&m, "sluice_context_overflows_total{route=\"anthropic\"}"),
        0.0
    );
}

/// The same with Codex CLI on the Responses API: twelve long counts through its own shell tool
/// pass the window chosen here; with the mock enforcing it and the guard on, Codex finishes.
#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn codex_keeps_working_past_its_window_under_the_context_guard() {
    const CALLS: usize = 12;
    let prompt = format!("Run the counts. mock:shells={CALLS}");
    let session = |mock: &MockUpstream| -> Vec<Value> {
        on(mock, "/v1/responses")
            .into_iter()
            .filter(|r| history(r).contains("mock:shells="))
            .collect()
    };
    let output_of = |r: &Value| r["max_output_tokens"].as_u64().unwrap_or(0);
    // Without a window: how large the session grows, as the mock counts it.
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
    let (home, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    codex_config(home.path(), &sluice, "");
    let (ok, out, err) = codex(home.path(), work.path(), &[&prompt]);
    println!("--- codex stdout:\n{out}\n--- stderr:\n{err}");
    assert!(
        ok && out.contains(&format!("Ran {CALLS} commands.")),
        "codex without a window"
    );
    let requests = session(&mock);
    let (first, last) = (requests.first().unwrap(), requests.last().unwrap());
    let output = output_of(last);
    let (small, large) = (
        common::mock::responses_tokens(first),
        common::mock::responses_tokens(last),
    );
    let window = output + small + (large - small) / 2;
    assert!(large + output > window, "the session passes the window");
    println!("Codex: first request {small} tokens, last {large}, max_output_tokens {output}; window {window}");
    // The same session with the mock enforcing that window, through the guard. Codex names no
    // output budget here: the route assumes 1,000 tokens.
    let mock = MockUpstream::start();
    mock.context_window(Some(window));
    let guarded = guard_routes(
        &config_for(&mock.base_url(), ""),
        &format!("window_tokens = {window}\noutput_tokens = 1000\n"),
    );
    assert!(
        guarded.contains("window_tokens"),
        "the openai route is guarded"
    );
    let sluice = Sluice::start(&guarded);
    let (home, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    codex_config(home.path(), &sluice, "");
    let (ok, out, err) = codex(home.path(), work.path(), &[&prompt]);
    println!("--- codex (guarded) stdout:\n{out}\n--- stderr:\n{err}");
    assert!(ok, "codex under the guard");
    assert!(
        out.contains(&format!("Ran {CALLS} commands.")),
        "codex finished"
    );
    let requests = session(&mock);
    for r in &requests {
        assert!(
            common::mock::responses_tokens(r) + output_of(r) <= window,
            "every request fits"
        );
    }
    let retired = history(requests.last().unwrap())
        .matches("tool output retired")
        .count();
    println!(
        "Codex under the guard: {} requests, all within {window}; {retired} results retired on the last",
        requests.len()
    );
    assert!(retired >= 2, "older results retired ({retired})");
}

/// sluice in front of `mock` with a Gemini route beside the others.
fn gemini_config(mock: &MockUpstream) -> String {
    format!(
        "{}\n[[routes]]\nname = \"gemini\"\ndialects = [\"gemini-generate\"]\nmodels = [\"*\"]\nupstream = \"{}\"\n",
        config_for(&mock.base_url(), ""),
        mock.base_url()
    )
}

/// Gemini CLI headless (`gemini -p`, JSON output, tools approved) with its HOME under `home`:
/// the API key auth selected, the workspace trusted, telemetry and update checks off.
fn gemini(home: &Path, work: &Path, sluice: &Sluice, args: &[&str]) -> (bool, String, String) {
    let settings = home.join(".gemini");
    std::fs::create_dir_all(&settings).unwrap();
    std::fs::write(
        settings.join("settings.json"),
        r#"{"security":{"auth":{"selectedType":"gemini-api-key"}},
            "privacy":{"usageStatisticsEnabled":false},
            "general":{"disableAutoUpdate":true,"disableUpdateNag":true},
            "model":{"disableLoopDetection":true},
            "telemetry":{"enabled":false}}"#,
    )
    .unwrap();
    let mut command = Command::new(bin("gemini"));
    quiet(&mut command, home);
    command
        .current_dir(work)
        .env("GOOGLE_GEMINI_BASE_URL", sluice.url(""))
        .env("GEMINI_API_KEY", "gemini-test-key")
        .env("GEMINI_CLI_TRUST_WORKSPACE", "true")
        .env("GEMINI_CLI_NO_RELAUNCH", "true")
        .args(["--output-format", "json", "--yolo"])
        .args(args);
    run(command, Duration::from_secs(180))
}

/// The Gemini requests the mock saw (every model method; Gemini CLI streams).
fn gemini_requests(mock: &MockUpstream) -> Vec<Value> {
    mock.requests()
        .iter()
        .filter(|r| r.uri.starts_with("/v1beta/models/"))
        .map(common::mock::Recorded::json)
        .collect()
}

/// The turns Gemini CLI streamed (not its token counts).
fn gemini_turns(mock: &MockUpstream) -> Vec<Value> {
    mock.requests()
        .iter()
        .filter(|r| r.uri.contains(":streamGenerateContent"))
        .map(common::mock::Recorded::json)
        .collect()
}

/// The last tool a Gemini request declares.
fn last_declared(request: &Value) -> Value {
    request["tools"]
        .as_array()
        .and_then(|t| t.last())
        .and_then(|t| t["functionDeclarations"].as_array())
        .and_then(|f| f.last())
        .cloned()
        .unwrap_or(Value::Null)
}

#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn gemini_cli_reads_a_spilled_shell_result_through_sluice() {
    for coding in [None, Some("gzip")] {
        let mock = MockUpstream::start();
        mock.compress(coding);
        let sluice = Sluice::start(&gemini_config(&mock));
        let home = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let case = format!("coding {coding:?}");
        let model = ["-m", "gemini-2.5-pro"];
        let (ok, out, err) = gemini(
            home.path(),
            work.path(),
            &sluice,
            &[&model[..], &["-p", PROMPT]].concat(),
        );
        println!("--- gemini ({case}) stdout:\n{out}\n--- stderr:\n{err}");
        assert!(ok, "{case}: gemini failed");
        let answer: Value = serde_json::from_str(out.trim()).expect("gemini's JSON output");
        assert_eq!(answer["response"], "Reading on. Read 1 pages.", "{case}");
        assert!(!out.contains("sluice_read"), "{case}: the read call leaked");
        let requests = gemini_requests(&mock);
        assert!(
            requests.iter().all(|r| r["tools"].is_array()),
            "{case}: every request is a turn with tools (no router call reached the mock)"
        );
        let spilled = requests
            .iter()
            .find(|r| history(r).contains("[sluice: lines 1-1999 of "))
            .unwrap_or_else(|| panic!("{case}: no spilled page reached the model"));
        assert_eq!(last_declared(spilled)["name"], "sluice_read", "{case}");
        assert!(
            last_declared(spilled)["parametersJsonSchema"].is_object(),
            "{case}"
        );
        assert!(
            requests
                .iter()
                .any(|r| history(r).contains("sluice: lines 2000-")),
            "{case}: the model read the next page"
        );
        let keys: Vec<_> = mock
            .requests()
            .iter()
            .map(|r| r.headers.get("x-goog-api-key").cloned())
            .collect();
        assert!(keys
            .iter()
            .all(|k| k.as_ref().is_some_and(|k| k == "gemini-test-key")));
        // The next turn (`--resume latest`) carries the hidden round spliced back (C3).
        let before = mock.requests().len();
        let (ok, out, err) = gemini(
            home.path(),
            work.path(),
            &sluice,
            &[
                &model[..],
                &["--resume", "latest", "-p", "And now? mock:read=1"],
            ]
            .concat(),
        );
        println!("--- gemini --resume ({case}) stdout:\n{out}\n--- stderr:\n{err}");
        assert!(ok, "{case}: gemini --resume failed");
        let next: Vec<Value> = mock.requests()[before..]
            .iter()
            .filter(|r| r.uri.starts_with("/v1beta/models/"))
            .map(common::mock::Recorded::json)
            .filter(|m| history(m).contains("And now?"))
            .collect();
        spliced(&next, &case);
        let m = futures_executor(sluice.metrics());
        assert_eq!(
            metric(&m, "sluice_commits_total{outcome=\"discarded\"}"),
            0.0,
            "{case}"
        );
    }
}

/// Gemini CLI with the MCP screenshot server and a Gemini 3 model: every request shows at least
/// the newest three screenshots (`recent`, docs/cache.md), though Gemini CLI sends each beside
/// its function response rather than in it.
#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn gemini_cli_screenshots_follow_the_recent_pattern() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&gemini_config(&mock));
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join(".gemini")).unwrap();
    let servers = serde_json::json!({"mcpServers": {"shots": {"command": mcp_python(),
        "args": [SCREENSHOTS], "trust": true}}});
    std::fs::write(
        work.path().join(".gemini/settings.json"),
        servers.to_string(),
    )
    .unwrap();
    let (ok, out, err) = gemini(
        home.path(),
        work.path(),
        &sluice,
        &[
            "-m",
            "gemini-3-pro-preview",
            "-p",
            "Watch the page. mock:screenshots=8",
        ],
    );
    println!("--- gemini stdout:\n{out}\n--- stderr:\n{err}");
    assert!(ok, "gemini failed");
    assert!(out.contains("Took 8 screenshots."), "no answer");
    let turns: Vec<Value> = gemini_turns(&mock)
        .into_iter()
        .filter(|r| r.to_string().contains("browser_take_screenshot"))
        .collect();
    let shown = pattern(&turns);
    assert_eq!(shown.len(), 8, "{shown:?}");
    assert!(keeps_recent(&shown), "images shown per turn: {shown:?}");
    // Gemini CLI puts an MCP tool's images beside its function response; each counts as
    // the tool's (its `*screenshot*` lifetime, `recent`), not as a user's (`once`).
    let last = turns.last().unwrap().to_string();
    assert!(
        !last.contains("shown earlier and no longer attached"),
        "{shown:?}"
    );
}

/// Qwen Code headless (`qwen -p`, OpenAI chat through sluice, tools approved) with its HOME
/// under `home`.
fn qwen(home: &Path, work: &Path, sluice: &Sluice, args: &[&str]) -> (bool, String, String) {
    let mut command = Command::new(bin("qwen"));
    quiet(&mut command, home);
    command
        .current_dir(work)
        .env("OPENAI_BASE_URL", sluice.url("/v1"))
        .env("OPENAI_API_KEY", "sk-qwen-test")
        .env("OPENAI_MODEL", "gpt-4.1")
        .env("QWEN_CODE_NO_RELAUNCH", "true")
        .args(["--auth-type", "openai", "--yolo", "--output-format", "json"])
        .args(args);
    run(command, Duration::from_secs(180))
}

#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn qwen_code_reads_a_spilled_shell_result_through_sluice() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (ok, out, err) = qwen(home.path(), work.path(), &sluice, &["-p", PROMPT]);
    println!("--- qwen stdout:\n{out}\n--- stderr:\n{err}");
    assert!(ok, "qwen failed");
    // chat's one content string sets the rounds' texts apart (docs/read-tool.md).
    assert!(
        out.contains(r#""result":"Reading on. \n\nRead 1 pages.""#),
        "no answer"
    );
    assert!(!out.contains("sluice_read"), "the read call leaked");
    spilled_and_read(&on(&mock, "/v1/chat/completions"), "qwen");
    let before = mock.requests().len();
    let (ok, out, err) = qwen(
        home.path(),
        work.path(),
        &sluice,
        &["--continue", "-p", "And now? mock:read=1"],
    );
    println!("--- qwen --continue stdout:\n{out}\n--- stderr:\n{err}");
    assert!(ok, "qwen --continue failed");
    let next: Vec<Value> = mock.requests()[before..]
        .iter()
        .map(common::mock::Recorded::json)
        .filter(|m| history(m).contains("And now?"))
        .collect();
    // Qwen Code rewrites its first message and system prompt when it continues a session
    // (docs/clients.md), so sluice sees a new conversation: the earlier hidden round is not
    // spliced back, and nothing else changes; the new turn reads on as the first did.
    assert!(!next.is_empty(), "qwen: no second turn reached the model");
    assert!(!out.contains("sluice_read"), "the read call leaked");
    assert!(
        out.contains("Read 1 pages."),
        "no answer on the second turn"
    );
}

/// OpenCode (`opencode run`) with its config under `home`: `provider` (`anthropic` or `openai`)
/// pointed at sluice, every permission granted, sharing and updates off.
fn opencode(
    home: &Path,
    work: &Path,
    sluice: &Sluice,
    provider: &str,
    args: &[&str],
) -> (bool, String, String) {
    let (model, key) = match provider {
        "anthropic" => ("anthropic/claude-sonnet-4-5", "sk-ant-test"),
        _ => ("openai/gpt-5", "sk-test"),
    };
    let dir = home.join(".config/opencode");
    std::fs::create_dir_all(&dir).unwrap();
    let config = serde_json::json!({
        "$schema": "https://opencode.ai/config.json",
        "model": model,
        "autoupdate": false,
        "share": "disabled",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "allow"},
        "provider": {provider: {"options": {"baseURL": sluice.url("/v1"), "apiKey": key}}},
        "mcp": {"shots": {"type": "local", "command": [mcp_python(), SCREENSHOTS], "enabled": true}}
    });
    std::fs::write(dir.join("opencode.json"), config.to_string()).unwrap();
    let mut command = Command::new(bin("opencode"));
    quiet(&mut command, home);
    command
        .current_dir(work)
        .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
        .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .env("OPENCODE_DISABLE_SHARE", "1")
        .arg("run")
        .args(args);
    run(command, Duration::from_secs(180))
}

#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn opencode_reads_a_spilled_bash_result_through_sluice() {
    for (provider, path) in [("anthropic", "/v1/messages"), ("openai", "/v1/responses")] {
        let mock = MockUpstream::start();
        let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
        let home = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let (ok, out, err) = opencode(home.path(), work.path(), &sluice, provider, &[PROMPT]);
        println!("--- opencode {provider} stdout:\n{out}\n--- stderr:\n{err}");
        assert!(ok, "opencode {provider} failed");
        assert!(out.contains("Read 1 pages."), "{provider}: no answer");
        assert!(
            !out.contains("sluice_read"),
            "{provider}: the read call leaked"
        );
        // OpenCode names its session with a short titling request first (no tools).
        let turns: Vec<Value> = on(&mock, path)
            .into_iter()
            .filter(|r| r["tools"].is_array())
            .collect();
        spilled_and_read(&turns, provider);
        let before = mock.requests().len();
        let (ok, out, err) = opencode(
            home.path(),
            work.path(),
            &sluice,
            provider,
            &["--continue", "And now? mock:read=1"],
        );
        println!("--- opencode {provider} --continue stdout:\n{out}\n--- stderr:\n{err}");
        assert!(ok, "opencode {provider} --continue failed");
        let next: Vec<Value> = mock.requests()[before..]
            .iter()
            .map(common::mock::Recorded::json)
            .filter(|m| m["tools"].is_array() && history(m).contains("And now?"))
            .collect();
        spliced(&next, provider);
    }
}

/// OpenCode (Anthropic provider) with the MCP screenshot server: every turn shows at least the
/// newest three screenshots (`recent`), each inside its tool result.
#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn opencode_screenshots_follow_the_recent_pattern() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (ok, out, err) = opencode(
        home.path(),
        work.path(),
        &sluice,
        "anthropic",
        &["Watch the page. mock:screenshots=8"],
    );
    println!("--- opencode stdout:\n{out}\n--- stderr:\n{err}");
    assert!(ok, "opencode failed");
    assert!(out.contains("Took 8 screenshots."), "no answer");
    let turns: Vec<Value> = on(&mock, "/v1/messages")
        .into_iter()
        .filter(|r| r["tools"].is_array() && r.to_string().contains("browser_take_screenshot"))
        .collect();
    let shown = pattern(&turns);
    assert_eq!(shown.len(), 8, "{shown:?}");
    assert!(keeps_recent(&shown), "images shown per turn: {shown:?}");
}

/// Qwen Code (OpenAI chat) with the MCP screenshot server: chat's tool messages take no image,
/// so Qwen Code sends each screenshot in a user message right after its tool message; each
/// counts as the tool's (`recent`), and every turn shows at least the newest three.
#[test]
#[ignore = "needs the agent CLIs: run tests/agents/run.sh"]
fn qwen_code_screenshots_follow_the_recent_pattern() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config_for(&mock.base_url(), ""));
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".qwen")).unwrap();
    // MCP tools in the request's tools, not behind Qwen Code's tool search.
    let servers = serde_json::json!({"mcpServers": {"shots": {"command": mcp_python(),
        "args": [SCREENSHOTS], "trust": true}}, "tools": {"toolSearch": {"enabled": false}}});
    std::fs::write(home.path().join(".qwen/settings.json"), servers.to_string()).unwrap();
    let (ok, out, err) = qwen(
        home.path(),
        work.path(),
        &sluice,
        &["-p", "Watch the page. mock:screenshots=8"],
    );
    println!("--- qwen stdout:\n{out}\n--- stderr:\n{err}");
    assert!(ok, "qwen failed");
    assert!(out.contains("Took 8 screenshots."), "no answer");
    let turns: Vec<Value> = on(&mock, "/v1/chat/completions")
        .into_iter()
        .filter(|r| r.to_string().contains("browser_take_screenshot"))
        .collect();
    let shown: Vec<usize> = {
        let mut seen = std::collections::BTreeMap::new();
        for r in &turns {
            let k = r["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "tool")
                .count();
            let images = r.to_string().matches(r#""type":"image_url""#).count();
            if k > 0 {
                seen.entry(k).or_insert(images);
            }
        }
        seen.into_values().collect()
    };
    assert_eq!(shown.len(), 8, "{shown:?}");
    assert!(keeps_recent(&shown), "images shown per turn: {shown:?}");
}
