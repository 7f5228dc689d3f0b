//! One framer of server-sent events, shared by the completion watch and the read-round
//! stitcher: bytes in, whole events out (name, data lines joined by `\n`, and the event's bytes
//! exactly as they came), at most one event buffered, up to a bound.

/// The longest event followed (8 MiB: a Responses stream's `response.completed` carries the
/// whole response). A longer one stops the framer: a watch then cannot tell the stream
/// completed (nothing is committed), and a stitched stream ends as failed.
pub const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// The room a framer's event buffer (`raw`) takes at its first bytes: a usual delta fits.
const EVENT_ROOM: usize = 512;

/// One event of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// The `event:` field, if any.
    pub name: Option<&'a str>,
    /// The `data:` lines joined by `\n`; `None` for an event with no data (a comment, a
    /// keep-alive).
    pub data: Option<&'a str>,
    /// The event's bytes as they came, its closing blank line included.
    pub raw: &'a [u8],
}

/// An event longer than the framer's bound: the framer stops there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an event is longer than {0} bytes")]
pub struct TooLong(pub usize);

/// Frames a byte stream into events (the SSE format: lines ended by `\n` or `\r\n`, an event
/// ended by a blank line).
#[derive(Debug)]
pub struct Framer {
    max: usize,
    /// The bytes of the event being read, whole lines and the start of the next.
    raw: Vec<u8>,
    /// Where the unfinished line starts in `raw`.
    line_start: usize,
    /// The event's name and data so far; kept between events (cleared, not dropped), so a
    /// stream of small events allocates nothing per event.
    name: String,
    has_name: bool,
    data: String,
    has_data: bool,
    failed: bool,
}

impl Framer {
    /// A framer that gives up on an event longer than `max` bytes.
    pub fn new(max: usize) -> Framer {
        Framer {
            max,
            raw: Vec::new(),
            line_start: 0,
            name: String::new(),
            has_name: false,
            data: String::new(),
            has_data: false,
            failed: false,
        }
    }

    /// Feeds the next bytes; `on_event` gets each event they complete, in order.
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), TooLong> {
        if self.failed {
            return Err(TooLong(self.max));
        }
        if self.raw.capacity() == 0 {
            // Room for a usual event at once, instead of growing to it line by line.
            self.raw.reserve(EVENT_ROOM);
        }
        while let Some(at) = memchr::memchr(b'\n', bytes) {
            self.raw.extend_from_slice(&bytes[..=at]);
            bytes = &bytes[at + 1..];
            self.line(on_event);
        }
        self.raw.extend_from_slice(bytes);
        if self.raw.len() > self.max {
            self.failed = true;
            self.raw = Vec::new();
            return Err(TooLong(self.max));
        }
        Ok(())
    }

    /// The stream ended: an event whose lines all arrived but whose closing blank line did not
    /// is given to `on_event` (providers have been seen to end a stream so).
    /// The framer is then ready for another stream.
    pub fn finish(&mut self, on_event: &mut dyn FnMut(Event<'_>)) {
        if !self.failed && self.line_start > 0 {
            self.raw.truncate(self.line_start);
            self.dispatch(on_event);
        }
        self.clear();
    }

    /// Whether the stream passed the framer's bound.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// A whole line is at the end of `raw`.
    fn line(&mut self, on_event: &mut dyn FnMut(Event<'_>)) {
        let line = &self.raw[self.line_start..];
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if self.line_start == 0 {
                // A blank line with no event before it: passed on alone.
                on_event(Event {
                    name: None,
                    data: None,
                    raw: &self.raw,
                });
                self.raw.clear();
                return;
            }
            self.dispatch(on_event);
            return;
        }
        // Split on the bytes (`:` is ASCII, so this is where the text would split); only the
        // value of a field that is kept is read as text, borrowed unless it is not UTF-8.
        let (field, value) = match memchr::memchr(b':', line) {
            Some(at) => {
                let value = line.get(at + 1..).unwrap_or_default();
                (
                    line.get(..at).unwrap_or_default(),
                    value.strip_prefix(b" ").unwrap_or(value),
                )
            }
            None => (line, &b""[..]),
        };
        match field {
            b"event" => {
                self.name.clear();
                self.name.push_str(String::from_utf8_lossy(value).trim());
                self.has_name = true;
            }
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&String::from_utf8_lossy(value));
                self.has_data = true;
            }
            _ => {}
        }
        self.line_start = self.raw.len();
    }

    fn dispatch(&mut self, on_event: &mut dyn FnMut(Event<'_>)) {
        on_event(Event {
            name: self.has_name.then_some(self.name.as_str()),
            data: self.has_data.then_some(self.data.as_str()),
            raw: &self.raw,
        });
        self.clear();
    }

    /// Ready for the next event, keeping the buffers' room.
    fn clear(&mut self) {
        self.raw.clear();
        self.line_start = 0;
        self.name.clear();
        self.has_name = false;
        self.data.clear();
        self.has_data = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn events(chunks: &[&[u8]], finish: bool) -> Vec<(Option<String>, Option<String>, Vec<u8>)> {
        let mut framer = Framer::new(1024);
        let mut out = Vec::new();
        let mut on = |e: Event<'_>| {
            out.push((
                e.name.map(str::to_string),
                e.data.map(str::to_string),
                e.raw.to_vec(),
            ));
        };
        for chunk in chunks {
            framer.feed(chunk, &mut on).unwrap();
        }
        if finish {
            framer.finish(&mut on);
        }
        out
    }

    #[test]
    fn events_keep_their_bytes_and_join_data_lines() {
        let stream = b"event: a\ndata: {\"x\":1}\n\n: ping\r\n\r\ndata: one\ndata:two\n\n";
        let got = events(&[stream], false);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].0.as_deref(), Some("a"));
        assert_eq!(got[0].1.as_deref(), Some("{\"x\":1}"));
        assert_eq!(got[1].1, None, "a comment has no data");
        assert_eq!(got[2].1.as_deref(), Some("one\ntwo"));
        let raw: Vec<u8> = got.iter().flat_map(|e| e.2.clone()).collect();
        assert_eq!(raw, stream.to_vec(), "every byte, as it came");
    }

    #[test]
    fn fields_are_read_from_bytes_as_text_would_read_them() {
        // No space after the colon, a colon in the value, bytes that are not UTF-8 (replaced),
        // a field without a colon, and the buffers reused by the next event.
        let stream: &[u8] = b"event:a:b\ndata:x: y\ndata\ndata: \xff!\n\ndata: next\n\n";
        let got = events(&[stream], false);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0.as_deref(), Some("a:b"));
        assert_eq!(got[0].1.as_deref(), Some("x: y\n\n\u{fffd}!"));
        assert_eq!(
            (got[1].0.as_deref(), got[1].1.as_deref()),
            (None, Some("next"))
        );
    }

    #[test]
    fn a_last_event_without_its_blank_line_is_given_at_the_end_only() {
        let stream: &[u8] = b"data: [DONE]\n";
        assert!(events(&[stream], false).is_empty());
        let got = events(&[stream], true);
        assert_eq!(got[0].1.as_deref(), Some("[DONE]"));
        // An unfinished line is not an event.
        assert!(events(&[b"data: [DO"], true).is_empty());
    }

    #[test]
    fn an_event_over_the_bound_stops_the_framer() {
        let mut framer = Framer::new(8);
        let mut n = 0;
        assert!(framer.feed(b"data: 123456789", &mut |_| n += 1).is_err());
        assert!(framer.failed());
        assert!(framer.feed(b"\n\n", &mut |_| n += 1).is_err());
        assert_eq!(n, 0);
    }

    proptest! {
        /// However the bytes are cut, the same events come out, and their bytes are the
        /// stream's.
        #[test]
        fn any_split_gives_the_same_events(cut in proptest::collection::vec(0usize..60, 0..6)) {
            let stream: &[u8] = b"event: x\r\ndata: a\r\n\r\ndata: b\ndata: c\n\n: keep\n\n\ndata: d\n\n";
            let whole = events(&[stream], true);
            let mut points: Vec<usize> = cut.into_iter().map(|c| c.min(stream.len())).collect();
            points.sort_unstable();
            let mut chunks = Vec::new();
            let mut at = 0;
            for p in points {
                chunks.push(&stream[at..p]);
                at = p;
            }
            chunks.push(&stream[at..]);
            prop_assert_eq!(&events(&chunks, true), &whole);
            let raw: Vec<u8> = whole.iter().flat_map(|e| e.2.clone()).collect();
            prop_assert_eq!(raw, stream.to_vec());
        }
    }
}
