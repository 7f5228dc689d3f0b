//! OpenAI Responses (`POST /v1/responses`): `function_call_output` items are tool results;
//! `input_image` parts of user messages are user images. A string `input` holds neither.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::gathered::{Gathered, Names};
use super::resume::{self, Cursor, Field, Kept, Mark, Piece, Resumes, Seen, Table, Walk};
use super::{count, elements, span_of, Text};
use crate::projection::{Raw, RequestView, Span};

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    model: Text<'a>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    #[serde(borrow)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_cache_key: Text<'a>,
    #[serde(borrow)]
    max_output_tokens: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub(super) struct Item<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
    #[serde(borrow)]
    role: Text<'a>,
    #[serde(borrow)]
    call_id: Text<'a>,
    #[serde(borrow)]
    name: Text<'a>,
    #[serde(borrow)]
    output: Option<&'a RawValue>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, rename = "type")]
    kind: Text<'a>,
}

pub(super) fn read(body: &str) -> Result<RequestView<'_>, serde_json::Error> {
    let request: Request = serde_json::from_str(body)?;
    let items: Vec<Item> = match request.input {
        Some(raw) if raw.get().starts_with('[') => serde_json::from_str(raw.get())?,
        _ => Vec::new(),
    };
    let mut reading = Reading::new(body);
    for (index, item) in items.iter().enumerate() {
        reading.item(index, item);
    }
    reading.top = Top {
        model: request.model.as_ref().map(|t| Piece::of(body, t)),
        tools: request.tools.map(|r| span_of(body, r)),
        input_text: request
            .input
            .filter(|raw| raw.get().starts_with('"'))
            .map(|r| span_of(body, r)),
        instructions: request.instructions.map(|r| span_of(body, r)),
        prompt_cache_key: request
            .prompt_cache_key
            .as_ref()
            .map(|t| Piece::of(body, t)),
        max_output: count(request.max_output_tokens),
        seen: Seen::default(),
    };
    Ok(reading.finish().0)
}

/// The top-level fields the view reads, found so far.
#[derive(Debug, Default, Clone)]
struct Top {
    model: Option<Piece>,
    tools: Option<Span>,
    /// `input` when it is a string (it holds no items then).
    input_text: Option<Span>,
    instructions: Option<Span>,
    prompt_cache_key: Option<Piece>,
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
            "input" => 2,
            "instructions" => 3,
            "prompt_cache_key" => 4,
            "max_output_tokens" => 5,
            _ => return cur.value::<serde::de::IgnoredAny>().map(|_| Field::Read),
        };
        self.seen.take(bit)?;
        fn raw<'a>(cur: &mut Cursor<'a>) -> Option<Option<&'a RawValue>> {
            cur.value()
        }
        match bit {
            0 => self.model = cur.value::<Text>()?.map(|t| Piece::of(body, &t)),
            1 => self.tools = raw(cur)?.map(|r| span_of(body, r)),
            2 if cur.peek() == Some(b'[') => return Some(Field::List),
            2 => {
                self.input_text = raw(cur)?
                    .filter(|r| r.get().starts_with('"'))
                    .map(|r| span_of(body, r))
            }
            3 => self.instructions = raw(cur)?.map(|r| span_of(body, r)),
            4 => self.prompt_cache_key = cur.value::<Text>()?.map(|t| Piece::of(body, &t)),
            _ => self.max_output = count(raw(cur)?),
        }
        Some(Field::Read)
    }
}

/// What the input items held, by spans: what a trail keeps for the next body.
#[derive(Debug, Default, Clone)]
pub(super) struct Found {
    head: Top,
    gathered: Gathered,
    /// The first user item: its number and content.
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

    fn item(&mut self, index: usize, item: &Item<'a>) {
        let body = self.body;
        match (item.kind.as_deref(), item.role.as_deref()) {
            (Some("function_call" | "custom_tool_call"), _) => {
                if let (Some(id), Some(name)) = (&item.call_id, &item.name) {
                    self.found
                        .gathered
                        .call(body, &mut self.names, id.0.clone(), name.0.clone());
                }
            }
            (Some("function_call_output" | "custom_tool_call_output"), _) => {
                if let (Some(id), Some(output)) = (&item.call_id, item.output) {
                    self.found
                        .gathered
                        .result(body, &self.names, index, id, output, None);
                }
            }
            (None | Some("message"), Some("user")) => {
                for part in item.content.and_then(elements).into_iter().flatten() {
                    let Ok(p) = serde_json::from_str::<Part>(part.get()) else {
                        continue;
                    };
                    if p.kind.as_deref() == Some("input_image") {
                        self.found.gathered.image(body, index, part, None);
                    }
                }
            }
            _ => {}
        }
        if self.found.first_user.is_none() && item.role.as_deref() == Some("user") {
            self.found.first_user = Some((index, item.content.map(|c| span_of(body, c))));
        }
    }
}

impl<'a> Walk<'a> for Reading<'a> {
    type Found = Found;
    type Element = Item<'a>;

    fn start(body: &'a str) -> Self {
        Reading::new(body)
    }

    fn resume(body: &'a str, found: &Found, mark: &Mark) -> Self {
        let found = Found {
            head: found.head.clone(),
            gathered: found.gathered.before(mark.counts),
            first_user: found.first_user.filter(|(item, _)| *item < mark.messages),
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

    fn element(&mut self, n: usize, item: &Item<'a>) {
        self.item(n, item);
    }

    fn counts(&self) -> [usize; 3] {
        self.found.gathered.counts()
    }

    fn finish(self) -> (RequestView<'a>, Found) {
        let body = self.body;
        let (f, top) = (&self.found, &self.top);
        let first_user = match top.input_text {
            Some(text) => Some(text),
            None => f.first_user.and_then(|(_, content)| content),
        };
        let root = [top.instructions, first_user]
            .into_iter()
            .flatten()
            .map(|span| Cow::Borrowed(resume::at(body, span)))
            .collect();
        let view = RequestView {
            tools: top.tools.map(|s| Raw::read_before(resume::at(body, s))),
            conversation: top.prompt_cache_key.as_ref().map(|p| p.text(body)),
            root,
            body,
            shapes: &super::render::Classic::OpenAiResponses,
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
        &resumes.responses
    }
}

mod wire;
pub(crate) use wire::Responses;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::resume::{
        conversation_bodies, walk, walked_as_whole, Text as Checked, Trail,
    };
    use proptest::prelude::*;

    #[test]
    fn reads_function_call_outputs() {
        let body = r#"{"model":"gpt-5","input":[
            {"role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"https://x/y.png"}]},
            {"type":"function_call","call_id":"f1","name":"screenshot","arguments":"{}"},
            {"type":"function_call_output","call_id":"f1","output":[{"type":"input_text","text":"ok"}]}
        ],"stream":false}"#;
        let view = read(body).unwrap();
        let r = &view.tool_results[0];
        assert_eq!(r.tool_name.as_deref(), Some("screenshot"));
        assert!(body[r.span.start..r.span.end].starts_with(r#"[{"type":"input_text""#));
        assert_eq!(view.user_images.len(), 1);
    }

    #[test]
    fn string_input_has_nothing_to_project() {
        let view = read(r#"{"model":"gpt-5","input":"hello"}"#).unwrap();
        assert!(view.tool_results.is_empty());
    }

    /// One input item of a generated Responses conversation: kind `k % 6`, numbered `n`.
    fn item(k: u8, n: usize, marked: bool) -> String {
        let mark = if marked {
            r#","status":"completed""#
        } else {
            ""
        };
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
                r#"{{"type":"function_call","call_id":{id},"name":"shell","arguments":"{{}}"{mark}}}"#
            ),
            2 => format!(
                r#"{{"type":"function_call_output","call_id":{id},"output":"out {n}"{mark}}}"#
            ),
            3 => format!(
                r#"{{"type":"message","role":"user","content":[{{"type":"input_text","text":"see"}},{{"type":"input_image","image_url":"data:image/png;base64,QUJD{n}"}}]{mark}}}"#
            ),
            4 => format!(r#"{{"type":"reasoning","summary":[]{mark}}}"#),
            _ => format!(
                r#"{{ "content" : [{{"type":"output_text","text":"{n}"}}], "role" : "assistant"{mark} }}"#
            ),
        }
    }

    fn conversation(items: &[String], before: usize, model: u8, odd: u8) -> String {
        let ws = ["", " ", "\n  "][usize::from(model) % 3];
        let mut fields = vec![
            format!(r#""model":{ws}"gpt-{model}""#),
            r#""instructions":"be brief""#.to_string(),
            r#""prompt_cache_key":"k\"1""#.to_string(),
            r#""max_output_tokens":100"#.to_string(),
            r#""tools":[{"type":"function","name":"shell"}]"#.to_string(),
            r#""stream":true"#.to_string(),
        ];
        match odd % 8 {
            0 => fields.push(r#""max_output_tokens":7"#.to_string()),
            1 => fields.push(r#""input":[]"#.to_string()),
            2 => fields.push(r#""model":5"#.to_string()),
            3 => fields.push(r#""extra":[1,2,}"#.to_string()),
            _ => {}
        }
        let input = if odd % 8 == 5 {
            r#""input":"just text""#.to_string()
        } else {
            format!(r#""input":{ws}[{ws}{}{ws}]"#, items.join(&format!(",{ws}")))
        };
        fields.insert(before.min(fields.len()), input);
        let tail = if odd % 8 == 4 { " x" } else { "" };
        format!("{{{ws}{}{ws}}}{tail}", fields.join(","))
    }

    proptest! {
        /// The resumed view (runtime issue) of Responses bodies.
        #[test]
        fn a_resumed_walk_reads_what_a_whole_reading_reads(
            steps in prop::collection::vec((0u8..8, any::<u8>(), any::<u8>()), 1..14),
            before in 0usize..7,
        ) {
            // Odd way 5: a string input, as ordinary as an array.
            let bodies = conversation_bodies(&steps, (6, 5), item, |items, model, odd| {
                conversation(items, before, model, odd)
            });
            let walk = |t: &Checked<'_>, trail: Option<&Trail<Found>>| {
                walk::<Reading>(t, trail.and_then(|tr| Some((tr, tr.agreed(t)?)))).map(|(v, t, _)| (format!("{v:?}"), t))
            };
            let whole = |body: &str| read(body).ok().map(|v| format!("{v:?}"));
            prop_assert_eq!(walked_as_whole(&bodies, walk, whole), Ok(()));
        }
    }
}
