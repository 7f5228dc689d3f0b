//! The unified model exit for text (SPEC section 3): a tool result over the route's budget is
//! stored whole as a text artifact, and the model sees its first page and a notice with a
//! cursor. Pure: it returns the edits, the artifacts to store, and the memo entries to keep once
//! they are stored; the caller does the I/O.
//!
//! Agents resend their whole history every turn, so each result is looked up by a hash of its
//! raw JSON bytes first: a result already projected costs a hash and a cache hit (T7 makes the
//! cached answer the right one). A result that obviously fits costs not even that.

pub mod cursor;
pub mod index;
pub mod notice;
pub mod text;

use std::borrow::Cow;

use bytes::Bytes;
use serde_json::value::RawValue;
use xxhash_rust::xxh3::Xxh3;

use super::memos::Memos;
use super::shapes::{Content, NewContent, Part, PartKind, Shapes};
use crate::projection::artifact::{ArtifactId, ArtifactKind};
use crate::projection::{Edit, Raw, RequestView, Rope, ToolResult};
use crate::tenant::Tenant;
use text::{fits, utf16_len, Budget, Lines, Position};

/// What a tool result becomes: `None` when it fits as it is, else the replacement JSON value.
pub type Memoized = Option<Bytes>;

/// What the text exit needs to know about a request besides its view.
pub struct Policy<'a> {
    pub tenant: &'a Tenant,
    pub budget: Budget,
    pub read_tool: &'a str,
}

/// An artifact (spilled text or media bytes) to store before the request may go upstream.
#[derive(Debug, Clone)]
pub struct Spill {
    pub id: ArtifactId,
    pub bytes: Bytes,
}

/// The text exit's part of a projection.
#[derive(Debug, Default)]
pub struct TextExit {
    pub edits: Vec<Edit>,
    /// Tool results shown as a page this request (new or remembered).
    pub spilled: usize,
    /// Artifacts first made by this request.
    pub spills: Vec<Spill>,
    /// Memo entries to keep once the spills are stored.
    pub memos: Vec<(u128, Memoized)>,
}

/// Projects the tool results of `view` whose index `skip` does not name (those are handled by
/// the media stage, which pages their remaining text with [`page_text`]).
pub fn project(
    view: &RequestView<'_>,
    policy: &Policy<'_>,
    memo: &dyn Memos,
    skip: &dyn Fn(usize) -> bool,
) -> TextExit {
    let mut out = TextExit::default();
    for (index, result) in view.tool_results.iter().enumerate() {
        if skip(index) {
            continue;
        }
        let raw = result.content.get();
        if obviously_fits(raw, policy.budget) {
            continue;
        }
        let key = memo_key(b"", memo.seed(), view.shapes, policy, result);
        let replacement = match memo.page(key) {
            Some(known) => known,
            None => {
                let (value, spill) = project_result(view.shapes, result, policy);
                if let Some(spill) = spill {
                    out.spills.push(spill);
                }
                out.memos.push((key, value.clone()));
                value
            }
        };
        if let Some(with) = replacement {
            out.spilled += 1;
            out.edits.push(Edit {
                span: result.span,
                with: with.into(),
            });
        }
    }
    out
}

/// A cheap, conservative test on the raw JSON: a string of at most `units` raw bytes has at
/// most that many UTF-16 units, and at most one line more than it has backslashes (every `\n`
/// escape has one), counted by bytecount, which picks AVX2 at run time: under half the
/// instructions of memchr's count on an agent's history of build logs (docs/runtime.md).
fn obviously_fits(raw: &str, budget: Budget) -> bool {
    raw.starts_with('"')
        && raw.len() - 2 <= budget.units
        && bytecount::count(raw.as_bytes(), b'\\') < budget.lines
}

/// The memo key of what a tool result's content (known by its digest) becomes under `policy`,
/// in `domain` (empty for the text exit's pages; the context guard keeps its placeholders
/// beside them).
pub(crate) fn memo_key(
    domain: &[u8],
    seed: u64,
    shapes: &dyn Shapes,
    policy: &Policy<'_>,
    result: &ToolResult<'_>,
) -> u128 {
    let mut h = Xxh3::with_seed(seed);
    h.update(domain);
    h.update(policy.tenant.key());
    h.update(&(policy.budget.lines as u64).to_le_bytes());
    h.update(&(policy.budget.units as u64).to_le_bytes());
    h.update(policy.read_tool.as_bytes());
    h.update(&[0, shapes.tag()]);
    h.update(&result.digest.to_le_bytes());
    h.digest128()
}

/// The tool result's text and, for parts, the parts: text parts are budgeted as one text,
/// joined by newlines (SPEC section 3); other parts are kept as they are.
fn read_content<'a>(shapes: &dyn Shapes, content: Raw<'a>) -> Option<(Cow<'a, str>, Parts<'a>)> {
    let parts = match shapes.content(content.get())? {
        Content::Text(text) => return Some((text, None)),
        Content::Parts(parts) => parts,
    };
    let mut texts = Vec::new();
    for (_, part) in &parts {
        match part {
            Some(Part {
                kind: PartKind::Text(text),
                ..
            }) => texts.push(text.clone()),
            Some(_) => {}
            // A part the dialect cannot read: the content is left as it is.
            None => return None,
        }
    }
    let text = if texts.len() == 1 {
        texts.swap_remove(0)
    } else {
        Cow::Owned(texts.join("\n"))
    };
    Some((text, Some(parts)))
}

/// A content's parts as [`Shapes::content`] reads them; `None` for a plain string.
type Parts<'a> = Option<Vec<(&'a str, Option<Part<'a>>)>>;

/// The text a tool result's content carries, as the text exit reads it (text parts joined by
/// newlines); `None` when it is neither a string nor an array of parts.
pub fn result_text(shapes: &dyn Shapes, content: Raw<'_>) -> Option<String> {
    if let Some((text, _)) = read_content(shapes, content) {
        return Some(text.into_owned());
    }
    let fixed = crate::json::without_lone_surrogates(content.get())?;
    let fixed = RawValue::from_string(fixed).ok()?;
    read_content(shapes, Raw::from(&*fixed)).map(|(text, _)| text.into_owned())
}

/// Projects one tool result: `(None, None)` when it fits; else its replacement and its spill.
fn project_result(
    shapes: &dyn Shapes,
    result: &ToolResult<'_>,
    policy: &Policy<'_>,
) -> (Memoized, Option<Spill>) {
    // A lone surrogate escape has no UTF-8 form: it is read as U+FFFD, so the result is still
    // budgeted (docs/text-exit.md).
    let fixed = read_content(shapes, result.content)
        .is_none()
        .then(|| crate::json::without_lone_surrogates(result.content.get()))
        .flatten()
        .and_then(|raw| RawValue::from_string(raw).ok());
    let content = fixed.as_deref().map_or(result.content, Raw::from);
    let Some((text, parts)) = read_content(shapes, content) else {
        return (None, None);
    };
    let Some((page, spill)) = page_cow(text, policy) else {
        return (None, None);
    };
    let page_json = serde_json::Value::String(page).to_string();
    let replacement = replace_parts(shapes, content, parts.unwrap_or_default(), &page_json);
    (Some(replacement.to_bytes()), Some(spill))
}

/// `text` as the model sees it under the budget: `None` when it fits as it is; else its first
/// page with the notice, and the artifact that holds it whole (T3).
pub fn page_text(text: &str, policy: &Policy<'_>) -> Option<(String, Spill)> {
    page_cow(Cow::Borrowed(text), policy)
}

/// [`page_text`] for a text that may be owned already: the artifact takes it without a copy
/// (a spilled output of tens of megabytes is then held once, not twice).
fn page_cow(text: Cow<'_, str>, policy: &Policy<'_>) -> Option<(String, Spill)> {
    let (id, page) = {
        let lines = Lines::new(&text);
        if fits(utf16_len(&text), lines.count(), policy.budget) {
            return None;
        }
        let id = ArtifactId::for_content(policy.tenant, ArtifactKind::Text, text.as_bytes());
        let page = notice::render(
            &lines,
            &id,
            policy.tenant,
            Position::default(),
            policy.budget,
            policy.read_tool,
        );
        (id, page)
    };
    let spill = Spill {
        id,
        bytes: Bytes::from(text.into_owned()),
    };
    Some((page.text, spill))
}

/// The new content: one text part holding the page (in the dialect's shape, with the cache
/// breakpoint of the last text part, if any), then the non-text parts as they were.
fn replace_parts(
    shapes: &dyn Shapes,
    original: Raw<'_>,
    parts: Vec<(&str, Option<Part<'_>>)>,
    page_json: &str,
) -> Rope {
    let mut breakpoint = None;
    let mut others = Vec::new();
    for (raw, part) in parts {
        match part {
            Some(p) if matches!(p.kind, PartKind::Text(_)) => {
                if p.breakpoint.is_some() {
                    breakpoint = p.breakpoint;
                }
            }
            _ => others.push(Rope::from(raw.to_string())),
        }
    }
    let new = NewContent {
        text_json: page_json,
        text_breakpoint: breakpoint.map(RawValue::get),
        media: Vec::new(),
        others,
        last_breakpoint: None,
        as_parts: false,
    };
    shapes.tool_content(original, new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;
    use crate::memo::Memo;
    use crate::projection::splice;

    fn policy(tenant: &Tenant) -> Policy<'_> {
        Policy {
            tenant,
            budget: Budget {
                lines: 20,
                units: 2000,
            },
            read_tool: "sluice_read",
        }
    }

    fn chat(content: &str) -> String {
        serde_json::json!({"model": "m", "messages": [
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": content},
        ]})
        .to_string()
    }

    #[test]
    fn results_within_budget_are_untouched_t3() {
        let t = Tenant::from_credential(b"k");
        let body = chat("short\noutput");
        let view = Dialect::OpenAiChat.read_view(body.as_bytes()).unwrap();
        let out = project(&view, &policy(&t), &Memo::default(), &|_| false);
        assert!(out.edits.is_empty() && out.spills.is_empty());
        // Exactly at the line budget, with escapes that make the raw text long: still fits.
        let text: String = (0..20).map(|i| format!("é{i}\n")).collect();
        let body = chat(&text);
        let view = Dialect::OpenAiChat.read_view(body.as_bytes()).unwrap();
        let out = project(&view, &policy(&t), &Memo::default(), &|_| false);
        assert!(out.edits.is_empty(), "20 lines fit a 20-line budget");
    }

    #[test]
    fn a_long_result_is_spilled_and_remembered() {
        let t = Tenant::from_credential(b"k");
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let body = bytes::Bytes::from(chat(&text));
        let memo = Memo::default();
        let view = Dialect::OpenAiChat.read_view(&body).unwrap();
        let first = project(&view, &policy(&t), &memo, &|_| false);
        assert_eq!(
            (first.spilled, first.spills.len(), first.memos.len()),
            (1, 1, 1)
        );
        assert_eq!(&first.spills[0].bytes[..], text.as_bytes());
        for (k, v) in &first.memos {
            memo.insert_page(*k, v.clone());
        }
        let again = project(&view, &policy(&t), &memo, &|_| false);
        assert_eq!(again.spilled, 1);
        assert!(
            again.spills.is_empty() && again.memos.is_empty(),
            "a memo hit stores nothing"
        );
        assert_eq!(again.edits, first.edits, "T7: identical bytes");
        let out = splice(&body, first.edits).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let shown = v["messages"][1]["content"].as_str().unwrap();
        assert!(shown.starts_with("line 0\n"));
        assert_eq!(shown.lines().count(), 20);
        assert!(shown.contains(&format!("artifact://{}", first.spills[0].id)));
    }

    #[test]
    fn text_parts_are_budgeted_as_one_text_and_other_parts_kept() {
        let t = Tenant::from_credential(b"k");
        let a: String = (0..15).map(|i| format!("a{i}\n")).collect();
        let b: String = (0..15).map(|i| format!("b{i}\n")).collect();
        let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": a},
                {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                {"type": "text", "text": b, "cache_control": {"type": "ephemeral"}}
            ]}
        ]}]})
        .to_string();
        let body = bytes::Bytes::from(body);
        let view = Dialect::AnthropicMessages.read_view(&body).unwrap();
        let out = project(&view, &policy(&t), &Memo::default(), &|_| false);
        assert_eq!(out.spilled, 1);
        assert_eq!(
            std::str::from_utf8(&out.spills[0].bytes).unwrap(),
            format!("{a}\n{b}")
        );
        let spliced = splice(&body, out.edits).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&spliced).unwrap();
        let content = &v["messages"][0]["content"][0]["content"];
        assert_eq!(content.as_array().unwrap().len(), 2);
        assert_eq!(content[0]["type"], "text");
        assert_eq!(content[0]["cache_control"]["type"], "ephemeral");
        assert_eq!(content[1]["type"], "image");
    }
}
