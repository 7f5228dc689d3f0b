//! Test harness shared by the end-to-end tests: the mock provider, and the real `sluice`
//! binary started on port 0 with a config pointing at it.

#![allow(dead_code)] // each test file uses a different part of the harness
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

pub mod gemini;
pub mod mock;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[allow(unused_imports)] // not every test file scripts replies
pub use mock::{MockUpstream, Part, Reply};

/// The three dialects, for tests that run each case in every one of them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum D {
    Chat,
    Responses,
    Anthropic,
}

/// Every dialect, in a fixed order.
pub const DIALECTS: [D; 3] = [D::Chat, D::Responses, D::Anthropic];

impl D {
    /// The dialect's endpoint.
    pub fn path(self) -> &'static str {
        match self {
            D::Chat => "/v1/chat/completions",
            D::Responses => "/v1/responses",
            D::Anthropic => "/v1/messages",
        }
    }
}

/// A running `sluice serve`. Dropping it kills the process.
pub struct Sluice {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
    pub dir: tempfile::TempDir,
}

/// Routes every dialect to `upstream`, with test-sized timeouts. `extra` is appended to the
/// top-level table (before the routes).
pub fn config_for(upstream: &str, extra: &str) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
drain_timeout_seconds = 5
{extra}

[upstream]
connect_timeout_seconds = 2
first_byte_timeout_seconds = 10
idle_timeout_seconds = 10

[[routes]]
name = "openai"
dialects = ["openai-chat", "openai-responses"]
models = ["*"]
upstream = "{upstream}"

[[routes]]
name = "anthropic"
dialects = ["anthropic-messages"]
models = ["*"]
upstream = "{upstream}"
"#
    )
}

/// `config` with `lines` (TOML) on every route, after its `upstream` key: where a route's own
/// keys and tables go.
pub fn on_every_route(config: &str, lines: &str) -> String {
    config
        .lines()
        .map(|line| {
            if line.starts_with("upstream = \"") {
                format!("{line}\n{lines}\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect()
}

/// `config` with a `[routes.context]` table of `keys` (TOML lines) on every route: the context
/// guard on.
pub fn guard_routes(config: &str, keys: &str) -> String {
    on_every_route(config, &format!("[routes.context]\n{keys}"))
}

impl Sluice {
    /// Starts sluice with `config` (a TOML document) and extra environment variables.
    pub fn start_with(config: &str, env: &[(&str, &str)]) -> Sluice {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sluice.toml");
        let config = format!("{config}\n",);
        std::fs::write(&path, config).expect("write config");
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .arg("serve")
            .arg("--config")
            .arg(&path)
            .env("SLUICE_LOG_FORMAT", "json")
            .env("SLUICE_LOG", "debug")
            .env("SLUICE_STORE__DATA_DIR", dir.path().join("data"))
            .env_remove("SLUICE_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn sluice");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if v["message"] == "listening" {
                        let addr =
                            |k: &str| v[k].as_str().and_then(|s| s.parse::<SocketAddr>().ok());
                        let _ = tx.send((addr("proxy"), addr("admin")));
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok((Some(proxy), Some(admin))) => Sluice {
                proxy,
                admin,
                child,
                logs,
                dir,
            },
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "sluice did not start; its output:\n{}",
                    logs.lock().unwrap().join("\n")
                );
            }
        }
    }

    pub fn start(config: &str) -> Sluice {
        Self::start_with(config, &[])
    }

    /// Sluice in front of `mock` with the default test config.
    pub fn in_front_of(mock: &MockUpstream) -> Sluice {
        Self::start(&config_for(&mock.base_url(), ""))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.proxy, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    pub async fn metrics(&self) -> String {
        install_crypto();
        reqwest::get(self.admin_url("/metrics"))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM (O4).
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to exit, up to `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of a metric sample line `name{labels} value` whose text starts with `prefix`.
pub fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A client that does not pool connections (each test request on its own connection).
pub fn client() -> reqwest::Client {
    install_crypto();
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}

/// reqwest is built without a bundled crypto provider (as in sluice); install ring's.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A realistic tool output of about `bytes` bytes: a build and test log with warnings, code
/// excerpts, non-ASCII text (accents, CJK, emoji outside the BMP), CRLF lines, blank lines, and
/// one minified JSON line far longer than a page. Deterministic.
pub fn tool_output(bytes: usize) -> String {
    let mut out = String::with_capacity(bytes + 4096);
    let mut i = 0usize;
    while out.len() < bytes {
        match i % 50 {
            0 => out.push_str(&format!("   Compiling crate-{i} v0.{}.0 (/work/crates/crate-{i})\n", i % 7)),
            1..=3 => out.push_str(&format!(
                "warning: unused variable: `résumé_{i}`\n  --> src/lib.rs:{}:9\n   |\n{:>3} |     let résumé_{i} = \"日本語 😀 {i}\";\n   |         ^^^^^^^^ help: prefix it with an underscore\n\n",
                i * 3,
                i * 3
            )),
            4 => out.push_str("\r\nrunning 12 tests\r\n"),
            5 => {
                // One very long line: a minified JSON document.
                out.push_str("{\"results\":[");
                for j in 0..1200 {
                    out.push_str(&format!("{{\"id\":{j},\"name\":\"test_{j}\",\"ok\":{},\"ms\":{}.{}}},", j % 13 != 0, j % 97, j % 10));
                }
                out.push_str("{}]}\n");
            }
            _ => out.push_str(&format!("test tests::case_{i} ... ok\n")),
        }
        i += 1;
    }
    out
}

/// POSTs `body` as JSON to `path` through sluice.
pub async fn post(sluice: &Sluice, path: &str, body: &serde_json::Value) -> reqwest::Response {
    client()
        .post(sluice.url(path))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// POSTs `body` as JSON to `path` through sluice with the bearer credential `key`.
pub async fn post_as(
    sluice: &Sluice,
    path: &str,
    key: &str,
    body: &serde_json::Value,
) -> reqwest::Response {
    client()
        .post(sluice.url(path))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// GETs `path` from sluice with the bearer credential `key`.
pub async fn get_as(sluice: &Sluice, path: &str, key: &str) -> reqwest::Response {
    client()
        .get(sluice.url(path))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
}

/// A real encoded test picture of `w`×`h` in `format` (PNG, JPEG, GIF or WebP).
pub fn picture(w: u32, h: u32, format: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([(x % 256) as u8, (y % 256) as u8, ((x ^ y) % 251) as u8])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    match format {
        image::ImageFormat::WebP => image::DynamicImage::ImageRgb8(img)
            .to_rgba8()
            .write_with_encoder(image::codecs::webp::WebPEncoder::new_lossless(&mut out))
            .unwrap(),
        _ => img.write_to(&mut out, format).unwrap(),
    }
    out.into_inner()
}

/// A mono 16-bit 8 kHz WAV of `millis` milliseconds (a quiet ramp, so its bytes vary).
pub fn wav(millis: u32) -> Vec<u8> {
    let data = 16 * millis;
    let mut out = Vec::new();
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&[1, 0, 1, 0]);
    out.extend_from_slice(&8000u32.to_le_bytes());
    out.extend_from_slice(&16000u32.to_le_bytes());
    out.extend_from_slice(&[2, 0, 16, 0]);
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data.to_le_bytes());
    out.extend((0..data).map(|i| (i % 251) as u8));
    out
}

/// Standard base64.
pub fn b64(bytes: &[u8]) -> String {
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes)
}

/// Turn `upto` of an Anthropic screenshot session: one new PNG screenshot per turn, each a
/// `take_screenshot` tool result (`tu1`, `tu2`, …), the history kept whole.
pub fn screenshot_turns(upto: usize) -> serde_json::Value {
    use serde_json::json;
    let mut messages = vec![json!({"role": "user", "content": "watch"})];
    for t in 1..=upto {
        let id = format!("tu{t}");
        messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "take_screenshot", "input": {}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(&picture(9 + t as u32, 9, image::ImageFormat::Png))}}]}]}));
    }
    json!({"model": "claude-x", "max_tokens": 10, "messages": messages})
}

async fn send_as(
    sluice: &Sluice,
    key: &str,
    session: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    let response = client()
        .post(sluice.url("/v1/messages"))
        .bearer_auth(key)
        .header("x-sluice-session", session)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.unwrap()
}

fn image_block(w: u32, h: u32) -> serde_json::Value {
    serde_json::json!({"type": "image", "source": {"type": "base64", "media_type": "image/png",
        "data": b64(&picture(w, h, image::ImageFormat::Png))}})
}

/// The id of the newest session the inspector lists for `key`.
pub async fn newest_session(sluice: &Sluice, key: &str) -> String {
    let list: serde_json::Value = get_as(sluice, "/v1/sluice/sessions", key)
        .await
        .json()
        .await
        .unwrap();
    list["sessions"][0]["id"].as_str().unwrap().to_string()
}

/// Three turns of an Anthropic agent as `key` in `session`, for the inspector's tests: a long
/// build log (read on in a hidden round), then a screenshot (`recent`) and an image viewer's
/// picture (`once`), then a short output.
pub async fn inspected_session(sluice: &Sluice, mock: &MockUpstream, key: &str, session: &str) {
    use serde_json::{json, Value};
    let call = |id: &str, name: &str| {
        json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": id, "name": name, "input": {}}]})
    };
    let mut messages = vec![
        json!({"role": "user", "content": "Build it and look at the page."}),
        call("toolu_1", "bash"),
    ];
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": tool_output(150_000)}]}));
    let body = |messages: &Vec<Value>| {
        json!({"model": "claude-sonnet-4-5", "max_tokens": 1024,
        "tools": [{"name": "bash", "input_schema": {"type": "object"}},
                  {"name": "browser_take_screenshot", "input_schema": {"type": "object"}},
                  {"name": "view_image", "input_schema": {"type": "object"}}],
        "messages": messages})
    };
    mock.script([
        mock::Reply::Read {
            before: Some("Reading on. ".into()),
            also: None,
            answer: String::new(),
        },
        mock::Reply::Text("The build passed.".into()),
    ]);
    let answer = send_as(sluice, key, session, &body(&messages)).await;
    messages.push(json!({"role": "assistant", "content": answer["content"]}));
    messages.push(json!({"role": "user", "content": "Now the page."}));
    messages.push(json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_2", "name": "browser_take_screenshot", "input": {}},
        {"type": "tool_use", "id": "toolu_3", "name": "view_image", "input": {}}]}));
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": [image_block(320, 200)]},
        {"type": "tool_result", "tool_use_id": "toolu_3", "content": [image_block(64, 48)]}]}));
    send_as(sluice, key, session, &body(&messages)).await;
    messages.push(call("toolu_4", "bash"));
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_4", "content": "ok"}]}));
    send_as(sluice, key, session, &body(&messages)).await;
}

/// T5, #39: pages of the stored `text` served by `sluice` (as the tenant of `key`) are the
/// pages the whole text gives: the first few read on from `first_cursor` (as the notice gave
/// it), then pages at positions spread over the text, whole lines and inside one, through
/// cursors made for this tenant. A text over 8 MiB is cut from ranges of the store's bytes.
pub async fn pages_match_the_whole_text(
    sluice: &Sluice,
    key: &str,
    text: &str,
    first_cursor: &str,
) {
    use sluice::projection::exit::cursor::Cursor;
    use sluice::projection::exit::notice::render;
    use sluice::projection::exit::text::{Lines, Position};
    let tenant = sluice::tenant::Tenant::from_credential(key.as_bytes());
    let first = Cursor::decode(first_cursor, &tenant).expect("a cursor of this tenant");
    let lines = Lines::new(text);
    let count = lines.count() as u32;
    let mut cursors = vec![first];
    let spread = [count / 3, count / 2, count - 2, count - 1];
    cursors.extend(spread.iter().enumerate().map(|(i, &line)| Cursor {
        at: Position {
            line,
            unit: (i as u32 % 2) * 3,
        },
        ..first
    }));
    for (n, start) in cursors.into_iter().enumerate() {
        let mut cursor = start;
        for _ in 0..if n == 0 { 3 } else { 1 } {
            let want = render(
                &lines,
                &cursor.artifact,
                &tenant,
                cursor.at,
                cursor.budget,
                "sluice_read",
            );
            let got = client()
                .get(sluice.url(&format!(
                    "/v1/sluice/read?cursor={}",
                    cursor.encode(&tenant)
                )))
                .bearer_auth(key)
                .send()
                .await
                .unwrap();
            assert_eq!(got.status(), 200, "the page at {:?}", cursor.at);
            let next = got
                .headers()
                .get("x-sluice-next-cursor")
                .map(|v| v.to_str().unwrap().to_string());
            let page = got.text().await.unwrap();
            assert!(
                page == want.text,
                "the page at {:?} differs from the whole text's",
                cursor.at
            );
            assert_eq!(next, want.next, "the next cursor at {:?}", cursor.at);
            match next {
                Some(next) => cursor = Cursor::decode(&next, &tenant).unwrap(),
                None => break,
            }
        }
    }
}

/// The cursor a notice in `shown` gives to read on.
pub fn cursor_in(shown: &str) -> String {
    let at = shown
        .rfind("{\"cursor\":\"")
        .expect("a notice with a cursor")
        + 11;
    shown[at..].split('"').next().unwrap().to_string()
}
