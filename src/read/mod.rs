//! Continue through the gateway (SPEC section 6): the read tool sluice offers the model, answers
//! itself, and hides from the client.
//!
//! Here: the tool's definition and name, answering calls, and the links that splice hidden
//! rounds back into later requests (C3). What these look like in each provider's JSON (the
//! request edits, a round's output, the client's merged response, the stitched stream) is the
//! dialect layer's: `crate::dialect::wire` and `crate::dialect::stitch`.

use serde_json::{json, Value};

use crate::dialect::Dialect;
use crate::projection::attach::state::SessionState;
use crate::projection::exit::cursor::{Cursor, CursorError};
use crate::projection::{Edit, Span};
use crate::store::{ArtifactId, ArtifactKind};
use crate::tenant::Tenant;

use crate::dialect::wire::Wire;
pub use crate::dialect::wire::{Answer, Call, Layout, Media, Output};

const DESCRIPTION: &str = "Read on in a long tool result that was shortened, or see an image \
again. A shortened result's notice ends with a call hint such as {\"cursor\":\"...\"}: pass that \
cursor to get the next page; each page ends with the cursor of the page after it, until the end. \
An image no longer attached names its artifact: pass {\"url\":\"artifact://...\"} to see it again.";

/// The read tool's name for a request: the route's name, with a suffix if the client's own
/// tools already use it.
pub fn tool_name(base: &str, taken: &[String]) -> String {
    if !taken.iter().any(|t| t == base) {
        return base.to_string();
    }
    (2..)
        .map(|n| format!("{base}_{n}"))
        .find(|name| !taken.contains(name))
        .unwrap_or_else(|| base.to_string())
}

/// The tool's definition in the dialect's shape. Always the same bytes for the same name, so
/// tool definitions never change mid-session (prompt caches depend on it).
pub fn definition(dialect: Dialect, name: &str) -> String {
    let parameters = json!({
        "type": "object",
        "properties": {
            "cursor": {"type": "string", "description": "The cursor from a notice or from the previous page."},
            "url": {"type": "string", "description": "artifact://ID of an image shown earlier."}
        },
        "additionalProperties": false
    });
    let value = dialect.wire().tool(name, DESCRIPTION, parameters);
    value.to_string()
}

/// What a read call asks for: the page at a cursor, an image or audio file again (C5), or an
/// error the model can read.
pub enum Request {
    Page(Cursor),
    Media(ArtifactId),
    Invalid(String),
}

impl Request {
    /// The artifact a call reads, when it names one.
    pub fn artifact(&self) -> Option<ArtifactId> {
        match self {
            Request::Page(cursor) => Some(cursor.artifact),
            Request::Media(id) => Some(*id),
            Request::Invalid(_) => None,
        }
    }
}

impl Answer {
    /// The answer as later turns show it: media is shown once (C5), then its placeholder.
    pub fn once_shown(&self) -> Answer {
        let mut shown = self.clone();
        if let Some(media) = shown.media.take() {
            let (kind, done, again) = match media.audio_format() {
                Some(_) => ("audio", "played", "heard"),
                None => ("image", "shown", "read"),
            };
            shown.text = format!(
                "[sluice: {kind} artifact://{} was {done} here; it can be {again} again with {{\"url\":\"artifact://{}\"}}]",
                media.artifact, media.artifact
            );
        }
        shown
    }
}

/// Reads a read call's arguments against `tenant` (a cursor of another tenant is refused the
/// same way as a malformed one: the model learns nothing about other tenants' data).
pub fn parse_call(call: &Call, tenant: &Tenant) -> Request {
    if let Some(url) = call.arguments.get("url").and_then(Value::as_str) {
        let id = url
            .trim()
            .strip_prefix("artifact://")
            .and_then(ArtifactId::parse)
            .filter(|id| id.kind == ArtifactKind::Media);
        return match id {
            Some(id) => Request::Media(id),
            None => Request::Invalid(format!(
                "[sluice: {:?} is not the artifact://ID of an image or audio file; copy it exactly from its placeholder]",
                url.chars().take(120).collect::<String>()
            )),
        };
    }
    let Some(cursor) = call.arguments.get("cursor").and_then(Value::as_str) else {
        return Request::Invalid(
            "[sluice: pass {\"cursor\":\"...\"} copied from a notice or a page, or {\"url\":\"artifact://...\"} of an image]".to_string(),
        );
    };
    match Cursor::decode(cursor.trim(), tenant) {
        Ok(cursor) => Request::Page(cursor),
        Err(CursorError::Malformed | CursorError::Foreign) => Request::Invalid(format!(
            "[sluice: the cursor {:?} is not valid; copy it exactly from the notice]",
            cursor.chars().take(80).collect::<String>()
        )),
    }
}

/// What the client's history must show in place of the message(s) it received, so the model
/// sees the rounds it actually had (C3), and where that is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Fingerprint of the item before the received message(s) and of their visible content.
    pub fingerprint: u128,
    /// How many history items the client holds for what it received.
    pub items: usize,
    /// The artifact holding the replacement items and the blocks to put first in the next
    /// message (Anthropic mixed calls).
    pub artifact: ArtifactId,
}

impl Link {
    /// The artifact bytes: replacement items, NUL (never raw in JSON), next-message prefix.
    pub fn content(replacement: &str, next_prefix: &str) -> Vec<u8> {
        format!("{replacement}\0{next_prefix}").into_bytes()
    }

    pub fn artifact_for(tenant: &Tenant, content: &[u8]) -> ArtifactId {
        ArtifactId::for_content(tenant, ArtifactKind::Text, content)
    }

    /// How the session's delivery state stores the link: `<fingerprint>:<items>:<artifact>`.
    pub fn key(&self) -> String {
        format!("{:032x}:{}:{}", self.fingerprint, self.items, self.artifact)
    }

    /// The links a session holds.
    pub fn all(state: &SessionState) -> Vec<Link> {
        state
            .links
            .keys()
            .filter_map(|key| {
                let mut parts = key.splitn(3, ':');
                Some(Link {
                    fingerprint: u128::from_str_radix(parts.next()?, 16).ok()?,
                    items: parts.next()?.parse().ok().filter(|n| *n > 0)?,
                    artifact: ArtifactId::parse(parts.next()?)?,
                })
            })
            .collect()
    }
}

/// The fingerprint of `items` following `before` in a history: the hash of the item before in
/// the high half, of the items in the low half, so a history is searched by the (small) items
/// first and the item before (often a long tool result) is read only where they match.
pub fn fingerprint(wire: &dyn Wire, before: Option<&Value>, items: &[Value]) -> u128 {
    (u128::from(before_hash(wire, before)) << 64) | u128::from(items_hash(wire, items))
}

fn before_hash(wire: &dyn Wire, before: Option<&Value>) -> u64 {
    let mut text = String::new();
    if let Some(before) = before {
        wire.item_text(before, &mut text);
    }
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

fn items_hash(wire: &dyn Wire, items: &[Value]) -> u64 {
    let mut text = String::new();
    for item in items {
        wire.item_text(item, &mut text);
        text.push('\u{3}');
    }
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

/// Where a link's round goes back in a history: items `start..end` are what the client
/// received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    pub link: Link,
    pub start: usize,
    pub end: usize,
}

/// The places in `layout`'s history where the client shows what it received of a linked round
/// (C3). Only the model's items are parsed, each at most once, and the item before them only
/// where they match a link; no link's artifact is needed to find them.
pub fn matches(layout: &Layout<'_>, links: &[Link]) -> Vec<Match> {
    let wire = layout.wire();
    let Some((_, history)) = layout.history() else {
        return Vec::new();
    };
    let mut parsed: Vec<Option<Option<Value>>> = vec![None; history.len()];
    let mut parse = |i: usize| -> Option<Value> {
        parsed[i]
            .get_or_insert_with(|| serde_json::from_str(history[i].get()).ok())
            .clone()
    };
    let mut found = Vec::new();
    let mut taken_until = 0;
    for start in 0..history.len() {
        if start < taken_until || !wire.is_model_item(history[start]) {
            continue;
        }
        let mut before: Option<Option<u64>> = None;
        for link in links {
            let end = start + link.items;
            if end > history.len() {
                continue;
            }
            let Some(items) = (start..end).map(&mut parse).collect::<Option<Vec<Value>>>() else {
                continue;
            };
            if items_hash(wire, &items) != link.fingerprint as u64 {
                continue;
            }
            let before_hash = *before.get_or_insert_with(|| match start.checked_sub(1) {
                Some(i) => parse(i).map(|v| before_hash(wire, Some(&v))),
                None => Some(before_hash(wire, None)),
            });
            if before_hash != Some((link.fingerprint >> 64) as u64) {
                continue;
            }
            found.push(Match {
                link: link.clone(),
                start,
                end,
            });
            taken_until = end;
            break;
        }
    }
    found
}

/// The edits that put a matched round back: its stored items in place of what the client
/// received, and (where the dialect does so) the stored results first in the next message.
pub fn splice_edits(layout: &Layout<'_>, body: &str, m: &Match, content: &[u8]) -> Vec<Edit> {
    let Some((_, history)) = layout.history() else {
        return Vec::new();
    };
    let Some(zero) = content.iter().position(|b| *b == 0) else {
        return Vec::new();
    };
    let (Ok(replacement), Ok(prefix)) = (
        std::str::from_utf8(&content[..zero]),
        std::str::from_utf8(&content[zero + 1..]),
    ) else {
        return Vec::new();
    };
    let (Some(first), Some(last)) = (history.get(m.start), history.get(m.end.wrapping_sub(1)))
    else {
        return Vec::new();
    };
    let mut edits = vec![Edit {
        span: Span {
            start: crate::dialect::span_of(body, first).start,
            end: crate::dialect::span_of(body, last).end,
        },
        with: replacement.to_string().into(),
    }];
    if !prefix.is_empty() {
        edits.extend(
            history
                .get(m.end)
                .and_then(|next| layout.put_first(next, prefix)),
        );
    }
    edits
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_taken_name_gets_a_suffix() {
        assert_eq!(tool_name("sluice_read", &[]), "sluice_read");
        let taken = vec!["sluice_read".to_string(), "sluice_read_2".to_string()];
        assert_eq!(tool_name("sluice_read", &taken), "sluice_read_3");
    }

    #[test]
    fn fingerprints_ignore_serialisation_and_thinking_but_not_text() {
        let a = json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "x", "signature": "s"},
            {"type": "text", "text": "answer"}]});
        let b: Value = serde_json::from_str(
            r#"{ "content" : [ {"type":"text","text":"answer","citations":null} ], "role":"assistant" }"#,
        )
        .unwrap();
        let before = json!({"role": "user", "content": "q"});
        let wire = Dialect::AnthropicMessages.wire();
        assert_eq!(
            fingerprint(wire, Some(&before), std::slice::from_ref(&a)),
            fingerprint(wire, Some(&before), &[b])
        );
        let c = json!({"role": "assistant", "content": "answer!"});
        assert_ne!(
            fingerprint(wire, Some(&before), std::slice::from_ref(&a)),
            fingerprint(wire, Some(&before), &[c])
        );
    }

    #[test]
    fn links_round_trip_through_the_state() {
        let t = Tenant::from_credential(b"k");
        let content = Link::content("[1]", "");
        let link = Link {
            fingerprint: 0xabc,
            items: 2,
            artifact: Link::artifact_for(&t, &content),
        };
        let state = SessionState {
            links: BTreeMap::from([(link.key(), 1), ("not a link".to_string(), 2)]),
            ..SessionState::default()
        };
        assert_eq!(Link::all(&state), vec![link]);
    }
}
