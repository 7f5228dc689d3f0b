//! The view of a request that projection reads and edits, the edits it produces, and the
//! splice that applies them to the original bytes (SPEC P1, P2). A dialect reads the body once
//! into a [`RequestView`]: borrowed slices of the original bytes with their spans.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::shapes::Shapes;

/// A half-open byte range `[start, end)` in the request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

/// A JSON value's text as it stands in the body, as serde_json's `RawValue` holds it. A plain
/// slice, so that a view resumed from an earlier body's reading (`crate::dialect`) can point at a
/// value it found there without reading the value again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    /// The value's JSON text.
    pub fn get(self) -> &'a str {
        self.0
    }

    /// A slice known to hold exactly one JSON value: read as one before, from the same bytes.
    pub(crate) fn read_before(text: &'a str) -> Self {
        Raw(text)
    }
}

impl<'a> From<&'a RawValue> for Raw<'a> {
    fn from(raw: &'a RawValue) -> Self {
        Raw(raw.get())
    }
}

/// One tool result of the history (SPEC section 1): an OpenAI `tool` message, a Responses
/// `function_call_output` item, an Anthropic `tool_result` block.
#[derive(Debug)]
pub struct ToolResult<'a> {
    /// Index of the message (or input item) that holds it.
    pub item: usize,
    /// `tool_call_id`, `call_id` or `tool_use_id`: the source of what it carries.
    pub source: Cow<'a, str>,
    /// The name of the tool that was called, when the history still holds the call.
    pub tool_name: Option<Cow<'a, str>>,
    /// The result's content value (`content` or `output`): a string or an array of parts.
    pub content: Raw<'a>,
    /// Where `content` stands in the body.
    pub span: Span,
    /// A hash of `content`'s bytes, seeded per process: what the memos know it by. A resumed
    /// view takes it from the earlier turn's reading instead of hashing the bytes again.
    pub digest: u128,
}

/// An image a user message carries (a platform attachment, SPEC A5).
#[derive(Debug)]
pub struct UserImage<'a> {
    pub item: usize,
    /// The whole content part (`image_url`, `input_image` or `image` block).
    pub part: Raw<'a>,
    pub span: Span,
}

/// What projection may look at and edit in one request.
#[derive(Debug)]
pub struct RequestView<'a> {
    /// The shapes of the request's dialect, for writing what the projection decides.
    pub shapes: &'static dyn Shapes,
    /// The whole request body the spans point into (UTF-8, as JSON is).
    pub body: &'a str,
    pub model: Option<Cow<'a, str>>,
    pub tool_results: Vec<ToolResult<'a>>,
    pub user_images: Vec<UserImage<'a>>,
    /// The request's `tools` as sent (where the read tool is added, C1).
    pub tools: Option<Raw<'a>>,
    /// A conversation id the client already sends: Responses `prompt_cache_key`, Anthropic
    /// `metadata.user_id`.
    pub conversation: Option<Cow<'a, str>>,
    /// The conversation's root as sent: system prompt and first user message (raw JSON, or
    /// the parts a dialect reads them in), for the session fingerprint when there is no
    /// explicit session.
    pub root: Vec<Cow<'a, str>>,
    /// The output the request asks room for (`max_tokens`, `max_completion_tokens`,
    /// `max_output_tokens`), when it names it.
    pub max_output: Option<u64>,
}

impl<'a> RequestView<'a> {
    /// A view with nothing to project: the body is JSON but not of the dialect's shape. The
    /// model is still read when it can be, so the request is routed as the client meant.
    pub fn empty(shapes: &'static dyn Shapes, body: &'a str) -> Self {
        #[derive(Deserialize)]
        struct ModelOnly<'a> {
            #[serde(borrow)]
            model: Option<Cow<'a, str>>,
        }
        let model = serde_json::from_str::<ModelOnly>(body)
            .ok()
            .and_then(|m| m.model);
        Self {
            shapes,
            body,
            model,
            tool_results: Vec::new(),
            user_images: Vec::new(),
            tools: None,
            conversation: None,
            root: Vec::new(),
            max_output: None,
        }
    }
}

/// A replacement of the bytes in `span` by `with`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub span: Span,
    pub with: Bytes,
}

/// Edits that cannot be applied together.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpliceError {
    #[error("edit {0:?} lies outside the body")]
    OutOfBounds(Span),
    #[error("edits {0:?} and {1:?} overlap")]
    Overlap(Span, Span),
}

/// Applies `edits` to `body`. Bytes outside the edited spans are copied unchanged (P2); with no
/// edits the original buffer is returned without a copy (P1). Edits may come in any order.
pub fn splice(body: &Bytes, mut edits: Vec<Edit>) -> Result<Bytes, SpliceError> {
    if edits.is_empty() {
        return Ok(body.clone());
    }
    edits.sort_by_key(|e| e.span);
    let mut size = body.len();
    let mut prev: Option<Span> = None;
    for edit in &edits {
        let Span { start, end } = edit.span;
        if start > end || end > body.len() {
            return Err(SpliceError::OutOfBounds(edit.span));
        }
        if let Some(p) = prev {
            if p.end > start {
                return Err(SpliceError::Overlap(p, edit.span));
            }
        }
        prev = Some(edit.span);
        size = size - (end - start) + edit.with.len();
    }
    let mut out = BytesMut::with_capacity(size);
    let mut at = 0;
    for edit in &edits {
        out.extend_from_slice(&body[at..edit.span.start]);
        out.extend_from_slice(&edit.with);
        at = edit.span.end;
    }
    out.extend_from_slice(&body[at..]);
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn edit(start: usize, end: usize, with: &str) -> Edit {
        Edit {
            span: Span { start, end },
            with: Bytes::copy_from_slice(with.as_bytes()),
        }
    }

    #[test]
    fn no_edits_returns_the_same_buffer() {
        let body = Bytes::from_static(b"{\"a\" :  1}");
        let out = splice(&body, Vec::new()).unwrap();
        assert_eq!(out.as_ptr(), body.as_ptr(), "P1: no copy, same bytes");
    }

    #[test]
    fn edits_in_any_order_replace_only_their_spans() {
        let body = Bytes::from_static(b"0123456789");
        let out = splice(&body, vec![edit(7, 9, "xy z"), edit(1, 3, "")]).unwrap();
        assert_eq!(&out[..], b"03456xy z9");
    }

    #[test]
    fn overlapping_or_outside_edits_are_errors() {
        let body = Bytes::from_static(b"0123456789");
        assert!(matches!(
            splice(&body, vec![edit(1, 5, ""), edit(4, 6, "")]),
            Err(SpliceError::Overlap(..))
        ));
        assert!(matches!(
            splice(&body, vec![edit(8, 11, "")]),
            Err(SpliceError::OutOfBounds(..))
        ));
    }

    proptest! {
        /// P2: whatever edits are made, the bytes between them are the original bytes.
        #[test]
        fn splice_keeps_every_untouched_byte(
            body in proptest::collection::vec(any::<u8>(), 0..200),
            cuts in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), "[a-z]{0,5}"), 0..6),
        ) {
            let body = Bytes::from(body);
            // Build non-overlapping spans from sorted cut points.
            let mut points: Vec<(usize, usize, String)> = cuts
                .into_iter()
                .map(|(a, b, s)| {
                    let (a, b) = (a.index(body.len() + 1), b.index(body.len() + 1));
                    (a.min(b), a.max(b), s)
                })
                .collect();
            points.sort();
            let mut edits = Vec::new();
            let mut last = 0;
            for (a, b, s) in points {
                if a >= last {
                    edits.push(edit(a, b, &s));
                    last = b.max(a + 1);
                }
            }
            let out = splice(&body, edits.clone()).unwrap();
            // The same edits applied one by one, from the last, with std's Vec::splice.
            let mut expect = body.to_vec();
            for e in edits.iter().rev() {
                expect.splice(e.span.start..e.span.end, e.with.iter().copied());
            }
            prop_assert_eq!(&out[..], &expect[..]);
        }
    }
}
