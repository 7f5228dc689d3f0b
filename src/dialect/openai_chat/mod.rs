//! OpenAI Chat Completions (`POST /v1/chat/completions`): `tool` messages are tool results;
//! `image_url` parts of `user` messages are user images.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::gathered::{Gathered, Names};
use super::resume::{self, Cursor, Field, Kept, Mark, Piece, Resumes, Seen, Table, Walk};
use super::{count, elements, span_in, span_of, Text};
use crate::projection::{Raw, RequestView, Span};

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    model: Text<'a>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Vec<Message<'a>>,
    #[serde(borrow)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    max_tokens: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub(super) struct Message<'a> {
    #[serde(borrow)]
    role: Text<'a>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_call_id: Text<'a>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<ToolCall<'a>>>,
}

#[derive(Deserialize)]
struct ToolCall<'a> {
    #[serde(borrow)]
    id: Text<'a>,
    #[serde(borrow)]
    function: Option<Named<'a>>,
    #[serde(borrow)]
    custom: Option<Named<'a>>,
}

#[derive(Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    name: Text<'a>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
}

pub(super) fn read(body: &str) -> Result<RequestView<'_>, serde_json::Error> {
    let request: Request = serde_json::from_str(body)?;
    let mut reading = Reading::new(body);
    for (item, message) in request.messages.iter().enumerate() {
        reading.message(item, message);
    }
    reading.top = Top {
        model: request.model.as_ref().map(|t| Piece::of(body, t)),
        tools: request.tools.map(|r| span_of(body, r)),
        max_output: count(request.max_completion_tokens).or(count(request.max_tokens)),
        ..Top::default()
    };
    Ok(reading.finish().0)
}

/// The top-level fields the view reads, found so far.
#[derive(Debug, Default, Clone)]
struct Top {
    model: Option<Piece>,
    tools: Option<Span>,
    max_completion_tokens: Option<u64>,
    max_tokens: Option<u64>,
    /// What the whole reading made of the two (the walk sets the two above).
    max_output: Option<u64>,
    seen: Seen,
}

impl Top {
    /// [`Walk::field`].
    fn field(&mut self, key: &str, cur: &mut Cursor<'_>) -> Option<Field> {
        let body = cur.body;
        let bit = match key {
            "model" => 0,
            "tools" => 1,
            "max_completion_tokens" => 2,
            "max_tokens" => 3,
            "messages" => 4,
            _ => return cur.value::<serde::de::IgnoredAny>().map(|_| Field::Read),
        };
        self.seen.take(bit)?;
        match bit {
            0 => self.model = cur.value::<Text>()?.map(|t| Piece::of(body, &t)),
            1 => self.tools = cur.value::<Option<&RawValue>>()?.map(|r| span_of(body, r)),
            2 => self.max_completion_tokens = count(cur.value::<Option<&RawValue>>()?),
            3 => self.max_tokens = count(cur.value::<Option<&RawValue>>()?),
            _ => return (cur.peek() == Some(b'[')).then_some(Field::List),
        }
        self.max_output = self.max_completion_tokens.or(self.max_tokens);
        Some(Field::Read)
    }
}

/// What the messages held, by spans: what a trail keeps for the next body.
#[derive(Debug, Default, Clone)]
pub(super) struct Found {
    head: Top,
    gathered: Gathered,
    /// The first system (or developer) and the first user message: their number and content.
    first_system: Option<(usize, Option<Span>)>,
    first_user: Option<(usize, Option<Span>)>,
}

pub(super) struct Reading<'a> {
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

    fn message(&mut self, item: usize, message: &Message<'a>) {
        let body = self.body;
        let content = message.content.map(|c| span_of(body, c));
        match message.role.as_deref() {
            Some("assistant") => {
                for call in message.tool_calls.iter().flatten() {
                    let name = call.function.as_ref().or(call.custom.as_ref());
                    if let (Some(id), Some(Some(name))) = (&call.id, name.map(|n| &n.name)) {
                        self.found.gathered.call(
                            body,
                            &mut self.names,
                            id.0.clone(),
                            name.0.clone(),
                        );
                    }
                }
            }
            Some("tool") => {
                if let (Some(id), Some(raw)) = (&message.tool_call_id, message.content) {
                    self.found
                        .gathered
                        .result(body, &self.names, item, id, raw, None);
                }
            }
            Some("user") => {
                // A user message right after the tool messages (where sluice itself puts a
                // turn's images, A7, and Qwen Code a tool's): its images answer with the last
                // tool result.
                let beside = item
                    .checked_sub(1)
                    .and_then(|before| self.found.gathered.result_in(before));
                for part in message.content.and_then(elements).into_iter().flatten() {
                    let Ok(p) = serde_json::from_str::<Part>(part.get()) else {
                        continue;
                    };
                    if p.kind.as_deref() == Some("image_url") {
                        self.found.gathered.image(body, item, part, beside);
                    }
                }
            }
            _ => {}
        }
        let role = message.role.as_deref();
        let f = &mut self.found;
        if f.first_system.is_none() && matches!(role, Some("system" | "developer")) {
            f.first_system = Some((item, content));
        }
        if f.first_user.is_none() && role == Some("user") {
            f.first_user = Some((item, content));
        }
    }
}

impl<'a> Walk<'a> for Reading<'a> {
    type Found = Found;
    type Element = Message<'a>;

    fn start(body: &'a str) -> Self {
        Reading::new(body)
    }

    fn resume(body: &'a str, found: &Found, mark: &Mark) -> Self {
        let before =
            |first: &Option<(usize, Option<Span>)>| first.filter(|(item, _)| *item < mark.messages);
        let found = Found {
            head: found.head.clone(),
            gathered: found.gathered.before(mark.counts),
            first_system: before(&found.first_system),
            first_user: before(&found.first_user),
        };
        let names = found.gathered.names(body);
        Reading {
            body,
            top: found.head.clone(),
            found,
            names,
        }
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
        let body = self.body;
        let (f, top) = (&self.found, &self.top);
        let root = [f.first_system, f.first_user]
            .into_iter()
            .filter_map(|first| first.and_then(|(_, content)| content))
            .map(|span| Cow::Borrowed(resume::at(body, span)))
            .collect();
        let view = RequestView {
            tools: top.tools.map(|s| Raw::read_before(resume::at(body, s))),
            conversation: None,
            root,
            body,
            shapes: &super::render::Classic::OpenAiChat,
            max_output: top.max_output,
            model: top.model.as_ref().map(|p| p.text(body)),
            tool_results: f.gathered.tool_results(body),
            user_images: f.gathered.user_images(body),
        };
        (view, self.found)
    }
}

impl Kept for Found {
    fn weight(&self) -> usize {
        self.gathered.weight()
    }

    fn table(resumes: &Resumes) -> &Table<Self> {
        &resumes.chat
    }
}

/// Each message's span and whether it is a `tool` message. A second pass over the messages,
/// made only when images must be placed after a turn's tool messages (SPEC A7).
pub fn message_spans(body: &str) -> Option<Vec<(crate::projection::Span, bool)>> {
    #[derive(Deserialize)]
    struct Messages<'a> {
        #[serde(borrow, default)]
        messages: Vec<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Role<'a> {
        #[serde(borrow)]
        role: Text<'a>,
    }
    let parsed: Messages = serde_json::from_str(body).ok()?;
    Some(
        parsed
            .messages
            .iter()
            .map(|m| {
                let role = serde_json::from_str::<Role>(m.get())
                    .ok()
                    .and_then(|r| r.role);
                (span_in(body, m.get()), role.as_deref() == Some("tool"))
            })
            .collect(),
    )
}

mod wire;
pub(crate) use wire::Chat;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::resume::{
        conversation_bodies, walk, walked_as_whole, Text as Checked, Trail,
    };
    use proptest::prelude::*;

    #[test]
    fn reads_tool_results_with_names_and_spans() {
        let body = r#"{ "messages": [
            {"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"out\nput"},
            {"role":"tool","tool_call_id":"c2","content":[{"type":"text","text":"x"}]}
        ], "model":"gpt-4o", "stream": true, "unknown": {"k": [1, 2.50]}}"#;
        let view = read(body).unwrap();
        assert_eq!(view.model.as_deref(), Some("gpt-4o"));
        assert_eq!(view.tool_results.len(), 2);
        let r = &view.tool_results[0];
        assert_eq!(
            (r.item, &*r.source, r.tool_name.as_deref()),
            (2, "c1", Some("bash"))
        );
        assert_eq!(&body[r.span.start..r.span.end], r#""out\nput""#);
        assert_eq!(view.tool_results[1].tool_name, None);
        assert_eq!(view.user_images.len(), 1);
        let img = &view.user_images[0];
        assert!(body[img.span.start..img.span.end].starts_with(r#"{"type":"image_url""#));
    }

    /// One message of a generated chat conversation: kind `k % 6`, numbered `n`.
    fn message(k: u8, n: usize, marked: bool) -> String {
        let mark = if marked { r#","x_marked":true"# } else { "" };
        let id = if k % 7 == 6 {
            format!(r#""c\u0031{n}""#)
        } else {
            format!(r#""c{n}""#)
        };
        match k % 6 {
            0 => format!(
                r#"{{"role":"user","content":"step {n}\n{}"{mark}}}"#,
                "log line\\n".repeat(300 + n)
            ),
            1 => format!(
                r#"{{"role":"assistant","content":null,"tool_calls":[{{"id":{id},"type":"function","function":{{"name":"bash","arguments":"{{}}"}}}}]{mark}}}"#
            ),
            2 => format!(r#"{{"role":"tool","tool_call_id":{id},"content":"out {n}"{mark}}}"#),
            3 => format!(
                r#"{{"role":"user","content":[{{"type":"text","text":"see"}},{{"type":"image_url","image_url":{{"url":"data:image/png;base64,QUJD{n}"}}}}]{mark}}}"#
            ),
            4 => format!(r#"{{"role":"system","content":"be brief {n}"{mark}}}"#),
            _ => format!(r#"{{ "content" : [1, {{"x":[{n}]}}], "role" : "assistant"{mark} }}"#),
        }
    }

    fn conversation(messages: &[String], before: usize, model: u8, odd: u8) -> String {
        let ws = ["", " ", "\n  "][usize::from(model) % 3];
        let mut fields = vec![
            format!(r#""model":{ws}"gpt-{model}""#),
            r#""max_tokens":100"#.to_string(),
            r#""max_completion_tokens":200"#.to_string(),
            r#""tools":[{"type":"function","function":{"name":"bash"}}]"#.to_string(),
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
        fields.insert(before.min(fields.len()), messages);
        let tail = if odd % 8 == 4 { " x" } else { "" };
        format!("{{{ws}{}{ws}}}{tail}", fields.join(","))
    }

    proptest! {
        /// The resumed view (runtime issue) of chat bodies.
        #[test]
        fn a_resumed_walk_reads_what_a_whole_reading_reads(
            steps in prop::collection::vec((0u8..8, any::<u8>(), any::<u8>()), 1..14),
            before in 0usize..6,
        ) {
            let bodies = conversation_bodies(&steps, (5, 5), message, |m, model, odd| {
                conversation(m, before, model, odd)
            });
            let walk = |t: &Checked<'_>, trail: Option<&Trail<Found>>| {
                walk::<Reading>(t, trail.and_then(|tr| Some((tr, tr.agreed(t)?)))).map(|(v, t, _)| (format!("{v:?}"), t))
            };
            let whole = |body: &str| read(body).ok().map(|v| format!("{v:?}"));
            prop_assert_eq!(walked_as_whole(&bodies, walk, whole), Ok(()));
        }
    }
}
