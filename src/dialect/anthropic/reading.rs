//! The Anthropic reading: what the messages hold, gathered message by message into spans, and
//! the view built from them, whole or walked from an earlier body's trail (`super::super::resume`).

use std::borrow::Cow;

use serde_json::value::RawValue;

use super::{Content, Message, Metadata, Request};
use crate::dialect::gathered::{Gathered, Names};
use crate::dialect::resume::{self, Cursor, Field, Kept, Mark, Piece, Resumes, Seen, Table, Walk};
use crate::dialect::{count, span_of, Text};
use crate::projection::{Raw, RequestView, Span};

pub(crate) fn read(body: &str) -> Result<RequestView<'_>, serde_json::Error> {
    let request: Request = serde_json::from_str(body)?;
    let mut reading = Reading::new(body);
    for (item, message) in request.messages.iter().enumerate() {
        reading.message(item, message);
    }
    reading.top = Top {
        model: request.model.as_ref().map(|t| Piece::of(body, t)),
        tools: request.tools.map(|r| span_of(body, r)),
        system: request.system.map(|r| span_of(body, r)),
        user_id: request
            .metadata
            .and_then(|m| m.user_id)
            .map(|t| Piece::of(body, &t)),
        max_tokens: count(request.max_tokens),
        seen: Seen::default(),
    };
    Ok(reading.finish().0)
}

/// The fields of the request's top-level object that the view reads, found so far.
#[derive(Debug, Default, Clone)]
struct Top {
    model: Option<Piece>,
    tools: Option<Span>,
    system: Option<Span>,
    user_id: Option<Piece>,
    max_tokens: Option<u64>,
    seen: Seen,
}

impl Top {
    /// Reads the value of the field `key` at the cursor ([`Walk::field`]).
    fn field(&mut self, key: &str, cur: &mut Cursor<'_>) -> Option<Field> {
        let body = cur.body;
        let bit = match key {
            "model" => 0,
            "tools" => 1,
            "system" => 2,
            "metadata" => 3,
            "max_tokens" => 4,
            "messages" => 5,
            _ => return cur.value::<serde::de::IgnoredAny>().map(|_| Field::Read),
        };
        self.seen.take(bit)?;
        match bit {
            0 => self.model = cur.value::<Text>()?.map(|t| Piece::of(body, &t)),
            1 => self.tools = cur.value::<Option<&RawValue>>()?.map(|r| span_of(body, r)),
            2 => self.system = cur.value::<Option<&RawValue>>()?.map(|r| span_of(body, r)),
            3 => {
                self.user_id = cur
                    .value::<Option<Metadata>>()?
                    .and_then(|m| m.user_id)
                    .map(|t| Piece::of(body, &t))
            }
            4 => self.max_tokens = count(cur.value::<Option<&RawValue>>()?),
            // Anything but an array is read whole (the whole reading refuses it).
            _ => return (cur.peek() == Some(b'[')).then_some(Field::List),
        }
        Some(Field::Read)
    }
}

/// What the messages held, by spans of the body: what a [`Trail`] keeps for the next body.
#[derive(Debug, Default, Clone)]
pub(crate) struct Found {
    /// The top-level fields before `messages` (a resumed walk starts after them).
    head: Top,
    gathered: Gathered,
    /// The first user message: its number and its parts, for the session's root.
    first_user: Option<(usize, Vec<Piece>)>,
}

impl Found {
    /// What had been found before `mark`.
    fn before(&self, mark: &Mark) -> Found {
        Found {
            head: self.head.clone(),
            gathered: self.gathered.before(mark.counts),
            first_user: self
                .first_user
                .clone()
                .filter(|(item, _)| *item < mark.messages),
        }
    }
}

/// Messages read so far: what was found, and the tool calls' names by id.
pub(crate) struct Reading<'a> {
    body: &'a str,
    top: Top,
    found: Found,
    names: Names<'a>,
}

impl<'a> Reading<'a> {
    fn new(body: &'a str) -> Self {
        Reading {
            body,
            top: Top::default(),
            found: Found::default(),
            names: Names::default(),
        }
    }

    /// Carries on from what an earlier body had found before `mark` (its bytes up to there are
    /// this body's).
    fn resumed(body: &'a str, trail: &Found, mark: &Mark) -> Self {
        let found = trail.before(mark);
        let names = found.gathered.names(body);
        Reading {
            body,
            top: found.head.clone(),
            found,
            names,
        }
    }

    /// Message number `item`.
    fn message(&mut self, item: usize, message: &Message<'a>) {
        let body = self.body;
        let role = message.role.as_deref();
        let blocks = match &message.content {
            Some(Content::Blocks(blocks)) => blocks.as_slice(),
            _ => &[],
        };
        for block in blocks.iter().filter(|b| b.valid) {
            match (role, block.kind.as_deref()) {
                (Some("assistant"), Some("tool_use" | "server_tool_use")) => {
                    if let (Some(id), Some(name)) = (&block.id, &block.name) {
                        self.found.gathered.call(
                            body,
                            &mut self.names,
                            id.0.clone(),
                            name.0.clone(),
                        );
                    }
                }
                (Some("user"), Some("tool_result")) => {
                    if let (Some(id), Some(content)) = (&block.tool_use_id, block.content) {
                        let slot = block.slot(body);
                        self.found
                            .gathered
                            .result(body, &self.names, item, id, content, slot);
                    }
                }
                (Some("user"), Some("image")) => {
                    // The image part whole: read again (an image part is one small object
                    // around its data; the scan is the price of not keeping every block's).
                    let part = block
                        .text(body)
                        .and_then(|t| serde_json::from_str::<&RawValue>(t).ok());
                    if let Some(part) = part {
                        self.found.gathered.image(body, item, part, None);
                    }
                }
                _ => {}
            }
        }
        // The first user message as its blocks or its text (a session fingerprint: what matters
        // is that a conversation's every turn gives the same parts).
        if self.found.first_user.is_none() && role == Some("user") {
            let parts = match &message.content {
                Some(Content::Blocks(blocks)) => blocks
                    .iter()
                    .map(|b| Piece::of(body, b.text(body).unwrap_or_default()))
                    .collect(),
                Some(Content::Text(text)) => vec![Piece::of(body, text)],
                Some(Content::Other) | None => Vec::new(),
            };
            self.found.first_user = Some((item, parts));
        }
    }
}

/// The view of `body` from what its reading found.
fn view<'a>(body: &'a str, found: &Found, top: &Top) -> RequestView<'a> {
    let text = |p: &Option<Piece>| p.as_ref().map(|p| p.text(body));
    let mut root: Vec<Cow<str>> = top
        .system
        .map(|s| Cow::Borrowed(resume::at(body, s)))
        .into_iter()
        .collect();
    if let Some((_, parts)) = &found.first_user {
        root.extend(parts.iter().map(|p| p.text(body)));
    }
    RequestView {
        tools: top.tools.map(|s| Raw::read_before(resume::at(body, s))),
        conversation: text(&top.user_id),
        root,
        body,
        shapes: &crate::dialect::render::Classic::AnthropicMessages,
        max_output: top.max_tokens,
        model: text(&top.model),
        tool_results: found.gathered.tool_results(body),
        user_images: found.gathered.user_images(body),
    }
}

impl<'a> Walk<'a> for Reading<'a> {
    type Found = Found;
    type Element = Message<'a>;

    fn start(body: &'a str) -> Self {
        Reading::new(body)
    }

    fn resume(body: &'a str, found: &Found, mark: &Mark) -> Self {
        Reading::resumed(body, found, mark)
    }

    fn field(&mut self, key: &str, cur: &mut Cursor<'a>) -> Option<Field> {
        self.top.field(key, cur)
    }

    fn list_opened(&mut self) {
        self.found.head = self.top.clone();
    }

    fn element(&mut self, n: usize, message: &Message<'a>) {
        self.message(n, message);
    }

    fn counts(&self) -> [usize; 3] {
        self.found.gathered.counts()
    }

    fn finish(self) -> (RequestView<'a>, Found) {
        (view(self.body, &self.found, &self.top), self.found)
    }
}

impl Kept for Found {
    fn weight(&self) -> usize {
        let pieces = |p: &[Piece]| p.iter().map(Piece::weight).sum::<usize>();
        self.gathered.weight() + self.first_user.as_ref().map_or(0, |(_, p)| pieces(p))
    }

    fn table(resumes: &Resumes) -> &Table<Self> {
        &resumes.anthropic
    }
}
