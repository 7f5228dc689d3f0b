//! Whether a relayed response completed (SPEC A9), watched as its bytes pass. A stream is
//! complete only when its dialect's final event arrived: chat, a `finish_reason` then
//! `data: [DONE]`; Responses, `response.completed`; Anthropic, `message_stop`. An upstream
//! stream that just ends is incomplete, though clients often do not notice. Nothing is buffered
//! but the current line, up to a bound.

use serde::Deserialize;

use super::Dialect;

/// Longest SSE line followed; a longer one stops the watch (the response then counts as not
/// completed: nothing is committed on a response sluice could not read).
const MAX_LINE_BYTES: usize = 1024 * 1024;

#[derive(Debug)]
pub struct Completion {
    dialect: Dialect,
    line: Vec<u8>,
    event: String,
    saw_finish: bool,
    done: bool,
    failed: bool,
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

#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<std::borrow::Cow<'a, str>>,
}

impl Completion {
    pub fn new(dialect: Dialect) -> Self {
        Self {
            dialect,
            line: Vec::new(),
            event: String::new(),
            saw_finish: false,
            done: false,
            failed: false,
        }
    }

    /// Feeds the next bytes of the event stream.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.failed {
            match memchr::memchr(b'\n', bytes) {
                Some(at) => {
                    self.line.extend_from_slice(&bytes[..at]);
                    let line = std::mem::take(&mut self.line);
                    self.line_done(&line);
                    bytes = &bytes[at + 1..];
                }
                None => {
                    self.line.extend_from_slice(bytes);
                    if self.line.len() > MAX_LINE_BYTES {
                        self.failed = true;
                    }
                    return;
                }
            }
        }
    }

    /// Stops the watch: the response will not count as complete (its bytes could not be read).
    pub fn fail(&mut self) {
        self.failed = true;
    }

    /// Whether the final event has arrived (and nothing went wrong).
    pub fn is_complete(&self) -> bool {
        self.done && !self.failed
    }

    /// Whether the watch could read the stream so far (no over-long line, no undecodable
    /// bytes): only then does a missing final event mean the stream was cut.
    pub fn can_tell(&self) -> bool {
        !self.failed
    }

    fn line_done(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(name) = line.strip_prefix(b"event:") {
            self.event = String::from_utf8_lossy(name.trim_ascii()).into_owned();
            return;
        }
        if line.is_empty() {
            self.event.clear();
            return;
        }
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        match self.dialect {
            Dialect::OpenAiChat => {
                if data == b"[DONE]" {
                    self.done = self.saw_finish;
                } else if let Ok(chunk) = serde_json::from_slice::<ChatChunk>(data) {
                    if chunk
                        .choices
                        .iter()
                        .any(|c| c.finish_reason.is_some_and(|f| f.get() != "null"))
                    {
                        self.saw_finish = true;
                    }
                }
            }
            Dialect::OpenAiResponses | Dialect::AnthropicMessages => {
                let kind = serde_json::from_slice::<Typed>(data)
                    .ok()
                    .and_then(|t| t.kind)
                    .map(|k| k.into_owned())
                    .unwrap_or_else(|| self.event.clone());
                let final_event = match self.dialect {
                    Dialect::OpenAiResponses => "response.completed",
                    _ => "message_stop",
                };
                if kind == final_event {
                    self.done = true;
                } else if kind == "error" || kind == "response.failed" {
                    self.failed = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn an_endless_line_stops_the_watch_without_growing() {
        let mut c = Completion::new(Dialect::AnthropicMessages);
        let junk = vec![b'x'; 64 * 1024];
        for _ in 0..40 {
            c.feed(&junk);
        }
        c.feed(b"\ndata: {\"type\":\"message_stop\"}\n");
        assert!(!c.is_complete());
        assert!(c.line.len() <= MAX_LINE_BYTES + junk.len());
    }
}
