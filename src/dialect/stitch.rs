//! Streamed rounds stitched into one client stream (C2). Text and other tools' events pass at
//! once; a read call's own events are held back; the round's closing events are held until
//! sluice knows whether another round follows. Later rounds continue the same client stream:
//! their opening events are dropped and indices, ids and sequence numbers continue where the
//! client's stream stands, so its SDK sees one well-formed message.
//!
//! [`Stitcher`] frames the bytes and keeps what every dialect shares ([`Stream`]); each
//! provider's [`Events`] (from [`super::wire::Wire::events`]) reads its own events.

use std::collections::HashMap;

use serde_json::Value;

use super::sse::{Event, Framer, MAX_EVENT_BYTES};
use super::wire::{total_usage, Output, Wire};
use super::Dialect;
use crate::json;

/// One provider's events, as the stitcher reads them. Its per-round state is its own.
pub trait Events: std::fmt::Debug + Send {
    /// Whether an event's data that is not a JSON object closes the round (chat's `[DONE]`).
    fn is_end_marker(&self, _data: &str) -> bool {
        false
    }

    /// Reads one event of the current round; returns it (perhaps changed, then
    /// `s.touched` is set) to pass to the client, or `None` to hold it back.
    fn event(&mut self, s: &mut Stream, event: Value) -> Option<Value>;

    /// An event about to reach the client (sequence numbers continue).
    fn passing(&mut self, _s: &mut Stream, _event: &mut Value) {}

    /// The current round's output.
    fn output(&self, s: &Stream) -> Output;

    /// The next round begins: the per-round state starts over.
    fn next_round(&mut self);

    /// One of the last round's held closing events, rewritten for the client: the usage of all
    /// rounds (`total`) and what the client is shown. `data` is `Value::Null` for an end marker.
    fn closing(&mut self, c: Closing<'_>, out: &mut Vec<u8>);

    /// An error event ending the client's stream when a later round failed (the client's SDK
    /// raises it as an API error).
    fn error(&mut self, message: &str, out: &mut Vec<u8>);
}

/// A held closing event being finished (see [`Events::closing`]).
pub struct Closing<'a> {
    pub name: Option<&'a str>,
    pub data: Value,
    pub rounds: &'a [Output],
    pub total: Option<&'a Value>,
    pub read: &'a str,
}

/// What every dialect's stream shares: the read tool's name, the round, the index map and the
/// held closing events.
#[derive(Debug)]
pub struct Stream {
    /// The read tool's name.
    pub read: String,
    pub round_no: usize,
    /// Upstream index → client index; `None` for a read call, held back.
    map: HashMap<u64, Option<u64>>,
    /// Next client index for a block, output item or tool call.
    next_index: u64,
    /// The event being handled was changed; an unchanged one is passed on as its raw bytes.
    pub touched: bool,
    /// A read call's events were held back in this stream.
    held: bool,
    /// The round's usage so far.
    pub usage: Option<Value>,
    /// The round's closing events, held back: (event name, data).
    closing: Vec<(Option<String>, Value)>,
    /// The closing events' bytes as the provider sent them.
    closing_raw: Vec<u8>,
    /// The closing event arrived (the round completed).
    pub complete: bool,
}

impl Stream {
    /// Client index for upstream `index`, deciding at its first sight whether it is held.
    pub fn index(&mut self, index: u64, read: bool) -> Option<u64> {
        if let Some(known) = self.map.get(&index) {
            return *known;
        }
        self.held |= read;
        let client = (!read).then(|| {
            let i = self.next_index;
            self.next_index += 1;
            i
        });
        self.map.insert(index, client);
        client
    }

    /// Writes `client` as the event's `key` when it differs from the upstream index.
    pub fn set_index(&mut self, event: &mut Value, key: &str, upstream: u64, client: u64) {
        if upstream != client {
            self.touched |= json::set(event, key, client);
        }
    }

    /// Notes that a read call's events were held back.
    pub fn hold_read(&mut self) {
        self.held = true;
    }

    /// Holds a closing event of the round.
    pub fn hold(&mut self, name: Option<String>, data: Value) {
        self.closing.push((name, data));
    }

    /// The held closing events so far.
    pub fn held_closing(&self) -> &[(Option<String>, Value)] {
        &self.closing
    }
}

/// Stitches the rounds of one streamed request into the client's stream.
#[derive(Debug)]
pub struct Stitcher {
    wire: &'static dyn Wire,
    events: Box<dyn Events>,
    s: Stream,
    /// Frames the current round's bytes into events (an over-long event ends the stitched
    /// stream as a failure rather than grow without bound).
    framer: Framer,
    failed: bool,
}

impl Stitcher {
    pub fn new(dialect: Dialect, read: &str) -> Self {
        let wire = dialect.wire();
        Self {
            wire,
            events: wire.events(),
            s: Stream {
                read: read.to_string(),
                round_no: 0,
                map: HashMap::new(),
                next_index: 0,
                touched: false,
                held: false,
                usage: None,
                closing: Vec::new(),
                closing_raw: Vec::new(),
                complete: false,
            },
            framer: Framer::new(MAX_EVENT_BYTES),
            failed: false,
        }
    }

    /// Feeds upstream bytes of the current round; returns what the client gets now.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if self.failed {
            return out;
        }
        let mut framer = std::mem::replace(&mut self.framer, Framer::new(0));
        let fed = framer.feed(bytes, &mut |event| self.event(event, &mut out));
        self.framer = framer;
        if fed.is_err() {
            self.failed = true;
        }
        out
    }

    /// The current round's upstream stream ended: a last event whose closing blank line never
    /// came is handled now; returns what the client gets of it.
    pub fn upstream_ended(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut framer = std::mem::replace(&mut self.framer, Framer::new(0));
        if !self.failed {
            framer.finish(&mut |event| self.event(event, &mut out));
        }
        self.framer = framer;
        out
    }

    /// Whether the current round ended with its closing event.
    pub fn round_complete(&self) -> bool {
        self.s.complete && !self.failed
    }

    /// The current round's output.
    pub fn output(&self) -> Output {
        self.events.output(&self.s)
    }

    /// The dialect's shapes for the rounds.
    pub fn wire(&self) -> &'static dyn Wire {
        self.wire
    }

    /// Starts the next round: its events continue the client's stream.
    pub fn next_round(&mut self) {
        self.events.next_round();
        self.s.map.clear();
        self.s.usage = None;
        self.s.closing.clear();
        self.s.closing_raw.clear();
        self.s.complete = false;
        self.s.round_no += 1;
        self.framer = Framer::new(MAX_EVENT_BYTES);
    }

    /// The held closing events of the last round, with the usage of all `rounds` and the
    /// output of all rounds the client sees.
    pub fn finish(&mut self, rounds: &[Output]) -> Vec<u8> {
        let mut out = Vec::new();
        if rounds.len() <= 1 && !self.s.held {
            // Nothing was hidden: the closing events go as the provider sent them.
            self.s.closing.clear();
            return std::mem::take(&mut self.s.closing_raw);
        }
        let total = total_usage(rounds);
        for (name, data) in std::mem::take(&mut self.s.closing) {
            let closing = Closing {
                name: name.as_deref(),
                data,
                rounds,
                total: total.as_ref(),
                read: &self.s.read,
            };
            self.events.closing(closing, &mut out);
        }
        out
    }

    /// An error event in the dialect's shape, ending the client's stream when a later round
    /// failed.
    pub fn error(&mut self, message: &str) -> Vec<u8> {
        let mut out = Vec::new();
        self.events.error(message, &mut out);
        out
    }

    fn event(&mut self, event: Event<'_>, out: &mut Vec<u8>) {
        let Event { name, data, raw } = event;
        let Some(data) = data.filter(|d| !d.is_empty()) else {
            // Comments and keep-alives pass as they are.
            out.extend_from_slice(raw);
            return;
        };
        if self.events.is_end_marker(data.trim()) {
            self.s.closing.push((None, Value::Null));
            self.s.closing_raw.extend_from_slice(raw);
            self.s.complete = true;
            return;
        }
        // Only an object is an event sluice reads; anything else passes as it came.
        let Some(value) = serde_json::from_str::<Value>(data)
            .ok()
            .filter(Value::is_object)
        else {
            out.extend_from_slice(raw);
            return;
        };
        self.s.touched = false;
        let closing = self.s.closing.len();
        let forward = self.events.event(&mut self.s, value);
        if self.s.closing.len() > closing {
            self.s.closing_raw.extend_from_slice(raw);
        }
        if let Some(mut value) = forward {
            self.events.passing(&mut self.s, &mut value);
            if self.s.touched {
                emit(out, name, &value);
            } else {
                out.extend_from_slice(raw);
            }
        }
    }
}

/// Writes one SSE event.
pub(crate) fn emit(out: &mut Vec<u8>, name: Option<&str>, data: &Value) {
    if let Some(name) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
#[path = "stitch_tests.rs"]
mod tests;
