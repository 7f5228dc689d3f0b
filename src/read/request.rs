//! The request side of the read tool: where `tools`, `tool_choice` and the history stand in a
//! body, and the edits that add the tool (C1), append a round (C2), force an answer at the step
//! limit, and splice earlier hidden rounds back in (C3). Edits are byte splices, so everything
//! else stays as the client sent it.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::dialect::{elements, elements_in, span_in, span_of, Dialect};
use crate::projection::{Edit, Span};

#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_choice: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Option<&'a RawValue>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
}

/// Where the parts the read tool edits stand in one request body.
pub struct Shape<'a> {
    body: &'a str,
    tools: Option<(Span, Vec<&'a RawValue>)>,
    tool_choice: Option<Span>,
    /// `messages` (chat, Anthropic) or `input` (Responses), when it is an array; split into
    /// items only when asked (adding the tool needs no second pass over a long history).
    history: Option<&'a RawValue>,
    /// A Responses `input` given as a plain string.
    string_input: Option<&'a RawValue>,
    /// Where a new top-level member goes: just before the closing brace.
    end: usize,
    /// Whether the object already has a member (a new one needs a comma).
    has_members: bool,
}

impl<'a> Shape<'a> {
    /// Reads `body`; `None` when it is not a JSON object of the expected shape (the read tool is
    /// then not offered, and the request goes on as projected).
    pub fn read(dialect: Dialect, body: &'a [u8]) -> Option<Shape<'a>> {
        let body = std::str::from_utf8(body).ok()?;
        let top: Top = serde_json::from_str(body).ok()?;
        let end = body.trim_end().strip_suffix('}')?.len();
        let has_members = !body[..end]
            .trim_start()
            .trim_start_matches('{')
            .trim()
            .is_empty();
        let list = |raw: &'a RawValue| elements(raw).map(|e| (span_of(body, raw), e));
        let (history, string_input) = match dialect {
            Dialect::OpenAiResponses => match top.input {
                Some(raw) if raw.get().starts_with('"') => (None, Some(raw)),
                other => (other, None),
            },
            _ => (top.messages, None),
        };
        Some(Shape {
            body,
            tools: top.tools.and_then(list),
            tool_choice: top.tool_choice.map(|raw| span_of(body, raw)),
            history,
            string_input,
            end,
            has_members,
        })
    }

    /// The shape as far as adding the tool needs it, from the view the request was read into
    /// (no second pass over the body).
    pub fn of_view(view: &crate::projection::RequestView<'a>) -> Option<Shape<'a>> {
        let body = view.body;
        let end = body.trim_end().strip_suffix('}')?.len();
        let has_members = !body[..end]
            .trim_start()
            .trim_start_matches('{')
            .trim()
            .is_empty();
        Some(Shape {
            body,
            tools: view
                .tools
                .and_then(|raw| elements_in(raw.get()).map(|e| (span_in(body, raw.get()), e))),
            tool_choice: None,
            history: None,
            string_input: None,
            end,
            has_members,
        })
    }

    /// The history's items and the span of the whole list.
    pub fn history(&self) -> Option<(Span, Vec<&'a RawValue>)> {
        let raw = self.history?;
        Some((span_of(self.body, raw), elements(raw)?))
    }

    /// The last item of the history as JSON (a string input as the user message it is).
    pub fn last_item(&self) -> Option<serde_json::Value> {
        if let Some(raw) = self.string_input {
            return Some(
                serde_json::json!({"role": "user", "content": serde_json::from_str::<serde_json::Value>(raw.get()).ok()?}),
            );
        }
        let (_, list) = self.history()?;
        serde_json::from_str(list.last()?.get()).ok()
    }

    /// The names of the client's own tools.
    pub fn tool_names(&self, dialect: Dialect) -> Vec<String> {
        #[derive(Deserialize)]
        struct Named {
            name: Option<String>,
            function: Option<Box<Named>>,
            custom: Option<Box<Named>>,
        }
        let Some((_, tools)) = &self.tools else {
            return Vec::new();
        };
        tools
            .iter()
            .filter_map(|raw| serde_json::from_str::<Named>(raw.get()).ok())
            .filter_map(|t| match dialect {
                Dialect::OpenAiChat => t.function.or(t.custom).and_then(|f| f.name),
                _ => t.name,
            })
            .collect()
    }

    /// Adds `definition` as the last tool (C1).
    pub fn add_tool(&self, definition: &str) -> Edit {
        match &self.tools {
            Some((span, tools)) if tools.is_empty() => Edit {
                span: *span,
                with: format!("[{definition}]").into(),
            },
            Some((span, _)) => insert(span.end - 1, format!(",{definition}")),
            // First in the object: a client that sends no tools gets the same bytes before
            // its history on every turn (its requests stay byte-prefixes of each other).
            None => {
                let at = self.body.find('{').map_or(0, |i| i + 1);
                let comma = if self.has_members { "," } else { "" };
                insert(at, format!(r#""tools":[{definition}]{comma}"#))
            }
        }
    }

    /// Sets `tool_choice` so the model must answer in text (the last round, C2).
    pub fn force_answer(&self, dialect: Dialect) -> Edit {
        let none = match dialect {
            Dialect::AnthropicMessages => r#"{"type":"none"}"#,
            _ => r#""none""#,
        };
        match self.tool_choice {
            Some(span) => Edit {
                span,
                with: none.into(),
            },
            None => self.member("tool_choice", none),
        }
    }

    /// Appends `items` (JSON values joined by commas) to the end of the history (C2).
    pub fn append(&self, items: &str) -> Option<Edit> {
        if let Some(raw) = self.string_input {
            // A Responses string input is one user message; the items follow it.
            return Some(Edit {
                span: span_of(self.body, raw),
                with: format!(r#"[{{"role":"user","content":{}}},{items}]"#, raw.get()).into(),
            });
        }
        let raw = self.history?;
        let span = span_of(self.body, raw);
        let empty = raw.get()[1..].trim_start().starts_with(']');
        if !raw.get().starts_with('[') {
            return None;
        }
        Some(if empty {
            Edit {
                span,
                with: format!("[{items}]").into(),
            }
        } else {
            insert(span.end - 1, format!(",{items}"))
        })
    }

    /// A new top-level member, inserted before the closing brace.
    fn member(&self, key: &str, value: &str) -> Edit {
        let comma = if self.has_members { "," } else { "" };
        insert(self.end, format!(r#"{comma}"{key}":{value}"#))
    }
}

fn insert(at: usize, with: String) -> Edit {
    Edit {
        span: Span { start: at, end: at },
        with: with.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::splice;
    use bytes::Bytes;
    use serde_json::Value;

    fn apply(body: &str, edits: Vec<Edit>) -> Value {
        let out = splice(&Bytes::copy_from_slice(body.as_bytes()), edits).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn adds_the_tool_last_or_creates_the_list() {
        let body =
            r#"{"model":"m","tools":[{"type":"function","function":{"name":"ls"}}],"messages":[]}"#;
        let shape = Shape::read(Dialect::OpenAiChat, body.as_bytes()).unwrap();
        assert_eq!(shape.tool_names(Dialect::OpenAiChat), ["ls"]);
        let v = apply(body, vec![shape.add_tool(r#"{"x":1}"#)]);
        assert_eq!(v["tools"][1]["x"], 1);
        let body = r#"{"model":"m", "messages":[{"role":"user","content":"hi"}] }  "#;
        let shape = Shape::read(Dialect::OpenAiChat, body.as_bytes()).unwrap();
        let v = apply(
            body,
            vec![
                shape.add_tool(r#"{"x":1}"#),
                shape.force_answer(Dialect::OpenAiChat),
                shape
                    .append(r#"{"role":"assistant","content":"a"}"#)
                    .unwrap(),
            ],
        );
        assert_eq!(v["tools"][0]["x"], 1);
        assert_eq!(v["tool_choice"], "none");
        assert_eq!(v["messages"][1]["content"], "a");
        let body = r#"{"tools":[]}"#;
        let shape = Shape::read(Dialect::AnthropicMessages, body.as_bytes()).unwrap();
        let v = apply(body, vec![shape.add_tool("2")]);
        assert_eq!(v["tools"], serde_json::json!([2]));
    }

    #[test]
    fn a_string_input_becomes_a_user_message_before_the_round() {
        let body = r#"{"model":"m","input":"hello","tool_choice":"auto"}"#;
        let shape = Shape::read(Dialect::OpenAiResponses, body.as_bytes()).unwrap();
        let v = apply(
            body,
            vec![
                shape.append(r#"{"type":"x"}"#).unwrap(),
                shape.force_answer(Dialect::OpenAiResponses),
            ],
        );
        assert_eq!(v["input"][0]["content"], "hello");
        assert_eq!(v["input"][1]["type"], "x");
        assert_eq!(v["tool_choice"], "none");
    }

    #[test]
    fn anthropic_forces_an_answer_with_its_own_shape() {
        let body = r#"{"messages":[]}"#;
        let shape = Shape::read(Dialect::AnthropicMessages, body.as_bytes()).unwrap();
        let v = apply(body, vec![shape.force_answer(Dialect::AnthropicMessages)]);
        assert_eq!(v["tool_choice"]["type"], "none");
    }
}
