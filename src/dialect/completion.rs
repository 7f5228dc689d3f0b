//! Whether a relayed response completed (SPEC A9), watched as its bytes pass. A stream is
//! complete only when its dialect's final event arrived: chat, a `finish_reason` then
//! `data: [DONE]`; Responses, `response.completed`; Anthropic, `message_stop`. An upstream
//! stream that just ends is incomplete, though clients often do not notice. Nothing is buffered
//! but the current event, up to a bound ([`super::sse`]).

use serde::Deserialize;

use super::sse::{Event, Framer, MAX_EVENT_BYTES};
use super::Dialect;

#[derive(Debug)]
pub struct Completion {
    dialect: Dialect,
    framer: Framer,
    ends: Ends,
    /// What the stream's events say the request used, when asked to read it.
    usage: Option<super::usage::Usage>,
}

/// What the events so far say of the stream's end.
#[derive(Debug, Default)]
struct Ends {
    saw_finish: bool,
    done: bool,
    failed: bool,
}

impl Ends {
    fn note(&mut self, dialect: Dialect, seen: Seen) {
        match seen {
            Seen::Nothing => {}
            // Gemini streams end with the chunk that finishes: nothing follows it.
            Seen::Finish if dialect == Dialect::GeminiGenerate => {
                self.saw_finish = true;
                self.done = true;
            }
            Seen::Finish => self.saw_finish = true,
            Seen::Final => self.done = dialect != Dialect::OpenAiChat || self.saw_finish,
            Seen::Failure => self.failed = true,
        }
    }
}

#[derive(Deserialize)]
struct ChatChunk<'a> {
    #[serde(borrow, default)]
    choices: Vec<Choice<'a>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow)]
    finish_reason: Option<&'a serde_json::value::RawValue>,
}

/// A Gemini chunk, as far as its end and failure go.
#[derive(Deserialize)]
struct GeminiChunk<'a> {
    #[serde(borrow, default)]
    candidates: Vec<GeminiCandidate<'a>>,
    #[serde(borrow)]
    error: Option<&'a serde_json::value::RawValue>,
}

#[derive(Deserialize)]
struct GeminiCandidate<'a> {
    #[serde(borrow, rename = "finishReason", alias = "finish_reason")]
    finish_reason: Option<&'a serde_json::value::RawValue>,
}

#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<std::borrow::Cow<'a, str>>,
}

/// What one event says about the stream's end.
enum Seen {
    Nothing,
    /// chat: a choice finished.
    Finish,
    Final,
    Failure,
}

impl Completion {
    pub fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            framer: Framer::new(MAX_EVENT_BYTES),
            ends: Ends::default(),
            usage: None,
        }
    }

    /// Also reads the provider's usage from the events that carry it (the inspector).
    pub fn with_usage(mut self) -> Self {
        self.usage = Some(super::usage::Usage::default());
        self
    }

    /// The usage the stream reported, when asked for and reported.
    pub fn usage(&self) -> Option<super::usage::Usage> {
        self.usage.filter(|u| *u != super::usage::Usage::default())
    }

    /// Feeds the next bytes of the event stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.ends.failed {
            return;
        }
        let mut fed = Ok(());
        self.with_events(|framer, on_event| fed = framer.feed(bytes, on_event));
        if fed.is_err() {
            self.ends.failed = true;
        }
    }

    /// The upstream stream ended: a last event whose closing blank line never came still
    /// counts.
    pub fn finish(&mut self) {
        self.with_events(|framer, on_event| framer.finish(on_event));
    }

    /// Runs the framer with what reads each event it gives: its usage, and what it says of the
    /// stream's end, noted as it comes.
    fn with_events(&mut self, run: impl FnOnce(&mut Framer, &mut dyn FnMut(Event<'_>))) {
        let Completion {
            dialect,
            framer,
            ends,
            usage,
        } = self;
        run(framer, &mut |event| {
            Self::read_usage(*dialect, &event, usage);
            ends.note(*dialect, Self::judge(*dialect, event));
        });
    }

    /// Stops the watch: the response will not count as complete (its bytes could not be read).
    pub fn fail(&mut self) {
        self.ends.failed = true;
    }

    /// Whether the final event has arrived (and nothing went wrong).
    pub fn is_complete(&self) -> bool {
        self.ends.done && !self.ends.failed
    }

    /// Whether the watch could read the stream so far (no over-long event, no undecodable
    /// bytes): only then does a missing final event mean the stream was cut.
    pub fn can_tell(&self) -> bool {
        !self.ends.failed
    }

    /// Adds the usage an event carries, when usage is read and the event can carry it: the
    /// test on the raw text keeps the other events (the many deltas) unparsed.
    fn read_usage(dialect: Dialect, event: &Event<'_>, usage: &mut Option<super::usage::Usage>) {
        let (Some(usage), Some(data)) = (usage.as_mut(), event.data) else {
            return;
        };
        if !data.contains("\"usage\"")
            && !data.contains("sage_metadata\"")
            && !data.contains("sageMetadata\"")
        {
            return;
        }
        if let Some(more) = super::usage::of_json(dialect, data) {
            usage.merge(more);
        }
    }

    /// What an event says about the stream's end. Most events of a stream (the deltas) say
    /// nothing, and most of those are told so from their text without parsing it
    /// ([`says_nothing`]); the others are parsed.
    fn judge(dialect: Dialect, event: Event<'_>) -> Seen {
        if says_nothing(dialect, &event) {
            return Seen::Nothing;
        }
        Self::judge_parsed(dialect, event)
    }

    fn judge_parsed(dialect: Dialect, event: Event<'_>) -> Seen {
        let Some(data) = event.data else {
            return Seen::Nothing;
        };
        match dialect {
            Dialect::OpenAiChat => {
                if data == "[DONE]" {
                    return Seen::Final;
                }
                let finished = serde_json::from_str::<ChatChunk>(data).is_ok_and(|chunk| {
                    chunk
                        .choices
                        .iter()
                        .any(|c| c.finish_reason.is_some_and(|f| f.get() != "null"))
                });
                if finished {
                    Seen::Finish
                } else {
                    Seen::Nothing
                }
            }
            Dialect::GeminiGenerate => match serde_json::from_str::<GeminiChunk>(data) {
                Ok(chunk) if chunk.error.is_some() => Seen::Failure,
                Ok(chunk)
                    if chunk
                        .candidates
                        .iter()
                        .any(|c| c.finish_reason.is_some_and(|f| f.get() != "null")) =>
                {
                    Seen::Finish
                }
                _ => Seen::Nothing,
            },
            Dialect::OpenAiResponses | Dialect::AnthropicMessages => {
                let typed = serde_json::from_str::<Typed>(data)
                    .ok()
                    .and_then(|t| t.kind);
                let kind = typed.as_deref().or(event.name).unwrap_or("");
                if kind == final_type(dialect) {
                    Seen::Final
                } else if FAILURE_TYPES.contains(&kind) {
                    Seen::Failure
                } else {
                    Seen::Nothing
                }
            }
        }
    }
}

/// The type of the event that ends a Responses or Anthropic stream.
fn final_type(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::OpenAiResponses => "response.completed",
        _ => "message_stop",
    }
}

/// The types of the events that end a Responses or Anthropic stream as failed.
const FAILURE_TYPES: [&str; 2] = ["error", "response.failed"];

/// Whether an event certainly says nothing of the stream's end, told from its text alone: what
/// [`Completion::judge_parsed`] would find then, it finds without parsing. An event's data can
/// spell a key or a string with `\u` escapes, so such data is always parsed; without them, a
/// key or a value sluice looks for appears in the text as itself.
/// - chat: every `"finish_reason"` in it is followed by `null` (a delta; none finished);
/// - Responses and Anthropic: the type that opens its object (as providers send it,
///   [`leading_type`]) is neither the final event's nor a failure's, or, when it does not open
///   with one, its data holds neither; in both cases its name holds neither.
fn says_nothing(dialect: Dialect, event: &Event<'_>) -> bool {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    // Built once: a searcher's setup costs more than searching a short event.
    static ESCAPE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(br"\u"));
    static FINISH: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(br#""finish_reason""#));
    // The final type of each dialect, then the failures' (`ends` below picks from these).
    static ENDS: LazyLock<[Finder<'static>; 4]> = LazyLock::new(|| {
        let [error, failed] = FAILURE_TYPES;
        [
            final_type(Dialect::OpenAiResponses),
            final_type(Dialect::AnthropicMessages),
            error,
            failed,
        ]
        .map(|kind| Finder::new(kind.as_bytes()))
    });
    let Some(data) = event.data else {
        return true;
    };
    let [responses, anthropic, error, failed] = &*ENDS;
    let last = if dialect == Dialect::OpenAiResponses {
        responses
    } else {
        anthropic
    };
    let names_an_end = |name: &str| {
        [last, error, failed]
            .iter()
            .any(|kind| kind.find(name.as_bytes()).is_some())
    };
    if matches!(
        dialect,
        Dialect::OpenAiResponses | Dialect::AnthropicMessages
    ) {
        // Providers open each event's object with its type: read there, it is the type parsing
        // would find (the name is only read when parsing finds none, so it must not name an
        // end either).
        if let Some(kind) = leading_type(data) {
            return kind != final_type(dialect)
                && !FAILURE_TYPES.contains(&kind)
                && event.name.is_none_or(|name| !names_an_end(name));
        }
    }
    let text = data.as_bytes();
    if ESCAPE.find(text).is_some() {
        return false;
    }
    match dialect {
        Dialect::GeminiGenerate => {
            // No `finishReason` or `finish_reason` (one search for both: a model's text says
            // "finish" often, so what follows is checked), and no error.
            static FINISH_OR_ERROR: LazyLock<[Finder<'static>; 2]> =
                LazyLock::new(|| [Finder::new("inish"), Finder::new("\"error\"")]);
            let [finish, error] = &*FINISH_OR_ERROR;
            let finishes = finish.find_iter(text).any(|at| {
                let after = text.get(at + finish.needle().len()..).unwrap_or_default();
                after.starts_with(b"Reason") || after.starts_with(b"_reason")
            });
            !finishes && error.find(text).is_none()
        }
        Dialect::OpenAiChat => {
            let key = FINISH.needle().len();
            data != "[DONE]"
                && FINISH.find_iter(text).all(|at| {
                    let after = text.get(at + key..).unwrap_or_default();
                    after
                        .trim_ascii_start()
                        .strip_prefix(b":")
                        .is_some_and(|value| value.trim_ascii_start().starts_with(b"null"))
                })
        }
        Dialect::OpenAiResponses | Dialect::AnthropicMessages => {
            [last, error, failed]
                .iter()
                .all(|kind| kind.find(text).is_none())
                && event.name.is_none_or(|name| !names_an_end(name))
        }
    }
}

/// The value of a `"type"` member that opens the JSON object `data`, when it is spelled without
/// escapes: `{"type":"ping",…` gives `ping`. JSON keeps one member per key, so this is the
/// object's type.
fn leading_type(data: &str) -> Option<&str> {
    let rest = data
        .trim_ascii_start()
        .strip_prefix('{')?
        .trim_ascii_start()
        .strip_prefix("\"type\"")?
        .trim_ascii_start()
        .strip_prefix(':')?
        .trim_ascii_start()
        .strip_prefix('"')?;
    let kind = rest.get(..memchr::memchr(b'"', rest.as_bytes())?)?;
    (!kind.contains('\\')).then_some(kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(dialect: Dialect, stream: &str, cut_every: usize) -> bool {
        let mut c = Completion::new(dialect);
        for piece in stream.as_bytes().chunks(cut_every.max(1)) {
            c.feed(piece);
        }
        c.is_complete()
    }

    const CHAT: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    const RESPONSES: &str = "event: response.created\ndata: {\"type\":\"response.created\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n";
    const ANTHROPIC: &str = "event: message_start\r\ndata: {\"type\":\"message_start\"}\r\n\r\nevent: ping\r\ndata: {\"type\": \"ping\"}\r\n\r\nevent: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";

    #[test]
    fn final_events_complete_a_stream_however_it_is_chunked_a9() {
        for cut in [1, 2, 7, 1000] {
            assert!(run(Dialect::OpenAiChat, CHAT, cut), "chat cut {cut}");
            assert!(run(Dialect::OpenAiResponses, RESPONSES, cut));
            assert!(run(Dialect::AnthropicMessages, ANTHROPIC, cut));
        }
    }

    #[test]
    fn a_stream_that_just_ends_is_incomplete_a9() {
        for (dialect, stream) in [
            (Dialect::OpenAiChat, CHAT),
            (Dialect::OpenAiResponses, RESPONSES),
            (Dialect::AnthropicMessages, ANTHROPIC),
        ] {
            // Cut before the final event's line is whole.
            let cut = stream.len() - 12;
            assert!(!run(dialect, &stream[..cut], 5), "{dialect:?}");
        }
        // [DONE] without a finish_reason, an error event, a failed response: incomplete.
        assert!(!run(
            Dialect::OpenAiChat,
            "data: {\"choices\":[]}\n\ndata: [DONE]\n\n",
            3
        ));
        let error = ANTHROPIC.replace(
            "event: ping\r\ndata: {\"type\": \"ping\"}",
            "event: error\r\ndata: {\"type\":\"error\"}",
        );
        assert!(!run(Dialect::AnthropicMessages, &error, 4));
        assert!(!run(
            Dialect::OpenAiResponses,
            "data: {\"type\":\"response.failed\"}\n\ndata: {\"type\":\"response.completed\"}\n\n",
            9
        ));
    }

    #[test]
    fn an_endless_event_stops_the_watch() {
        let mut c = Completion::new(Dialect::AnthropicMessages);
        let junk = vec![b'x'; 64 * 1024];
        for _ in 0..(MAX_EVENT_BYTES / junk.len() + 2) {
            c.feed(&junk);
        }
        c.feed(b"\n\ndata: {\"type\":\"message_stop\"}\n\n");
        assert!(!c.is_complete());
        assert!(!c.can_tell());
    }

    #[test]
    fn a_long_final_event_still_completes() {
        // A Responses stream's last event carries the whole response.
        let big = "x".repeat(2 * 1024 * 1024);
        let stream = format!(
            "event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"output_text\":\"{big}\"}}}}\n\n"
        );
        assert!(run(Dialect::OpenAiResponses, &stream, 64 * 1024));
    }

    #[test]
    fn a_final_event_without_its_blank_line_completes_at_the_end() {
        let mut c = Completion::new(Dialect::OpenAiChat);
        c.feed(CHAT.trim_end_matches('\n').as_bytes());
        c.feed(b"\n");
        assert!(!c.is_complete(), "not before the stream ends");
        c.finish();
        assert!(c.is_complete());
    }

    /// A key or a type, written as itself or with a `\u` escape of its `_` or `.`.
    fn spelled(word: &'static str, escaped: bool) -> String {
        if escaped {
            word.replace('_', "\\u005f").replace('.', "\\u002e")
        } else {
            word.to_string()
        }
    }

    /// Chat chunks: choices whose `finish_reason` is null or not, spaced or not, the key
    /// spelled with an escape or not, and content that quotes a finish.
    fn chat_data() -> impl Strategy<Value = String> {
        let choice = (
            prop::sample::select(vec!["", " ", "\n "]),
            any::<bool>(),
            prop::sample::select(vec!["null", "\"stop\"", "\"length\"", "nullx", "0"]),
            any::<bool>(),
        )
            .prop_map(|(ws, escaped, value, quote)| {
                let content = if quote {
                    r#""delta":{"content":"\"finish_reason\": \"stop\""},"#
                } else {
                    ""
                };
                format!(
                    "{{{content}\"{}\"{ws}:{ws}{value}}}",
                    spelled("finish_reason", escaped)
                )
            });
        prop_oneof![
            proptest::collection::vec(choice, 0..3)
                .prop_map(|c| format!("{{\"choices\":[{}]}}", c.join(","))),
            Just("[DONE]".to_string()),
        ]
    }

    /// Responses and Anthropic events: a type among the ones that end a stream and others,
    /// spelled with an escape or not, and text that mentions them.
    fn typed_data() -> impl Strategy<Value = String> {
        let typed = (
            prop::sample::select(vec![
                "message_stop",
                "response.completed",
                "response.failed",
                "error",
                "ping",
                "content_block_delta",
            ]),
            any::<bool>(),
            prop::sample::select(vec!["", r#","text":"an error"#, r#","x":{"type":"error"}"#]),
        )
            .prop_map(|(kind, escaped, rest)| {
                format!("{{\"type\":\"{}\"{rest}}}", spelled(kind, escaped))
            });
        // Without a type (or unreadable), the event's name says what it is.
        prop_oneof![
            typed,
            Just("{}".to_string()),
            Just("{\"type\":".to_string())
        ]
    }

    fn name() -> impl Strategy<Value = Option<String>> {
        proptest::option::of(
            prop::sample::select(vec![
                "message_stop",
                "ping",
                "error",
                "response.completed",
                "response.failed",
            ])
            .prop_map(str::to_string),
        )
    }

    proptest! {
        /// Telling an event says nothing from its text never disagrees with parsing it.
        #[test]
        fn an_event_told_from_its_text_is_judged_as_parsed(
            name in name(),
            chat in proptest::option::of(chat_data()),
            typed in proptest::option::of(typed_data()),
        ) {
            for (dialect, data) in [
                (Dialect::OpenAiChat, &chat),
                (Dialect::OpenAiResponses, &typed),
                (Dialect::AnthropicMessages, &typed),
            ] {
                let event = Event { name: name.as_deref(), data: data.as_deref(), raw: b"" };
                if says_nothing(dialect, &event) {
                    prop_assert!(
                        matches!(Completion::judge_parsed(dialect, event), Seen::Nothing),
                        "{:?} {:?} {:?}", dialect, name, data
                    );
                }
            }
        }
    }

    #[test]
    fn deltas_are_told_without_parsing_and_ends_are_parsed() {
        let event = |name: Option<&'static str>, data: &'static str| Event {
            name,
            data: Some(data),
            raw: b"",
        };
        let chat = Dialect::OpenAiChat;
        assert!(says_nothing(
            chat,
            &event(
                None,
                r#"{"choices":[{"delta":{"content":"a"},"finish_reason":null}]}"#
            )
        ));
        assert!(says_nothing(
            chat,
            &event(None, r#"{"choices":[{"finish_reason" : null}]}"#)
        ));
        assert!(!says_nothing(
            chat,
            &event(None, r#"{"choices":[{"finish_reason":"stop"}]}"#)
        ));
        assert!(!says_nothing(
            chat,
            &event(None, r#"{"choices":[{"finish\u005freason":"stop"}]}"#)
        ));
        assert!(!says_nothing(chat, &event(None, "[DONE]")));
        let anthropic = Dialect::AnthropicMessages;
        assert!(says_nothing(
            anthropic,
            &event(
                Some("content_block_delta"),
                r#"{"type":"content_block_delta"}"#
            )
        ));
        assert!(!says_nothing(
            anthropic,
            &event(Some("message_stop"), r#"{"type":"message_stop"}"#)
        ));
        assert!(!says_nothing(
            anthropic,
            &event(None, r#"{"type":"message\u005fstop"}"#)
        ));
        assert!(!says_nothing(
            anthropic,
            &event(Some("content_block_delta"), r#"{"text":"an error"}"#)
        ));
        assert!(!says_nothing(
            Dialect::OpenAiResponses,
            &event(None, r#"{"type":"response.failed"}"#)
        ));
        let gemini = Dialect::GeminiGenerate;
        let chunk = |text: &str, rest: &str| {
            format!(r#"{{"candidates":[{{"content":{{"parts":[{{"text":"{text}"}}]}}{rest}}}]}}"#)
        };
        let told = |data: &str| {
            says_nothing(
                gemini,
                &Event {
                    name: None,
                    data: Some(data),
                    raw: b"",
                },
            )
        };
        assert!(told(&chunk("I will finish the build", "")));
        assert!(!told(&chunk("done", r#","finishReason":"STOP""#)));
        assert!(!told(&chunk("done", r#","finish_reason":"STOP""#)));
        assert!(!told(r#"{"error":{"code":500}}"#));
        // Read from the type that opens the object, whatever else the data holds.
        assert!(says_nothing(
            anthropic,
            &event(
                Some("content_block_delta"),
                r#" { "type" : "content_block_delta","delta":{"text":"an error: message_stop"}}"#
            )
        ));
        assert!(!says_nothing(
            anthropic,
            &event(Some("message_stop"), r#"{"type":"ping"}"#)
        ));
    }
}
