//! One turn's record (docs/inspector.md): what the agent sent and what the model got, as
//! sizes, fates and artifact ids, never the bodies themselves. A [`Draft`] is filled on the
//! request path from what the stages already know (cheap clones); the inspector's thread turns
//! it into a [`Turn`] after the response ended.

use std::time::Instant;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub use crate::dialect::usage::Usage;
use crate::store::session::SessionKey;
use crate::tenant::Tenant;
use crate::tokens::Tokenizer;

/// At most this many tool results are listed per turn (the rest are counted).
pub const MAX_LISTED_RESULTS: usize = 512;
/// At most this many images and reads are listed per turn.
pub const MAX_LISTED_MEDIA: usize = 256;

/// One turn, as stored and served.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Turn {
    /// Milliseconds since the epoch when the request arrived.
    pub at_ms: u64,
    pub request_id: String,
    pub dialect: String,
    pub route: String,
    pub model: String,
    /// The response was an event stream.
    pub stream: bool,
    /// The upstream's status; 0 when no response came.
    pub status: u16,
    /// The response completed and reached the client (A9).
    pub complete: bool,
    /// `x-sluice-projection` as sent.
    pub projection: String,
    pub ms: Durations,
    pub received: Size,
    pub forwarded: Size,
    /// Estimated input tokens that repeat the previous request's prefix (what a provider's
    /// prompt cache can serve), for what the agent sent and what sluice forwarded.
    pub prefix: Prefix,
    /// Cache-weighted input cost, in uncached input tokens (docs/inspector.md).
    pub cost: Cost,
    /// What the provider bills, by kind, for what the agent sent and what sluice forwarded
    /// (the exact cache model, `projection::cache`).
    pub bill: Bills,
    /// Where the forwarded request's cache broke, and why.
    pub cache_break: Option<Break>,
    /// Tool results in history order, with their fate.
    pub results: Vec<ResultFate>,
    /// Results left off the list past [`MAX_LISTED_RESULTS`].
    pub results_unlisted: usize,
    pub images: Vec<ImageFate>,
    /// Audio items in tool results (docs/audio.md), with their fate.
    pub audio: Vec<AudioFate>,
    /// Read-tool calls sluice answered within this request (C2).
    pub reads: Vec<ReadFate>,
    /// Rounds hidden on earlier turns, spliced back into this request (C3).
    pub hidden_rounds: usize,
    /// The read tool was offered to the model.
    pub read_tool: bool,
    pub context: Option<ContextFate>,
    /// What the provider reported.
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Durations {
    /// sluice's own time before the request was sent.
    pub sluice: f64,
    /// From sending upstream to its response head.
    pub upstream: f64,
    /// From arrival to the end of the response.
    pub total: f64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Size {
    pub bytes: u64,
    pub tokens: u64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Prefix {
    pub received_tokens: u64,
    pub forwarded_tokens: u64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Cost {
    pub received: f64,
    pub forwarded: f64,
}

/// A request's bill on each side.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Bills {
    pub received: crate::projection::cache::Bill,
    pub forwarded: crate::projection::cache::Bill,
}

/// The forwarded request found less of its history in the cache than the previous request
/// left there.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Break {
    /// `ttl`: the previous request was longer ago than the cache keeps an entry; `client`: the
    /// agent changed its own history there; `sluice`: sluice changed what it had forwarded (an
    /// image pruned, a result retired, a tool added).
    pub cause: String,
    /// The first block (in cache order) that differs from the previous request.
    pub block: u64,
    /// Tokens written to the cache again that the previous request had cached.
    pub rewritten: u64,
}

/// What happened to one tool result.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ResultFate {
    /// The call id the result answers.
    pub source: String,
    pub tool: Option<String>,
    /// `untouched`, `spilled` (a page and its notice), `retired` (one line, by the context
    /// guard) or `media` (its images taken out, its text kept).
    pub fate: String,
    /// The result as the agent sent it and as the model got it (JSON bytes).
    pub bytes: u64,
    pub shown_bytes: u64,
    /// The artifact holding its whole text.
    pub artifact: Option<String>,
    /// The notice (or retirement) line the model read at its end.
    pub notice: Option<String>,
    /// Lines of the artifact shown as the page.
    pub shown_lines: Option<u64>,
}

/// What happened to one image.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct ImageFate {
    /// `embedded`, `deferred`, `refused` or `placeholder`.
    pub fate: String,
    pub reason: String,
    pub width: u32,
    pub height: u32,
    /// Bytes as sent to the model (base64 length), when embedded.
    pub bytes: u64,
    pub downscaled: bool,
    pub artifact: Option<String>,
    /// The tool result it came from (its index in `results`), or none for a user's image.
    pub result: Option<usize>,
}

/// What happened to one audio item.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct AudioFate {
    /// `embedded` (sent to the model), `deferred`, `refused` or `placeholder`.
    pub fate: String,
    pub reason: String,
    /// The file's bytes, when sent.
    pub bytes: u64,
    /// Its length in milliseconds, where its header says it (WAV).
    pub millis: Option<u64>,
    pub artifact: Option<String>,
    /// The tool result it came from (its index in `results`).
    pub result: Option<usize>,
}

/// A read call sluice answered.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct ReadFate {
    /// `page`, `image`, `expired`, `bad_cursor`, …
    pub outcome: String,
    pub artifact: Option<String>,
}

/// What the context guard did.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct ContextFate {
    pub estimated: u64,
    pub limit: u64,
    pub retired: usize,
    pub batch: usize,
    pub overflow: bool,
}

/// A tool result as the front saw it: enough to tell its fate later.
#[derive(Debug, Clone)]
pub struct SeenResult {
    pub source: String,
    pub tool: Option<String>,
    pub bytes: u64,
    /// What replaced it, if anything.
    pub with: Option<Bytes>,
}

/// A turn on its way: filled on the request path, finished by the inspector.
#[derive(Debug)]
pub struct Draft {
    pub tenant: Tenant,
    pub session: SessionKey,
    /// The session id the client sent, when it sent one (shown to its own tenant only).
    pub label: String,
    pub dialect: crate::dialect::Dialect,
    pub tokenizer: Tokenizer,
    pub started: Instant,
    pub turn: Turn,
    pub received: Bytes,
    pub forwarded: Bytes,
    pub results: Vec<SeenResult>,
    /// The whole response body, when it was not a stream (its usage is read from it).
    pub response: Option<Bytes>,
}

impl Draft {
    /// The images' fates, from the projection's events.
    pub fn images(events: &[crate::projection::ImageEvent]) -> Vec<ImageFate> {
        events
            .iter()
            .take(MAX_LISTED_MEDIA)
            .map(|e| ImageFate {
                fate: e.outcome.to_string(),
                reason: e.reason.to_string(),
                width: e.width,
                height: e.height,
                bytes: e.bytes,
                downscaled: e.downscaled,
                artifact: e.artifact.map(|id| id.to_string()),
                result: e.result,
            })
            .collect()
    }

    /// The audio items' fates, from the projection's events.
    pub fn audio(events: &[crate::projection::AudioEvent]) -> Vec<AudioFate> {
        events
            .iter()
            .take(MAX_LISTED_MEDIA)
            .map(|e| AudioFate {
                fate: e.outcome.to_string(),
                reason: e.reason.to_string(),
                bytes: e.bytes,
                millis: e.millis,
                artifact: e.artifact.map(|id| id.to_string()),
                result: Some(e.result),
            })
            .collect()
    }

    /// A read call answered within the request.
    pub fn read(&mut self, outcome: &str, artifact: Option<String>) {
        if self.turn.reads.len() < MAX_LISTED_MEDIA {
            self.turn.reads.push(ReadFate {
                outcome: outcome.to_string(),
                artifact,
            });
        }
    }
}

const RETIRED: &str = "[sluice: tool output retired to save context";
const FULL_TEXT: &str = "full text: artifact://";

/// The fate of a result from what replaced it: the placeholder of the context guard, a page
/// with its notice, or its images taken out.
pub fn fate(shapes: &dyn crate::projection::shapes::Shapes, seen: &SeenResult) -> ResultFate {
    let mut out = ResultFate {
        source: seen.source.clone(),
        tool: seen.tool.clone(),
        fate: "untouched".into(),
        bytes: seen.bytes,
        shown_bytes: seen.bytes,
        ..ResultFate::default()
    };
    let Some(with) = &seen.with else {
        return out;
    };
    out.shown_bytes = with.len() as u64;
    let raw = std::str::from_utf8(with).unwrap_or_default();
    let text = serde_json::from_str::<&serde_json::value::RawValue>(raw)
        .ok()
        .and_then(|raw| crate::projection::exit::result_text(shapes, raw.into()))
        .unwrap_or_default();
    let last = text.lines().rev().find(|l| l.starts_with("[sluice: "));
    if text.starts_with(RETIRED) {
        out.fate = "retired".into();
        out.artifact = artifact_after(&text, "artifact://");
        out.notice = text.lines().next().map(str::to_owned);
    } else if let Some(notice) =
        last.filter(|l| l.contains(FULL_TEXT) || l.contains("; end of artifact://"))
    {
        out.fate = "spilled".into();
        out.artifact = artifact_after(notice, "artifact://");
        out.notice = Some(notice.to_owned());
        out.shown_lines = shown_lines(notice);
    } else {
        out.fate = "media".into();
    }
    out
}

fn artifact_after(text: &str, marker: &str) -> Option<String> {
    let at = text.find(marker)? + marker.len();
    let id: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    (!id.is_empty()).then_some(id)
}

/// "lines 1-K of N": K.
fn shown_lines(notice: &str) -> Option<u64> {
    let rest = notice.strip_prefix("[sluice: lines ")?;
    let (range, _) = rest.split_once(' ')?;
    let (_, last) = range.split_once('-')?;
    last.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(with: Option<&str>) -> SeenResult {
        SeenResult {
            source: "call_1".into(),
            tool: Some("bash".into()),
            bytes: 9000,
            with: with.map(|w| Bytes::from(w.to_owned())),
        }
    }

    #[test]
    fn fates_are_read_from_what_replaced_a_result() {
        assert_eq!(
            fate(
                crate::dialect::Dialect::AnthropicMessages.shapes(),
                &seen(None)
            )
            .fate,
            "untouched"
        );
        let page = serde_json::Value::String(
            "line 1\nline 2\n[sluice: lines 1-2 of 900 shown, 14 of 9000 UTF-16 units; full text: artifact://AbC-12_x; to read on, call sluice_read with {\"cursor\":\"c\"}]".into(),
        )
        .to_string();
        let f = fate(
            crate::dialect::Dialect::AnthropicMessages.shapes(),
            &seen(Some(&page)),
        );
        assert_eq!(f.fate, "spilled");
        assert_eq!(f.artifact.as_deref(), Some("AbC-12_x"));
        assert_eq!(f.shown_lines, Some(2));
        assert_eq!(f.shown_bytes, page.len() as u64);
        let retired = r#"[{"type":"text","text":"[sluice: tool output retired to save context (900 lines): artifact://Zz9; read it with sluice_read {\"cursor\":\"c\"}]"}]"#;
        let f = fate(
            crate::dialect::Dialect::AnthropicMessages.shapes(),
            &seen(Some(retired)),
        );
        assert_eq!(f.fate, "retired");
        assert_eq!(f.artifact.as_deref(), Some("Zz9"));
        assert!(f.notice.unwrap().contains("900 lines"));
        let media = r#"[{"type":"text","text":"[image #1: PNG 10×10, 1 KB, artifact://I1]"}]"#;
        assert_eq!(
            fate(
                crate::dialect::Dialect::AnthropicMessages.shapes(),
                &seen(Some(media))
            )
            .fate,
            "media"
        );
    }
}
