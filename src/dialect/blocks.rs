//! A request body's blocks in its provider's cache order, with the breakpoints it marks
//! (Anthropic `cache_control`, on a block or top-level): what the inspector's prefix chains
//! hash and count (`crate::inspect::chain`), read here so that no other layer names a
//! provider's fields.

use serde_json::value::RawValue;

use super::Dialect;
use crate::projection::cache::Ttl;

#[derive(serde::Deserialize)]
struct Parts<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    system: Option<&'a RawValue>,
    #[serde(borrow)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Option<&'a RawValue>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    #[serde(borrow)]
    contents: Option<&'a RawValue>,
    #[serde(borrow, rename = "systemInstruction", alias = "system_instruction")]
    system_instruction: Option<&'a RawValue>,
    #[serde(borrow)]
    cache_control: Option<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Option<&'a RawValue>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct Marked<'a> {
    #[serde(borrow)]
    cache_control: Option<&'a RawValue>,
}

/// One block of a body in cache order: the text it hashes and counts, what it adds to the hash before its
/// text (a message's role, at its first block), and whether it marks a breakpoint.
pub struct Segment<'a> {
    pub text: &'a str,
    pub head: &'a str,
    pub mark: Option<Ttl>,
}

/// The breakpoint a `cache_control` value asks for.
fn ttl_of(value: &RawValue) -> Option<Ttl> {
    #[derive(serde::Deserialize)]
    struct Control<'a> {
        #[serde(borrow)]
        ttl: Option<&'a str>,
    }
    let c: Control = serde_json::from_str(value.get()).ok()?;
    Some(match c.ttl {
        Some("1h") => Ttl::Long,
        _ => Ttl::Short,
    })
}

/// The breakpoint a block marks.
fn mark_of(block: &str) -> Option<Ttl> {
    if !block.contains("\"cache_control\"") {
        return None;
    }
    serde_json::from_str::<Marked>(block)
        .ok()?
        .cache_control
        .and_then(ttl_of)
}

/// A list's items, or the value itself as one item when it is no list.
fn items(value: &RawValue) -> Vec<&RawValue> {
    serde_json::from_str::<Vec<&RawValue>>(value.get()).unwrap_or_else(|_| vec![value])
}

/// A body's blocks in cache order (Anthropic: tools, system blocks, each message's content
/// blocks; OpenAI: tools, the system prompt, each message or input item), and its model.
/// `None` when it is not a JSON object.
pub fn segments(dialect: Dialect, body: &[u8]) -> Option<(Vec<Segment<'_>>, Option<&str>)> {
    let p: Parts = serde_json::from_slice(body).ok()?;
    fn whole(v: &RawValue) -> Segment<'_> {
        Segment {
            text: v.get(),
            head: "",
            mark: None,
        }
    }
    let mut out = Vec::new();
    if dialect != Dialect::AnthropicMessages {
        out.extend(p.tools.map(whole));
        out.extend(
            p.system
                .or(p.instructions)
                .or(p.system_instruction)
                .map(whole),
        );
        for list in [p.messages, p.input, p.contents].into_iter().flatten() {
            out.extend(items(list).into_iter().map(whole));
        }
        return Some((out, p.model.map(RawValue::get)));
    }
    fn block(v: &RawValue) -> Segment<'_> {
        Segment {
            text: v.get(),
            head: "",
            mark: mark_of(v.get()),
        }
    }
    for list in [p.tools, p.system].into_iter().flatten() {
        out.extend(items(list).into_iter().map(block));
    }
    for message in p.messages.map(items).unwrap_or_default() {
        let Ok(m) = serde_json::from_str::<Message>(message.get()) else {
            out.push(whole(message));
            continue;
        };
        let role = m.role.map_or("", RawValue::get);
        let first = out.len();
        match m.content {
            Some(c) if c.get().starts_with('[') => out.extend(items(c).into_iter().map(block)),
            Some(c) => out.push(whole(c)),
            None => out.push(whole(message)),
        }
        if let Some(piece) = out.get_mut(first) {
            piece.head = role;
        }
    }
    // A top-level marker marks the last block.
    if let Some(ttl) = p.cache_control.and_then(ttl_of) {
        if let Some(last) = out.last_mut() {
            last.mark = Some(last.mark.map_or(ttl, |t| t.max(ttl)));
        }
    }
    Some((out, p.model.map(RawValue::get)))
}

/// A part as a provider's cache sees it: a `cache_control` marker says where to cache, it is
/// not content (Claude Code moves its breakpoint to the newest message every turn and still
/// reads the rest from the cache). A marker written as one compact member (as sluice's anchor
/// and the SDKs write it) is cut from the text, so the part hashes as the same part sent
/// unmarked, byte for byte; any other is dropped from a re-serialisation.
pub fn without_breakpoints(part: &str) -> std::borrow::Cow<'_, str> {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("cache_control");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    const MARKERS: [&str; 3] = [
        r#""cache_control":{"type":"ephemeral"}"#,
        r#""cache_control":{"type":"ephemeral","ttl":"5m"}"#,
        r#""cache_control":{"type":"ephemeral","ttl":"1h"}"#,
    ];
    if !part.contains("\"cache_control\"") {
        return std::borrow::Cow::Borrowed(part);
    }
    let mut cut = part.to_string();
    for marker in MARKERS {
        cut = cut
            .replace(&format!(",{marker}"), "")
            .replace(&format!("{marker},"), "");
    }
    if !cut.contains("\"cache_control\"") {
        return std::borrow::Cow::Owned(cut);
    }
    match serde_json::from_str::<serde_json::Value>(part) {
        Ok(mut v) => {
            strip(&mut v);
            std::borrow::Cow::Owned(v.to_string())
        }
        Err(_) => std::borrow::Cow::Borrowed(part),
    }
}
