//! Unit and property tests of the Anthropic reader: one-pass blocks, and the walked and resumed
//! readings against the whole one.

use std::collections::HashMap;

use super::reading::{read, Found, Reading};
use super::*;
use crate::dialect::resume::{self, Resumes};
use crate::dialect::resume::{conversation_bodies, walk, walked_as_whole, Text as Checked, Trail};
use crate::dialect::span_in;
use crate::dialect::Dialect;
use crate::projection::Span;
use proptest::prelude::*;

/// A tool result as the tests compare it: its id, its tool's name, its content's span.
type Seen = (String, Option<String>, Span);

/// The reading before content blocks were read in one pass: each block read again whole.
fn reference(body: &str) -> (Vec<Seen>, Vec<Span>) {
    #[derive(Deserialize)]
    struct Msg<'a> {
        #[serde(borrow)]
        role: Text<'a>,
        #[serde(borrow)]
        content: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Req<'a> {
        #[serde(borrow, default)]
        messages: Vec<Msg<'a>>,
    }
    #[derive(Deserialize)]
    struct Old<'a> {
        #[serde(borrow, rename = "type")]
        kind: Text<'a>,
        #[serde(borrow)]
        id: Text<'a>,
        #[serde(borrow)]
        name: Text<'a>,
        #[serde(borrow)]
        tool_use_id: Text<'a>,
        #[serde(borrow)]
        content: Option<&'a RawValue>,
    }
    let req: Req = serde_json::from_str(body).unwrap();
    let (mut names, mut results, mut images) = (HashMap::new(), Vec::new(), Vec::new());
    for m in &req.messages {
        let blocks = m
            .content
            .and_then(super::super::elements)
            .unwrap_or_default();
        for raw in blocks {
            let Ok(b) = serde_json::from_str::<Old>(raw.get()) else {
                continue;
            };
            match (m.role.as_deref(), b.kind.as_deref()) {
                (Some("assistant"), Some("tool_use")) => {
                    if let (Some(id), Some(name)) = (b.id, b.name) {
                        names.insert(id.to_string(), name.to_string());
                    }
                }
                (Some("user"), Some("tool_result")) => {
                    if let (Some(id), Some(c)) = (b.tool_use_id, b.content) {
                        let name = names.get(&*id).cloned();
                        results.push((id.to_string(), name, span_in(body, c.get())));
                    }
                }
                (Some("user"), Some("image")) => images.push(span_in(body, raw.get())),
                _ => {}
            }
        }
    }
    (results, images)
}

fn block() -> impl Strategy<Value = String> {
    let ws = prop::sample::select(vec!["", " ", "\n  ", "\t"]);
    let text = prop::sample::select(vec![
        r#""plain""#,
        r#""esc\"aped\n""#,
        r#"[{"type":"text","text":"a"},{"type":"image","source":{"data":"QUJD"}}]"#,
        "null",
        "7",
    ]);
    let kind = prop::sample::select(vec![
        r#""tool_use""#,
        r#""tool_result""#,
        r#""image""#,
        r#""text""#,
        r#""tool_\u0072esult""#,
        "3",
    ]);
    let id = prop::sample::select(vec![r#""t1""#, r#""t2""#, r#""t\u0031""#, "null"]);
    (kind, id, text, ws, any::<u8>(), any::<bool>()).prop_map(
        |(kind, id, text, ws, order, twice)| {
            let mut fields = vec![
                format!(r#""type"{ws}:{ws}{kind}"#),
                format!(r#""id":{id}"#),
                format!(r#""name":"bash""#),
                format!(r#""tool_use_id"{ws}:{id}"#),
                format!(r#""content":{ws}{text}"#),
                format!(r#""source":{{"type":"base64","data":"QUJD"}}"#),
            ];
            let n = fields.len();
            fields.rotate_left(usize::from(order) % n);
            fields.truncate(3 + usize::from(order) % 4);
            if twice {
                fields.push(r#""content":"again""#.to_string());
            }
            format!("{{{ws}{}{ws}}}", fields.join(&format!(",{ws}")))
        },
    )
}

proptest! {
    #[test]
    fn one_pass_blocks_read_what_whole_blocks_read(
        messages in prop::collection::vec(
            (any::<bool>(), prop::collection::vec(block(), 0..5), any::<bool>()), 0..6)
    ) {
        let messages: Vec<String> = messages
            .into_iter()
            .map(|(user, blocks, odd)| {
                let role = if user { "user" } else { "assistant" };
                let content = if odd { "[1, \"x\", [2]]".to_string() } else {
                    format!("[ {} ]", blocks.join(" , "))
                };
                format!(r#"{{"role":"{role}","content":{content}}}"#)
            })
            .collect();
        let body = format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","));
        let view = read(&body).unwrap();
        let (results, images) = reference(&body);
        let seen: Vec<Seen> = view
            .tool_results
            .iter()
            .map(|r| (r.source.to_string(), r.tool_name.as_deref().map(str::to_string), r.span))
            .collect();
        prop_assert_eq!(seen, results);
        let seen: Vec<Span> = view.user_images.iter().map(|u| u.span).collect();
        prop_assert_eq!(seen, images);
    }
}

#[test]
fn message_content_of_any_shape_reads_and_roots_the_session() {
    let body = r#"{"model":"m","system":"be brief","messages":[
      {"role":"user","content":"line one\nline \"two\""},
      {"role":"assistant","content":{"odd":[1,{"type":"tool_use"}]}},
      {"role":"user","content":7},
      {"role":"user","content":null},
      {"role":"user","content":[true,{"type":"tool_result","tool_use_id":"x","content":"ok"}]}
    ]}"#;
    let view = read(body).unwrap();
    assert_eq!(view.root, ["\"be brief\"", "line one\nline \"two\""]);
    assert_eq!(view.tool_results.len(), 1);
    assert_eq!(view.tool_results[0].content.get(), r#""ok""#);
    let blocks = r#"{"messages":[{"role":"user","content":[ {"type":"text","text":"a"} ,{"type":"text","text":"b"}]}]}"#;
    let view = read(blocks).unwrap();
    assert_eq!(
        view.root,
        [
            r#"{"type":"text","text":"a"}"#,
            r#"{"type":"text","text":"b"}"#
        ]
    );
    // Bad JSON inside content is still bad JSON.
    assert!(read(r#"{"messages":[{"role":"user","content":[{"type":]}]}"#).is_err());
}

#[test]
fn reads_tool_result_blocks() {
    let body = r#"{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[
      {"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA"}}]},
      {"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"tool_use","id":"tu1","name":"read_file","input":{}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"tu1","content":"file text","cache_control":{"type":"ephemeral"}}]}
    ]}"#;
    let view = read(body).unwrap();
    let r = &view.tool_results[0];
    assert_eq!(r.tool_name.as_deref(), Some("read_file"));
    assert_eq!(&body[r.span.start..r.span.end], r#""file text""#);
    assert_eq!(view.user_images.len(), 1);
}

/// A body as the walk takes it.
fn checked(body: &str) -> Checked<'_> {
    Checked::of(body.as_bytes(), None).unwrap()
}

/// One message of a generated conversation: kind `k % 6`, numbered `n`.
fn message(k: u8, n: usize, cached: bool) -> String {
    let cache = if cached {
        r#","cache_control":{"type":"ephemeral"}"#
    } else {
        ""
    };
    let id = if k % 7 == 6 {
        format!(r#""t\u0031{n}""#)
    } else {
        format!(r#""t{n}""#)
    };
    match k % 6 {
        0 => format!(
            r#"{{"role":"user","content":"step {n}: \"quoted\"\n{}"}}"#,
            "log line\\n".repeat(300 + n)
        ),
        1 => format!(
            r#"{{"role":"assistant","content":[{{"type":"tool_use","id":{id},"name":"bash","input":{{}}{cache}}}]}}"#
        ),
        2 => format!(
            r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":{id},"content":[{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"QUJD{n}"}}}}]{cache}}}]}}"#
        ),
        3 => format!(
            r#"{{"role":"user","content":[ {{"type":"tool_result","tool_use_id":"t{}","content":"out {n}"{cache}}} ]}}"#,
            n.saturating_sub(1)
        ),
        4 => format!(
            r#"{{"role":"user","content":[{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"AA{n}"}}{cache}}}]}}"#
        ),
        _ => format!(r#"{{ "content" : [1, {{"x":[{n}]}}], "role" : "assistant" }}"#),
    }
}

/// A body around `messages`: some of the top-level fields before them, the rest after,
/// `odd` adding what a walk gives up on (the whole reading decides).
fn conversation(messages: &[String], before: usize, model: u8, odd: u8) -> String {
    let ws = ["", " ", "\n  "][usize::from(model) % 3];
    let mut fields = vec![
        format!(r#""model":{ws}"claude-{model}""#),
        r#""system":[{"type":"text","text":"be brief"}]"#.to_string(),
        r#""max_tokens":100"#.to_string(),
        r#""metadata":{"user_id":"u\"1"}"#.to_string(),
        r#""tools":[{"name":"bash"}]"#.to_string(),
        r#""stream":true"#.to_string(),
    ];
    match odd % 8 {
        0 => fields.push(r#""max_tokens":7"#.to_string()),
        1 => fields.push(r#""messages":[]"#.to_string()),
        2 => fields.push(r#""model":5"#.to_string()),
        3 => fields.push(r#""extra":[1,2,}"#.to_string()),
        _ => {}
    }
    let messages = format!(
        r#""messages":{ws}[{ws}{}{ws}]"#,
        messages.join(&format!(",{ws}"))
    );
    let at = before.min(fields.len());
    fields.insert(at, messages);
    let tail = if odd % 8 == 4 { " x" } else { "" };
    format!("{{{ws}{}{ws}}}{tail}", fields.join(","))
}

proptest! {
    /// The resumed view (runtime issue): walked from an earlier body's trail, or from the
    /// start, a body gives the view the whole reading gives, or the walk gives up.
    #[test]
    fn a_resumed_walk_reads_what_a_whole_reading_reads(
        steps in prop::collection::vec((0u8..8, any::<u8>(), any::<u8>()), 1..14),
        before in 0usize..7,
    ) {
        let bodies = conversation_bodies(&steps, (5, 5), message, |m, model, odd| {
            conversation(m, before, model, odd)
        });
        let walk = |t: &Checked<'_>, trail: Option<&Trail<Found>>| {
            walk::<Reading>(t, trail.and_then(|tr| Some((tr, tr.agreed(t)?))))
                .map(|(v, t, _)| (format!("{v:?}"), t))
        };
        let whole = |body: &str| read(body).ok().map(|v| format!("{v:?}"));
        prop_assert_eq!(walked_as_whole(&bodies, walk, whole), Ok(()));
    }
}

#[test]
fn a_longer_body_resumes_after_the_messages_it_shares() {
    // Kinds 1 to 4: messages that carry the cache marker when asked to.
    let messages: Vec<String> = (0..6)
        .map(|n| message(1 + n as u8 % 4, n, n == 5))
        .collect();
    let first = conversation(&messages[..5], 1, 0, 7);
    let (_, trail, from) = walk::<Reading>(&checked(&first), None).unwrap();
    assert_eq!(from, 0);
    assert_eq!(trail.marks.len(), 6, "after the [ and after each message");
    // The next turn: one more message, and the cache marker moved onto it (the fifth's
    // bytes are unchanged, so every mark agrees).
    let next = conversation(&messages, 1, 0, 7);
    let mark = trail.agreed(&checked(&next)).unwrap();
    assert_eq!(mark.messages, 5);
    let (view, again, from) = walk::<Reading>(&checked(&next), Some((&trail, mark))).unwrap();
    assert_eq!(from, mark.at);
    assert_eq!(format!("{view:?}"), format!("{:?}", read(&next).unwrap()));
    assert_eq!(again.marks.len(), 7);
    // A marker that moves off a message changes its bytes: the walk resumes before it.
    let mut moved = messages.clone();
    moved[5] = message(1 + 5 % 4, 5, false);
    moved.push(message(3, 6, true));
    let moved = conversation(&moved, 1, 0, 7);
    let mark = again.agreed(&checked(&moved)).unwrap();
    assert_eq!(mark.messages, 5);
    // Another conversation agrees with no mark.
    assert!(trail
        .agreed(&checked(&conversation(&messages, 0, 0, 7)))
        .is_none());
}

#[test]
fn conversations_that_start_alike_each_resume_from_their_own_trail() {
    let resumes = Resumes::default();
    // The same first message (more than the table's 16 KiB key), then each its own.
    let start = message(0, 1700, false);
    let turn = |who: usize, n: usize| -> String {
        let mut messages = vec![start.clone()];
        messages.extend((1..=n).map(|k| message(1 + (k + who) as u8 % 4, k * 10 + who, false)));
        conversation(&messages, 1, 0, 7)
    };
    let read_at = |body: &str| {
        let text = checked(body);
        let (view, at) =
            resume::read::<Reading>(Dialect::AnthropicMessages, &text, &resumes).unwrap();
        assert_eq!(format!("{view:?}"), format!("{:?}", read(body).unwrap()));
        at
    };
    assert!(start.len() > 16 * 1024);
    assert_eq!(read_at(&turn(0, 3)), 0);
    // The other conversation's trail serves as far as the two agree: the first message.
    let shared = read_at(&turn(1, 3));
    assert!(
        shared > start.len() && shared < start.len() + 100,
        "{shared}"
    );
    for n in 4..8 {
        for who in 0..2 {
            let body = turn(who, n);
            let at = read_at(&body);
            // Past its own earlier messages: its own trail was kept beside the other's.
            assert!(
                at > shared + 100,
                "conversation {who}, turn {n}: resumed at {at}"
            );
        }
    }
}
