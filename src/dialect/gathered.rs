//! What every dialect's reading gathers from a request's list (messages or input items): tool
//! calls, tool results and user images, by spans of the body, so that a resumed reading
//! (`super::resume`) can take what an earlier body's reading gathered before a mark.

use std::borrow::Cow;

use serde_json::value::RawValue;

use super::resume::{at, Piece};
use super::{digest, span_of};
use crate::projection::edits::Slot;
use crate::projection::{Raw, Span, ToolResult, UserImage};

/// The tool calls' names by id, as a reading meets them. foldhash, seeded per map, in place of
/// std's SipHash: the ids are the request's own, so a client could slow only its own reading,
/// within its body's bytes.
pub(super) type Names<'a> =
    std::collections::HashMap<Cow<'a, str>, Cow<'a, str>, foldhash::fast::RandomState>;

/// A tool result, by span.
#[derive(Debug, Clone)]
struct Noted {
    item: usize,
    source: Piece,
    tool_name: Option<Piece>,
    span: Span,
    digest: u128,
    slot: Option<Slot>,
}

#[derive(Debug, Default, Clone)]
pub(super) struct Gathered {
    /// Each tool call: its id and its tool's name.
    calls: Vec<(Piece, Piece)>,
    results: Vec<Noted>,
    /// User images: their item's number, span, and the tool result they answer with
    /// (`UserImage::beside`).
    images: Vec<(usize, Span, Option<usize>)>,
}

impl Gathered {
    /// What had been gathered when the lists were `counts` long ([`Gathered::counts`]).
    pub fn before(&self, counts: [usize; 3]) -> Gathered {
        let [calls, results, images] = counts;
        Gathered {
            calls: self.calls.get(..calls).unwrap_or_default().to_vec(),
            results: self.results.get(..results).unwrap_or_default().to_vec(),
            images: self.images.get(..images).unwrap_or_default().to_vec(),
        }
    }

    pub fn counts(&self) -> [usize; 3] {
        [self.calls.len(), self.results.len(), self.images.len()]
    }

    /// Bytes it takes, roughly.
    pub fn weight(&self) -> usize {
        self.calls
            .iter()
            .map(|(a, b)| a.weight() + b.weight())
            .sum::<usize>()
            + self
                .results
                .iter()
                .map(|k| 64 + k.source.weight())
                .sum::<usize>()
            + self.images.len() * 24
    }

    /// A tool call, and its id's name in `names`.
    pub fn call<'a>(
        &mut self,
        body: &'a str,
        names: &mut Names<'a>,
        id: Cow<'a, str>,
        name: Cow<'a, str>,
    ) {
        self.calls
            .push((Piece::of(body, &id), Piece::of(body, &name)));
        names.insert(id, name);
    }

    /// A tool result of item number `item`, named by the call of its id seen so far; `slot`
    /// where its block could carry a cache breakpoint (Anthropic).
    pub fn result<'a>(
        &mut self,
        body: &'a str,
        names: &Names<'a>,
        item: usize,
        id: &str,
        content: &RawValue,
        slot: Option<Slot>,
    ) {
        self.results.push(Noted {
            item,
            source: Piece::of(body, id),
            tool_name: names.get(id).map(|n| Piece::of(body, n)),
            span: span_of(body, content),
            digest: digest(content.get()),
            slot,
        });
    }

    /// A user image part of item number `item`, beside tool result number `beside`.
    pub fn image(&mut self, body: &str, item: usize, part: &RawValue, beside: Option<usize>) {
        self.images.push((item, span_of(body, part), beside));
    }

    /// The last tool result, when it is in item number `item` (the one just before a message
    /// whose images may answer with it).
    pub fn result_in(&self, item: usize) -> Option<usize> {
        let last = self.results.len().checked_sub(1)?;
        (self.results[last].item == item).then_some(last)
    }

    /// The tool calls' names by id, as the reading had them (a later call of an id names it).
    pub fn names<'a>(&self, body: &'a str) -> Names<'a> {
        self.calls
            .iter()
            .map(|(id, name)| (id.text(body), name.text(body)))
            .collect()
    }

    pub fn tool_results<'a>(&self, body: &'a str) -> Vec<ToolResult<'a>> {
        self.results
            .iter()
            .map(|k| ToolResult {
                item: k.item,
                source: k.source.text(body),
                tool_name: k.tool_name.as_ref().map(|p| p.text(body)),
                content: Raw::read_before(at(body, k.span)),
                span: k.span,
                digest: k.digest,
                slot: k.slot,
            })
            .collect()
    }

    pub fn user_images<'a>(&self, body: &'a str) -> Vec<UserImage<'a>> {
        self.images
            .iter()
            .map(|&(item, span, beside)| UserImage {
                item,
                part: Raw::read_before(at(body, span)),
                span,
                beside,
            })
            .collect()
    }
}
