//! A bad-input corpus replayed through the real binary (issue "reliability"; SPEC P4, S3, S5):
//! truncated, deep, huge and duplicate-key JSON, a wrong type at every place a request has one,
//! bad encodings, bomb and broken images, forged cursors and artifact ids, hostile headers, over
//! the four projected endpoints and sluice's two. Every case must get a dialect-shaped 4xx, a
//! placeholder, or a faithful pass-through: never a dropped connection, a 5xx, a panic, or
//! invalid JSON sent upstream.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::time::Duration;

use common::{b64, picture, tool_output, MockUpstream, Sluice};
use image::ImageFormat;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One request of the corpus, sent as raw HTTP/1.1.
struct Case {
    name: String,
    method: &'static str,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Refused by the HTTP parser before there is a request (a control character in a header):
    /// hyper answers a bare 400 of its own, which sluice cannot shape (docs/timeouts-and-errors.md).
    by_parser: bool,
}

/// The one right status for the cases where only one is right, by their names: bodies that are
/// not (unambiguous, UTF-8) JSON are `bad_json`; encodings sluice does not know are 415; sluice's
/// endpoints without a credential are 401.
fn expected(name: &str) -> Option<u16> {
    let bad_json = [
        "truncated at",
        "duplicate ",
        "not utf-8",
        "utf-16",
        "not json",
        "gzip that is not",
    ];
    if bad_json.iter().any(|p| name.contains(p)) || name.ends_with(" empty") {
        Some(400)
    } else if name.ends_with("compress encoding") {
        Some(415)
    } else if name.ends_with(" anonymous") {
        Some(401)
    } else {
        None
    }
}

const PROJECTED: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
];

fn post(name: impl Into<String>, path: &str, body: Vec<u8>) -> Case {
    Case {
        name: name.into(),
        method: "POST",
        path: path.to_string(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("authorization".into(), "Bearer sk-corpus".into()),
        ],
        body,
        by_parser: false,
    }
}

/// A rich valid request for `path`: a long tool result, an image in a tool result and one from
/// the user, tools, a system prompt.
fn base(path: &str) -> Value {
    let png = b64(&picture(24, 16, ImageFormat::Png));
    let long = tool_output(40_000);
    let mcp = json!({"content": [{"type": "text", "text": "shot"}, {"type": "image", "data": png, "mimeType": "image/png"}]}).to_string();
    match path {
        "/v1/chat/completions" => json!({"model": "gpt-4o", "stream": false, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{png}"), "detail": "low"}}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "take_screenshot", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": long},
            {"role": "tool", "tool_call_id": "c2", "content": mcp}],
            "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}),
        "/v1/responses" => json!({"model": "gpt-4o", "instructions": "be brief", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": format!("data:image/png;base64,{png}")}]},
            {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": long},
            {"type": "function_call", "call_id": "c2", "name": "take_screenshot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c2", "output": [
                {"type": "input_image", "image_url": format!("data:image/png;base64,{png}"), "detail": "high"}]}],
            "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]}),
        _ => json!({"model": "claude-x", "max_tokens": 50, "system": "be brief", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}},
                {"type": "tool_use", "id": "t2", "name": "take_screenshot", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": long},
                {"type": "tool_result", "tool_use_id": "t2", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}, "cache_control": {"type": "ephemeral"}}]}]}],
            "tools": [{"name": "bash", "input_schema": {"type": "object"}}]}),
    }
}

/// Every place in `v` (object members and array elements), as paths.
fn places(v: &Value, at: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                at.push(json!(k));
                out.push(at.clone());
                places(child, at, out);
                at.pop();
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                at.push(json!(i));
                out.push(at.clone());
                places(child, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn replaced(v: &Value, path: &[Value], with: &Value) -> Value {
    let mut out = v.clone();
    let mut node = &mut out;
    for step in path {
        node = match step {
            Value::String(k) => node.get_mut(k.as_str()).unwrap(),
            _ => node.get_mut(step.as_u64().unwrap() as usize).unwrap(),
        };
    }
    *node = with.clone();
    out
}

/// A PNG header announcing `w`×`h` (no pixel data): a decompression bomb by its dimensions.
fn png_header(w: u32, h: u32) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    out.extend(w.to_be_bytes());
    out.extend(h.to_be_bytes());
    out.extend([8, 2, 0, 0, 0, 0, 0, 0, 0]);
    out
}

fn corpus() -> Vec<Case> {
    let mut cases = Vec::new();
    let wrong = [
        json!(null),
        json!(1),
        json!("s"),
        json!([]),
        json!({}),
        json!(true),
        json!(-1e300),
    ];
    for path in PROJECTED {
        let v = base(path);
        let text = serde_json::to_vec(&v).unwrap();
        // A wrong type at every place, cycling through the kinds.
        let mut all = Vec::new();
        places(&v, &mut Vec::new(), &mut all);
        for (i, place) in all.iter().enumerate().filter(|(_, p)| p.len() <= 7) {
            let with = &wrong[i % wrong.len()];
            let body = serde_json::to_vec(&replaced(&v, place, with)).unwrap();
            cases.push(post(format!("{path} {place:?} = {with}"), path, body));
        }
        // Truncated anywhere.
        for k in [
            1,
            2,
            10,
            100,
            text.len() / 3,
            text.len() / 2,
            text.len() - 1,
        ] {
            cases.push(post(
                format!("{path} truncated at {k}"),
                path,
                text[..k].to_vec(),
            ));
        }
        // Deep nesting, at the top and inside a message.
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        cases.push(post(
            format!("{path} deep top"),
            path,
            deep(100_000).into_bytes(),
        ));
        let nested = String::from_utf8(text.clone())
            .unwrap()
            .replacen("\"look\"", &deep(5_000), 1);
        cases.push(post(
            format!("{path} deep inside"),
            path,
            nested.into_bytes(),
        ));
        // Huge values.
        let mut huge = v.clone();
        huge["model"] = json!("m".repeat(2_000_000));
        cases.push(post(
            format!("{path} huge model"),
            path,
            serde_json::to_vec(&huge).unwrap(),
        ));
        cases.push(post(
            format!("{path} huge number"),
            path,
            br#"{"model":"x","max_tokens":1e999999,"messages":[]}"#.to_vec(),
        ));
        cases.push(post(
            format!("{path} many keys"),
            path,
            serde_json::to_vec(&json!((0..50_000)
                .map(|i| (format!("k{i}"), json!(i)))
                .collect::<serde_json::Map<_, _>>()))
            .unwrap(),
        ));
        // Duplicate keys, at the top and inside.
        let s = String::from_utf8(text.clone()).unwrap();
        let key = if path == "/v1/responses" {
            "\"input\":"
        } else {
            "\"messages\":"
        };
        cases.push(post(
            format!("{path} duplicate {key}"),
            path,
            s.replacen('{', &format!("{{{key}[],"), 1).into_bytes(),
        ));
        cases.push(post(
            format!("{path} duplicate model"),
            path,
            s.replacen('{', "{\"model\":\"other\",", 1).into_bytes(),
        ));
        cases.push(post(
            format!("{path} duplicate inner"),
            path,
            s.replacen(
                "\"role\":\"user\"",
                "\"role\":\"user\",\"role\":\"system\"",
                1,
            )
            .into_bytes(),
        ));
        // Bad encodings.
        let mut latin1 = text.clone();
        latin1.splice(10..10, [0xff, 0xfe, 0xe9]);
        cases.push(post(format!("{path} not utf-8"), path, latin1));
        let mut bom = b"\xef\xbb\xbf".to_vec();
        bom.extend(&text);
        cases.push(post(format!("{path} bom"), path, bom));
        let utf16: Vec<u8> = s[..200].encode_utf16().flat_map(u16::to_le_bytes).collect();
        cases.push(post(format!("{path} utf-16"), path, utf16));
        cases.push(post(
            format!("{path} lone surrogate"),
            path,
            s.replacen("test tests::case_", "\\ud83d tests::case_", 1)
                .into_bytes(),
        ));
        cases.push(post(
            format!("{path} bad escape"),
            path,
            s.replacen("look", "lo\\qok", 1).into_bytes(),
        ));
        cases.push(post(
            format!("{path} nul"),
            path,
            s.replacen("look", "lo\\u0000ok", 1).into_bytes(),
        ));
        cases.push(post(format!("{path} empty"), path, Vec::new()));
        cases.push(post(format!("{path} not json"), path, b"hello".to_vec()));
        // Bomb and broken images, where the base request's images stand.
        let png = b64(&picture(24, 16, ImageFormat::Png));
        for (what, data) in [
            ("bomb", b64(&png_header(100_000, 100_000))),
            (
                "truncated png",
                b64(&picture(24, 16, ImageFormat::Png)[..40]),
            ),
            ("not base64", "!!!!not-base64@@@@".to_string()),
            ("empty image", String::new()),
            ("gif as png", b64(&picture(8, 8, ImageFormat::Gif))),
            ("huge base64", "A".repeat(8_000_000)),
        ] {
            cases.push(post(
                format!("{path} image {what}"),
                path,
                s.replace(&png, &data).into_bytes(),
            ));
        }
        cases.push(post(
            format!("{path} uppercase data url"),
            path,
            s.replace("data:image/png;base64,", "DATA:IMAGE/PNG;BASE64,")
                .into_bytes(),
        ));
        cases.push(post(
            format!("{path} data url without base64"),
            path,
            s.replace("data:image/png;base64,", "data:image/png,")
                .into_bytes(),
        ));
        // An image part's URL as a bare string, labelled as another type (chat wants an object).
        let object = format!("{{\"url\":\"data:image/png;base64,{png}\",\"detail\":\"low\"}}");
        let bare = format!("\"data:image/jpeg;base64,{png}\"");
        if s.contains(&object) {
            cases.push(post(
                format!("{path} bare mislabelled image url"),
                path,
                s.replace(&object, &bare).into_bytes(),
            ));
        }
        // Hostile headers on a valid body.
        let mut h = post(format!("{path} huge session header"), path, text.clone());
        h.headers
            .push(("x-sluice-session".into(), "s".repeat(60_000)));
        cases.push(h);
        let mut h = post(
            format!("{path} non-ascii session header"),
            path,
            text.clone(),
        );
        h.headers
            .push(("x-sluice-session".into(), "sé€ssion".into()));
        cases.push(h);
        let mut h = post(
            format!("{path} control character in a header"),
            path,
            text.clone(),
        );
        h.headers
            .push(("x-sluice-session".into(), "a\u{1}b".into()));
        h.by_parser = true;
        cases.push(h);
        let mut h = post(format!("{path} empty credentials"), path, text.clone());
        h.headers = vec![
            ("x-api-key".into(), String::new()),
            ("authorization".into(), "Bearer".into()),
        ];
        cases.push(h);
        let mut h = post(format!("{path} compress encoding"), path, text.clone());
        h.headers
            .push(("content-encoding".into(), "compress".into()));
        cases.push(h);
        let mut h = post(format!("{path} gzip that is not"), path, text.clone());
        h.headers.push(("content-encoding".into(), "gzip".into()));
        cases.push(h);
        let mut h = post(format!("{path} wrong content-type"), path, text.clone());
        h.headers[0].1 = "text/plain".into();
        cases.push(h);
    }
    // sluice's own endpoints: forged cursors and artifact ids, with and without a credential.
    let get = |name: &str, path: String, credential: bool| Case {
        name: name.to_string(),
        method: "GET",
        path,
        headers: if credential {
            vec![("authorization".into(), "Bearer sk-corpus".into())]
        } else {
            Vec::new()
        },
        body: Vec::new(),
        by_parser: false,
    };
    for (i, cursor) in [
        "",
        "x",
        "AAAA",
        &"A".repeat(10_000),
        "%00",
        "..%2F..%2Fetc%2Fpasswd",
        "c%FF%FE",
        "eyJ0eXAiOiJKV1QifQ",
        "____-----",
        &"_".repeat(43),
        "%F0%9F%98%80",
    ]
    .iter()
    .enumerate()
    {
        cases.push(get(
            &format!("read cursor {i}"),
            format!("/v1/sluice/read?cursor={cursor}"),
            true,
        ));
        cases.push(get(
            &format!("read cursor {i} anonymous"),
            format!("/v1/sluice/read?cursor={cursor}"),
            false,
        ));
    }
    cases.push(get("read without cursor", "/v1/sluice/read".into(), true));
    cases.push(get(
        "read two cursors",
        "/v1/sluice/read?cursor=a&cursor=b".into(),
        true,
    ));
    for (i, id) in [
        "",
        "t",
        "../../etc/passwd",
        "..%2F..%2Fetc",
        &"t".repeat(33),
        &"m".repeat(5000),
        "t%00x",
        "tAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "m!!!!",
        "%C3%A9",
    ]
    .iter()
    .enumerate()
    {
        cases.push(get(
            &format!("artifact id {i}"),
            format!("/v1/sluice/artifacts/{id}"),
            true,
        ));
        cases.push(get(
            &format!("artifact id {i} anonymous"),
            format!("/v1/sluice/artifacts/{id}"),
            false,
        ));
    }
    let mut post_read = get("post to read", "/v1/sluice/read?cursor=x".into(), true);
    post_read.method = "POST";
    cases.push(post_read);
    cases
}

/// Sends `case` on its own connection; the raw response, or `None` when the connection was
/// dropped without one.
async fn send(sluice: &Sluice, case: &Case) -> Option<(u16, String, String)> {
    let mut stream = tokio::net::TcpStream::connect(sluice.proxy).await.unwrap();
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: sluice\r\nconnection: close\r\n",
        case.method, case.path
    );
    for (k, v) in &case.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if case.method == "POST" {
        head.push_str(&format!("content-length: {}\r\n", case.body.len()));
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend(&case.body);
    // The server may answer (413, 415) before the whole body is written: that is fine.
    let _ = stream.write_all(&request).await;
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut out)).await;
    if read.is_err() {
        panic!("{}: no answer within 30 s", case.name);
    }
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.get(9..12)?.parse().ok()?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Some((status, head.to_ascii_lowercase(), body.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_a_clear_answer_p4_s5() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    let cases = corpus();
    assert!(cases.len() >= 200, "{} cases", cases.len());
    let mut failures = Vec::new();
    let mut statuses = std::collections::BTreeMap::new();
    for case in &cases {
        let before = mock.requests().len();
        let Some((status, head, body)) = send(&sluice, case).await else {
            failures.push(format!(
                "{}: connection dropped without a response",
                case.name
            ));
            continue;
        };
        *statuses.entry(status).or_insert(0) += 1;
        if let Some(want) = expected(&case.name).filter(|want| *want != status) {
            failures.push(format!("{}: {status}, want {want}: {body:.200}", case.name));
        }
        if status >= 500 {
            failures.push(format!("{}: {status} {body}", case.name));
        }
        let from_provider = head.contains("x-mock: 1");
        if case.by_parser {
            if status != 400 {
                failures.push(format!("{}: {status} from the parser", case.name));
            }
        } else if (400..500).contains(&status) && !from_provider {
            // sluice's own error: the dialect's shape.
            let anthropic = case.path.starts_with("/v1/messages");
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let shaped = if anthropic {
                v["type"] == "error" && v["error"]["message"].is_string()
            } else {
                v["error"]["message"].is_string()
            };
            if !shaped {
                failures.push(format!(
                    "{}: {status} not dialect-shaped: {body:.200}",
                    case.name
                ));
            }
        }
        for forwarded in &mock.requests()[before..] {
            if PROJECTED.contains(&forwarded.uri.as_str())
                && serde_json::from_slice::<serde::de::IgnoredAny>(&forwarded.body).is_err()
            {
                failures.push(format!("{}: invalid JSON went upstream", case.name));
            }
        }
    }
    println!("{} cases, statuses {statuses:?}", cases.len());
    // Still serving, and it never panicked.
    let resp = common::post(
        &sluice,
        "/v1/chat/completions",
        &base("/v1/chat/completions"),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let logs = sluice.logs().join("\n");
    assert!(!logs.contains("panicked"), "a panic:\n{logs}");
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
