//! End-to-end: audio in tool results (issue #17, docs/audio.md) through the real binary. An
//! MCP `audio` item, an `audio/*` resource or a `data:audio/` URL in a tool result never
//! reaches the provider as base64: it is checked, stored as an artifact (served with its media
//! type to its tenant), and replaced by one reference line; a truncated or mislabelled file is
//! refused with a note. The route's images and the rest of the text are untouched.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use common::{b64, client, get_as, metric, wav, MockUpstream, Reply, Sluice, D, DIALECTS};
use serde_json::{json, Value};

const KEY: &str = "sk-audio";

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
    let response = common::post_as(sluice, d.path(), KEY, body).await;
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
    let id = common::newest_session(&sluice, KEY).await;
    let record: Value = get_as(&sluice, &format!("/v1/sluice/sessions/{id}"), KEY)
        .await
        .json()
        .await
        .unwrap();
    let fates: Vec<(&str, &str)> = record["turns"][0]["audio"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["fate"].as_str().unwrap(), a["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        fates,
        [
            ("placeholder", "no_audio_input"),
            ("refused", "mislabelled")
        ],
        "{record}"
    );
    let first = &record["turns"][0]["audio"][0];
    assert_eq!(
        (first["millis"].as_u64(), first["result"].as_u64()),
        (Some(300), Some(0))
    );
    assert!(
        first["artifact"]
            .as_str()
            .is_some_and(|a| a.starts_with('m')),
        "{first}"
    );
    assert!(record["turns"][0]["audio"][1]["artifact"].is_null());
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

/// `config_for` with `audio` in every route's `input_modalities`, and `extra` (TOML lines, such
/// as a `[routes.audio]` table) on every route.
fn audio_config(mock: &MockUpstream, extra: &str) -> String {
    common::on_every_route(
        &common::config_for(&mock.base_url(), ""),
        &format!("input_modalities = [\"text\", \"image\", \"audio\"]\n{extra}"),
    )
}

/// A WAV of `millis` ms as base64, and a tool result's text holding it as one MCP audio item.
fn one_clip(millis: u32) -> (String, String) {
    let data = b64(&wav(millis));
    let text = json!({"content": [{"type": "audio", "data": data, "mimeType": "audio/wav"}]});
    (data, text.to_string())
}

/// An Ogg file's first bytes: a container OpenAI's `input_audio` does not take.
fn ogg() -> Vec<u8> {
    [b"OggS\x00\x02".as_slice(), &[7u8; 200]].concat()
}

/// The `input_audio` parts of a forwarded chat request, with the role of the message each is in
/// and what stands before it in that message.
fn audio_parts(forwarded: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for m in forwarded["messages"].as_array().into_iter().flatten() {
        let parts = m["content"].as_array().cloned().unwrap_or_default();
        for (i, p) in parts.iter().enumerate() {
            if p["type"] == "input_audio" {
                let before = i
                    .checked_sub(1)
                    .and_then(|j| parts[j]["text"].as_str())
                    .unwrap_or_default()
                    .to_string();
                out.push((
                    m["role"].as_str().unwrap_or("").to_string(),
                    before,
                    p["input_audio"].clone(),
                ));
            }
        }
    }
    out
}

async fn committed(sluice: &Sluice, n: f64) {
    for _ in 0..300 {
        let m = sluice.metrics().await;
        if metric(&m, "sluice_commits_total{outcome=\"committed\"}") >= n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{n} commits were not written");
}

/// A1, A3, A7, A9: on a chat route with `audio`, an MCP audio item is sent as an `input_audio`
/// part in a user message after the turn's tool messages (the mock refuses it anywhere else, or
/// in another format), introduced by its reference; once that response completed (here a
/// stream, through its final event), the next request shows a placeholder naming the artifact
/// and the read-tool call, and no base64.
#[tokio::test]
async fn an_audio_route_sends_an_audio_item_once_then_a_placeholder_a3_a7() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&audio_config(&mock, ""));
    let clip = wav(1500);
    let data = b64(&clip);
    let text = json!({"content": [
        {"type": "text", "text": "Recorded the meeting."},
        {"type": "audio", "data": data, "mimeType": "audio/wav"}]})
    .to_string();
    let mut body = request(D::Chat, &text);
    body["stream"] = json!(true);
    let projection = send(&sluice, D::Chat, &body).await;
    assert!(projection.contains("embedded=1;"), "{projection}");
    assert!(projection.contains("placeholders=0"), "{projection}");
    let forwarded = mock.last().json();
    let parts = audio_parts(&forwarded);
    assert_eq!(parts.len(), 1, "{forwarded}");
    let (role, before, audio) = &parts[0];
    assert_eq!(role, "user");
    assert!(
        before.starts_with("[audio #1: WAV 1.5 s, 24 KB, artifact://"),
        "{before}"
    );
    assert_eq!(audio["format"], "wav");
    assert_eq!(audio["data"], data.as_str(), "the client's base64, as sent");
    let messages = forwarded["messages"].as_array().unwrap();
    assert_eq!(
        messages.len(),
        4,
        "one user message added after the tool message"
    );
    assert_eq!(messages[2]["role"], "tool");
    let tool_text = messages[2]["content"].as_str().unwrap();
    assert!(
        !tool_text.contains(&data[..100]),
        "no base64 in the tool message"
    );
    assert!(tool_text.contains("Recorded the meeting."));
    committed(&sluice, 1.0).await;

    // Sent once: the same history now shows the reference and a placeholder.
    let projection = send(&sluice, D::Chat, &request(D::Chat, &text)).await;
    assert!(projection.contains("embedded=0;"), "{projection}");
    assert!(projection.contains("placeholders=1"), "{projection}");
    let forwarded = mock.last().json();
    assert!(audio_parts(&forwarded).is_empty(), "{forwarded}");
    let id = artifacts(&forwarded.to_string()).pop().unwrap();
    let shown = forwarded.to_string();
    assert!(
        shown.contains(
            "sent earlier and no longer attached; it can be heard again with the read tool"
        ),
        "{shown}"
    );
    assert!(shown.contains(&format!(r#"{{\"url\":\"artifact://{id}\"}}"#)));
    assert!(shown.contains("sluice_read"), "the read tool is offered");
    assert!(!shown.contains(&data[..100]));
    let m = sluice.metrics().await;
    assert_eq!(
        metric(&m, "sluice_audio_total{outcome=\"embedded\",reason=\"\"}"),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            "sluice_audio_total{outcome=\"placeholder\",reason=\"shown_before\"}"
        ),
        1.0
    );
}

/// A1: where the wire API takes no audio (Anthropic, Responses' tool output) the route's
/// `audio` changes nothing: a placeholder says why, and the strict mock accepts the request.
#[tokio::test]
async fn apis_without_audio_input_get_a_placeholder_on_an_audio_route_a1() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&audio_config(&mock, ""));
    let (data, text) = one_clip(400);
    for d in [D::Responses, D::Anthropic] {
        let projection = send(&sluice, d, &request(d, &text)).await;
        assert!(projection.contains("placeholders=1"), "{d:?}: {projection}");
        let forwarded = mock.last().json().to_string();
        assert!(!forwarded.contains(&data[..100]), "{d:?}");
        assert!(!forwarded.contains("input_audio"), "{d:?}");
        assert!(
            forwarded.contains("[audio #1: not sent to the model: this API takes no audio input]"),
            "{d:?}: {forwarded}"
        );
    }
}

/// A9: a request whose response failed consumes no showing: sent again, the audio is sent
/// again; only after a success is it a placeholder.
#[tokio::test]
async fn a_failed_request_consumes_no_audio_a9() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&audio_config(&mock, ""));
    let (_, text) = one_clip(300);
    let body = request(D::Chat, &text);
    mock.script([Reply::Status(
        500,
        json!({"error": {"message": "upstream broke", "type": "server_error"}}).to_string(),
    )]);
    let response = common::post_as(&sluice, D::Chat.path(), KEY, &body).await;
    assert_eq!(response.status().as_u16(), 500);
    response.bytes().await.unwrap();
    assert_eq!(audio_parts(&mock.last().json()).len(), 1);
    send(&sluice, D::Chat, &body).await;
    assert_eq!(audio_parts(&mock.last().json()).len(), 1, "not consumed");
    committed(&sluice, 1.0).await;
    send(&sluice, D::Chat, &body).await;
    assert_eq!(audio_parts(&mock.last().json()).len(), 0, "consumed once");
}

/// A5, A6 with `[routes.audio]`: files are taken in arrival order; one that does not fit this
/// request's count waits (a note, sent on a later request), one over the per-file bytes or in
/// a container the API does not take is refused for good, with a note.
#[tokio::test]
async fn audio_budgets_defer_and_refuse_in_arrival_order_a5_a6() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&audio_config(
        &mock,
        "[routes.audio]\nmax_audio = 1\nmax_audio_bytes = 40000",
    ));
    let (first, second, long) = (wav(1000), wav(500), wav(3000));
    let text = json!({"content": [
        {"type": "audio", "data": b64(&first), "mimeType": "audio/wav"},
        {"type": "audio", "data": b64(&second), "mimeType": "audio/wav"},
        {"type": "audio", "data": b64(&long), "mimeType": "audio/wav"},
        {"type": "audio", "data": b64(&ogg()), "mimeType": "audio/ogg"}]})
    .to_string();
    let body = request(D::Chat, &text);
    let projection = send(&sluice, D::Chat, &body).await;
    assert!(
        projection.starts_with("spilled=0; embedded=1; deferred=1; refused=2; placeholders=0"),
        "{projection}"
    );
    let forwarded = mock.last().json();
    let parts = audio_parts(&forwarded);
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].2["data"], b64(&first).as_str());
    let shown = forwarded.to_string();
    for note in [
        "[audio #2: not sent in this request (its audio budget is full); it will be sent in a later one (artifact://",
        "[audio #3: not sent: 47 KB is over this route's audio limit of 39 KB]",
        "[audio #4: not sent: this API takes WAV or MP3 audio, not Ogg]",
    ] {
        assert!(shown.contains(note), "{note}: {shown}");
    }
    committed(&sluice, 1.0).await;
    // The first was sent; the second's turn has come.
    let projection = send(&sluice, D::Chat, &body).await;
    assert!(
        projection.starts_with("spilled=0; embedded=1; deferred=0; refused=2; placeholders=1"),
        "{projection}"
    );
    let parts = audio_parts(&mock.last().json());
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].2["data"], b64(&second).as_str());
}

/// A chat request whose tool results are one MCP audio item each, the WAVs of `millis`.
fn clips(millis: &[u32]) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Record the meeting."})];
    for (i, &ms) in millis.iter().enumerate() {
        let id = format!("call_{i}");
        messages.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": id,
            "type": "function", "function": {"name": "record", "arguments": "{}"}}]}),
        );
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": one_clip(ms).1}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

/// A4 through the edit decision (docs/cache.md): a `recent` file past `recent_count` is not
/// pruned while the session's provider cache is warm and the prune does not pay
/// (`deferred_edits` says it waits), and goes once the cache is cold (the session's last
/// request older than `ttl_seconds`); under `policy = "eager"` it goes at once. The newest
/// file is sent on every request.
#[tokio::test]
async fn recent_audio_is_pruned_when_it_pays_a4() {
    let mock = MockUpstream::start();
    let recent = "[routes.audio]\ndefault_lifetime = \"recent\"\nrecent_count = 1\nprune_batch = 1";
    let economic = Sluice::start(&audio_config(
        &mock,
        &format!("{recent}\n[routes.cache]\nttl_seconds = 2"),
    ));
    let eager = Sluice::start(&audio_config(
        &mock,
        &format!("{recent}\n[routes.cache]\npolicy = \"eager\""),
    ));
    let sent = |mock: &MockUpstream| -> Vec<String> {
        audio_parts(&mock.last().json())
            .iter()
            .map(|(_, _, a)| a["data"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let (a, b, c) = (20_000, 20_100, 20_200);
    for sluice in [&economic, &eager] {
        let projection = send(sluice, D::Chat, &clips(&[a])).await;
        assert!(projection.contains("embedded=1;"), "{projection}");
        committed(sluice, 1.0).await;
    }
    // Warm: the viewed first file is past recent_count, and waits.
    let projection = send(&economic, D::Chat, &clips(&[a, b])).await;
    assert!(projection.contains("embedded=2;"), "{projection}");
    assert!(projection.contains("deferred_edits=1"), "{projection}");
    assert_eq!(sent(&mock), [one_clip(a).0, one_clip(b).0]);
    // Eager: pruned at once.
    let projection = send(&eager, D::Chat, &clips(&[a, b])).await;
    assert!(projection.contains("embedded=1;"), "{projection}");
    assert!(projection.contains("placeholders=1"), "{projection}");
    assert!(!projection.contains("deferred_edits"), "{projection}");
    assert_eq!(sent(&mock), [one_clip(b).0]);
    // Cold: every pending prune at once, the newest kept.
    committed(&economic, 2.0).await;
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    let projection = send(&economic, D::Chat, &clips(&[a, b, c])).await;
    assert!(projection.contains("embedded=1;"), "{projection}");
    assert!(projection.contains("placeholders=2"), "{projection}");
    assert!(!projection.contains("deferred_edits"), "{projection}");
    assert_eq!(sent(&mock), [one_clip(c).0]);
}

/// M5: a `retain` hint on the item keeps the audio in every request while its source is present.
#[tokio::test]
async fn a_retain_hint_sends_the_audio_on_every_request_m5() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&audio_config(&mock, ""));
    let data = b64(&wav(200));
    let text = json!({"content": [{"type": "audio", "data": data, "mimeType": "audio/wav",
        "_meta": {"sluice/lifetime": "retain"}}]})
    .to_string();
    let body = request(D::Chat, &text);
    for turn in 1..=3 {
        send(&sluice, D::Chat, &body).await;
        let forwarded = mock.last().json();
        assert_eq!(audio_parts(&forwarded).len(), 1, "turn {turn}");
        assert!(
            !forwarded.to_string().contains("sluice/lifetime"),
            "hint stripped"
        );
        committed(&sluice, f64::from(turn)).await;
    }
}

/// C5: audio sent once is heard again through the read tool's `{"url":"artifact://…"}`: the
/// answer's audio goes in a user message after the round's tool messages (the mock enforces
/// that), and later turns show the re-read once, as a placeholder. Where the API takes no
/// audio, the read is answered in words.
#[tokio::test]
async fn audio_sent_once_can_be_heard_again_with_the_read_tool_c5() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&audio_config(&mock, ""));
    mock.record(true);
    let (data, text) = one_clip(700);
    let body = request(D::Chat, &text);
    send(&sluice, D::Chat, &body).await;
    let id = artifacts(&mock.last().json().to_string()).pop().unwrap();
    committed(&sluice, 1.0).await;

    mock.script([
        Reply::Parts(vec![common::Part::Tool(
            "sluice_read".into(),
            json!({"url": format!("artifact://{id}")}),
        )]),
        Reply::Text("I heard it again.".into()),
    ]);
    let before = mock.requests().len();
    let response = common::post_as(&sluice, D::Chat.path(), KEY, &body).await;
    assert_eq!(response.status().as_u16(), 200, "the mock takes the round");
    let answer: Value = response.json().await.unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "I heard it again."
    );
    let rounds: Vec<Value> = mock.requests()[before..].iter().map(|r| r.json()).collect();
    assert_eq!(rounds.len(), 2);
    assert!(audio_parts(&rounds[0]).is_empty(), "sent once already");
    let heard = audio_parts(&rounds[1]);
    assert_eq!(heard.len(), 1, "{}", rounds[1]);
    assert_eq!(heard[0].0, "user");
    assert_eq!(heard[0].2["format"], "wav");
    assert_eq!(heard[0].2["data"], data.as_str());
    assert!(rounds[1]
        .to_string()
        .contains(&format!("audio artifact://{id}, WAV, played again")));
    let m = sluice.metrics().await;
    assert_eq!(
        metric(&m, "sluice_read_calls_total{outcome=\"audio\"}"),
        1.0
    );
    committed(&sluice, 2.0).await;

    // The next turn: the re-read is spliced back as a placeholder (C3, once).
    let mut third = body.clone();
    let messages = third["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "I heard it again."}));
    messages.push(json!({"role": "user", "content": "thanks"}));
    send(&sluice, D::Chat, &third).await;
    let later = mock.last().json();
    assert!(audio_parts(&later).is_empty(), "{later}");
    assert!(
        later
            .to_string()
            .contains("was played here; it can be heard again"),
        "{later}"
    );

    // Anthropic takes no audio: the read is answered in words, and the mock accepts the round.
    mock.script([
        Reply::Parts(vec![common::Part::Tool(
            "sluice_read".into(),
            json!({"url": format!("artifact://{id}")}),
        )]),
        Reply::Text("Understood.".into()),
    ]);
    let output = common::tool_output(150_000);
    send(&sluice, D::Anthropic, &request(D::Anthropic, &output)).await;
    let round = mock.last().json().to_string();
    assert!(
        round.contains("cannot be played again: this model does not accept audio here"),
        "{round}"
    );
    let m = sluice.metrics().await;
    assert_eq!(
        metric(&m, "sluice_read_calls_total{outcome=\"audio_refused\"}"),
        1.0
    );
}
