//! Unit tests of the media stage: extraction, checks, selection under budgets, notes.

use super::extract;
use super::*;
use crate::dialect::Dialect;
use crate::image::tests::{encode, picture};
use crate::tenant::Tenant;
use ::image::ImageFormat;
use serde_json::json;

fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

fn png(w: u32, h: u32) -> String {
    b64(&encode(&picture(w, h), ImageFormat::Png))
}

fn raw(v: &serde_json::Value) -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(v.to_string()).unwrap()
}

/// [`extract::from_result`] of a value as the view would hand it over.
fn tool_result(content: &serde_json::value::RawValue, t: &Tenant) -> Option<extract::Extracted> {
    extract::from_result(Dialect::AnthropicMessages.shapes(), content.into(), t)
}

/// [`extract::user_part`] of a value as the view would hand it over.
fn user_part(part: &serde_json::value::RawValue, k: usize, t: &Tenant) -> Option<Item> {
    extract::user_part(Dialect::AnthropicMessages.shapes(), part.into(), k, t)
}

fn limits() -> Limits {
    Limits::new(&crate::config::ImagesConfig::default(), true, true)
}

#[test]
fn finds_mcp_items_resources_and_data_urls_in_tool_text_m1() {
    let t = Tenant::from_credential(b"k");
    let mcp = json!({"content": [
        {"type": "text", "text": "before"},
        {"type": "image", "data": png(20, 10), "mimeType": "image/png", "_meta": {"sluice/lifetime": "retain"}},
        {"type": "resource", "resource": {"uri": "file:///x.png", "mimeType": "image/jpeg", "blob": png(8, 8)}}
    ], "isError": false});
    let text = format!("result: {mcp}");
    // Nested in a larger JSON text, and as a data URL in plain text.
    let nested = json!({"tool": "shot", "result": mcp}).to_string();
    for content in [
        json!(nested),
        json!(format!("see data:image/png;base64,{} there", png(4, 4))),
    ] {
        let out = tool_result(&raw(&content), &t).unwrap();
        assert!(!out.text.contains("base64,") && !out.text.contains(&png(8, 8)));
        assert!(out.text.contains("[image #1: image/png"), "{}", out.text);
    }
    let out = tool_result(&raw(&json!(nested)), &t).unwrap();
    assert_eq!(out.items.len(), 2);
    assert_eq!(
        out.items[0].lifetime,
        Some(Lifetime::Retain),
        "M5 hint read"
    );
    assert!(!out.text.contains("_meta"), "M5 hint stripped");
    let Media::Image(second) = &out.items[1].media else {
        panic!()
    };
    assert!(second.relabelled, "labelled jpeg, bytes are png");
    // Text that merely mentions images is left alone.
    assert!(tool_result(
        &raw(&json!(text
            .replace("\"image\"", "\"picture\"")
            .replace("blob", "blub")
            .replace("data:image", "data:img"))),
        &t
    )
    .is_none());
}

#[test]
fn finds_native_image_parts_and_keeps_other_parts() {
    let t = Tenant::from_credential(b"k");
    let anthropic = json!([
        {"type": "text", "text": "shot:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png(30, 20)}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}, "cache_control": {"type": "ephemeral"}}
    ]);
    let out = tool_result(&raw(&anthropic), &t).unwrap();
    assert_eq!(out.items.len(), 2);
    assert!(matches!(out.items[1].media, Media::Remote(_)));
    assert_eq!(out.others.len(), 1);
    assert_eq!(
        out.breakpoint, None,
        "the kept last part carries its own marker"
    );
    assert!(out.others[0].contains("cache_control"));
    assert!(out.text.starts_with("shot:\n[image #1: image/png 30×20, "));
    let responses = json!([{"type": "input_image", "image_url": format!("data:image/png;base64,{}", png(5, 5))}]);
    let out = tool_result(&raw(&responses), &t).unwrap();
    assert_eq!(out.items.len(), 1);
}

#[test]
fn bad_images_become_refusals_not_failures_a6() {
    let t = Tenant::from_credential(b"k");
    let content = json!({"content": [
        {"type": "image", "data": "not base64!", "mimeType": "image/png"},
        {"type": "image", "data": b64(b"GIF89a but truncated"), "mimeType": "image/gif"},
        {"type": "image", "data": b64(b"%PDF-1.4"), "mimeType": "image/png"},
        {"type": "image", "data": "", "mimeType": "image/png"}
    ]})
    .to_string();
    let out = tool_result(&raw(&json!(content)), &t).unwrap();
    let reasons: Vec<_> = out
        .items
        .iter()
        .map(|i| match &i.media {
            Media::Refused(r) => r.reason(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        reasons,
        ["invalid_base64", "damaged", "unsupported_type", "empty"]
    );
    assert!(out
        .text
        .contains("[image #1: not shown: the image data is not valid base64]"));
}

#[test]
fn user_parts_of_each_dialect() {
    let t = Tenant::from_credential(b"k");
    let chat = json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", png(3, 3)), "detail": "low"}});
    let item = user_part(&raw(&chat), 2, &t).unwrap();
    assert_eq!(item.k, 2);
    assert!(matches!(item.media, Media::Image(_)));
    let remote = json!({"type": "image_url", "image_url": {"url": "https://x/y.png"}});
    assert!(matches!(
        user_part(&raw(&remote), 1, &t).unwrap().media,
        Media::Remote(_)
    ));
    let anthropic = json!({"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": png(3, 3)}});
    let Media::Image(i) = user_part(&raw(&anthropic), 1, &t).unwrap().media else {
        panic!()
    };
    assert!(i.relabelled);
}

fn image_item(k: usize, w: u32, h: u32) -> Item {
    let bytes = encode(&picture(w, h), ImageFormat::Png);
    Item {
        k,
        media: Media::Image(crate::image::check(bytes, Some("image/png")).unwrap()),
        id: None,
        lifetime: None,
        base64: None,
        extras: None,
    }
}

fn no_shrink(_: &Checked, _: u32, _: u64) -> Result<Checked, Refusal> {
    Err(Refusal::Damaged)
}

#[test]
fn budgets_take_images_in_arrival_order_and_defer_the_rest_a5() {
    let items: Vec<Item> = (1..=5).map(|k| image_item(k, 10, 10)).collect();
    let refs: Vec<&Item> = items.iter().collect();
    let mut l = limits();
    l.max_images = 3;
    let out = select(&refs, &l, &no_shrink);
    let kinds: Vec<_> = out.iter().map(|o| matches!(o, Outcome::Embed(_))).collect();
    assert_eq!(kinds, [true, true, true, false, false]);
    assert_eq!(out[4], Outcome::Deferred);
    // A byte budget: an image that does not fit waits, a later smaller one may still go.
    let big = image_item(1, 200, 200);
    let small = image_item(2, 4, 4);
    let Media::Image(b) = &big.media else {
        panic!()
    };
    l.max_images = 10;
    l.max_total_bytes = b.base64_len() + 10;
    let first = image_item(0, 60, 60);
    let out = select(&[&first, &big, &small], &l, &no_shrink);
    assert!(matches!(out[0], Outcome::Embed(_)));
    assert_eq!(out[1], Outcome::Deferred);
    assert!(matches!(out[2], Outcome::Embed(_)));
}

#[test]
fn per_image_limits_refuse_or_downscale_a6() {
    let item = image_item(1, 300, 100);
    let mut l = limits();
    l.max_dimension = 150;
    let out = select(&[&item], &l, &no_shrink);
    assert!(matches!(
        out[0],
        Outcome::Refused(Refusal::TooManyPixels { .. })
    ));
    l.downscale = true;
    let out = select(&[&item], &l, &shrink);
    let Outcome::Embed(e) = &out[0] else {
        panic!("{out:?}")
    };
    assert!(e.downscaled);
    let bytes = STANDARD.decode(e.base64.as_bytes()).unwrap();
    let back = crate::image::check(bytes.into(), Some(e.mime)).unwrap();
    assert_eq!((back.width, back.height), (150, 50));
}

#[test]
fn the_gate_turns_every_image_into_a_placeholder_a1() {
    let items = [
        image_item(1, 10, 10),
        Item {
            k: 2,
            media: Media::Remote("https://x".into()),
            id: None,
            lifetime: None,
            base64: None,
            extras: None,
        },
    ];
    let mut l = limits();
    l.accepts_images = false;
    let out = select(&[&items[0], &items[1]], &l, &no_shrink);
    assert_eq!(out, [Outcome::Gated, Outcome::Gated]);
    assert!(note(&items[0], &out[0])
        .unwrap()
        .contains("no visual content was provided"));
}

#[test]
fn more_than_twenty_large_images_for_anthropic_keep_twenty() {
    let items: Vec<Item> = (1..=22)
        .map(|k| image_item(k, if k == 3 { 2100 } else { 8 }, 8))
        .collect();
    let refs: Vec<&Item> = items.iter().collect();
    let mut l = limits();
    l.max_images = 100;
    let out = select(&refs, &l, &no_shrink);
    let shown = out
        .iter()
        .filter(|o| matches!(o, Outcome::Embed(_)))
        .count();
    assert_eq!(shown, 20);
    assert_eq!(out[21], Outcome::Deferred);
    l.anthropic = false;
    let out = select(&refs, &l, &no_shrink);
    assert_eq!(
        out.iter()
            .filter(|o| matches!(o, Outcome::Embed(_)))
            .count(),
        22
    );
}

#[test]
fn finds_audio_items_resources_and_data_urls_and_takes_their_base64_out() {
    let t = Tenant::from_credential(b"k");
    let clip = b64(&crate::audio::tests::wav(500));
    let mcp = json!({"content": [
        {"type": "text", "text": "said:"},
        {"type": "audio", "data": clip, "mimeType": "audio/wav"},
        {"type": "resource", "resource": {"uri": "file:///a.mp3", "mimeType": "audio/mpeg", "blob": clip}}
    ]});
    let url = format!("listen: data:audio/wav;base64,{clip} done");
    for (content, sounds) in [(json!(mcp.to_string()), 2), (json!(url), 1)] {
        let out = tool_result(&raw(&content), &t).unwrap();
        assert!(out.items.is_empty());
        assert_eq!(out.audio.len(), sounds);
        assert!(!out.text.contains(&clip[..100]), "{}", out.text);
        let first = &out.audio[0];
        assert!(first.checked.is_ok() && first.id.is_some());
        assert!(out.text.contains(&first.reference()));
        assert!(first
            .reference()
            .starts_with("[audio #1: WAV 0.5 s, 8 KB, artifact://"));
    }
    // The resource is labelled MP3 but is a WAV: refused, with a note, nothing to store.
    let out = tool_result(&raw(&json!(mcp.to_string())), &t).unwrap();
    assert_eq!(out.audio[1].id, None);
    assert!(out.audio[1]
        .reference()
        .contains("labelled audio/mpeg but is WAV"));
}
