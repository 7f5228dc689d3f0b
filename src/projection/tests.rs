//! Unit and property tests of the core's one function, `project`: splices, lifetimes, light
//! preparation, never-broken JSON.

use super::*;
use crate::config::RouteConfig;
use crate::dialect::Dialect;
use crate::memo::Memo;
use bytes::Bytes;
use proptest::prelude::*;

/// P2 at the seam: replacing a tool result's content through its view span changes those
/// bytes only; unknown fields, whitespace, key order and number formats survive.
#[test]
fn an_edited_request_changes_only_its_spliced_spans() {
    let cases = [
        (Dialect::OpenAiChat, "{ \"x_unknown\" : {\"n\": 1.50e3},\n \"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\",\"function\":{\"name\":\"ls\"}}]},\n\t{\"tool_call_id\":\"c1\", \"content\" :\"old\\nout\", \"role\":\"tool\"}], \"model\":\"m\", \"temperature\": 0.70 }"),
        (Dialect::OpenAiResponses, "{\"input\":[{\"output\":[{\"type\":\"input_text\",\"text\":\"old\"}],  \"type\":\"function_call_output\",\"call_id\":\"f\"}],\"model\":\"m\",\"z\":-0.0}"),
        (Dialect::AnthropicMessages, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"cache_control\":{\"type\":\"ephemeral\"},\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":\"old\"}]}],  \"max_tokens\":1e2}"),
        (Dialect::GeminiGenerate, "{\"contents\":[{\"role\":\"user\",\"parts\":[{\"functionResponse\" : {\"name\":\"ls\",\"response\":{\"output\":\"old\"}}}]}],\"generationConfig\":{\"temperature\":0.70}}"),
    ];
    for (dialect, body) in cases {
        let body = Bytes::from(body);
        let view = dialect.read_view(&body).unwrap();
        let span = view.tool_results[0].span;
        drop(view);
        let out = splice(
            &body,
            vec![Edit {
                span,
                with: Bytes::from_static(b"\"new\"").into(),
            }],
        )
        .unwrap();
        assert_eq!(
            &out[..span.start],
            &body[..span.start],
            "{dialect:?}: prefix untouched"
        );
        assert_eq!(
            &out[span.start + 5..],
            &body[span.end..],
            "{dialect:?}: suffix untouched"
        );
        let mut before: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let after: serde_json::Value = serde_json::from_slice(&out).unwrap();
        // The only semantic change is the replaced content.
        let pointer = match dialect {
            Dialect::OpenAiChat => "/messages/1/content",
            Dialect::OpenAiResponses => "/input/0/output",
            Dialect::AnthropicMessages => "/messages/0/content/0/content",
            Dialect::GeminiGenerate => "/contents/0/parts/0/functionResponse",
        };
        *before.pointer_mut(pointer).unwrap() = serde_json::json!("new");
        assert_eq!(before, after, "{dialect:?}");
    }
}

/// M5: the hint on the item, else the tool's glob, else the route default.
#[test]
fn each_image_gets_its_lifetime() {
    use base64::Engine;
    let png = crate::image::tests::encode(
        &crate::image::tests::picture(4, 4),
        ::image::ImageFormat::Png,
    );
    let data = base64::engine::general_purpose::STANDARD.encode(&png);
    let mcp = |meta: serde_json::Value| {
        serde_json::json!({"content": [{"type": "image", "data": data, "mimeType": "image/png", "_meta": meta}]}).to_string()
    };
    let body = serde_json::json!({"model": "m", "messages": [
        {"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "take_screenshot", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "render", "arguments": "{}"}},
            {"id": "c", "type": "function", "function": {"name": "take_screenshot", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": mcp(serde_json::json!({}))},
        {"role": "tool", "tool_call_id": "b", "content": mcp(serde_json::json!({}))},
        {"role": "tool", "tool_call_id": "c", "content": mcp(serde_json::json!({"sluice/lifetime": "retain"}))}
    ]})
    .to_string();
    let view = Dialect::OpenAiChat.read_view(body.as_bytes()).unwrap();
    let tenant = Tenant::from_credential(b"k");
    let route = RouteConfig::default();
    let memo = Memo::default();
    let p = project(
        &view,
        &Context {
            tenant: &tenant,
            policy: route.policy(&route.read_tool),
            memo: &memo,
            state: &SessionState::default(),
            now_ms: 0,
        },
    );
    // The delivery state records each image under its source (`<source>#<k>#<content>`).
    let lifetimes: Vec<_> = p
        .delta
        .records
        .iter()
        .map(|(key, r)| (key.split('#').next().unwrap_or(""), r.lifetime))
        .collect();
    assert_eq!(
        lifetimes,
        [
            ("a", Lifetime::Recent),
            ("b", Lifetime::Once),
            ("c", Lifetime::Retain)
        ]
    );
    assert!(
        !String::from_utf8_lossy(&splice(&Bytes::from(body.clone()), p.edits).unwrap())
            .contains("sluice/lifetime"),
        "hint stripped"
    );
}

#[test]
fn only_requests_without_images_are_prepared_cheaply() {
    let tenant = Tenant::from_credential(b"k");
    let memo = Memo::default();
    let chat = |content: serde_json::Value| {
        serde_json::json!({"model": "m", "messages": [
            {"role": "tool", "tool_call_id": "a", "content": content}]})
        .to_string()
    };
    let text = chat(serde_json::json!("plain output"));
    let view = Dialect::OpenAiChat.read_view(text.as_bytes()).unwrap();
    let light = Prepared::without_images(&view, &tenant, &memo).unwrap();
    assert!(!light.has_images());
    // Remembered now: the next turn costs a lookup, no search.
    assert!(matches!(
        memo.known_tool_images(view.shapes, &view.tool_results[0], &tenant),
        Some(None)
    ));
    let png = crate::image::tests::encode(
        &crate::image::tests::picture(4, 4),
        ::image::ImageFormat::Png,
    );
    use base64::Engine;
    let data = base64::engine::general_purpose::STANDARD.encode(&png);
    let image = chat(
        serde_json::json!([{"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}")}}]),
    );
    let view = Dialect::OpenAiChat.read_view(image.as_bytes()).unwrap();
    assert!(Prepared::without_images(&view, &tenant, &memo).is_none());
    assert!(Prepared::new(&view, &tenant, &memo).has_images());
    assert!(
        Prepared::without_images(&view, &tenant, &memo).is_none(),
        "known to hold images"
    );
}

/// A 4×4 PNG's base64.
fn tiny_png_b64() -> String {
    use base64::Engine;
    let png = crate::image::tests::encode(
        &crate::image::tests::picture(4, 4),
        ::image::ImageFormat::Png,
    );
    base64::engine::general_purpose::STANDARD.encode(&png)
}

/// A build log of about 45 KB (~11k tokens).
fn long_log() -> String {
    (0..1500)
        .map(|i| format!("line {i}: ok, nothing to see\n"))
        .collect()
}

/// docs/cache.md, anchors: a breakpoint goes on a tool result only when what it would cache
/// reaches the model's minimum in the *forwarded* request; a long log spilled before it no
/// longer counts.
#[test]
fn an_anchor_is_placed_only_above_the_minimum_of_what_is_forwarded() {
    use serde_json::json;
    let (data, log) = (tiny_png_b64(), long_log());
    // claude-opus-4-5 writes no entry below 4,096 tokens; the log is ~45 KB (~11k tokens).
    let body = json!({"model": "claude-opus-4-5", "max_tokens": 10, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "build", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": log}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "b", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}]}]})
    .to_string();
    let body = Bytes::from(body);
    let tenant = Tenant::from_credential(b"k");
    let memo = Memo::default();
    let markers = |max_units: usize| {
        let mut route = RouteConfig::default();
        route.exit.max_units = max_units;
        let view = Dialect::AnthropicMessages.read_view(&body).unwrap();
        let ctx = Context {
            tenant: &tenant,
            policy: route.policy(&route.read_tool),
            memo: &memo,
            state: &SessionState::default(),
            now_ms: 0,
        };
        let out = splice(&body, project(&view, &ctx).edits).unwrap();
        memchr::memmem::find_iter(&out, b"\"cache_control\"").count()
    };
    // The log forwarded whole: an anchor after it, and the top-level marker.
    assert_eq!(markers(crate::config::DEFAULT_MAX_UNITS * 4), 2);
    // The log spilled to a 1,024-unit page: too short to cache, no anchor; the request as a
    // whole is too short as well.
    assert_eq!(markers(1024), 0);
}

/// docs/cache.md, anchors: the client's breakpoints are counted in the request as forwarded,
/// without reading the base64 of the tool results sluice writes again, yet one on an image part
/// inside such a result counts (its other fields are kept): with three more, no anchor is added
/// past the four; with two, one is. A 1-hour one there stops the anchor, as anywhere.
#[test]
fn client_markers_inside_rewritten_results_count_toward_the_four() {
    use serde_json::json;
    let (data, log) = (tiny_png_b64(), long_log());
    let tenant = Tenant::from_credential(b"k");
    let memo = Memo::default();
    let forwarded = |system_marks: usize, ttl: &str| {
        let mut cc = json!({"type": "ephemeral"});
        if !ttl.is_empty() {
            cc["ttl"] = json!(ttl);
        }
        let system: Vec<serde_json::Value> = (0..3)
            .map(|i| match i < system_marks {
                true => json!({"type": "text", "text": format!("rule {i}"), "cache_control": cc}),
                false => json!({"type": "text", "text": format!("rule {i}")}),
            })
            .collect();
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 10, "system": system,
            "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "build", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": log}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "b", "name": "shot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data},
                 "cache_control": cc}]}]}]})
        .to_string();
        let body = Bytes::from(body);
        let route = RouteConfig::default();
        let view = Dialect::AnthropicMessages.read_view(&body).unwrap();
        let ctx = Context {
            tenant: &tenant,
            policy: route.policy(&route.read_tool),
            memo: &memo,
            state: &SessionState::default(),
            now_ms: 0,
        };
        let out = splice(&body, project(&view, &ctx).edits).unwrap();
        let text = String::from_utf8(out.to_vec()).unwrap();
        let marks = memchr::memmem::find_iter(text.as_bytes(), b"\"cache_control\"").count();
        let sent: serde_json::Value = serde_json::from_str(&text).unwrap();
        let anchored = sent
            .pointer("/messages/2/content/0/cache_control")
            .is_some();
        (marks, anchored)
    };
    assert_eq!(
        forwarded(2, ""),
        (4, true),
        "two in system, one on the image: an anchor"
    );
    assert_eq!(forwarded(3, ""), (4, false), "four already: none added");
    assert_eq!(
        forwarded(2, "1h"),
        (3, false),
        "1-hour entries asked for: none added"
    );
}

/// A short WAV's base64.
fn wav_b64() -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(crate::audio::tests::wav(20))
}

/// Arbitrary JSON values, biased towards the shapes projection looks at.
fn arb_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::json;
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "(\\PC|\\n|data:image/png;base64,|iVBORw0KGgo=|image|\"){0,40}"
            .prop_map(serde_json::Value::from),
        Just(json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"})),
        Just(json!({"type": "text", "text": "x".repeat(50)})),
        Just(
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}})
        ),
        Just(json!({"type": "input_image", "image_url": "data:image/gif;base64,R0lGODlh"})),
        Just(json!({"type": "audio", "data": wav_b64(), "mimeType": "audio/wav"})),
        Just(json!({"type": "audio", "data": "SUQzBAAAAAAA", "mimeType": "audio/mpeg"})),
        Just(serde_json::Value::from(format!(
            "data:audio/wav;base64,{}",
            wav_b64()
        ))),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::vec(
                ("(type|content|text|data|role|image_url|output)", inner),
                0..4
            )
            .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// S5, P2: whatever a client sends, projection never panics, and a JSON request stays
    /// JSON after its edits are spliced in; with no edits it is unchanged (P1).
    #[test]
    fn projection_never_breaks_json(content in arb_value(), user in arb_value(), small in any::<bool>()) {
        use serde_json::json;
        let mut route = RouteConfig::default();
        if small {
            route.exit.max_lines = 3;
            route.exit.max_units = 1024;
            route.images.max_images = 1;
            route.audio.max_audio = 1;
            route.input_modalities.push(crate::config::Modality::Audio);
        }
        let tenant = Tenant::from_credential(b"k");
        let memo = Memo::default();
        let bodies = [
            (Dialect::OpenAiChat, json!({"model": "m", "messages": [
                {"role": "user", "content": user.clone()},
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": content.clone()},
                {"role": "tool", "tool_call_id": "d", "content": content.to_string()}]})),
            (Dialect::OpenAiResponses, json!({"model": "m", "input": [
                {"role": "user", "content": user.clone()},
                {"type": "function_call_output", "call_id": "c", "output": content.clone()},
                {"type": "function_call_output", "call_id": "d", "output": content.to_string()}]})),
            (Dialect::AnthropicMessages, json!({"model": "m", "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": content.clone()},
                                             {"type": "tool_result", "tool_use_id": "d", "content": content.to_string()}]},
                {"role": "user", "content": user.clone()}]})),
        ];
        for (dialect, body) in bodies {
            let body = Bytes::from(body.to_string());
            let view = dialect.read_view(&body).unwrap();
            let p = project(&view, &Context { tenant: &tenant, policy: route.policy(&route.read_tool), memo: &memo, state: &SessionState::default(), now_ms: 0 });
            let unchanged = p.edits.is_empty();
            let out = splice(&body, p.edits).unwrap();
            prop_assert!(serde_json::from_slice::<serde_json::Value>(&out).is_ok(), "{dialect:?}: {}", String::from_utf8_lossy(&out));
            if unchanged {
                prop_assert_eq!(&out, &body);
            }
        }
    }
}
