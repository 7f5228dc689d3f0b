//! End-to-end: the real wire. Providers compress their answers when the client accepts it, and
//! some clients compress their requests. Whatever the content coding, sluice sees the decoded
//! bytes wherever it looks (the completion watch, the read tool's rounds), commits delivery
//! state only on completed responses (A9), and the client gets a body it can decode (P3).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{
    b64, client, config_for, metric, picture, tool_output, MockUpstream, Sluice, D, DIALECTS,
};
use image::ImageFormat;
use serde_json::{json, Value};

const CODINGS: [&str; 4] = ["gzip", "br", "zstd", "deflate"];

impl D {
    /// One tool turn whose result is `content` (a string), then `user` asks.
    fn request(self, content: &Value, user: &str, stream: bool) -> Value {
        let mut body = match self {
            D::Chat => json!({"model": "gpt-4o", "messages": [
                {"role": "user", "content": "look"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "render_chart", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": content},
                {"role": "user", "content": user}]}),
            D::Responses => json!({"model": "gpt-4o", "input": [
                {"role": "user", "content": "look"},
                {"type": "function_call", "call_id": "call_1", "name": "render_chart", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": content},
                {"role": "user", "content": user}]}),
            D::Anthropic => json!({"model": "claude-x", "max_tokens": 100, "messages": [
                {"role": "user", "content": "look"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": "render_chart", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": content},
                                             {"type": "text", "text": user}]}]}),
        };
        if stream {
            body["stream"] = json!(true);
        }
        body
    }

    /// A tool result holding one picture, in the dialect's own image form (chat: an MCP image
    /// item serialised into the text, as agents send it).
    fn screenshot(self, w: u32) -> Value {
        let png = b64(&picture(w, 10, ImageFormat::Png));
        match self {
            D::Chat => json!(
                json!({"content": [{"type": "image", "data": png, "mimeType": "image/png"}]})
                    .to_string()
            ),
            D::Responses => {
                json!([{"type": "input_image", "image_url": format!("data:image/png;base64,{png}")}])
            }
            D::Anthropic => {
                json!([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}])
            }
        }
    }

    /// The final event a complete stream of this dialect carries.
    fn final_event(self) -> &'static str {
        match self {
            D::Chat => "data: [DONE]",
            D::Responses => "event: response.completed",
            D::Anthropic => "event: message_stop",
        }
    }
}

/// Compresses `data` in `coding`, in one piece.
fn encode(coding: &str, data: &[u8]) -> Vec<u8> {
    match coding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        }
        "br" => {
            let mut out = Vec::new();
            {
                let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                e.write_all(data).unwrap();
            }
            out
        }
        "zstd" => zstd::encode_all(data, 3).unwrap(),
        other => panic!("no encoder for {other}"),
    }
}

/// Decodes a body the way the client's HTTP library would, by its `content-encoding`.
fn decode(coding: Option<&str>, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        None | Some("identity") => return data.to_vec(),
        Some("gzip") => flate2::read::MultiGzDecoder::new(data)
            .read_to_end(&mut out)
            .map(drop),
        Some("deflate") => flate2::read::ZlibDecoder::new(data)
            .read_to_end(&mut out)
            .map(drop),
        Some("br") => brotli::Decompressor::new(data, 4096)
            .read_to_end(&mut out)
            .map(drop),
        Some("zstd") => zstd::stream::read::Decoder::new(data)
            .unwrap()
            .read_to_end(&mut out)
            .map(drop),
        Some(other) => panic!("the client cannot decode {other}"),
    }
    .unwrap_or_else(|e| panic!("the client could not decode its {coding:?} body: {e}"));
    out
}

/// What a client got: status, the projection header, the content coding, the decoded body.
struct Got {
    status: u16,
    projection: String,
    coding: Option<String>,
    body: String,
}

async fn send(sluice: &Sluice, d: D, body: &Value, accept: &str, session: &str) -> Got {
    let response = client()
        .post(sluice.url(d.path()))
        .bearer_auth("key-wire")
        .header("accept-encoding", accept)
        .header("x-sluice-session", session)
        .json(body)
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let (status, projection, coding) = (
        response.status().as_u16(),
        header("x-sluice-projection").unwrap_or_default(),
        header("content-encoding"),
    );
    let raw = response.bytes().await.unwrap();
    let body = String::from_utf8(decode(coding.as_deref(), &raw)).unwrap();
    Got {
        status,
        projection,
        coding,
        body,
    }
}

fn embedded(projection: &str) -> &str {
    projection
        .split("; ")
        .find_map(|kv| kv.strip_prefix("embedded="))
        .unwrap_or("?")
}

/// Waits until the metric line starting with `prefix` reaches `n`.
async fn metric_reaches(sluice: &Sluice, prefix: &str, n: f64) {
    for _ in 0..300 {
        if metric(&sluice.metrics().await, prefix) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{prefix} did not reach {n}:\n{}", sluice.metrics().await);
}

#[tokio::test]
async fn compressed_answers_complete_and_once_images_are_consumed_a9() {
    let mock = MockUpstream::start();
    // The relay path: under the economic policy a first screenshot already gets the read tool,
    // whose rounds answer decoded (docs/cache.md).
    let sluice = Sluice::start(&common::on_every_route(
        &config_for(&mock.base_url(), ""),
        "cache.policy = \"eager\"",
    ));
    let mut commits = 0.0;
    for coding in CODINGS {
        mock.compress(Some(coding));
        for d in DIALECTS {
            for stream in [true, false] {
                let session = format!("once-{coding}-{d:?}-{stream}");
                // A picture of its own per case, so no case sees another's delivery state.
                let width = 8 + commits as u32;
                let body = d.request(&d.screenshot(width), "what do you see?", stream);
                let first = send(&sluice, d, &body, "gzip, deflate, br, zstd", &session).await;
                let case = format!("{coding} {d:?} stream={stream}");
                assert_eq!(first.status, 200, "{case}: {}", first.body);
                assert_eq!(embedded(&first.projection), "1", "{case}");
                // The provider's compressed bytes reach the client as they were (P3).
                assert_eq!(first.coding.as_deref(), Some(coding), "{case}");
                if stream {
                    assert!(first.body.contains(d.final_event()), "{case}");
                }
                commits += 1.0;
                // Written to the store, not only counted.
                let written = "sluice_store_seconds_count{backend=\"embedded\",op=\"commit\"}";
                metric_reaches(&sluice, written, commits).await;
                let second = send(&sluice, d, &body, "gzip, deflate, br, zstd", &session).await;
                assert_eq!(second.status, 200, "{case}: {}", second.body);
                assert_eq!(embedded(&second.projection), "0", "{case}: shown once");
                assert!(second.projection.contains("placeholders=1"), "{case}");
            }
        }
    }
    let m = sluice.metrics().await;
    assert_eq!(
        metric(&m, "sluice_commits_total{outcome=\"discarded\"}"),
        0.0
    );
}

#[tokio::test]
async fn a_model_reading_compressed_rounds_gives_one_clean_response_c2() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let output = json!(tool_output(150_000));
    for coding in CODINGS {
        mock.compress(Some(coding));
        for d in DIALECTS {
            for stream in [true, false] {
                let case = format!("{coding} {d:?} stream={stream}");
                let before = mock.requests().len();
                let body = d.request(&output, "mock:read=3", stream);
                let got = send(&sluice, d, &body, "zstd,gzip", &case).await;
                assert_eq!(got.status, 200, "{case}: {}", got.body);
                let text = visible_text(d, &got.body);
                assert!(text.ends_with("Read 3 pages."), "{case}: {text:?}");
                assert!(
                    !got.body.contains("sluice_read"),
                    "{case}: the hidden read call leaked: {}",
                    got.body
                );
                // sluice rewrote this body: it is sent uncompressed, and says so.
                assert_eq!(got.coding, None, "{case}");
                if stream {
                    assert_eq!(got.body.matches(d.final_event()).count(), 1, "{case}");
                } else {
                    serde_json::from_str::<Value>(&got.body).unwrap();
                }
                let rounds = &mock.requests()[before..];
                assert_eq!(rounds.len(), 4, "{case}: three reads, then the answer");
                for round in rounds {
                    let accept = round.headers.get("accept-encoding").unwrap();
                    assert_eq!(accept, "zstd,gzip", "{case}");
                }
            }
        }
    }
}

#[tokio::test]
async fn compressed_request_bodies_are_projected_like_plain_ones() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let output = json!(tool_output(150_000));
    for d in DIALECTS {
        let body = serde_json::to_vec(&d.request(&output, "go on", false)).unwrap();
        let plain = client()
            .post(sluice.url(d.path()))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(plain.status(), 200);
        assert!(plain.headers()["x-sluice-projection"]
            .to_str()
            .unwrap()
            .starts_with("spilled=1"));
        let expected = mock.last();
        for coding in CODINGS {
            let resp = client()
                .post(sluice.url(d.path()))
                .header("content-type", "application/json")
                .header("content-encoding", coding)
                .body(encode(coding, &body))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{d:?} {coding}");
            let forwarded = mock.last();
            assert_eq!(forwarded.body, expected.body, "{d:?} {coding}");
            assert!(forwarded.headers.get("content-encoding").is_none());
        }
    }
}

#[tokio::test]
async fn unknown_and_broken_encodings_get_dialect_shaped_errors() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let body = serde_json::to_vec(&D::Anthropic.request(&json!("x"), "hi", false)).unwrap();
    let resp = client()
        .post(sluice.url("/v1/messages"))
        .header("content-encoding", "compress")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let mut cut = encode("gzip", &body);
    cut.truncate(cut.len() / 2);
    let resp = client()
        .post(sluice.url("/v1/chat/completions"))
        .header("content-encoding", "gzip")
        .body(cut)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "bad_encoding");
    assert!(mock.requests().is_empty(), "nothing reached the provider");
}

/// The text a client shows of a response body (SSE or JSON) in dialect `d`.
fn visible_text(d: D, body: &str) -> String {
    let mut text = String::new();
    let mut add = |v: &Value| text.push_str(v.as_str().unwrap_or_default());
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        match d {
            D::Chat => add(&v["choices"][0]["message"]["content"]),
            D::Responses => {
                for item in v["output"].as_array().into_iter().flatten() {
                    for part in item["content"].as_array().into_iter().flatten() {
                        add(&part["text"]);
                    }
                }
            }
            D::Anthropic => {
                for block in v["content"].as_array().into_iter().flatten() {
                    add(&block["text"]);
                }
            }
        }
        return text;
    }
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        match d {
            D::Chat => add(&v["choices"][0]["delta"]["content"]),
            D::Responses if v["type"] == "response.output_text.delta" => add(&v["delta"]),
            D::Anthropic if v["type"] == "content_block_delta" => add(&v["delta"]["text"]),
            _ => {}
        }
    }
    text
}

/// Peak resident memory of a process, in bytes (Linux `VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[tokio::test]
async fn a_gzip_bomb_gets_413_with_memory_bounded_s5() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    // 100 gzip members of 100 MiB of zeros each: about 10 MB that inflate to 10 GiB.
    let member = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(&vec![0u8; 100 * 1024 * 1024]).unwrap();
        e.finish().unwrap()
    };
    let bomb: Vec<u8> = std::iter::repeat_n(member.as_slice(), 100)
        .flatten()
        .copied()
        .collect();
    assert!(bomb.len() < 12 * 1024 * 1024, "{}", bomb.len());
    let before = peak_rss(sluice.pid());
    let resp = client()
        .post(sluice.url("/v1/chat/completions"))
        .header("content-encoding", "gzip")
        .body(bomb.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "body_too_large");
    let grown = peak_rss(sluice.pid()).saturating_sub(before);
    println!(
        "gzip bomb: {} bytes sent, peak RSS grew by {:.1} MiB (max_body_bytes 64 MiB)",
        bomb.len(),
        grown as f64 / 1048576.0
    );
    // The compressed body plus at most max_body_bytes decoded, with allocator slack.
    assert!(grown < 200 * 1024 * 1024, "peak RSS grew by {grown} bytes");
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn passthrough_keeps_the_providers_compressed_bytes_p5() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    mock.compress(Some("br"));
    let resp = client()
        .get(sluice.url("/v1/models"))
        .header("accept-encoding", "br, compress")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-encoding"], "br");
    let raw = resp.bytes().await.unwrap();
    let echo: Value = serde_json::from_slice(&decode(Some("br"), &raw)).unwrap();
    assert_eq!(echo["object"], "echo");
    // A path sluice does not look into keeps the client's Accept-Encoding as sent.
    assert_eq!(mock.last().headers["accept-encoding"], "br, compress");
}

/// The forwarded request's image parts (every part whose type names an image).
fn image_parts(v: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    let mut stack = vec![v.clone()];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => {
                let kind = map.get("type").and_then(Value::as_str).unwrap_or("");
                if ["image", "input_image", "image_url"].contains(&kind) {
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

#[tokio::test]
async fn image_parts_keep_the_clients_fields_p2() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let png = b64(&picture(12, 9, ImageFormat::Png));
    let data_url = format!("data:image/png;base64,{png}");
    // Claude Code: a native block with a cache breakpoint, before other parts.
    let anthropic = json!([
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png},
         "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "page loaded"}]);
    // Codex: `input_image` with `detail` in a function_call_output.
    let responses = json!([{"type": "input_image", "image_url": data_url, "detail": "high"}]);
    // chat: an image part in a tool message, moved to a user message by sluice (A7).
    let chat = json!([{"type": "image_url", "image_url": {"url": data_url, "detail": "low"}}]);
    for (d, content, check) in [
        (
            D::Anthropic,
            anthropic,
            ("cache_control", json!({"type": "ephemeral"})),
        ),
        (D::Responses, responses, ("detail", json!("high"))),
        (D::Chat, chat, ("detail", json!("low"))),
    ] {
        let got = send(
            &sluice,
            d,
            &d.request(&content, "what changed?", false),
            "identity",
            &format!("fields-{d:?}"),
        )
        .await;
        assert_eq!(got.status, 200, "{d:?}: {}", got.body);
        assert_eq!(embedded(&got.projection), "1", "{d:?}");
        let parts = image_parts(&mock.last().json());
        assert_eq!(parts.len(), 1, "{d:?}: {parts:?}");
        let part = &parts[0];
        let field = match d {
            D::Chat => &part["image_url"][check.0],
            _ => &part[check.0],
        };
        assert_eq!(field, &check.1, "{d:?}: {part}");
        assert!(part.get("_meta").is_none());
    }
    // A user's chat image whose label is wrong is relabelled, its `detail` kept; the bare string
    // form (not what OpenAI documents, but sent) is rewritten without failing the request.
    let mislabelled = format!("data:image/jpeg;base64,{png}");
    for part in [
        json!({"type": "image_url", "image_url": {"url": mislabelled, "detail": "high"}}),
        json!({"type": "image_url", "image_url": mislabelled}),
    ] {
        let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"}, part.clone()]}]});
        let got = send(&sluice, D::Chat, &body, "identity", "user-part").await;
        assert_eq!(got.status, 200, "{part}: {}", got.body);
        let sent = mock.last().json();
        let image = &sent["messages"][0]["content"][1]["image_url"];
        assert!(image["url"]
            .as_str()
            .unwrap()
            .starts_with("data:image/png;base64,"));
        if part["image_url"].is_object() {
            assert_eq!(image["detail"], "high");
        }
    }
}

/// An Anthropic screenshot session: turn `t` took screenshot `t` (recent lifetime).
fn screenshots(upto: usize, stream: bool) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "watch the page"})];
    for t in 1..=upto {
        let id = format!("tu{t}");
        messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "browser_take_screenshot", "input": {}}]}));
        let png = b64(&picture(20 + t as u32, 10, ImageFormat::Png));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}]}]}));
    }
    json!({"model": "claude-x", "max_tokens": 10, "stream": stream, "messages": messages})
}

#[tokio::test]
async fn every_path_records_its_metrics_o2() {
    let mock = MockUpstream::start();
    // Turns 4-6 show placeholders that name artifacts, so the read tool is offered and they
    // take its path (streamed and not); with the tool off they take the plain relay. Turns 4
    // and 6 prune two images each, on either path.
    let upstream = format!("upstream = \"{}\"", mock.base_url());
    // A4's batches as written (docs/cache.md: the economic policy would keep these tiny images).
    let eager = common::on_every_route(
        &config_for(&mock.base_url(), ""),
        "cache.policy = \"eager\"",
    );
    let no_tool = eager.replace(&upstream, &format!("{upstream}\nmax_read_steps = 0"));
    for (config, read_path) in [(eager.clone(), true), (no_tool, false)] {
        let sluice = Sluice::start(&config);
        let commit = "sluice_store_seconds_count{backend=\"embedded\",op=\"commit\"}";
        let mut turns = 0.0;
        for stream in [false, true] {
            let session = format!("metrics-{stream}");
            for t in 1..=6 {
                let got = send(
                    &sluice,
                    D::Anthropic,
                    &screenshots(t, stream),
                    "gzip",
                    &session,
                )
                .await;
                assert_eq!(got.status, 200);
                turns += 1.0;
                metric_reaches(&sluice, commit, turns).await;
            }
        }
        let m = sluice.metrics().await;
        let case = format!("read path: {read_path}\n{m}");
        assert_eq!(metric(&m, "sluice_images_pruned_total"), 8.0, "{case}");
        let rounds = if read_path { 6.0 } else { 0.0 };
        assert_eq!(metric(&m, "sluice_read_rounds_count"), rounds, "{case}");
        assert_eq!(metric(&m, "sluice_overhead_seconds_count"), 12.0, "{case}");
        assert_eq!(
            metric(&m, "sluice_commits_total{outcome=\"committed\"}"),
            12.0,
            "{case}"
        );
        let completed =
            "sluice_streams_total{dialect=\"anthropic-messages\",outcome=\"completed\"}";
        assert_eq!(metric(&m, completed), 6.0, "{case}");
    }
}

#[tokio::test]
async fn a_client_hanging_up_after_the_final_event_completed_its_stream() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    // Every event, then the upstream keeps the stream open: Codex hangs up at this point.
    mock.script([common::Reply::Gate { events: 100 }]);
    let body = D::Responses.request(&json!("ok"), "hi", true);
    let response = client()
        .post(sluice.url("/v1/responses"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("event: response.completed") {
        let chunk = futures_util::StreamExt::next(&mut stream)
            .await
            .unwrap()
            .unwrap();
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    drop(stream);
    let done = "sluice_streams_total{dialect=\"openai-responses\",outcome=\"completed\"}";
    metric_reaches(&sluice, done, 1.0).await;
    let m = sluice.metrics().await;
    assert_eq!(
        metric(
            &m,
            "sluice_streams_total{dialect=\"openai-responses\",outcome=\"cancelled\"}"
        ),
        0.0
    );
    mock.release();
}

#[tokio::test]
async fn the_base_url_answers_head_and_get() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    for method in [reqwest::Method::HEAD, reqwest::Method::GET] {
        let resp = client()
            .request(method.clone(), sluice.url("/"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{method}");
    }
    let m = sluice.metrics().await;
    assert_eq!(metric(&m, "sluice_errors_total{kind=\"not_found\"}"), 0.0);
    assert!(mock.requests().is_empty());
}
