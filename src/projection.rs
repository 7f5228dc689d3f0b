//! The projection seam: the view of a request that projection stages edit, the edits they
//! produce, and the splice that applies them to the original bytes (SPEC P1, P2).
//!
//! A dialect reads the body once into a [`RequestView`]: borrowed slices of the original bytes
//! with their spans. [`project`] turns a view into [`Edit`]s; [`splice`] writes them into a copy
//! of the original body, leaving every byte outside the edited spans as the client sent it.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::RouteConfig;
use crate::dialect::Dialect;
use crate::exit::{self, text::Budget};
use crate::tenant::Tenant;

/// A half-open byte range `[start, end)` in the request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Span {
    pub start: usize,
    pub end: usize,
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
    pub content: &'a RawValue,
    /// Where `content` stands in the body.
    pub span: Span,
}

/// An image a user message carries (a platform attachment, SPEC A5).
#[derive(Debug)]
pub struct UserImage<'a> {
    pub item: usize,
    /// The whole content part (`image_url`, `input_image` or `image` block).
    pub part: &'a RawValue,
    pub span: Span,
}

/// What projection may look at and edit in one request.
#[derive(Debug)]
pub struct RequestView<'a> {
    pub dialect: Dialect,
    pub model: Option<Cow<'a, str>>,
    pub stream: bool,
    /// Messages (chat, Anthropic) or input items (Responses) in the history.
    pub items: usize,
    pub tool_results: Vec<ToolResult<'a>>,
    pub user_images: Vec<UserImage<'a>>,
}

impl<'a> RequestView<'a> {
    /// A view with nothing to project: the body is JSON but not of the dialect's shape. The
    /// model is still read when it can be, so the request is routed as the client meant.
    pub fn empty(dialect: Dialect, body: &'a [u8]) -> Self {
        #[derive(Deserialize)]
        struct ModelOnly<'a> {
            #[serde(borrow)]
            model: Option<Cow<'a, str>>,
        }
        let model = serde_json::from_slice::<ModelOnly>(body)
            .ok()
            .and_then(|m| m.model);
        Self {
            dialect,
            model,
            stream: false,
            items: 0,
            tool_results: Vec::new(),
            user_images: Vec::new(),
        }
    }
}

/// A replacement of the bytes in `span` by `with`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub span: Span,
    pub with: Bytes,
}

/// What a request's projection changed, for the `x-sluice-projection` header (SPEC O3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    pub spilled: usize,
    pub embedded: usize,
    pub deferred: usize,
    pub refused: usize,
    pub placeholders: usize,
}

impl Summary {
    pub fn header_value(&self) -> String {
        format!(
            "spilled={}; embedded={}; deferred={}; refused={}; placeholders={}",
            self.spilled, self.embedded, self.deferred, self.refused, self.placeholders
        )
    }
}

/// The result of projecting one request: pure data, for the caller to act on.
#[derive(Debug, Default)]
pub struct Projection {
    pub edits: Vec<Edit>,
    pub summary: Summary,
    /// Text artifacts to store before the request may be forwarded (T3).
    pub spills: Vec<exit::Spill>,
    /// Memo entries to keep once the spills are stored.
    pub memos: Vec<(u128, exit::Memoized)>,
}

/// What projection needs besides the view: who asks, under which route's policy, and the memo
/// of earlier projections.
pub struct Context<'a> {
    pub tenant: &'a Tenant,
    pub route: &'a RouteConfig,
    pub memo: &'a exit::Memo,
}

/// Projects a request: the text exit (section 3), then the media and delivery stages as they
/// come. When nothing needs changing the edits are empty and the body is forwarded as sent (P1).
pub fn project(view: &RequestView<'_>, ctx: &Context<'_>) -> Projection {
    let policy = exit::Policy {
        tenant: ctx.tenant,
        budget: Budget {
            lines: ctx.route.exit.max_lines,
            units: ctx.route.exit.max_units,
        },
        read_tool: &ctx.route.read_tool,
    };
    let text = exit::project(view, &policy, ctx.memo);
    Projection {
        edits: text.edits,
        summary: Summary {
            spilled: text.spilled,
            ..Summary::default()
        },
        spills: text.spills,
        memos: text.memos,
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

    /// P2 at the seam: replacing a tool result's content through its view span changes those
    /// bytes only; unknown fields, whitespace, key order and number formats survive.
    #[test]
    fn an_edited_request_changes_only_its_spliced_spans() {
        let cases = [
            (Dialect::OpenAiChat, "{ \"x_unknown\" : {\"n\": 1.50e3},\n \"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\",\"function\":{\"name\":\"ls\"}}]},\n\t{\"tool_call_id\":\"c1\", \"content\" :\"old\\nout\", \"role\":\"tool\"}], \"model\":\"m\", \"temperature\": 0.70 }"),
            (Dialect::OpenAiResponses, "{\"input\":[{\"output\":[{\"type\":\"input_text\",\"text\":\"old\"}],  \"type\":\"function_call_output\",\"call_id\":\"f\"}],\"model\":\"m\",\"z\":-0.0}"),
            (Dialect::AnthropicMessages, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"cache_control\":{\"type\":\"ephemeral\"},\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":\"old\"}]}],  \"max_tokens\":1e2}"),
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
                    with: Bytes::from_static(b"\"new\""),
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
            };
            *before.pointer_mut(pointer).unwrap() = serde_json::json!("new");
            assert_eq!(before, after, "{dialect:?}");
        }
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
