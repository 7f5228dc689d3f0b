//! The inspector's page in a real browser (docs/inspector.md, SPEC 9.1 `GET /sluice/ui`):
//! headless Chromium driven over WebDriver by Debian's chromedriver. A scripted session goes
//! through sluice — a spilled output read on in a hidden round, a `once` and a `recent` image,
//! the hidden round spliced back on the next turn — then the page is opened, the key entered,
//! the session picked: the turn view shows each of them, the thumbnails load, the savings panel
//! matches the API. A screenshot is saved as `target/inspector-ui.png`. Another tenant's key
//! shows no session. A turn's audio plays from its artifact.
//!
//! Ignored by default (it needs `chromium` and `chromium-driver`); `.ci/run` installs both and
//! runs it: `cargo test --test ui -- --ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{client, config_for, get_as, tool_output, MockUpstream, Sluice};
use serde_json::{json, Value};

const KEY: &str = "sk-ui-tenant";
const SESSION: &str = "ui-session";

/// A chromedriver on a free port, and a headless Chromium session on it.
struct Browser {
    driver: Child,
    base: String,
    session: String,
}

impl Browser {
    async fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut driver =
            Command::new(std::env::var("CHROMEDRIVER").unwrap_or("chromedriver".into()))
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromedriver (apt-get install chromium chromium-driver)");
        let base = format!("http://127.0.0.1:{port}");
        let chromium = std::env::var("CHROMIUM").unwrap_or("/usr/bin/chromium".into());
        let capabilities = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": ["--headless=new", "--no-sandbox",
                "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,2200"]}}}});
        for _ in 0..100 {
            if let Ok(r) = client()
                .post(format!("{base}/session"))
                .json(&capabilities)
                .send()
                .await
            {
                let v: Value = r.json().await.unwrap();
                let session = v["value"]["sessionId"]
                    .as_str()
                    .unwrap_or_else(|| panic!("no session: {v}"));
                return Browser {
                    driver,
                    base,
                    session: session.to_string(),
                };
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = driver.kill();
        let _ = driver.wait();
        panic!("chromedriver did not start");
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let request = client().request(method, url);
        let request = if body.is_null() {
            request
        } else {
            request.json(&body)
        };
        let response = request.send().await.unwrap();
        let v: Value = response.json().await.unwrap();
        assert!(v["value"]["error"].is_null(), "{path}: {v}");
        v["value"].clone()
    }

    async fn open(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", json!({"url": url}))
            .await;
    }

    async fn js(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    async fn element(&self, css: &str) -> String {
        let v = self
            .call(
                reqwest::Method::POST,
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        v.as_object()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    }

    async fn click(&self, css: &str) {
        let id = self.element(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            json!({}),
        )
        .await;
    }

    async fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            json!({"text": text}),
        )
        .await;
    }

    /// Waits until `script` returns a truthy value, and returns it.
    async fn until(&self, script: &str, what: &str) -> Value {
        for _ in 0..200 {
            let v = self.js(script).await;
            if !(v.is_null() || v == json!(false) || v == json!(0) || v == json!("")) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let status = self
            .js("return document.querySelector('#status').textContent")
            .await;
        panic!("the page never showed {what} (status: {status})");
    }

    /// Opens the page, enters the key and picks session `id` from the list.
    async fn open_session(&self, sluice: &Sluice, id: &str) {
        self.open(&sluice.url("/sluice/ui")).await;
        self.type_into("#key", KEY).await;
        self.click("#key-form button[type=submit]").await;
        let row = format!("#sessions tbody button[data-session='{id}']");
        self.until(
            &format!("return document.querySelector(\"{row}\")?.textContent"),
            "the session",
        )
        .await;
        self.click(&row).await;
    }

    async fn screenshot(&self, path: &std::path::Path) {
        let png = self
            .call(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        let bytes = base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            png.as_str().unwrap(),
        )
        .unwrap();
        // The target dir may live elsewhere (CARGO_TARGET_DIR): make the place for it.
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, bytes).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

#[tokio::test]
#[ignore = "needs chromium and chromium-driver; .ci/run runs it"]
async fn the_page_shows_a_sessions_turns_images_reads_and_savings() {
    let mock = MockUpstream::start();
    mock.prompt_cache(true);
    let sluice = Sluice::start(&config_for(
        &mock.base_url(),
        "[inspector]\nenabled = true\n",
    ));
    common::inspected_session(&sluice, &mock, KEY, SESSION).await;
    let list: Value = get_as(&sluice, "/v1/sluice/sessions", KEY)
        .await
        .json()
        .await
        .unwrap();
    let head = list["sessions"][0].clone();
    assert_eq!(head["label"], SESSION);
    let id = head["id"].as_str().unwrap().to_string();

    let browser = Browser::start().await;
    browser.open_session(&sluice, &id).await;
    browser
        .until(
            "return document.querySelectorAll('#turns > li').length === 3",
            "three turns",
        )
        .await;
    // The turn view: the spilled result, the hidden read round and its splice, both images.
    let shown = browser
        .js(r#"
        const turns = [...document.querySelectorAll('#turns > li')];
        return turns.map(t => ({
          fates: [...t.querySelectorAll('[data-result]')].map(r => r.dataset.fate),
          images: [...t.querySelectorAll('figure')].map(f => f.dataset.fate),
          reads: Number(t.querySelector('[data-reads]')?.dataset.reads || 0),
          hidden: Number(t.querySelector('[data-hidden]')?.dataset.hidden || 0),
        }));"#)
        .await;
    assert_eq!(shown[0]["fates"], json!(["spilled"]), "{shown}");
    assert_eq!(shown[0]["reads"], 1, "{shown}");
    assert!(shown[1]["hidden"].as_u64().unwrap() > 0, "{shown}");
    assert_eq!(
        shown[1]["images"],
        json!(["embedded", "embedded"]),
        "{shown}"
    );
    assert_eq!(
        shown[2]["images"],
        json!(["embedded", "placeholder"]),
        "{shown}"
    );
    // The page of the spilled result opens with its notice.
    browser
        .click("#turns > li:first-child [data-fate=spilled] div:last-child details summary")
        .await;
    let page = browser
        .until("return document.querySelector('#turns > li:first-child [data-fate=spilled] div:last-child pre')?.textContent.includes('full text: artifact://') && document.querySelector('#turns > li:first-child [data-fate=spilled] div:last-child pre').textContent", "the page")
        .await;
    let first_line = tool_output(150_000).lines().next().unwrap().to_string();
    assert!(page.as_str().unwrap().starts_with(&first_line), "{page}");
    // Every thumbnail loads.
    let loaded = browser
        .until("const i = [...document.querySelectorAll('figure img')]; return i.length === 4 && i.every(x => x.complete && x.naturalWidth > 0) && i.map(x => x.naturalWidth)", "the thumbnails")
        .await;
    assert_eq!(loaded, json!([320, 64, 320, 64]));
    // The savings panel shows the API's numbers.
    let record: Value = get_as(&sluice, &format!("/v1/sluice/sessions/{id}"), KEY)
        .await
        .json()
        .await
        .unwrap();
    let totals = &record["session"]["totals"];
    let panel = browser.js("return Object.fromEntries([...document.querySelectorAll('#savings dd')].map(d => [d.dataset.key, d.dataset.value]))").await;
    for key in [
        "received_tokens",
        "forwarded_tokens",
        "received_cost",
        "forwarded_cost",
        "provider_cached",
        "spilled",
        "reads",
    ] {
        let shown: f64 = panel[key].as_str().unwrap().parse().unwrap();
        assert!(
            (shown - totals[key].as_f64().unwrap()).abs() < 1e-6,
            "{key}: {panel} vs {totals}"
        );
    }
    assert!(totals["forwarded_tokens"].as_u64() < totals["received_tokens"].as_u64());
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/inspector-ui.png");
    browser.screenshot(&target).await;
    println!("screenshot: {}", target.display());

    // Another tenant's key: no session.
    browser.js("sessionStorage.clear()").await;
    browser.open(&sluice.url("/sluice/ui")).await;
    browser.type_into("#key", "sk-another-tenant").await;
    browser.click("#key-form button[type=submit]").await;
    browser
        .until(
            "return document.querySelector('#status').textContent.includes('No sessions')",
            "no sessions",
        )
        .await;
    let rows = browser
        .js("return document.querySelectorAll('#sessions tbody tr').length")
        .await;
    assert_eq!(rows, 0);
}

/// The page plays what a turn's tool results carried as audio (docs/audio.md): one file sent to
/// the model on an audio route, one refused; the player loads the artifact with the key and
/// reads its length.
#[tokio::test]
#[ignore = "needs chromium and chromium-driver: .ci/run installs them"]
async fn the_page_plays_a_turns_audio() {
    let mock = MockUpstream::start();
    let config = common::on_every_route(
        &config_for(&mock.base_url(), "[inspector]\nenabled = true\n"),
        "input_modalities = [\"text\", \"audio\"]",
    );
    let sluice = Sluice::start(&config);
    // A mono 16-bit 8 kHz WAV of 1.5 s.
    let mut wav = b"RIFF".to_vec();
    wav.extend_from_slice(&(36u32 + 24_000).to_le_bytes());
    wav.extend_from_slice(
        b"WAVEfmt \x10\0\0\0\x01\0\x01\0\x40\x1f\0\0\x80\x3e\0\0\x02\0\x10\0data",
    );
    wav.extend_from_slice(&24_000u32.to_le_bytes());
    wav.extend((0..24_000u32).map(|i| ((i * 7) % 256) as u8));
    let clip = common::b64(&wav);
    let text = json!({"content": [
        {"type": "audio", "data": clip, "mimeType": "audio/wav"},
        {"type": "audio", "data": clip, "mimeType": "audio/mpeg"}]})
    .to_string();
    let body = json!({"model": "gpt-4o-audio-preview", "messages": [
        {"role": "user", "content": "Listen."},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "record", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": text}]});
    let response = common::post_as(&sluice, "/v1/chat/completions", KEY, &body).await;
    assert_eq!(response.status().as_u16(), 200);
    response.bytes().await.unwrap();
    let id = common::newest_session(&sluice, KEY).await;

    let browser = Browser::start().await;
    browser.open_session(&sluice, &id).await;
    let fates = browser
        .until(
            "const f = [...document.querySelectorAll('[data-audio-fate]')]; return f.length === 2 && f.map(x => x.dataset.audioFate)",
            "the audio",
        )
        .await;
    assert_eq!(fates, json!(["embedded", "refused"]));
    let length = browser
        .until(
            "const a = document.querySelectorAll('audio[data-artifact]'); return a.length === 1 && a[0].readyState >= 1 && a[0].duration",
            "the player's metadata",
        )
        .await;
    let seconds = length.as_f64().unwrap();
    assert!((seconds - 1.5).abs() < 0.01, "{seconds}");
    let target =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/inspector-audio.png");
    browser.screenshot(&target).await;
}
