//! Pages of a text too large to hold (SPEC T5, #39): a small index of a stored text (its line
//! and unit totals, and a mark every [`STRIDE`] bytes saying which position starts there) lets
//! a page be cut from a window of the text's bytes, read from the store as a range, and come
//! out exactly as it would from the whole text. A 60 MB log has an index of about 15 KB and
//! a default page reads about 150 KB of it.
//!
//! The index is built from the text's bytes in chunks, as they are read from the store, so the
//! text is never held whole to build it either.

use std::ops::Range;

use memchr::memchr;

use super::text::{page, utf16_len, Budget, Lines, Page, Paged, Position};

/// Bytes between two marks (at most, plus one character).
pub const STRIDE: usize = 64 * 1024;

/// Where a position starts in the text's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub byte: u64,
    pub at: Position,
}

/// What paging a stored text needs to know of it without reading it whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextIndex {
    /// Bytes between two marks, at most (plus one character).
    stride: usize,
    bytes: u64,
    lines: usize,
    units: usize,
    /// In order of position and byte; the first is the text's start.
    marks: Vec<Mark>,
}

impl TextIndex {
    /// Lines of the text.
    pub fn lines(&self) -> usize {
        self.lines
    }

    /// Bytes of the text.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Memory the index takes (for the cache that holds indexes).
    pub fn weight(&self) -> usize {
        self.marks.len() * std::mem::size_of::<Mark>() + std::mem::size_of::<Self>()
    }

    /// The bytes to read for the page at `from` within `budget`, and the mark they start at.
    /// A position past the text reads its last line, as a page of the whole text does.
    pub fn window(&self, from: Position, budget: Budget) -> (Mark, Range<u64>) {
        let from = match usize::try_from(from.line) {
            Ok(line) if line < self.lines => from,
            _ => Position {
                line: u32::try_from(self.lines.saturating_sub(1)).unwrap_or(u32::MAX),
                unit: 0,
            },
        };
        let i = self.marks.partition_point(|m| m.at <= from);
        let mark = self
            .marks
            .get(i.saturating_sub(1))
            .copied()
            .unwrap_or(Mark {
                byte: 0,
                at: Position::default(),
            });
        // The position lies within a stride (and a character) of its mark; past it, a page of
        // `units` UTF-16 units takes at most three bytes a unit, and a window that much longer
        // holds more than the page can take, so every cut falls where the whole text's would.
        let span = self.stride as u64 + 3 * budget.units.max(2) as u64 + 16;
        let end = mark.byte.saturating_add(span).min(self.bytes);
        (mark, mark.byte..end)
    }
}

/// Builds a [`TextIndex`] from a text's bytes, given in chunks of any size.
pub struct IndexBuilder {
    stride: usize,
    /// Bytes taken so far (the offset of the next chunk's first byte, less `pending`).
    byte: u64,
    line: u32,
    /// UTF-16 units of the current line so far, and its bytes.
    unit: u32,
    line_bytes: u64,
    units: usize,
    next_mark: u64,
    marks: Vec<Mark>,
    /// The start of a character the last chunk cut (at most three bytes).
    pending: Vec<u8>,
    invalid: bool,
}

impl Default for IndexBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl IndexBuilder {
    pub fn new() -> Self {
        Self::with_stride(STRIDE)
    }

    /// A builder placing marks every `stride` bytes (small strides test the windows).
    pub fn with_stride(stride: usize) -> Self {
        Self {
            stride: stride.max(1),
            byte: 0,
            line: 0,
            unit: 0,
            line_bytes: 0,
            units: 0,
            next_mark: 0,
            marks: Vec::new(),
            pending: Vec::new(),
            invalid: false,
        }
    }

    /// Takes the next bytes of the text.
    pub fn push(&mut self, mut chunk: &[u8]) {
        if self.invalid {
            return;
        }
        if let Some(&lead) = self.pending.first() {
            let want = match lead {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            };
            let take = (want - self.pending.len()).min(chunk.len());
            self.pending.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if self.pending.len() < want {
                return;
            }
            let pending = std::mem::take(&mut self.pending);
            match std::str::from_utf8(&pending) {
                Ok(c) => self.take(c),
                Err(_) => {
                    self.invalid = true;
                    return;
                }
            }
        }
        match std::str::from_utf8(chunk) {
            Ok(s) => self.take(s),
            Err(e) => {
                let (valid, rest) = chunk.split_at(e.valid_up_to());
                // `valid_up_to` bytes are UTF-8 by the error's own account.
                self.take(std::str::from_utf8(valid).unwrap_or_default());
                if e.error_len().is_some() {
                    self.invalid = true;
                } else {
                    self.pending = rest.to_vec();
                }
            }
        }
    }

    /// The index; `None` when the bytes are not UTF-8 (no text sluice stored).
    pub fn finish(mut self) -> Option<TextIndex> {
        if self.invalid || !self.pending.is_empty() {
            return None;
        }
        if self.marks.is_empty() {
            self.marks.push(Mark {
                byte: 0,
                at: Position::default(),
            });
        }
        Some(TextIndex {
            stride: self.stride,
            bytes: self.byte,
            lines: self.line as usize + usize::from(self.line_bytes > 0),
            units: self.units,
            marks: self.marks,
        })
    }

    fn take(&mut self, s: &str) {
        let mut pos = 0;
        while pos < s.len() {
            let end = memchr(b'\n', &s.as_bytes()[pos..]).map_or(s.len(), |i| pos + i + 1);
            // Marks due within this piece of a line, each at a character boundary.
            while self.next_mark < self.byte + (end - pos) as u64 {
                let target = pos + (self.next_mark - self.byte) as usize;
                let b = (target..=end)
                    .find(|&b| s.is_char_boundary(b))
                    .unwrap_or(end);
                let units = utf16_len(&s[pos..b]);
                self.advance(b - pos, units);
                pos = b;
                self.marks.push(Mark {
                    byte: self.byte,
                    at: Position {
                        line: self.line,
                        unit: self.unit,
                    },
                });
                self.next_mark = self.byte + self.stride as u64;
            }
            let units = utf16_len(&s[pos..end]);
            self.advance(end - pos, units);
            if s.as_bytes().get(end.wrapping_sub(1)) == Some(&b'\n') {
                self.line = self.line.saturating_add(1);
                self.unit = 0;
                self.line_bytes = 0;
            }
            pos = end;
        }
    }

    fn advance(&mut self, bytes: usize, units: usize) {
        self.byte += bytes as u64;
        self.line_bytes += bytes as u64;
        self.units += units;
        self.unit = self
            .unit
            .saturating_add(u32::try_from(units).unwrap_or(u32::MAX));
    }
}

/// A window of a stored text, read from `mark`: pages the same as the whole text would.
pub struct Window<'a> {
    index: &'a TextIndex,
    mark: Mark,
    lines: Lines<'a>,
    /// Whether the window reaches the text's end.
    to_end: bool,
}

impl<'a> Window<'a> {
    /// The window of `index`'s text that `bytes` (read at the range [`TextIndex::window`]
    /// gave) hold; `None` when they are not UTF-8 from its mark on. A character cut at the
    /// window's end is left out.
    pub fn new(index: &'a TextIndex, mark: Mark, bytes: &'a [u8]) -> Option<Window<'a>> {
        let to_end = mark.byte + bytes.len() as u64 >= index.bytes;
        let text = match std::str::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) if e.error_len().is_none() && !to_end => {
                std::str::from_utf8(&bytes[..e.valid_up_to()]).ok()?
            }
            Err(_) => return None,
        };
        Some(Window {
            index,
            mark,
            lines: Lines::new(text),
            to_end,
        })
    }

    fn local(&self, p: Position) -> Position {
        let line = p.line.saturating_sub(self.mark.at.line);
        let unit = if line == 0 {
            p.unit.saturating_sub(self.mark.at.unit)
        } else {
            p.unit
        };
        Position { line, unit }
    }

    fn global(&self, p: Position) -> Position {
        Position {
            line: p.line.saturating_add(self.mark.at.line),
            unit: if p.line == 0 {
                p.unit.saturating_add(self.mark.at.unit)
            } else {
                p.unit
            },
        }
    }
}

impl Paged for Window<'_> {
    fn count(&self) -> usize {
        self.index.lines
    }

    fn total_units(&self) -> usize {
        self.index.units
    }

    fn line_units(&self, i: usize) -> usize {
        let local = self.local(Position {
            line: u32::try_from(i).unwrap_or(u32::MAX),
            unit: 0,
        });
        let shift = if local.line == 0 {
            self.mark.at.unit as usize
        } else {
            0
        };
        match (local.line as usize) < self.lines.count() {
            true => shift + utf16_len(self.lines.line(local.line as usize)),
            false => shift,
        }
    }

    fn page(&self, from: Position, budget: Budget) -> Page<'_> {
        let p = page(&self.lines, self.local(from), budget);
        Page {
            body: p.body,
            start: self.global(p.start),
            end: self.global(p.end),
            more: p.more || !self.to_end,
            units: p.units,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::cursor::Cursor;
    use super::super::notice::{render, Rendered};
    use super::*;
    use crate::projection::artifact::{ArtifactId, ArtifactKind};
    use crate::tenant::Tenant;
    use proptest::prelude::*;

    fn built(text: &str, stride: usize, chunk: usize) -> TextIndex {
        let mut b = IndexBuilder::with_stride(stride);
        for piece in text.as_bytes().chunks(chunk.max(1)) {
            b.push(piece);
        }
        b.finish().unwrap()
    }

    fn windowed(
        text: &str,
        index: &TextIndex,
        id: &ArtifactId,
        t: &Tenant,
        at: Position,
        budget: Budget,
    ) -> Rendered {
        let (mark, range) = index.window(at, budget);
        let bytes = &text.as_bytes()[range.start as usize..range.end as usize];
        let window = Window::new(index, mark, bytes).unwrap();
        render(&window, id, t, at, budget, "sluice_read")
    }

    #[test]
    fn totals_match_the_whole_text() {
        for text in ["", "\n", "a", "a\n", "a\nb", "é😀\r\n\nx"] {
            let index = built(text, 2, 1);
            let lines = Lines::new(text);
            assert_eq!(index.lines(), lines.count(), "{text:?}");
            assert_eq!(index.units, lines.total_units(), "{text:?}");
            assert_eq!(index.bytes(), text.len() as u64);
        }
        assert!(IndexBuilder::new().finish().is_some(), "the empty text");
        let mut b = IndexBuilder::new();
        b.push(b"ok \xff");
        assert!(b.finish().is_none(), "not UTF-8");
        let mut b = IndexBuilder::new();
        b.push("é".as_bytes().get(..1).unwrap());
        assert!(b.finish().is_none(), "a character cut at the end");
    }

    #[test]
    fn a_60_mb_log_has_a_small_index_and_small_windows() {
        let line = "2026-12-07T08:00:00Z INFO build step finished in 12 ms, all good\n";
        let text = line.repeat(60_000_000 / line.len());
        let index = built(&text, STRIDE, text.len());
        assert!(index.weight() < 20_000, "{}", index.weight());
        let budget = Budget {
            lines: 2000,
            units: 30_000,
        };
        let (_, range) = index.window(
            Position {
                line: 500_000,
                unit: 0,
            },
            budget,
        );
        assert!(range.end - range.start < 200_000, "{range:?}");
    }

    proptest! {
        /// T1, T5: reading on from a window of the text's bytes gives the same pages and
        /// cursors as reading the whole text, whatever the chunks the index was built from.
        #[test]
        fn a_window_pages_as_the_whole_text(
            text in "(\\PC|\\r\\n|\\n\\n|😀|é|[a-z ]{1,40}){1,400}",
            stride in 1usize..64,
            chunk in 1usize..50,
            lines in 2usize..6,
            units in 1024usize..1400,
        ) {
            let t = Tenant::from_credential(b"k");
            let id = ArtifactId::for_content(&t, ArtifactKind::Text, text.as_bytes());
            let index = built(&text, stride, chunk);
            prop_assert_eq!(&index, &built(&text, stride, text.len()));
            let whole = Lines::new(&text);
            let budget = Budget { lines, units };
            let mut at = Position::default();
            for _ in 0..=text.len() {
                let want = render(&whole, &id, &t, at, budget, "sluice_read");
                let got = windowed(&text, &index, &id, &t, at, budget);
                prop_assert_eq!(&got, &want);
                match want.next {
                    Some(c) => at = Cursor::decode(&c, &t).unwrap().at,
                    None => return Ok(()),
                }
            }
            prop_assert!(false, "never reached the end");
        }

        /// The windows stay right at small budgets, where one long line is cut in many pages,
        /// and for positions past the text.
        #[test]
        fn a_window_cuts_long_lines_as_the_whole_text(
            text in "([a-z]{0,300}|😀{1,50}|é{1,90}|中{1,120})(\\n[a-zé中]{0,200}){0,4}",
            stride in 1usize..40,
            units in 2usize..60,
            past in 0u32..3,
        ) {
            let t = Tenant::from_credential(b"k");
            let id = ArtifactId::for_content(&t, ArtifactKind::Text, text.as_bytes());
            let index = built(&text, stride, 7);
            let whole = Lines::new(&text);
            let budget = Budget { lines: 3, units };
            let mut at = Position::default();
            for _ in 0..=text.len() {
                let p = whole.page(at, budget);
                let (mark, range) = index.window(at, budget);
                let bytes = &text.as_bytes()[range.start as usize..range.end as usize];
                let window = Window::new(&index, mark, bytes).unwrap();
                prop_assert_eq!(window.page(at, budget).end, p.end);
                prop_assert_eq!(window.page(at, budget).body, p.body);
                if !p.more { break; }
                at = p.end;
            }
            let beyond = Position { line: whole.count() as u32 + past, unit: 5 };
            let budget = Budget { lines: 3, units: 1100 };
            prop_assert_eq!(
                windowed(&text, &index, &id, &t, beyond, budget),
                render(&whole, &id, &t, beyond, budget, "sluice_read")
            );
        }
    }
}
