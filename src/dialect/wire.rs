//! The read tool's rounds in a provider's shapes (SPEC C1-C4): what each wire API implements
//! ([`Wire`]) so that `crate::read` and the gateway answer read calls, hide them and splice
//! them back without naming a provider's fields. Each provider's module implements it
//! (`anthropic/wire.rs`, `openai_chat/wire.rs`, `openai_responses/wire.rs`); the streamed
//! side is `super::stitch`.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::stitch::Events;
use super::{elements, elements_in, span_in, span_of, Dialect};
use crate::projection::artifact::ArtifactId;
use crate::projection::{Edit, Span};

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The id the call's result must name.
    pub id: String,
    pub name: String,
    /// The arguments as JSON (parsed from the string form where the dialect sends one).
    pub arguments: Value,
}

/// A read call's answer: its text, and an image or audio file to attach (C5).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub id: String,
    /// The name of the tool called (the read tool's).
    pub name: String,
    pub text: String,
    pub media: Option<Media>,
}

/// An image or audio file a read call shows again: its media type and base64 data.
#[derive(Debug, Clone, PartialEq)]
pub struct Media {
    pub mime: &'static str,
    pub base64: String,
    /// The artifact, named in the placeholder that replaces the media on later turns.
    pub artifact: ArtifactId,
}

impl Media {
    /// The audio format name of an audio file (`wav`, `mp3`); `None` for an image.
    pub fn audio_format(&self) -> Option<&'static str> {
        crate::audio::AudioType::of_mime(self.mime)?.input_format()
    }
}

/// What the model produced in one round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Output {
    /// The output as history items, exactly as they go back to the model (thinking blocks,
    /// signatures and reasoning items untouched).
    pub items: Vec<Value>,
    /// Every tool call, in order.
    pub calls: Vec<Call>,
    pub usage: Option<Value>,
}

impl Output {
    /// The read calls and whether the model also called other tools.
    pub fn read_calls(&self, read: &str) -> (Vec<&Call>, bool) {
        let reads: Vec<&Call> = self.calls.iter().filter(|c| c.name == read).collect();
        let others = reads.len() < self.calls.len();
        (reads, others)
    }
}

/// One wire API's shapes as the read tool's rounds need them.
pub trait Wire: std::fmt::Debug + Sync {
    /// The read tool's definition: `name`, `description` and the JSON schema of its arguments.
    fn tool(&self, name: &str, description: &str, parameters: Value) -> Value;

    /// The names a client's tool definition declares.
    fn tool_names(&self, tool: &RawValue) -> Vec<String>;

    /// The request's history member (`messages`, `input`, …).
    fn history_key(&self) -> &'static str;

    /// Whether the history may be a plain string (one user message), as Responses' `input`.
    fn history_may_be_text(&self) -> bool {
        false
    }

    /// The request's tool choice member and the value that makes the model answer in text.
    fn answer_in_text(&self) -> (&'static str, &'static str);

    /// The user message a string history stands for, with `raw` (a JSON string) as its text.
    fn text_history_item(&self, raw: &str) -> String {
        format!(r#"{{"role":"user","content":{raw}}}"#)
    }

    /// A whole (non-streamed) response's round.
    fn output(&self, response: &Value) -> Output;

    /// The history items that answer read calls.
    fn results(&self, answers: &[Answer]) -> Vec<Value>;

    /// Where the last round's results go on later turns when the model also called the
    /// client's tools: `Some(blocks)` to put first in the client's next message (Anthropic,
    /// whose tool results share one user message); `None` to follow the round as items.
    fn results_first_in_next(&self, _answers: &[Answer]) -> Option<Vec<Value>> {
        None
    }

    /// What the client is shown of `rounds`: everything but the read calls, as the history
    /// items it will send back.
    fn visible(&self, rounds: &[Output], read: &str) -> Vec<Value>;

    /// Writes `shown` (from [`Wire::visible`]) and the usage of all rounds into the last
    /// round's response.
    fn show(&self, last: &mut Value, shown: Vec<Value>, usage: Option<Value>);

    /// The text and tool-call ids of one history item, as they survive the client's round trip
    /// (whatever else the client re-serialises differently), appended to `out`.
    fn item_text(&self, item: &Value, out: &mut String);

    /// Whether a history item is one the model produced (where a link can start), read
    /// without parsing its content.
    fn is_model_item(&self, raw: &RawValue) -> bool;

    /// The edit that puts `prefix` (items joined by commas) first in the history item `next`
    /// (see [`Wire::results_first_in_next`]).
    fn put_first(&self, _body: &str, _next: &RawValue, _prefix: &str) -> Option<Edit> {
        None
    }

    /// A streamed round's events, as the stitcher reads them.
    fn events(&self) -> Box<dyn Events>;

    /// A complete answer of `text` from `model`, as the provider would send it: a whole
    /// response, or its event stream (`sluice replay`'s stub provider).
    fn answer(&self, model: &str, text: &str, streamed: bool) -> String;

    /// A token-counting endpoint's answer of `tokens`.
    fn token_count(&self, tokens: u64) -> String {
        format!(r#"{{"input_tokens":{tokens}}}"#)
    }
}

/// One SSE event's text, named or not.
pub(crate) fn event_text(name: Option<&str>, data: &Value) -> String {
    match name {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

impl Dialect {
    /// The dialect's shapes for the read tool's rounds.
    pub fn wire(self) -> &'static dyn Wire {
        match self {
            Dialect::OpenAiChat => &super::openai_chat::Chat,
            Dialect::OpenAiResponses => &super::openai_responses::Responses,
            Dialect::AnthropicMessages => &super::anthropic::Messages,
            Dialect::GeminiGenerate => &super::gemini::Gemini,
        }
    }
}

/// Adds up two `usage` objects field by field (numbers are summed, nested objects merged).
pub fn add_usage(total: &mut Value, more: &Value) {
    match (total, more) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(existing) => add_usage(existing, v),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Number(a), Value::Number(b)) => {
            if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
                *a = (x + y).into();
            } else if let (Some(x), Some(y)) = (a.as_f64(), b.as_f64()) {
                if let Some(n) = serde_json::Number::from_f64(x + y) {
                    *a = n;
                }
            }
        }
        (a, b) if a.is_null() => *a = b.clone(),
        _ => {}
    }
}

/// The usage of all rounds added up.
pub fn total_usage(rounds: &[Output]) -> Option<Value> {
    let mut total: Option<Value> = None;
    for usage in rounds.iter().filter_map(|r| r.usage.as_ref()) {
        match &mut total {
            Some(t) => add_usage(t, usage),
            None => total = Some(usage.clone()),
        }
    }
    total
}

/// The client's response: the last round's response, showing every round's visible output and
/// the usage of all rounds (C2, non-streamed).
pub fn merged(wire: &dyn Wire, mut last: Value, rounds: &[Output], read: &str) -> Value {
    let shown = wire.visible(rounds, read);
    wire.show(&mut last, shown, total_usage(rounds));
    last
}

/// A tool call's arguments as JSON: parsed where the dialect sends them as a string.
pub(crate) fn arguments(raw: &Value) -> Value {
    match raw {
        Value::String(s) => serde_json::from_str(s).unwrap_or(Value::Null),
        other => other.clone(),
    }
}

/// Where the parts the read tool edits stand in one request body: its tools, tool choice and
/// history. Edits are byte splices, so everything else stays as the client sent it.
pub struct Layout<'a> {
    wire: &'static dyn Wire,
    body: &'a str,
    tools: Option<(Span, Vec<&'a RawValue>)>,
    tool_choice: Option<Span>,
    /// The history, when it is an array; split into items only when asked (adding the tool
    /// needs no second pass over a long history).
    history: Option<&'a RawValue>,
    /// A history given as a plain string.
    string_history: Option<&'a RawValue>,
    /// Where a new top-level member goes: just before the closing brace.
    end: usize,
    /// Whether the object already has a member (a new one needs a comma).
    has_members: bool,
}

/// The top-level members of a request, as raw values.
type Members<'a> = std::collections::HashMap<std::borrow::Cow<'a, str>, &'a RawValue>;

impl<'a> Layout<'a> {
    /// Reads `body`; `None` when it is not a JSON object of the expected shape (the read tool is
    /// then not offered, and the request goes on as projected).
    pub fn read(dialect: Dialect, body: &'a [u8]) -> Option<Layout<'a>> {
        let wire = dialect.wire();
        let body = std::str::from_utf8(body).ok()?;
        let top: Members<'a> = serde_json::from_str(body).ok()?;
        let (end, has_members) = object_end(body)?;
        let list = |raw: &'a RawValue| elements(raw).map(|e| (span_of(body, raw), e));
        let history = top.get(wire.history_key()).copied();
        let (history, string_history) = match history {
            Some(raw) if wire.history_may_be_text() && raw.get().starts_with('"') => {
                (None, Some(raw))
            }
            other => (other, None),
        };
        Some(Layout {
            wire,
            body,
            tools: top.get("tools").copied().and_then(list),
            tool_choice: top
                .get(wire.answer_in_text().0)
                .map(|raw| span_of(body, raw)),
            history,
            string_history,
            end,
            has_members,
        })
    }

    /// The layout as far as adding the tool needs it, from the view the request was read into
    /// (no second pass over the body).
    pub fn of_view(dialect: Dialect, view: &crate::projection::RequestView<'a>) -> Option<Self> {
        let body = view.body;
        let (end, has_members) = object_end(body)?;
        Some(Layout {
            wire: dialect.wire(),
            body,
            tools: view
                .tools
                .and_then(|raw| elements_in(raw.get()).map(|e| (span_in(body, raw.get()), e))),
            tool_choice: None,
            history: None,
            string_history: None,
            end,
            has_members,
        })
    }

    /// The history's items and the span of the whole list.
    pub fn history(&self) -> Option<(Span, Vec<&'a RawValue>)> {
        let raw = self.history?;
        Some((span_of(self.body, raw), elements(raw)?))
    }

    /// The last item of the history as JSON (a string history as the user message it is).
    pub fn last_item(&self) -> Option<Value> {
        if let Some(raw) = self.string_history {
            return serde_json::from_str(&self.wire.text_history_item(raw.get())).ok();
        }
        let (_, list) = self.history()?;
        serde_json::from_str(list.last()?.get()).ok()
    }

    /// The names of the client's own tools.
    pub fn tool_names(&self) -> Vec<String> {
        let Some((_, tools)) = &self.tools else {
            return Vec::new();
        };
        tools.iter().flat_map(|t| self.wire.tool_names(t)).collect()
    }

    /// Adds `definition` as the last tool (C1).
    pub fn add_tool(&self, definition: &str) -> Edit {
        let listed = self.tools.as_ref().and_then(|(span, _)| {
            into_list(
                *span,
                super::resume::at(self.body, *span),
                definition,
                false,
            )
        });
        match listed {
            Some(edit) => edit,
            // First in the object: a client that sends no tools gets the same bytes before
            // its history on every turn (its requests stay byte-prefixes of each other).
            None => {
                let at = self.body.find('{').map_or(0, |i| i + 1);
                let comma = if self.has_members { "," } else { "" };
                insert(at, format!(r#""tools":[{definition}]{comma}"#))
            }
        }
    }

    /// Sets the tool choice so the model must answer in text (the last round, C2).
    pub fn force_answer(&self) -> Edit {
        let (key, none) = self.wire.answer_in_text();
        match self.tool_choice {
            Some(span) => Edit {
                span,
                with: none.into(),
            },
            None => {
                let comma = if self.has_members { "," } else { "" };
                insert(self.end, format!(r#"{comma}"{key}":{none}"#))
            }
        }
    }

    /// Appends `items` (JSON values joined by commas) to the end of the history (C2).
    pub fn append(&self, items: &str) -> Option<Edit> {
        if let Some(raw) = self.string_history {
            // A string history is one user message; the items follow it.
            return Some(Edit {
                span: span_of(self.body, raw),
                with: format!("[{},{items}]", self.wire.text_history_item(raw.get())).into(),
            });
        }
        let raw = self.history?;
        into_list(span_of(self.body, raw), raw.get(), items, false)
    }

    /// The dialect's shapes.
    pub fn wire(&self) -> &'static dyn Wire {
        self.wire
    }

    /// The edit that puts `prefix` first in history item `next`.
    pub fn put_first(&self, next: &RawValue, prefix: &str) -> Option<Edit> {
        self.wire.put_first(self.body, next, prefix)
    }
}

/// Where a new top-level member goes (before the closing brace) and whether the object has
/// members already; `None` when `body` is not an object.
fn object_end(body: &str) -> Option<(usize, bool)> {
    let end = body.trim_end().strip_suffix('}')?.len();
    let has_members = !body[..end]
        .trim_start()
        .trim_start_matches('{')
        .trim()
        .is_empty();
    Some((end, has_members))
}

/// The edit that puts `items` (JSON values joined by commas) into the list `raw`, which stands
/// at `span`: first or last. `None` when `raw` is not a list.
pub(crate) fn into_list(span: Span, raw: &str, items: &str, first: bool) -> Option<Edit> {
    let inner = raw.strip_prefix('[')?;
    Some(if inner.trim_start().starts_with(']') {
        Edit {
            span,
            with: format!("[{items}]").into(),
        }
    } else if first {
        insert(span.start + 1, format!("{items},"))
    } else {
        insert(span.end - 1, format!(",{items}"))
    })
}

/// The names of a tool definition that names itself at its top (`{"name": …}`).
pub(crate) fn top_name(tool: &RawValue) -> Vec<String> {
    #[derive(Deserialize)]
    struct Named {
        name: Option<String>,
    }
    serde_json::from_str::<Named>(tool.get())
        .ok()
        .and_then(|t| t.name)
        .into_iter()
        .collect()
}

pub(crate) fn insert(at: usize, with: String) -> Edit {
    Edit {
        span: Span { start: at, end: at },
        with: with.into(),
    }
}

/// A history item's `role` and `type`, read without its content.
#[derive(Deserialize)]
pub(crate) struct Kind<'a> {
    #[serde(borrow)]
    pub role: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, rename = "type")]
    pub kind: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> Kind<'a> {
    pub fn of(raw: &'a RawValue) -> Option<Kind<'a>> {
        serde_json::from_str(raw.get()).ok()
    }
}

/// Appends `s` and a separator to a link's text (`Wire::item_text`).
pub(crate) fn push_text(out: &mut String, s: &str) {
    out.push_str(s);
    out.push('\u{1}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::splice;
    use bytes::Bytes;

    fn apply(body: &str, edits: Vec<Edit>) -> Value {
        let out = splice(&Bytes::copy_from_slice(body.as_bytes()), edits).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn adds_the_tool_last_or_creates_the_list() {
        let body =
            r#"{"model":"m","tools":[{"type":"function","function":{"name":"ls"}}],"messages":[]}"#;
        let layout = Layout::read(Dialect::OpenAiChat, body.as_bytes()).unwrap();
        assert_eq!(layout.tool_names(), ["ls"]);
        let v = apply(body, vec![layout.add_tool(r#"{"x":1}"#)]);
        assert_eq!(v["tools"][1]["x"], 1);
        let body = r#"{"model":"m", "messages":[{"role":"user","content":"hi"}] }  "#;
        let layout = Layout::read(Dialect::OpenAiChat, body.as_bytes()).unwrap();
        let v = apply(
            body,
            vec![
                layout.add_tool(r#"{"x":1}"#),
                layout.force_answer(),
                layout
                    .append(r#"{"role":"assistant","content":"a"}"#)
                    .unwrap(),
            ],
        );
        assert_eq!(v["tools"][0]["x"], 1);
        assert_eq!(v["tool_choice"], "none");
        assert_eq!(v["messages"][1]["content"], "a");
        let body = r#"{"tools":[]}"#;
        let layout = Layout::read(Dialect::AnthropicMessages, body.as_bytes()).unwrap();
        let v = apply(body, vec![layout.add_tool("2")]);
        assert_eq!(v["tools"], serde_json::json!([2]));
    }

    #[test]
    fn a_string_input_becomes_a_user_message_before_the_round() {
        let body = r#"{"model":"m","input":"hello","tool_choice":"auto"}"#;
        let layout = Layout::read(Dialect::OpenAiResponses, body.as_bytes()).unwrap();
        let v = apply(
            body,
            vec![
                layout.append(r#"{"type":"x"}"#).unwrap(),
                layout.force_answer(),
            ],
        );
        assert_eq!(v["input"][0]["content"], "hello");
        assert_eq!(v["input"][1]["type"], "x");
        assert_eq!(v["tool_choice"], "none");
        assert_eq!(layout.last_item().unwrap()["content"], "hello");
    }

    #[test]
    fn anthropic_forces_an_answer_with_its_own_shape() {
        let body = r#"{"messages":[]}"#;
        let layout = Layout::read(Dialect::AnthropicMessages, body.as_bytes()).unwrap();
        let v = apply(body, vec![layout.force_answer()]);
        assert_eq!(v["tool_choice"]["type"], "none");
    }

    #[test]
    fn usage_adds_up_nested_fields() {
        let mut total =
            serde_json::json!({"input_tokens": 10, "output_tokens": 2, "details": {"cached": 1}});
        add_usage(
            &mut total,
            &serde_json::json!({"input_tokens": 5, "output_tokens": 3, "details": {"cached": 4}, "new": 1}),
        );
        assert_eq!(
            total,
            serde_json::json!({"input_tokens": 15, "output_tokens": 5, "details": {"cached": 5}, "new": 1})
        );
    }

    fn chat(content: Value, calls: Value, usage: u64) -> Value {
        serde_json::json!({"id": "c", "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": calls}, "finish_reason": "tool_calls"}],
               "usage": {"prompt_tokens": usage, "completion_tokens": 1, "total_tokens": usage + 1}})
    }

    #[test]
    fn chat_rounds_merge_into_one_message_without_read_calls() {
        let wire = Dialect::OpenAiChat.wire();
        let read = serde_json::json!([{"id": "r1", "type": "function", "function": {"name": "sluice_read", "arguments": "{\"cursor\":\"c\"}"}}]);
        let first = wire.output(&chat(serde_json::json!("Reading. "), read, 10));
        assert_eq!(first.calls[0].arguments["cursor"], "c");
        assert_eq!(first.read_calls("sluice_read").0.len(), 1);
        assert!(!first.read_calls("sluice_read").1);
        let last_response = chat(serde_json::json!("Done."), Value::Null, 20);
        let last = wire.output(&last_response);
        let rounds = [first, last];
        let out = merged(wire, last_response, &rounds, "sluice_read");
        assert_eq!(
            out["choices"][0]["message"]["content"],
            "Reading. \n\nDone."
        );
        assert!(out["choices"][0]["message"].get("tool_calls").is_none());
        assert_eq!(out["usage"]["prompt_tokens"], 30);
        assert_eq!(out["usage"]["total_tokens"], 32);
    }

    #[test]
    fn anthropic_keeps_thinking_and_drops_only_read_blocks() {
        let wire = Dialect::AnthropicMessages.wire();
        let r1 = serde_json::json!({"content": [
            {"type": "thinking", "thinking": "hm", "signature": "SIG"},
            {"type": "tool_use", "id": "t1", "name": "sluice_read", "input": {"cursor": "c"}},
            {"type": "tool_use", "id": "t2", "name": "bash", "input": {}}],
            "usage": {"input_tokens": 3, "output_tokens": 4}});
        let out = wire.output(&r1);
        assert_eq!(out.items[0]["content"][0]["signature"], "SIG");
        assert!(out.read_calls("sluice_read").1, "mixed");
        let shown = wire.visible(&[out], "sluice_read");
        let ids: Vec<_> = shown[0]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].clone())
            .collect();
        assert_eq!(ids, [Value::Null, serde_json::json!("t2")]);
    }

    #[test]
    fn responses_output_drops_read_items() {
        let wire = Dialect::OpenAiResponses.wire();
        let r = serde_json::json!({"output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
            {"type": "function_call", "call_id": "c1", "name": "sluice_read", "arguments": "{}"}]});
        let out = wire.output(&r);
        assert_eq!(out.calls.len(), 1);
        let merged = merged(wire, r, &[out], "sluice_read");
        assert_eq!(merged["output"].as_array().unwrap().len(), 1);
    }
}
