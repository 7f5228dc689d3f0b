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
    /// Where a cache breakpoint could go on its block (Anthropic), `super::edits`.
    pub slot: Option<super::edits::Slot>,
}

/// An image a user message carries (a platform attachment, SPEC A5).
#[derive(Debug)]
pub struct UserImage<'a> {
    pub item: usize,
    /// The whole content part (`image_url`, `input_image` or `image` block).
    pub part: Raw<'a>,
    pub span: Span,
    /// The tool result (index into `tool_results`) this image answers with, when the client
    /// puts a tool's images beside its result rather than in it (Gemini CLI): the image then
    /// has that result's source and tool, hence the tool's lifetime (M5).
    pub beside: Option<usize>,
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
            model: Option<crate::json::Str<'a>>,
        }
        let model = serde_json::from_str::<ModelOnly>(body)
            .ok()
            .and_then(|m| m.model);
        Self {
            shapes,
            body,
            model: model.map(|m| m.0),
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
    pub with: Rope,
}

/// Bytes written as pieces one after another: an embedded image's base64 stays the buffer it is
/// kept in, not copied into the part around it, and is sent from there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rope(Vec<Bytes>);

impl Rope {
    /// `pieces` in order; empty ones are left out.
    pub fn of(pieces: impl IntoIterator<Item = Bytes>) -> Rope {
        Rope(pieces.into_iter().filter(|p| !p.is_empty()).collect())
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn pieces(&self) -> &[Bytes] {
        &self.0
    }

    /// The bytes in one buffer: the piece itself when there is one, else a copy.
    pub fn to_bytes(&self) -> Bytes {
        match self.0.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => {
                let mut out = BytesMut::with_capacity(self.len());
                for piece in many {
                    out.extend_from_slice(piece);
                }
                out.freeze()
            }
        }
    }

    /// The bytes as text, lossily (they are written as JSON, so UTF-8 unless an edit is wrong).
    pub fn to_text(&self) -> String {
        String::from_utf8_lossy(&self.to_bytes()).into_owned()
    }

    /// Appends `more`'s pieces.
    pub fn push(&mut self, more: impl Into<Rope>) {
        self.0.extend(more.into().0);
    }

    /// Whether the last byte is `byte`.
    pub fn ends_with(&self, byte: u8) -> bool {
        self.0.last().and_then(|p| p.last()) == Some(&byte)
    }

    /// Whether one of the pieces holds `needle` (a needle that cannot lie across two pieces,
    /// as a JSON key cannot across a string value's edge).
    pub fn has(&self, needle: &[u8]) -> bool {
        self.0
            .iter()
            .any(|p| memchr::memmem::find(p, needle).is_some())
    }

    pub fn into_pieces(self) -> Vec<Bytes> {
        self.0
    }

    /// The bytes without their last one.
    pub fn pop(&mut self) {
        if let Some(last) = self.0.last_mut() {
            last.truncate(last.len().saturating_sub(1));
            if last.is_empty() {
                self.0.pop();
            }
        }
    }
}

impl From<std::sync::Arc<str>> for Rope {
    /// The text shared, not copied.
    fn from(text: std::sync::Arc<str>) -> Rope {
        Rope::of([Bytes::from_owner(SharedText(text))])
    }
}

/// The buffer behind text a [`Rope`] shares.
struct SharedText(std::sync::Arc<str>);

impl AsRef<[u8]> for SharedText {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl From<Bytes> for Rope {
    fn from(bytes: Bytes) -> Rope {
        Rope::of([bytes])
    }
}

impl From<String> for Rope {
    fn from(text: String) -> Rope {
        Rope::of([Bytes::from(text)])
    }
}

impl From<&'static str> for Rope {
    fn from(text: &'static str) -> Rope {
        Rope::of([Bytes::from_static(text.as_bytes())])
    }
}

/// Edits that cannot be applied together.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpliceError {
    #[error("edit {0:?} lies outside the body")]
    OutOfBounds(Span),
    #[error("edits {0:?} and {1:?} overlap")]
    Overlap(Span, Span),
}

/// Below this size a spliced body is joined into one buffer: a copy of a few kilobytes costs less
/// than sending it as several pieces.
const JOINED_BELOW: usize = 64 * 1024;

/// Applies `edits` to `body`. Bytes outside the edited spans are the original bytes (P2); with
/// no edits the original buffer is returned without a copy (P1). Edits may come in any order.
pub fn splice(body: &Bytes, edits: Vec<Edit>) -> Result<Bytes, SpliceError> {
    splice_shared(body, edits).map(|s| s.to_bytes())
}

/// [`splice`] as the pieces the body is sent in: the received bytes between the edits are
/// slices of `body`, not copied, and each edit is its own piece, so a long history with a few
/// edits is forwarded without a copy of its megabytes (docs/runtime.md). A body under 64 KiB
/// is joined into one piece.
pub fn splice_shared(body: &Bytes, mut edits: Vec<Edit>) -> Result<Rope, SpliceError> {
    if edits.is_empty() {
        return Ok(Rope::from(body.clone()));
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
    let mut pieces = Vec::with_capacity(2 * edits.len() + 1);
    let mut at = 0;
    for edit in edits {
        pieces.push(body.slice(at..edit.span.start));
        pieces.extend(edit.with.0);
        at = edit.span.end;
    }
    pieces.push(body.slice(at..));
    let spliced = Rope::of(pieces);
    debug_assert_eq!(spliced.len(), size);
    if size < JOINED_BELOW {
        return Ok(Rope::from(spliced.to_bytes()));
    }
    Ok(spliced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn edit(start: usize, end: usize, with: &str) -> Edit {
        Edit {
            span: Span { start, end },
            with: Bytes::copy_from_slice(with.as_bytes()).into(),
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
    fn a_long_body_is_spliced_without_copying_its_unedited_bytes() {
        let mut text = vec![b'a'; 3 * JOINED_BELOW];
        text[JOINED_BELOW] = b'b';
        let body = Bytes::from(text);
        let at = JOINED_BELOW;
        let shared = splice_shared(&body, vec![edit(at, at + 1, "cc")]).unwrap();
        let pieces = shared.pieces();
        assert_eq!(pieces.len(), 3);
        assert_eq!(
            pieces[0].as_ptr(),
            body.as_ptr(),
            "the stretch before is the body's"
        );
        assert_eq!(pieces[2].as_ptr(), body[at + 1..].as_ptr());
        assert_eq!(&pieces[1][..], b"cc");
        assert_eq!(shared.len(), body.len() + 1);
        // A short one is joined into one buffer.
        let short = Bytes::from_static(b"0123456789");
        assert_eq!(
            splice_shared(&short, vec![edit(1, 2, "x")])
                .unwrap()
                .pieces()
                .len(),
            1
        );
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
            let shared = splice_shared(&body, edits.clone()).unwrap();
            prop_assert_eq!(shared.len(), out.len());
            prop_assert!(shared.pieces().iter().all(|p| !p.is_empty()));
            prop_assert_eq!(&shared.to_bytes()[..], &out[..]);
            // The same edits applied one by one, from the last, with std's Vec::splice.
            let mut expect = body.to_vec();
            for e in edits.iter().rev() {
                expect.splice(e.span.start..e.span.end, e.with.to_bytes().iter().copied());
            }
            prop_assert_eq!(&out[..], &expect[..]);
        }
    }
}
