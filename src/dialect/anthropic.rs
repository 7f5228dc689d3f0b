//! Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): `tool_result` blocks
//! in user messages are tool results; `image` blocks in user messages are user images.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::resume::{self, Cursor, Mark, Piece, Text as Checked, Trail};
use super::{count, digest, span_of, Dialect, Text};
use crate::projection::{Raw, RequestView, Span, ToolResult, UserImage};

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    model: Text<'a>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Vec<Message<'a>>,
    #[serde(borrow)]
    system: Option<&'a RawValue>,
    #[serde(borrow)]
    metadata: Option<Metadata<'a>>,
    #[serde(borrow)]
    max_tokens: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Metadata<'a> {
    #[serde(borrow)]
    user_id: Text<'a>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Text<'a>,
    #[serde(borrow)]
    content: Option<Content<'a>>,
}

/// A message's `content`, read in the same pass as the message: its blocks, or its text. A tool
/// result's content is scanned once, as a raw value inside its block: reading the content whole,
/// then each block, then each tool result's content would scan it three times.
enum Content<'a> {
    Blocks(Vec<Block<'a>>),
    Text(Cow<'a, str>),
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<Content<'a>>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Content<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("message content")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut blocks = Vec::new();
                while let Some(block) = seq.next_element::<Block<'a>>()? {
                    blocks.push(block);
                }
                Ok(Content::Blocks(blocks))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Content::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
        }
        deserializer.deserialize_any(Visit(std::marker::PhantomData))
    }
}

/// A content block: the fields sluice reads, and where its bytes are. Anything that is not an
/// object, or an object with a field twice or of an unexpected type, is `valid: false`: left as
/// the client sent it, as the provider will read it.
#[derive(Default)]
struct Block<'a> {
    kind: Text<'a>,
    id: Text<'a>,
    name: Text<'a>,
    tool_use_id: Text<'a>,
    content: Option<&'a RawValue>,
    /// Its first key (borrowed from the body) and its last value: the object's own bytes are
    /// between them and the braces around them ([`Block::text`]).
    bounds: Option<(&'a str, &'a RawValue)>,
    valid: bool,
}

impl<'a> Block<'a> {
    /// The block's bytes as sent, `{` to `}`: only whitespace lies between a brace and its
    /// object's first key or last value (RFC 8259).
    fn text(&self, body: &'a str) -> Option<&'a str> {
        let (key, last) = self.bounds?;
        let offset = |s: &str| (s.as_ptr() as usize).checked_sub(body.as_ptr() as usize);
        // The key's opening quote, then back over whitespace to the brace.
        let before = body.get(..offset(key)?.checked_sub(1)?)?;
        let start = before.trim_end_matches([' ', '\t', '\n', '\r']);
        let start = start.len().checked_sub(1)?;
        let after_last = offset(last.get())? + last.get().len();
        let rest = body.get(after_last..)?;
        let end =
            after_last + (rest.len() - rest.trim_start_matches([' ', '\t', '\n', '\r']).len());
        (body.as_bytes().get(start) == Some(&b'{') && body.as_bytes().get(end) == Some(&b'}'))
            .then(|| body.get(start..=end))
            .flatten()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Block<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<Block<'a>>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Block<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a content block")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut block = Block {
                    valid: true,
                    ..Block::default()
                };
                let mut first_key = None;
                let mut first = true;
                // The fields read so far, one bit each.
                let mut seen = 0u8;
                while let Some(key) = map.next_key::<Key<'de>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    if first {
                        first_key = match key {
                            Key(Cow::Borrowed(k)) => Some(k),
                            Key(Cow::Owned(_)) => None,
                        };
                        first = false;
                    }
                    block.bounds = first_key.map(|k| (k, value));
                    let (bit, field) = match key.0.as_ref() {
                        "type" => (1u8, &mut block.kind),
                        "id" => (2, &mut block.id),
                        "name" => (4, &mut block.name),
                        "tool_use_id" => (8, &mut block.tool_use_id),
                        "content" => {
                            // A field twice (even after a null) leaves the block as sent.
                            block.valid &= seen & 16 == 0;
                            seen |= 16;
                            block.content = (value.get() != "null").then_some(value);
                            continue;
                        }
                        _ => continue,
                    };
                    block.valid &= seen & bit == 0;
                    seen |= bit;
                    match text_of(value) {
                        Some(text) => *field = text,
                        None => block.valid = false,
                    }
                }
                Ok(block)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Block::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Block::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Block::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Block::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Block::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Block::default())
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Block::default())
            }
        }
        deserializer.deserialize_any(Visit(std::marker::PhantomData))
    }
}

/// An object key, borrowed from the body when it has no escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Key<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<Key<'a>>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Key<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(Visit(std::marker::PhantomData))
    }
}

/// A field's text: `Some(None)` for `null`, borrowed when it has no escapes; `None` when the
/// value is not a string.
fn text_of(raw: &RawValue) -> Option<Text<'_>> {
    let raw = raw.get();
    if raw == "null" {
        return Some(None);
    }
    if !raw.starts_with('"') {
        return None;
    }
    match raw.get(1..raw.len() - 1) {
        Some(inner) if !inner.contains('\\') => Some(Some(Cow::Borrowed(inner))),
        _ => serde_json::from_str::<String>(raw)
            .ok()
            .map(|s| Some(Cow::Owned(s))),
    }
}

pub(super) fn read(body: &str) -> Result<RequestView<'_>, serde_json::Error> {
    let request: Request = serde_json::from_str(body)?;
    let mut reading = Reading::new(body);
    for (item, message) in request.messages.iter().enumerate() {
        reading.message(item, message);
    }
    let top = Top {
        model: request.model.as_ref().map(|t| Piece::of(body, t)),
        tools: request.tools.map(|r| span_of(body, r)),
        system: request.system.map(|r| span_of(body, r)),
        user_id: request
            .metadata
            .and_then(|m| m.user_id)
            .map(|t| Piece::of(body, &t)),
        max_tokens: count(request.max_tokens),
        seen: 0,
    };
    Ok(view(body, &reading.found, &top))
}

/// The fields of the request's top-level object that the view reads, found so far.
#[derive(Debug, Default, Clone)]
struct Top {
    model: Option<Piece>,
    tools: Option<Span>,
    system: Option<Span>,
    user_id: Option<Piece>,
    max_tokens: Option<u64>,
    /// The fields read so far, one bit each (a walk that meets one twice gives up).
    seen: u8,
}

impl Top {
    /// Reads the value of the field `key` at the cursor; `None` where the whole reading would
    /// fail or read it differently.
    fn field(&mut self, key: &str, cur: &mut Cursor<'_>) -> Option<()> {
        let body = cur.body;
        let bit = match key {
            "model" => 1,
            "tools" => 2,
            "system" => 4,
            "metadata" => 8,
            "max_tokens" => 16,
            "messages" => 32,
            _ => return cur.value::<serde::de::IgnoredAny>().map(drop),
        };
        if self.seen & bit != 0 {
            return None;
        }
        self.seen |= bit;
        match bit {
            1 => self.model = cur.value::<Text>()?.map(|t| Piece::of(body, &t)),
            2 => self.tools = cur.value::<Option<&RawValue>>()?.map(|r| span_of(body, r)),
            4 => self.system = cur.value::<Option<&RawValue>>()?.map(|r| span_of(body, r)),
            8 => {
                self.user_id = cur
                    .value::<Option<Metadata>>()?
                    .and_then(|m| m.user_id)
                    .map(|t| Piece::of(body, &t))
            }
            16 => self.max_tokens = count(cur.value::<Option<&RawValue>>()?),
            _ => {}
        }
        Some(())
    }
}

/// A tool result found, by span.
#[derive(Debug, Clone)]
struct Kept {
    item: usize,
    source: Piece,
    tool_name: Option<Piece>,
    span: Span,
    digest: u128,
}

/// What the messages held, by spans of the body: what a [`Trail`] keeps for the next body.
#[derive(Debug, Default, Clone)]
pub(super) struct Found {
    /// The top-level fields before `messages` (a resumed walk starts after them).
    head: Top,
    /// Each tool call: its id and its tool's name.
    calls: Vec<(Piece, Piece)>,
    results: Vec<Kept>,
    images: Vec<(usize, Span)>,
    /// The first user message: its number and its parts, for the session's root.
    first_user: Option<(usize, Vec<Piece>)>,
}

impl Found {
    /// What had been found before `mark`.
    fn before(&self, mark: &Mark) -> Found {
        let [calls, results, images] = mark.counts;
        Found {
            head: self.head.clone(),
            calls: self.calls.get(..calls).unwrap_or_default().to_vec(),
            results: self.results.get(..results).unwrap_or_default().to_vec(),
            images: self.images.get(..images).unwrap_or_default().to_vec(),
            first_user: self
                .first_user
                .clone()
                .filter(|(item, _)| *item < mark.messages),
        }
    }

    /// Bytes it takes, roughly (the table's weigher).
    pub(super) fn weight(&self) -> usize {
        let pieces = |p: &[Piece]| p.iter().map(Piece::weight).sum::<usize>();
        self.calls
            .iter()
            .map(|(a, b)| a.weight() + b.weight())
            .sum::<usize>()
            + self
                .results
                .iter()
                .map(|k| 48 + k.source.weight())
                .sum::<usize>()
            + self.images.len() * 24
            + self.first_user.as_ref().map_or(0, |(_, p)| pieces(p))
    }
}

/// Messages read so far: what was found, and the tool calls' names by id.
struct Reading<'a> {
    body: &'a str,
    found: Found,
    names: HashMap<Cow<'a, str>, Cow<'a, str>>,
}

impl<'a> Reading<'a> {
    fn new(body: &'a str) -> Self {
        Reading {
            body,
            found: Found::default(),
            names: HashMap::new(),
        }
    }

    /// Carries on from what an earlier body had found before `mark` (its bytes up to there are
    /// this body's).
    fn resumed(body: &'a str, trail: &Found, mark: &Mark) -> Self {
        let found = trail.before(mark);
        let names = found
            .calls
            .iter()
            .map(|(id, name)| (id.text(body), name.text(body)))
            .collect();
        Reading { body, found, names }
    }

    fn counts(&self) -> [usize; 3] {
        let f = &self.found;
        [f.calls.len(), f.results.len(), f.images.len()]
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
                        self.found
                            .calls
                            .push((Piece::of(body, id), Piece::of(body, name)));
                        self.names.insert(id.clone(), name.clone());
                    }
                }
                (Some("user"), Some("tool_result")) => {
                    if let (Some(id), Some(content)) = (&block.tool_use_id, block.content) {
                        self.found.results.push(Kept {
                            item,
                            tool_name: self.names.get(id).map(|n| Piece::of(body, n)),
                            source: Piece::of(body, id),
                            span: span_of(body, content),
                            digest: digest(content.get()),
                        });
                    }
                }
                (Some("user"), Some("image")) => {
                    // The image part whole: read again (an image part is one small object
                    // around its data; the scan is the price of not keeping every block's).
                    let part = block
                        .text(body)
                        .and_then(|t| serde_json::from_str::<&RawValue>(t).ok());
                    if let Some(part) = part {
                        self.found.images.push((item, span_of(body, part)));
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
        shapes: &Dialect::AnthropicMessages,
        max_output: top.max_tokens,
        model: text(&top.model),
        tool_results: found
            .results
            .iter()
            .map(|k| ToolResult {
                item: k.item,
                source: k.source.text(body),
                tool_name: text(&k.tool_name),
                content: Raw::read_before(resume::at(body, k.span)),
                span: k.span,
                digest: k.digest,
            })
            .collect(),
        user_images: found
            .images
            .iter()
            .map(|&(item, span)| UserImage {
                item,
                part: Raw::read_before(resume::at(body, span)),
                span,
            })
            .collect(),
    }
}

/// Reads `body` by walking it, from the last mark of `trail` its bytes agree with (else from
/// the start), leaving a trail for the next body; also says where it resumed (0: from the
/// start). `None` where the walk meets what it does not expect: the caller reads the body
/// whole, which gives the view or the error as for any body.
pub(super) fn walk<'a>(
    body: &Checked<'a>,
    trail: Option<&Trail<Found>>,
) -> Option<(RequestView<'a>, Trail<Found>, usize)> {
    let text = body.text;
    let mut cur = Cursor { body: text, at: 0 };
    let mut marks = Vec::new();
    let agreed = trail.and_then(|t| Some((t, t.agreed(body)?)));
    let mut first = agreed.is_none();
    let resumed_at = agreed.as_ref().map_or(0, |(_, mark)| mark.at);
    let (mut reading, mut top) = match agreed {
        Some((trail, mark)) => {
            let mut reading = Reading::resumed(text, &trail.found, &mark);
            marks.extend(trail.marks.iter().take_while(|m| m.at <= mark.at));
            cur.at = mark.at;
            messages_from(&mut cur, &mut reading, &mut marks, mark.messages)?;
            (reading, trail.found.head.clone())
        }
        None => {
            if !cur.eat(b'{') {
                return None;
            }
            (Reading::new(text), Top::default())
        }
    };
    // The top-level object's fields, from the start or from the end of `messages`.
    loop {
        if cur.eat(b'}') {
            break;
        }
        if !first && !cur.eat(b',') {
            return None;
        }
        first = false;
        let key: Key = cur.value()?;
        if !cur.eat(b':') {
            return None;
        }
        top.field(&key.0, &mut cur)?;
        if key.0 == "messages" {
            reading.found.head = top.clone();
            if !cur.eat(b'[') {
                return None;
            }
            marks.push(Mark::at(text, cur.at, 0, reading.counts())?);
            messages_from(&mut cur, &mut reading, &mut marks, 0)?;
        }
    }
    if !cur.at_end() {
        return None;
    }
    let view = view(text, &reading.found, &top);
    let trail = Trail {
        blocks: body.blocks.clone(),
        marks,
        found: reading.found,
    };
    Some((view, trail, resumed_at))
}

/// Walks the message array from after its `[` or after element number `n` - 1, to after its `]`.
fn messages_from<'a>(
    cur: &mut Cursor<'a>,
    reading: &mut Reading<'a>,
    marks: &mut Vec<Mark>,
    mut n: usize,
) -> Option<()> {
    loop {
        if cur.eat(b']') {
            return Some(());
        }
        if n > 0 && !cur.eat(b',') {
            return None;
        }
        let message: Message = cur.value()?;
        reading.message(n, &message);
        n += 1;
        marks.push(Mark::at(cur.body, cur.at, n, reading.counts())?);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::span_in;
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
                            let name = names.get(id.as_ref()).cloned();
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
            let mut kinds: Vec<u8> = Vec::new();
            let mut cached = None;
            let mut trail: Option<Trail<Found>> = None;
            let mut model = 0u8;
            for (op, k, odd) in steps {
                match op {
                    0..=3 => kinds.push(k),
                    // The client's cache marker moves to the last message (it changes bytes
                    // an earlier body had).
                    4 => cached = kinds.len().checked_sub(1),
                    5 => model = model.wrapping_add(1),
                    // The history's start changes: no mark agrees.
                    6 => if let Some(first) = kinds.first_mut() { *first = first.wrapping_add(1) },
                    _ => {}
                }
                let odd = if op == 7 { odd % 5 } else { 7 };
                let messages: Vec<String> = kinds
                    .iter()
                    .enumerate()
                    .map(|(n, &k)| message(k, n, cached == Some(n)))
                    .collect();
                let body = conversation(&messages, before, model, odd);
                let whole = read(&body);
                if let Some((view, ..)) = walk(&checked(&body), None) {
                    prop_assert_eq!(format!("{view:?}"), format!("{:?}", whole.as_ref().unwrap()));
                }
                match walk(&checked(&body), trail.as_ref()) {
                    Some((view, next, _)) => {
                        prop_assert_eq!(format!("{view:?}"), format!("{:?}", whole.as_ref().unwrap()));
                        trail = Some(next);
                    }
                    None => prop_assert!(odd < 7, "an ordinary body was not walked: {}", body),
                }
            }
        }
    }

    #[test]
    fn a_longer_body_resumes_after_the_messages_it_shares() {
        // Kinds 1 to 4: messages that carry the cache marker when asked to.
        let messages: Vec<String> = (0..6)
            .map(|n| message(1 + n as u8 % 4, n, n == 5))
            .collect();
        let first = conversation(&messages[..5], 1, 0, 7);
        let (_, trail, from) = walk(&checked(&first), None).unwrap();
        assert_eq!(from, 0);
        assert_eq!(trail.marks.len(), 6, "after the [ and after each message");
        // The next turn: one more message, and the cache marker moved onto it (the fifth's
        // bytes are unchanged, so every mark agrees).
        let next = conversation(&messages, 1, 0, 7);
        let mark = trail.agreed(&checked(&next)).unwrap();
        assert_eq!(mark.messages, 5);
        let (view, again, from) = walk(&checked(&next), Some(&trail)).unwrap();
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
}
