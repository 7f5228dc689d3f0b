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
    /// The event's name so far; kept between events (cleared, not dropped), so a stream of
    /// small events allocates nothing per event.
    name: String,
    has_name: bool,
    /// Where the event's data is (see [`Data`]); `joined` holds it once it is not one line.
    data: Data,
    joined: String,
    failed: bool,
}

/// Where an event's data is. Nearly every event has one `data:` line, whose value is read where
/// it lies in the event's bytes, not copied; a second line has the data joined into a string of
/// its own, as has a value that is not UTF-8 (with replacement characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Data {
    None,
    /// One line's value: `raw[start..end]`.
    Line {
        start: usize,
        end: usize,
    },
    /// In `joined`.
    Joined,
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
            data: Data::None,
            joined: String::new(),
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
        let (field, value_at) = match memchr::memchr(b':', line) {
            Some(at) => {
                let skip = usize::from(line.get(at + 1) == Some(&b' '));
                (line.get(..at).unwrap_or_default(), at + 1 + skip)
            }
            None => (line, line.len()),
        };
        let (start, end) = (self.line_start + value_at, self.line_start + line.len());
        let value = self.raw.get(start..end).unwrap_or_default();
        match field {
            b"event" => {
                self.name.clear();
                push_text(&mut self.name, value);
                // Trimmed in place, so the name keeps its buffer for the next event.
                self.name.truncate(self.name.trim_end().len());
                self.name
                    .drain(..self.name.len() - self.name.trim_start().len());
                self.has_name = true;
            }
            b"data" => match self.data {
                Data::None => self.data = Data::Line { start, end },
                Data::Line {
                    start: first,
                    end: first_end,
                } => {
                    self.joined.clear();
                    push_text(
                        &mut self.joined,
                        self.raw.get(first..first_end).unwrap_or_default(),
                    );
                    self.joined.push('\n');
                    push_text(&mut self.joined, value);
                    self.data = Data::Joined;
                }
                Data::Joined => {
                    self.joined.push('\n');
                    push_text(&mut self.joined, value);
                }
            },
            _ => {}
        }
        self.line_start = self.raw.len();
    }

    fn dispatch(&mut self, on_event: &mut dyn FnMut(Event<'_>)) {
        let data = match self.data {
            Data::None => None,
            Data::Line { start, end } => {
                let line = self.raw.get(start..end).unwrap_or_default();
                match simdutf8::basic::from_utf8(line) {
                    Ok(text) => Some(text),
                    Err(_) => {
                        self.joined.clear();
                        self.joined.push_str(&String::from_utf8_lossy(line));
                        Some(self.joined.as_str())
                    }
                }
            }
            Data::Joined => Some(self.joined.as_str()),
        };
        on_event(Event {
            name: self.has_name.then_some(self.name.as_str()),
            data,
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
        self.data = Data::None;
    }
}

/// Appends `bytes` as text: as they are when they are UTF-8 (the usual case, checked on the
/// fast path), with replacement characters where they are not.
fn push_text(out: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => out.push_str(text),
        Err(_) => out.push_str(&String::from_utf8_lossy(bytes)),
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

    /// `stream` cut at the given offsets (clamped to it, in any order).
    fn cut_at(stream: &[u8], cut: Vec<usize>) -> Vec<&[u8]> {
        let mut points: Vec<usize> = cut.into_iter().map(|c| c.min(stream.len())).collect();
        points.sort_unstable();
        let mut chunks = Vec::new();
        let mut at = 0;
        for p in points {
            chunks.push(&stream[at..p]);
            at = p;
        }
        chunks.push(&stream[at..]);
        chunks
    }

    /// The SSE rules read as plainly as they can be: lines, fields, events; what the framer
    /// must give for a whole stream.
    #[allow(clippy::type_complexity)]
    fn reference(stream: &[u8], finish: bool) -> Vec<(Option<String>, Option<String>, Vec<u8>)> {
        let mut out = Vec::new();
        let (mut name, mut data): (Option<String>, Option<Vec<String>>) = (None, None);
        let (mut raw, mut rest) = (Vec::new(), stream);
        while let Some(at) = rest.iter().position(|&b| b == b'\n') {
            let (whole, tail) = rest.split_at(at + 1);
            rest = tail;
            raw.extend_from_slice(whole);
            let line = &whole[..at];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                let joined = data.take().map(|lines| lines.join("\n"));
                out.push((name.take(), joined, std::mem::take(&mut raw)));
                continue;
            }
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            let (field, value) = match line.iter().position(|&b| b == b':') {
                Some(c) => {
                    let value = &line[c + 1..];
                    (&line[..c], value.strip_prefix(b" ").unwrap_or(value))
                }
                None => (line, &b""[..]),
            };
            match field {
                b"event" => name = Some(text(value).trim().to_string()),
                b"data" => data.get_or_insert_with(Vec::new).push(text(value)),
                _ => {}
            }
        }
        if finish && !raw.is_empty() {
            let joined = data.take().map(|lines| lines.join("\n"));
            out.push((name.take(), joined, raw));
        }
        out
    }

    proptest! {
        /// Any stream of lines (fields kept and not, values with and without a space, bytes that
        /// are not UTF-8, `\r\n` and `\n`, blank lines), cut anywhere, ended or not: the framer
        /// gives what the plain reading does.
        #[test]
        fn the_framer_reads_what_the_rules_say(
            lines in proptest::collection::vec(
                (0usize..6, 0usize..3, proptest::collection::vec(0usize..6, 0..3), any::<bool>()),
                0..12,
            ),
            cut in proptest::collection::vec(0usize..200, 0..5),
            finish in any::<bool>(),
        ) {
            // A line: a field (or none: a blank line), a separator, a value, an ending.
            const FIELDS: [&[u8]; 6] = [b"data", b"data", b"event", b"id", b"", b""];
            const SEPARATORS: [&[u8]; 3] = [b"", b":", b": "];
            const VALUES: [&[u8]; 6] = [b"x", b"{\"a\":1}", b"\xff", "\u{e9}".as_bytes(), b"\xc3", b"  y "];
            let mut stream = Vec::new();
            for (field, separator, value, crlf) in &lines {
                let field = FIELDS[*field];
                if !field.is_empty() {
                    stream.extend_from_slice(field);
                    stream.extend_from_slice(SEPARATORS[*separator]);
                    for &v in value {
                        stream.extend_from_slice(VALUES[v]);
                    }
                }
                stream.extend_from_slice(if *crlf { b"\r\n" } else { b"\n" });
            }
            let chunks = cut_at(&stream, cut);
            prop_assert_eq!(events(&chunks, finish), reference(&stream, finish));
        }

        /// However the bytes are cut, the same events come out, and their bytes are the
        /// stream's.
        #[test]
        fn any_split_gives_the_same_events(cut in proptest::collection::vec(0usize..60, 0..6)) {
            let stream: &[u8] = b"event: x\r\ndata: a\r\n\r\ndata: b\ndata: c\n\n: keep\n\n\ndata: d\n\n";
            let whole = events(&[stream], true);
            let chunks = cut_at(stream, cut);
            prop_assert_eq!(&events(&chunks, true), &whole);
            let raw: Vec<u8> = whole.iter().flat_map(|e| e.2.clone()).collect();
            prop_assert_eq!(raw, stream.to_vec());
        }
    }
}
