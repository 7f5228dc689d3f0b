//! The Gemini dialect through the rest of the end-to-end matrix the other three pass: images
//! in a `functionResponse` under `once` (A3, and A9: a failed request consumes nothing),
//! `recent` (A4) and `retain` (A8); audio in a tool result stored and referenced, never sent
//! (A1, M4); and compressed bodies both ways with read rounds streamed (C2, #11).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::io::Write;
use std::time::Duration;

use common::gemini::*;
use common::*;
use image::ImageFormat;
use serde_json::{json, Value};

/// A conversation of `upto` tool turns, turn `t` calling `tool` and getting image `t` back in
/// its `functionResponse`'s parts.
fn history(tool: &str, upto: usize) -> Value {
    let mut contents = vec![json!({"role": "user", "parts": [{"text": "watch the screen"}]})];
    for t in 1..=upto {
        let id = format!("c{t}");
        contents.push(json!({"role": "model", "parts": [{"functionCall": {"name": tool, "args": {}, "id": id}}]}));
        let png = b64(&picture(8 + t as u32, 8, ImageFormat::Png));
        contents.push(
            json!({"role": "user", "parts": [{"functionResponse": {"name": tool, "id": id,
            "response": {"output": format!("frame {t}")},
            "parts": [{"inlineData": {"mimeType": "image/png", "data": png}}]}}]}),
        );
    }
    json!({"contents": contents})
}

/// Images the last forwarded request embedded.
fn embedded(mock: &MockUpstream) -> usize {
    mock.last()
        .json()
        .to_string()
        .matches("\"inlineData\"")
        .count()
}

/// Waits until `n` commits have been written.
async fn committed(sluice: &Sluice, n: f64) {
    for _ in 0..300 {
        let m = sluice.metrics().await;
        if metric(&m, "sluice_commits_total{outcome=\"committed\"}") >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} commits were not written");
}

async fn answered(sluice: &Sluice, body: &Value) -> String {
    let response = send(sluice, GENERATE, body).await;
    assert_eq!(response.status(), 200);
    let projection = response.headers()["x-sluice-projection"]
        .to_str()
        .unwrap()
        .to_string();
    response.bytes().await.unwrap();
    projection
}

/// A3 and A9: a `once` image is shown in exactly one successful response; a request the
/// provider refused shows it again, and the read tool is named where it went.
#[tokio::test]
async fn a_once_image_is_shown_in_one_successful_response_a3_a9() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    let body = history("render_chart", 1);
    mock.script([Reply::Status(
        503,
        r#"{"error":{"code":503,"message":"busy","status":"UNAVAILABLE"}}"#.into(),
    )]);
    let failed = send(&sluice, GENERATE, &body).await;
    assert_eq!(failed.status(), 503);
    failed.bytes().await.unwrap();
    assert_eq!(embedded(&mock), 1);
    mock.script([Reply::Text("a chart".into())]);
    assert!(answered(&sluice, &body).await.contains("embedded=1;"));
    assert_eq!(embedded(&mock), 1, "the failed request consumed nothing");
    committed(&sluice, 1.0).await;
    mock.script([Reply::Text("still a chart".into())]);
    let projection = answered(&sluice, &body).await;
    assert!(projection.contains("placeholders=1"), "{projection}");
    assert_eq!(embedded(&mock), 0);
    let forwarded = mock.last().json();
    let output = forwarded["contents"][2]["parts"][0]["functionResponse"]["response"]["output"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(output.starts_with("frame 1"), "{output}");
    assert!(
        output.contains(
            "shown earlier and no longer attached; it can be read again with the read tool"
        ),
        "{output}"
    );
    assert!(forwarded.to_string().contains("sluice_read"));
}

/// A4: screenshots are `recent`: up to three shown, the oldest pruned two at a time once a
/// fourth arrives, as on the other dialects.
#[tokio::test]
async fn recent_prunes_screenshots_in_batches_a4() {
    let mock = MockUpstream::start();
    let route = "cache.policy = \"eager\"\ncache.breakpoints = \"off\"\n[routes.images]\nrecent_count = 3\nprune_batch = 2\n";
    let sluice = Sluice::start(&config(&mock, route));
    let mut shown = Vec::new();
    for turn in 1..=8 {
        mock.script([Reply::Text(format!("turn {turn}"))]);
        answered(&sluice, &history("take_screenshot", turn)).await;
        shown.push(embedded(&mock));
        let forwarded = mock.last().json().to_string();
        // Eager A4: the newest two are always there, a batch of two goes at a time.
        for newest in turn.saturating_sub(1).max(1)..=turn {
            let png = b64(&picture(8 + newest as u32, 8, ImageFormat::Png));
            assert!(
                forwarded.contains(&png),
                "turn {turn}: image {newest} shown"
            );
        }
        committed(&sluice, turn as f64).await;
    }
    assert_eq!(shown, [1, 2, 3, 2, 3, 2, 3, 2]);
}

/// A8: `retain` shows every image on every request, and the history already sent stays byte
/// for byte what it was.
#[tokio::test]
async fn retain_keeps_every_image_and_the_history_byte_stable_a8() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(
        &mock,
        "[routes.images]\ndefault_lifetime = \"retain\"\n",
    ));
    let mut previous: Option<Vec<u8>> = None;
    for turn in 1..=5 {
        mock.script([Reply::Text(format!("turn {turn}"))]);
        answered(&sluice, &history("render_chart", turn)).await;
        assert_eq!(embedded(&mock), turn);
        committed(&sluice, turn as f64).await;
        let body = mock.last().body.to_vec();
        if let Some(prev) = &previous {
            let cut = prev.len() - 3;
            assert_eq!(
                &body[..cut],
                &prev[..cut],
                "turn {turn}: the history is as it was"
            );
        }
        previous = Some(body);
    }
}

/// A1, M4: Gemini takes no audio in a function response: a clip there (as `inlineData` or as
/// an MCP item in the response's text) is stored as an artifact and named, never sent, even on
/// a route that accepts audio; the strict mock accepts what is forwarded.
#[tokio::test]
async fn audio_in_a_function_response_is_stored_and_named_never_sent_a1_m4() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(
        &mock,
        "input_modalities = [\"text\", \"image\", \"audio\"]\n",
    ));
    let clip = wav(1500);
    let data = b64(&clip);
    let mcp = json!({"content": [{"type": "text", "text": "Recorded the meeting."},
        {"type": "audio", "data": data, "mimeType": "audio/wav"}]})
    .to_string();
    let call = json!({"role": "model", "parts": [{"functionCall": {"name": "record", "args": {}, "id": "r1"}}]});
    let shapes = [
        json!({"name": "record", "id": "r1", "response": {"output": "Recorded the meeting."},
            "parts": [{"inlineData": {"mimeType": "audio/wav", "data": data}}]}),
        json!({"name": "record", "id": "r1", "response": {"output": mcp}}),
    ];
    for (k, response) in shapes.into_iter().enumerate() {
        let body = json!({"contents": [
            {"role": "user", "parts": [{"text": "Listen."}]}, call,
            {"role": "user", "parts": [{"functionResponse": response}]}]});
        mock.script([Reply::Text("heard".into())]);
        let projection = answered(&sluice, &body).await;
        assert!(projection.contains("placeholders=1"), "{k}: {projection}");
        let forwarded = mock.last().json().to_string();
        assert!(!forwarded.contains(&data[..200]), "{k}: base64 forwarded");
        assert!(forwarded.contains("Recorded the meeting."), "{k}");
        assert!(
            forwarded.contains("[audio #1: WAV 1.5 s"),
            "{k}: {forwarded}"
        );
        assert!(forwarded.contains("not sent to the model"), "{k}");
        let at = forwarded.find("artifact://").expect("the clip is named") + "artifact://".len();
        let id: String = forwarded[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        let got = get_as(&sluice, &format!("/v1/sluice/artifacts/{id}"), KEY).await;
        assert_eq!(got.headers()["content-type"], "audio/wav", "{k}");
        assert_eq!(got.bytes().await.unwrap().as_ref(), clip.as_slice(), "{k}");
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// #11 and C2: a gzip request body is projected as a plain one, and a model reading a spilled
/// output over zstd-compressed rounds gives the client one clean stream.
#[tokio::test]
async fn compressed_bodies_both_ways_with_streamed_read_rounds_c2() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    let output = tool_output(150_000);
    let body = json!({"contents": [
        {"role": "user", "parts": [{"text": "build it"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "sh", "args": {}, "id": "b1"}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "sh", "id": "b1", "response": {"output": output}}}]}]});
    let bytes = serde_json::to_vec(&body).unwrap();
    mock.script([Reply::Text("plain".into())]);
    assert!(answered(&sluice, &body).await.starts_with("spilled=1"));
    let plain = mock.last().body;
    let read = |before: Option<&str>| Reply::Read {
        before: before.map(str::to_string),
        also: None,
        answer: "no cursor".into(),
    };
    mock.compress(Some("zstd"));
    mock.script([
        read(Some("Reading. ")),
        read(None),
        Reply::Text("It failed in crate-7.".into()),
    ]);
    let response = client()
        .post(sluice.url(STREAM))
        .header("x-goog-api-key", KEY)
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .header("accept-encoding", "zstd,gzip")
        .body(gzip(&bytes))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // sluice rewrote this stream: it goes out uncompressed, and says so (docs/compression.md).
    assert!(response.headers().get("content-encoding").is_none());
    let text = response.text().await.unwrap();
    let (parts, chunks) = parts_of(&text, true);
    assert_eq!(text_of(&parts), "Reading. It failed in crate-7.");
    assert!(
        parts.iter().all(|p| p.get("functionCall").is_none()),
        "the rounds are sluice's"
    );
    let last = chunks.last().unwrap();
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    let recorded = mock.requests();
    let first_round = &recorded[recorded.len() - 3];
    assert_eq!(
        first_round.body, plain,
        "the gzip body was projected as the plain one"
    );
    assert!(first_round.headers.get("content-encoding").is_none());
    for round in &recorded[recorded.len() - 3..] {
        assert_eq!(
            round.headers["accept-encoding"], "zstd,gzip",
            "each round asks as the client did"
        );
    }
}
