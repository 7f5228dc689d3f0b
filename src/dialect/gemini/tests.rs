//! Unit tests of the Gemini dialect: endpoints, the key, the view, content written back, the
//! completion watch and a stitched stream.

use super::*;
use crate::dialect::completion::Completion;
use crate::dialect::stitch::Stitcher;
use crate::dialect::Dialect;
use crate::projection::shapes::{Content, NewContent, PartKind, Shapes};

#[test]
fn paths_name_the_model_and_the_method() {
    let e = endpoint("/v1beta/models/gemini-2.5-pro:streamGenerateContent").unwrap();
    assert_eq!(e.model.as_deref(), Some("gemini-2.5-pro"));
    assert!(!e.counts);
    assert!(
        endpoint("/v1/models/gemini-2.5-flash:countTokens")
            .unwrap()
            .counts
    );
    assert!(endpoint("/v1beta/models/x:embedContent").is_none());
    assert!(endpoint("/v1beta/models/:generateContent").is_none());
    assert!(endpoint("/v1beta/models").is_none());
}

#[test]
fn a_key_in_the_query_moves_into_the_header() {
    let (mut parts, ()) =
        http::Request::post("/v1beta/models/m:streamGenerateContent?alt=sse&key=a%2Bb")
            .body(())
            .unwrap()
            .into_parts();
    key_to_header(&mut parts);
    assert_eq!(parts.uri, "/v1beta/models/m:streamGenerateContent?alt=sse");
    assert_eq!(parts.headers["x-goog-api-key"], "a+b");
    let (mut parts, ()) = http::Request::post("/v1beta/models/m:generateContent?key=k")
        .header("x-goog-api-key", "h")
        .body(())
        .unwrap()
        .into_parts();
    key_to_header(&mut parts);
    assert_eq!(parts.uri, "/v1beta/models/m:generateContent");
    assert_eq!(parts.headers["x-goog-api-key"], "h", "the header wins");
}

#[test]
fn function_responses_are_tool_results_and_user_inline_images_are_user_images() {
    let body = r#"{"contents":[{"role":"user","parts":[{"text":"hi"},{"inlineData":{"mimeType":"image/png","data":"AAAA"}}]},{"role":"model","parts":[{"functionCall":{"name":"ls","args":{}}}]},{"role":"user","parts":[{"function_response":{"name":"ls","response":{"output":"a\nb"}}}]}],"generationConfig":{"maxOutputTokens":77}}"#;
    let view = read(body).unwrap();
    assert_eq!(view.tool_results.len(), 1);
    let r = &view.tool_results[0];
    assert_eq!(
        (r.item, &*r.source, r.tool_name.as_deref()),
        (2, "ls", Some("ls"))
    );
    assert!(r.content.get().starts_with(r#"{"name":"ls""#));
    assert_eq!(view.user_images.len(), 1);
    assert_eq!(view.max_output, Some(77));
    let Some(Content::Parts(parts)) = Gemini.content(r.content.get()) else {
        panic!("parts");
    };
    assert!(matches!(&parts[0].1, Some(p) if matches!(&p.kind, PartKind::Text(t) if t == "a\nb")));
}

#[test]
fn new_content_goes_where_it_was_read_from_and_keeps_the_rest() {
    let original = r#"{"id":"c1","name":"sh","response":{"exit":1,"output":"long"},"parts":[{"fileData":{"fileUri":"u"}}]}"#;
    let new = NewContent {
        text_json: r#""page""#,
        text_breakpoint: None,
        media: vec![r#"{"inlineData":{"mimeType":"image/png","data":"QQ=="}}"#.into()],
        others: vec![r#"{"fileData":{"fileUri":"u"}}"#.into()],
        last_breakpoint: None,
        as_parts: false,
    };
    let out = Gemini
        .tool_content(
            crate::projection::Raw::from(
                &*serde_json::value::RawValue::from_string(original.into()).unwrap(),
            ),
            new,
        )
        .to_text();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["response"],
        serde_json::json!({"exit": 1, "output": "page"})
    );
    assert_eq!(v["parts"].as_array().unwrap().len(), 2);
    assert!(
        out.starts_with(r#"{"id":"c1","name":"sh","response":"#),
        "{out}"
    );
    // A response of another shape becomes `{"output":…}`.
    let other = r#"{"name":"q","response":{"rows":[1,2]}}"#;
    let raw = serde_json::value::RawValue::from_string(other.into()).unwrap();
    let new = NewContent {
        text_json: r#""short""#,
        text_breakpoint: None,
        media: Vec::new(),
        others: Vec::new(),
        last_breakpoint: None,
        as_parts: false,
    };
    let out = Gemini
        .tool_content(crate::projection::Raw::from(&*raw), new)
        .to_text();
    assert_eq!(out, r#"{"name":"q","response":{"output":"short"}}"#);
}

const STREAM: &str = concat!(
    "data: {\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":[{\"text\":\"Let me \"}]},\"index\":0}]}\n\n",
    "data: {\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":[{\"text\":\"read.\"},{\"functionCall\":{\"name\":\"sluice_read\",\"args\":{\"cursor\":\"c\"}},\"thoughtSignature\":\"S\"}]},\"finishReason\":\"STOP\",\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":10,\"candidatesTokenCount\":3}}\n\n",
);

#[test]
fn a_stream_is_complete_at_its_finishing_chunk_a9() {
    for cut in [1, 7, STREAM.len()] {
        let mut c = Completion::new(Dialect::GeminiGenerate).with_usage();
        for piece in STREAM.as_bytes().chunks(cut) {
            c.feed(piece);
        }
        assert!(c.is_complete(), "cut {cut}");
        assert_eq!(c.usage().map(|u| (u.input, u.output)), Some((10, 3)));
    }
    let (head, _) = STREAM.split_at(STREAM.find("\n\n").unwrap() + 2);
    let mut c = Completion::new(Dialect::GeminiGenerate);
    c.feed(head.as_bytes());
    assert!(!c.is_complete(), "a stream cut before its last chunk");
    let mut c = Completion::new(Dialect::GeminiGenerate);
    c.feed(b"data: {\"error\":{\"code\":500,\"message\":\"x\",\"status\":\"INTERNAL\"}}\n\n");
    c.feed(STREAM.as_bytes());
    assert!(!c.is_complete(), "an error chunk fails the stream");
}

#[test]
fn a_read_call_is_held_and_the_rounds_become_one_stream_c2() {
    let mut s = Stitcher::new(Dialect::GeminiGenerate, "sluice_read");
    let mut out = s.feed(STREAM.as_bytes());
    assert!(s.round_complete());
    let first = s.output();
    assert_eq!(first.calls.len(), 1);
    assert_eq!(first.items[0]["parts"][2]["thoughtSignature"], "S");
    s.next_round();
    let answer = "data: {\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":[{\"text\":\" Done.\"}]},\"finishReason\":\"STOP\",\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":20,\"candidatesTokenCount\":2}}\n\n";
    out.extend(s.feed(answer.as_bytes()));
    let second = s.output();
    out.extend(s.finish(&[first, second]));
    let text = String::from_utf8(out).unwrap();
    assert!(!text.contains("sluice_read"), "{text}");
    let chunks: Vec<serde_json::Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let said: String = chunks
        .iter()
        .flat_map(|c| {
            c["candidates"][0]["content"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(said, "Let me read. Done.");
    let finished: Vec<_> = chunks
        .iter()
        .filter(|c| !c["candidates"][0]["finishReason"].is_null())
        .collect();
    assert_eq!(finished.len(), 1, "one finishing chunk: {text}");
    assert_eq!(finished[0]["usageMetadata"]["promptTokenCount"], 30);
}
