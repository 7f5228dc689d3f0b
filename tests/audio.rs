//! End-to-end: audio in tool results (issue #17, docs/audio.md) through the real binary. An
//! MCP `audio` item, an `audio/*` resource or a `data:audio/` URL in a tool result never
//! reaches the provider as base64: it is checked, stored as an artifact (served with its media
//! type to its tenant), and replaced by one reference line; a truncated or mislabelled file is
//! refused with a note. The route's images and the rest of the text are untouched.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use common::{b64, client, get_as, metric, MockUpstream, Sluice, D, DIALECTS};
use serde_json::{json, Value};

const KEY: &str = "sk-audio";

/// A mono 16-bit 8 kHz WAV of `millis` milliseconds (a quiet ramp, so its bytes vary).
fn wav(millis: u32) -> Vec<u8> {
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

/// A request whose one tool result is `text` (a string), in dialect `d`.
fn request(d: D, text: &str) -> Value {
    match d {
        D::Chat => json!({"model": "gpt-4o", "messages": [
            {"role": "user", "content": "Listen."},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "record", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": text}]}),
        D::Responses => json!({"model": "gpt-4o", "input": [
            {"role": "user", "content": "Listen."},
            {"type": "function_call", "call_id": "call_1", "name": "record", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": text}]}),
        D::Anthropic => json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [
            {"role": "user", "content": "Listen."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "record", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": text}]}]}),
    }
}

async fn send(sluice: &Sluice, d: D, body: &Value) -> String {
    let response = client()
        .post(sluice.url(d.path()))
        .bearer_auth(KEY)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let projection = response.headers()["x-sluice-projection"]
        .to_str()
        .unwrap()
        .to_string();
    response.bytes().await.unwrap();
    projection
}

/// The artifact ids named in `text`.
fn artifacts(text: &str) -> Vec<String> {
    text.match_indices("artifact://")
        .map(|(at, m)| {
            text[at + m.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn audio_in_tool_results_is_stored_and_named_never_sent_as_base64() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let clip = wav(1500);
    let data = b64(&clip);
    let mcp = json!({"content": [
        {"type": "text", "text": "Recorded the meeting."},
        {"type": "audio", "data": data, "mimeType": "audio/wav"}]})
    .to_string();
    let url = format!("Here it is again: data:audio/wav;base64,{data} (end)");
    for d in DIALECTS {
        for text in [&mcp, &url] {
            let projection = send(&sluice, d, &request(d, text)).await;
            let forwarded = mock.last().json().to_string();
            let case = format!("{d:?}: {}", &text[..30]);
            assert!(
                !forwarded.contains(&data[..200]),
                "{case}: base64 forwarded"
            );
            assert!(
                forwarded.contains("[audio #1: WAV 1.5 s, 24 KB, artifact://"),
                "{case}: {forwarded}"
            );
            assert!(forwarded.contains("not sent to the model"), "{case}");
            assert!(
                projection.contains("placeholders=1"),
                "{case}: {projection}"
            );
            let id = artifacts(&forwarded).pop().unwrap();
            let got = get_as(&sluice, &format!("/v1/sluice/artifacts/{id}"), KEY).await;
            assert_eq!(got.headers()["content-type"], "audio/wav", "{case}");
            assert_eq!(
                got.bytes().await.unwrap().as_ref(),
                clip.as_slice(),
                "{case}"
            );
            // The tool's own text is still there.
            let kept = if text == &mcp {
                "Recorded the meeting."
            } else {
                "(end)"
            };
            assert!(forwarded.contains(kept), "{case}");
        }
    }
    let m = sluice.metrics().await;
    assert_eq!(
        metric(&m, "sluice_audio_total{outcome=\"placeholder\""),
        6.0
    );
}

/// The inspector lists each turn's audio items with their fate (docs/inspector.md).
#[tokio::test]
async fn the_inspector_records_audio_fates() {
    let mock = MockUpstream::start();
    let config = common::config_for(&mock.base_url(), "[inspector]\nenabled = true\n");
    let sluice = Sluice::start(&config);
    let good = b64(&wav(300));
    let text = json!({"content": [
        {"type": "audio", "data": good, "mimeType": "audio/wav"},
        {"type": "audio", "data": good, "mimeType": "audio/mpeg"}]})
    .to_string();
    send(&sluice, D::Anthropic, &request(D::Anthropic, &text)).await;
    let list: Value = get_as(&sluice, "/v1/sluice/sessions", KEY)
        .await
        .json()
        .await
        .unwrap();
    let id = list["sessions"][0]["id"].as_str().unwrap().to_string();
    let record: Value = get_as(&sluice, &format!("/v1/sluice/sessions/{id}"), KEY)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        record["turns"][0]["audio"],
        json!([{"fate": "placeholder", "reason": "no_audio_input"},
               {"fate": "refused", "reason": "mislabelled"}]),
        "{record}"
    );
    assert_eq!(record["turns"][0]["results"][0]["fate"], "media");
}

#[tokio::test]
async fn truncated_or_mislabelled_audio_is_refused_with_a_note() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let mut cut = wav(1000);
    cut.truncate(cut.len() / 2);
    for (bytes, label, note) in [
        (
            cut,
            "audio/wav",
            "not used: the audio file is damaged or incomplete",
        ),
        (
            wav(200),
            "audio/mpeg",
            "not used: the file is labelled audio/mpeg but is WAV",
        ),
        (
            b"plain text".to_vec(),
            "audio/wav",
            "not used: the data is not a WAV",
        ),
    ] {
        let data = b64(&bytes);
        let text =
            json!({"content": [{"type": "audio", "data": data, "mimeType": label}]}).to_string();
        for d in DIALECTS {
            send(&sluice, d, &request(d, &text)).await;
            let forwarded = mock.last().json().to_string();
            assert!(forwarded.contains(note), "{d:?} {label}: {forwarded}");
            assert!(
                !forwarded.contains(&data),
                "{d:?} {label}: base64 forwarded"
            );
            assert!(
                artifacts(&forwarded).is_empty(),
                "{d:?} {label}: nothing stored"
            );
        }
    }
    let m = sluice.metrics().await;
    assert_eq!(
        metric(
            &m,
            "sluice_audio_total{outcome=\"refused\",reason=\"damaged\"}"
        ),
        3.0
    );
    assert_eq!(
        metric(
            &m,
            "sluice_audio_total{outcome=\"refused\",reason=\"mislabelled\"}"
        ),
        3.0
    );
}

#[tokio::test]
async fn a_tool_result_without_audio_is_forwarded_byte_for_byte_p1() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    // Words that look like audio markers, but no audio.
    let text = "{\"audio\": \"off\", \"note\": \"see data:audio/ later\"}";
    for d in DIALECTS {
        let body = request(d, text);
        let sent = body.to_string();
        client()
            .post(sluice.url(d.path()))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(sent.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(mock.last().body.as_ref(), sent.as_bytes(), "{d:?}");
    }
}
