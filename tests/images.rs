//! End-to-end: images (SPEC sections 4 and 5) through the real binary, against a mock that
//! enforces the providers' image rules. Each request that fails when sent straight to the
//! provider is accepted through sluice, and the model sees the pictures it can see.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use common::{b64, client, config_for, metric, picture, post, post_as, MockUpstream, Sluice};
use image::ImageFormat;
use serde_json::{json, Value};

fn chat_tool(content: Value) -> Value {
    json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "take a screenshot"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": content},
        {"role": "user", "content": "what do you see?"}
    ]})
}

fn anthropic_tool(content: Value) -> Value {
    json!({"model": "claude-x", "max_tokens": 10, "messages": [
        {"role": "user", "content": "take a screenshot"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": content}]}
    ]})
}

fn mcp_image(bytes: &[u8], mime: &str) -> String {
    json!({"content": [{"type": "text", "text": "Screenshot taken."},
                       {"type": "image", "data": b64(bytes), "mimeType": mime}]})
    .to_string()
}

/// Sends `body` straight to the mock, as a client without sluice would.
async fn direct(mock: &MockUpstream, path: &str, body: &Value) -> u16 {
    client()
        .post(format!("{}{path}", mock.base_url()))
        .json(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn openai_chat_tool_images_move_to_a_user_message_after_the_turn_a7() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let png = picture(64, 48, ImageFormat::Png);
    // An MCP result stringified into the tool text, as agents do.
    let body = chat_tool(json!(mcp_image(&png, "image/png")));
    // The same image as a native part of the tool message: the provider refuses it.
    let native = chat_tool(
        json!([{"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", b64(&png))}}]),
    );
    assert_eq!(direct(&mock, "/v1/chat/completions", &native).await, 400);
    for body in [body, native] {
        let resp = post(&sluice, "/v1/chat/completions", &body).await;
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
        let seen = mock.last().json();
        let messages = seen["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 5, "one user message added");
        let tool = messages[2]["content"].to_string();
        assert!(tool.contains("[image #1: image/png 64×48, "), "{tool}");
        assert!(
            !tool.contains(&b64(&png)),
            "no image bytes left in the tool message"
        );
        assert_eq!(
            messages[3]["role"], "user",
            "right after the turn's tool messages"
        );
        assert!(messages[3]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("[image #1: image/png 64×48"));
        assert_eq!(
            messages[3]["content"][1]["image_url"]["url"],
            format!("data:image/png;base64,{}", b64(&png))
        );
        assert_eq!(messages[4]["content"], "what do you see?");
    }
}

#[tokio::test]
async fn every_image_type_is_read_from_its_bytes_and_bad_ones_cost_a_placeholder_m2() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let png = picture(40, 30, ImageFormat::Png);
    let bomb = {
        // A PNG header claiming 100,000 × 100,000 px.
        let mut v = png[..16].to_vec();
        v.extend_from_slice(&100_000u32.to_be_bytes());
        v.extend_from_slice(&100_000u32.to_be_bytes());
        v.extend_from_slice(&png[24..]);
        v
    };
    let items: Vec<Value> = [
        (picture(40, 30, ImageFormat::Png), "image/png"),
        (picture(40, 30, ImageFormat::Jpeg), "image/jpeg"),
        (picture(40, 30, ImageFormat::Gif), "image/gif"),
        (picture(40, 30, ImageFormat::WebP), "image/webp"),
        (picture(40, 30, ImageFormat::Png), "image/jpeg"), // mislabelled
        (png[..png.len() / 2].to_vec(), "image/png"),      // truncated
        (b"just some text".to_vec(), "image/png"),         // not an image
        (bomb, "image/png"),                               // decompression bomb header
        (Vec::new(), "image/png"),                         // zero bytes
    ]
    .iter()
    .map(|(bytes, mime)| json!({"type": "image", "data": b64(bytes), "mimeType": mime}))
    .chain(std::iter::once(
        json!({"type": "image", "data": "@@not base64@@", "mimeType": "image/png"}),
    ))
    .collect();
    let body = anthropic_tool(json!(json!({"content": items}).to_string()));
    assert_eq!(
        direct(&mock, "/v1/messages", &body).await,
        200,
        "stringified images are just text to the provider"
    );
    let resp = post(&sluice, "/v1/messages", &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-sluice-projection"],
        "spilled=0; embedded=5; deferred=0; refused=5; placeholders=0"
    );
    let seen = mock.last().json();
    let content = seen["messages"][2]["content"][0]["content"]
        .as_array()
        .unwrap()
        .clone();
    let text = content[0]["text"].as_str().unwrap();
    for reason in [
        "damaged or incomplete",
        "not a PNG, JPEG, GIF or WebP",
        "is empty",
        "not valid base64",
    ] {
        assert!(text.contains(reason), "{reason}: {text}");
    }
    let media: Vec<&str> = content[1..]
        .iter()
        .map(|b| b["source"]["media_type"].as_str().unwrap())
        .collect();
    assert_eq!(
        media,
        [
            "image/png",
            "image/jpeg",
            "image/gif",
            "image/webp",
            "image/png"
        ],
        "mislabelled png relabelled"
    );
    let metrics = sluice.metrics().await;
    assert_eq!(
        metric(&metrics, "sluice_images_total{outcome=\"embedded\""),
        5.0
    );
    assert_eq!(
        metric(&metrics, "sluice_images_total{outcome=\"refused\""),
        5.0
    );
}

#[tokio::test]
async fn an_oversized_image_is_refused_or_downscaled_deterministically_a6() {
    let mock = MockUpstream::start();
    // A noisy PNG (incompressible) whose base64 text is over 5 MiB.
    let big = {
        let img = image::RgbImage::from_fn(1800, 1400, |x, y| {
            let v = (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503))
                .wrapping_mul(2_246_822_519);
            image::Rgb([(v >> 24) as u8, (v >> 16) as u8, (v >> 8) as u8])
        });
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Png).unwrap();
        out.into_inner()
    };
    assert!(
        b64(&big).len() > 5_242_880,
        "over Anthropic's 5 MiB base64 limit"
    );
    let body = anthropic_tool(
        json!([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(&big)}}]),
    );
    assert_eq!(direct(&mock, "/v1/messages", &body).await, 400);
    // Default route: refused once, with its reason; the request goes through.
    let sluice = Sluice::in_front_of(&mock);
    let resp = post(&sluice, "/v1/messages", &body).await;
    assert_eq!(resp.status(), 200);
    let text = mock.last().json()["messages"][2]["content"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.contains("not shown: the image data is"), "{text}");
    drop(sluice);
    // With downscale: resized to fit, the same bytes every time and after a restart.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_string();
    let config = format!(
        "{}\n[routes.images]\ndownscale = true\n",
        config_for(&mock.base_url(), "")
    );
    let env = [("SLUICE_STORE__DATA_DIR", data.as_str())];
    let mut seen = Vec::new();
    for _ in 0..2 {
        let sluice = Sluice::start_with(&config, &env);
        for _ in 0..2 {
            let resp = post(&sluice, "/v1/messages", &body).await;
            assert_eq!(resp.status(), 200);
            let block = mock.last().json()["messages"][2]["content"][0]["content"][1].clone();
            assert_eq!(block["type"], "image");
            assert!(block["source"]["data"].as_str().unwrap().len() <= 5_242_880);
            seen.push(block);
        }
        let metrics = sluice.metrics().await;
        assert_eq!(metric(&metrics, "sluice_downscales_total"), 2.0);
    }
    assert!(
        seen.windows(2).all(|w| w[0] == w[1]),
        "identical bytes, also after a restart"
    );
}

#[tokio::test]
async fn more_than_twenty_images_with_a_large_one_keeps_the_request_acceptable() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&format!(
        "{}\n[routes.images]\nmax_images = 100\n",
        config_for(&mock.base_url(), "")
    ));
    let small = b64(&picture(16, 16, ImageFormat::Png));
    let large = b64(&picture(2400, 10, ImageFormat::Png));
    let mut blocks: Vec<Value> = (0..22)
        .map(|i| json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": if i == 0 { &large } else { &small }}}))
        .collect();
    blocks.push(json!({"type": "text", "text": "what changed?"}));
    let body = json!({"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": blocks}]});
    assert_eq!(direct(&mock, "/v1/messages", &body).await, 400);
    let resp = post(&sluice, "/v1/messages", &body).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    assert_eq!(
        resp.headers()["x-sluice-projection"],
        "spilled=0; embedded=20; deferred=2; refused=0; placeholders=0"
    );
    let content = mock.last().json()["messages"][0]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content.iter().filter(|b| b["type"] == "image").count(), 20);
    assert!(content[21]["text"]
        .as_str()
        .unwrap()
        .contains("not shown in this request"));
}

#[tokio::test]
async fn a_text_only_route_gets_placeholders_a1() {
    let mock = MockUpstream::start();
    let config = config_for(&mock.base_url(), "").replace(
        "dialects = [\"openai-chat\", \"openai-responses\"]",
        "dialects = [\"openai-chat\", \"openai-responses\"]\ninput_modalities = [\"text\"]",
    );
    let sluice = Sluice::start(&config);
    let png = picture(8, 8, ImageFormat::Png);
    let mut body = chat_tool(json!(mcp_image(&png, "image/png")));
    body["messages"][0]["content"] = json!([{"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", b64(&png))}}]);
    let resp = post(&sluice, "/v1/chat/completions", &body).await;
    assert_eq!(
        resp.headers()["x-sluice-projection"],
        "spilled=0; embedded=0; deferred=0; refused=0; placeholders=2"
    );
    let seen = mock.last().json();
    assert_eq!(
        seen["messages"].as_array().unwrap().len(),
        4,
        "no image message added"
    );
    assert!(seen["messages"][0]["content"][1]["text"]
        .as_str()
        .unwrap()
        .contains("no visual content was provided"));
    assert!(seen["messages"][2]["content"]
        .as_str()
        .unwrap()
        .contains("no visual content was provided"));
    assert!(!seen.to_string().contains(&b64(&png)));
}

#[tokio::test]
async fn responses_keep_images_in_the_function_call_output_and_media_is_stored_m4() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let jpeg = picture(50, 20, ImageFormat::Jpeg);
    let body = json!({"model": "gpt-5", "input": [
        {"type": "function_call", "call_id": "fc1", "name": "screenshot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "fc1", "output": mcp_image(&jpeg, "image/jpeg")}
    ]});
    let resp = post_as(&sluice, "/v1/responses", "sk-a", &body).await;
    assert_eq!(resp.status(), 200);
    let seen = mock.last().json();
    let output = seen["input"][1]["output"].as_array().unwrap();
    assert_eq!(output[0]["type"], "input_text");
    assert_eq!(output[1]["type"], "input_image");
    assert_eq!(
        output[1]["image_url"],
        format!("data:image/jpeg;base64,{}", b64(&jpeg))
    );
    let text = output[0]["text"].as_str().unwrap();
    let at = text.find("artifact://").unwrap() + 11;
    let id: String = text[at..].chars().take(33).collect();
    let stored = client()
        .get(sluice.url(&format!("/v1/sluice/artifacts/{id}")))
        .bearer_auth("sk-a")
        .send()
        .await
        .unwrap();
    assert_eq!(stored.status(), 200);
    assert_eq!(stored.headers()["content-type"], "image/jpeg");
    assert_eq!(stored.bytes().await.unwrap().to_vec(), jpeg);
    let other = client()
        .get(sluice.url(&format!("/v1/sluice/artifacts/{id}")))
        .bearer_auth("sk-b")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
}

#[tokio::test]
async fn a_wrong_media_type_and_an_over_8000_px_image_no_longer_fail_the_request() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let png = b64(&picture(12, 12, ImageFormat::Png));
    let wide = b64(&picture(8001, 2, ImageFormat::Png));
    let body = json!({"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": png}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": wide}, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "compare"}
    ]}]});
    assert_eq!(direct(&mock, "/v1/messages", &body).await, 400);
    let resp = post(&sluice, "/v1/messages", &body).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let content = mock.last().json()["messages"][0]["content"].clone();
    assert_eq!(
        content[0]["source"]["media_type"], "image/png",
        "relabelled by its bytes"
    );
    assert_eq!(content[0]["source"]["data"], png.as_str());
    assert_eq!(
        content[1]["type"], "text",
        "refused, stated once in a placeholder"
    );
    assert!(content[1]["text"]
        .as_str()
        .unwrap()
        .contains("8001×2 px, over the limit of 8000 px"));
    assert_eq!(
        content[1]["cache_control"]["type"], "ephemeral",
        "P2: the breakpoint stays"
    );
    assert_eq!(content[2]["text"], "compare");
    // An image that needs no change is left byte for byte as the client sent it (P1).
    let fine = json!({"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
        {"type": "text", "text": "ok"}]}]});
    let bytes = serde_json::to_vec(&fine).unwrap();
    client()
        .post(sluice.url("/v1/messages"))
        .body(bytes.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(&mock.last().body[..], &bytes[..]);
}

/// Sends `body`'s bytes as they are to `path` through sluice; the status.
async fn post_bytes(sluice: &Sluice, path: &str, body: Vec<u8>) -> u16 {
    client()
        .post(sluice.url(path))
        .header("content-type", "application/json")
        .header("x-api-key", "k")
        .header("anthropic-version", "2023-06-01")
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The resumed view (runtime issue, docs/runtime.md): a long conversation's turns are read from
/// where the previous turn's reading left off, and projected exactly as when read whole. The
/// second gateway gets the same bodies behind a different number of spaces each turn, so no
/// turn finds an earlier one's trail; what both forward must be the same bytes after the
/// spaces, turn after turn, while the screenshots are delivered once (A3), a large output is
/// spilled (T1) and the client's cache marker moves to the newest message.
#[tokio::test]
async fn a_long_conversation_read_from_its_last_turn_is_projected_as_read_whole() {
    let (mock_a, mock_b) = (MockUpstream::start(), MockUpstream::start());
    let (a, b) = (Sluice::in_front_of(&mock_a), Sluice::in_front_of(&mock_b));
    mock_a.record(true);
    mock_b.record(true);
    let log = common::tool_output(300_000);
    let mut messages = vec![
        json!({"role": "user", "content": [{"type": "text", "text": "Fix the build, look at the page."}]}),
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": "build", "name": "bash", "input": {}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "build", "content": log}]}),
    ];
    for turn in 0..4 {
        let png = picture(200 + turn * 10, 150, ImageFormat::Png);
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": format!("shot{turn}"), "name": "screenshot", "input": {}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("shot{turn}"),
            "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(&png)}}]}]}));
        // The client's cache marker on the newest message only, as Claude Code places it.
        let mut sent = messages.clone();
        if let Some(Value::Array(blocks)) = sent.last_mut().and_then(|m| m.get_mut("content")) {
            if let Some(Value::Object(last)) = blocks.last_mut() {
                last.insert("cache_control".into(), json!({"type": "ephemeral"}));
            }
        }
        let body = json!({"model": "claude-sonnet-4-5", "messages": sent, "max_tokens": 100,
                          "system": "You are a coding agent.", "stream": false});
        let bytes = serde_json::to_vec(&body).unwrap();
        assert!(bytes.len() > 256 * 1024, "long enough to leave a trail");
        let spaced = [vec![b' '; turn as usize + 1], bytes.clone()].concat();
        assert_eq!(post_bytes(&a, "/v1/messages", bytes).await, 200);
        assert_eq!(post_bytes(&b, "/v1/messages", spaced).await, 200);
        let (sent_a, sent_b) = (mock_a.last().body, mock_b.last().body);
        assert_eq!(
            String::from_utf8_lossy(&sent_a),
            String::from_utf8_lossy(sent_b.trim_ascii_start()),
            "turn {turn}: resumed and whole readings forward the same request"
        );
        let forwarded = mock_a.last().json();
        let shown = forwarded.to_string().matches("\"type\":\"image\"").count();
        assert!(shown >= 1, "turn {turn}: the new screenshot is shown");
        // Forwarded as pieces of the received body (docs/runtime.md), still with its length:
        // providers get a `content-length`, never a chunked request.
        let last = mock_a.last();
        let length = last
            .headers
            .get("content-length")
            .and_then(|v| v.to_str().ok());
        assert_eq!(
            length,
            Some(last.body.len().to_string().as_str()),
            "turn {turn}"
        );
        assert!(
            last.headers.get("transfer-encoding").is_none(),
            "turn {turn}"
        );
    }
    let resumed = |m: &str| metric(m, "sluice_view_bytes_total{read=\"resumed\"}");
    let (ma, mb) = (a.metrics().await, b.metrics().await);
    assert!(
        resumed(&ma) > 3.0 * 300_000.0,
        "turns 2 to 4 resumed past the log: {ma}"
    );
    assert_eq!(resumed(&mb), 0.0);
    assert!(metric(&mb, "sluice_view_bytes_total{read=\"scanned\"}") > 4.0 * 300_000.0);
}

/// The resumed view of Responses and Chat bodies (Codex CLI sends its whole `input` every
/// turn): forwarded as when read whole, turn after turn, the large output spilled (T1).
#[tokio::test]
async fn long_openai_conversations_read_from_their_last_turn_are_projected_as_read_whole() {
    for path in ["/v1/responses", "/v1/chat/completions"] {
        let (mock_a, mock_b) = (MockUpstream::start(), MockUpstream::start());
        let (a, b) = (Sluice::in_front_of(&mock_a), Sluice::in_front_of(&mock_b));
        mock_a.record(true);
        mock_b.record(true);
        let log = common::tool_output(300_000);
        let responses = path == "/v1/responses";
        let mut items: Vec<Value> = vec![json!({"role": "user", "content": "Fix the build."})];
        for turn in 0..4 {
            let (call, output) = if responses {
                (
                    json!({"type": "function_call", "call_id": format!("c{turn}"), "name": "shell", "arguments": "{}"}),
                    json!({"type": "function_call_output", "call_id": format!("c{turn}"), "output": format!("{turn}\n{log}")}),
                )
            } else {
                (
                    json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{turn}"), "type": "function",
                        "function": {"name": "shell", "arguments": "{}"}}]}),
                    json!({"role": "tool", "tool_call_id": format!("c{turn}"), "content": format!("{turn}\n{log}")}),
                )
            };
            items.extend([call, output]);
            let body = if responses {
                json!({"model": "gpt-5", "instructions": "You are Codex.", "input": items, "stream": false})
            } else {
                json!({"model": "gpt-4o", "messages": items, "stream": false})
            };
            let bytes = serde_json::to_vec(&body).unwrap();
            let spaced = [vec![b' '; turn + 1], bytes.clone()].concat();
            assert_eq!(post_bytes(&a, path, bytes).await, 200);
            assert_eq!(post_bytes(&b, path, spaced).await, 200);
            let (sent_a, sent_b) = (mock_a.last().body, mock_b.last().body);
            assert_eq!(
                String::from_utf8_lossy(&sent_a),
                String::from_utf8_lossy(sent_b.trim_ascii_start()),
                "{path} turn {turn}: resumed and whole readings forward the same request"
            );
            assert!(
                sent_a.len() < 200_000,
                "{path} turn {turn}: the outputs are spilled"
            );
        }
        let resumed = |m: &str| metric(m, "sluice_view_bytes_total{read=\"resumed\"}");
        let (ma, mb) = (a.metrics().await, b.metrics().await);
        assert!(
            resumed(&ma) > 3.0 * 300_000.0,
            "{path}: turns 2 to 4 resumed: {ma}"
        );
        assert_eq!(resumed(&mb), 0.0);
    }
}

/// Qwen Code sends an MCP tool's screenshot in a user message right after the tool message
/// (chat's tool messages take no image): the image is the tool's (the `*screenshot*` lifetime,
/// `recent`), not a user's (`once`), so the next turn still shows it (M5, A3).
#[tokio::test]
async fn a_chat_image_right_after_its_tool_message_is_the_tools_m5() {
    let shot = |n: u32| b64(&picture(40 + n, 30, ImageFormat::Png));
    let turn = |n: u32| {
        [
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("s{n}"),
                "type": "function", "function": {"name": "mcp__shots__browser_take_screenshot",
                "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": format!("s{n}"),
                "content": "[Tool 'browser_take_screenshot' provided the following image data]"}),
            json!({"role": "user", "content": [
                {"type": "text", "text": "(attached media from previous tool call)"},
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", shot(n))}}]}),
        ]
    };
    let mut messages = vec![json!({"role": "user", "content": "watch the page"})];
    messages.extend(turn(1));
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let body = |messages: &Vec<Value>| json!({"model": "gpt-4.1", "messages": messages});
    let response = post_as(&sluice, "/v1/chat/completions", "sk-a", &body(&messages)).await;
    assert_eq!(response.status(), 200);
    response.text().await.unwrap();
    for _ in 0..100 {
        let m = sluice.metrics().await;
        if metric(&m, "sluice_commits_total{outcome=\"committed\"}") >= 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    messages.extend(turn(2));
    let response = post_as(&sluice, "/v1/chat/completions", "sk-a", &body(&messages)).await;
    assert_eq!(response.status(), 200);
    let got = String::from_utf8_lossy(&mock.last().body).into_owned();
    assert!(
        got.contains(&shot(1)),
        "the first screenshot is still shown"
    );
    assert!(got.contains(&shot(2)));
    assert!(!got.contains("no longer attached"));
}
