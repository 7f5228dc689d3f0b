//! Text measured as the model's budget counts it, and cut into pages (SPEC T1, T4).
//!
//! A text is a sequence of lines. A line ends after `\n` (so `\r\n` ends a line too, its `\r`
//! staying on the line); a last line without `\n` is a line; a trailing `\n` does not start an
//! extra empty line. Sizes are UTF-16 code units. A position is a line index and a UTF-16 offset
//! within that line. Pages are cut between lines; only a line longer than a whole page is cut
//! inside, and never inside a surrogate pair.

use memchr::memchr_iter;

/// How much one page may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub lines: usize,
    pub units: usize,
}

/// A place in a text: `line` (0-based) and `unit` (UTF-16 offset within that line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Position {
    pub line: u32,
    pub unit: u32,
}

/// UTF-16 code units of `s`, computed from its UTF-8 bytes: one unit per character, two for a
/// character outside the BMP (the 4-byte sequences).
pub fn utf16_len(s: &str) -> usize {
    if s.is_ascii() {
        return s.len();
    }
    let bytes = s.as_bytes();
    let continuation = bytes.iter().filter(|&&b| b & 0xC0 == 0x80).count();
    let four_byte = bytes.iter().filter(|&&b| b >= 0xF0).count();
    bytes.len() - continuation + four_byte
}

/// A text split into lines, each line keeping its `\n`.
pub struct Lines<'a> {
    text: &'a str,
    /// Byte offset where each line starts; one more entry at the end (`text.len()`).
    starts: Vec<usize>,
}

impl<'a> Lines<'a> {
    pub fn new(text: &'a str) -> Self {
        let mut starts = Vec::with_capacity(text.len() / 40 + 2);
        starts.push(0);
        starts.extend(memchr_iter(b'\n', text.as_bytes()).map(|i| i + 1));
        if starts.last() != Some(&text.len()) {
            starts.push(text.len());
        }
        Self { text, starts }
    }

    /// Number of lines (0 for the empty text).
    pub fn count(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// Line `i`, with its `\n` if it has one.
    pub fn line(&self, i: usize) -> &'a str {
        &self.text[self.starts[i]..self.starts[i + 1]]
    }

    pub fn total_units(&self) -> usize {
        utf16_len(self.text)
    }

    /// Whether position `p` is the end of the text.
    pub fn is_end(&self, p: Position) -> bool {
        p.line as usize >= self.count()
    }
}

/// Byte offset in `line` of UTF-16 offset `unit`, moved back to a character boundary. Returns
/// the byte offset and the unit offset actually reached.
fn byte_at_unit(line: &str, unit: usize) -> (usize, usize) {
    let mut units = 0;
    for (i, c) in line.char_indices() {
        let next = units + c.len_utf16();
        if next > unit {
            return (i, units);
        }
        units = next;
    }
    (line.len(), units)
}

/// One page of a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<'a> {
    /// The page's text: whole lines, or a piece of one line too long for a page.
    pub body: &'a str,
    pub start: Position,
    /// Where the next page starts; the end of the text when `more` is false.
    pub end: Position,
    pub more: bool,
    /// UTF-16 units in `body`.
    pub units: usize,
}

/// The page of `lines` that starts at `from`, within `budget` (`budget.units` ≥ 2, so a page
/// always advances, even over a surrogate pair). Whole lines are taken while they fit; a line
/// that alone does not fit an empty page is cut inside, at a character boundary.
pub fn page<'a>(lines: &Lines<'a>, from: Position, budget: Budget) -> Page<'a> {
    let count = lines.count();
    let budget = Budget {
        lines: budget.lines.max(1),
        units: budget.units.max(2),
    };
    let first = from.line as usize;
    if first >= count {
        return Page {
            body: "",
            start: from,
            end: from,
            more: false,
            units: 0,
        };
    }
    // The rest of the first line, from the position's offset.
    let line = lines.line(first);
    let (skip, _) = byte_at_unit(line, from.unit as usize);
    let start_byte = lines.starts[first] + skip;
    let rest = &line[skip..];
    let rest_units = utf16_len(rest);
    if rest_units > budget.units {
        // Cut inside the line.
        let (cut, took) = byte_at_unit(rest, budget.units);
        let end = Position {
            line: from.line,
            unit: from.unit + took as u32,
        };
        return Page {
            body: &lines.text[start_byte..start_byte + cut],
            start: from,
            end,
            more: true,
            units: took,
        };
    }
    let mut units = rest_units;
    let mut next = first + 1;
    while next < count && next - first < budget.lines {
        let u = utf16_len(lines.line(next));
        if units + u > budget.units {
            break;
        }
        units += u;
        next += 1;
    }
    let end = Position {
        line: next as u32,
        unit: 0,
    };
    Page {
        body: &lines.text[start_byte..lines.starts[next]],
        start: from,
        end,
        more: next < count,
        units,
    }
}

/// A text pages are cut from: held whole ([`Lines`]) or a window of a larger stored one
/// (`super::index::Window`), which pages the same.
pub trait Paged {
    /// Lines of the whole text.
    fn count(&self) -> usize;
    /// UTF-16 units of the whole text.
    fn total_units(&self) -> usize;
    /// UTF-16 units of line `i`, which the text has.
    fn line_units(&self, i: usize) -> usize;
    /// The page at `from` within `budget`, as [`page`] cuts it.
    fn page(&self, from: Position, budget: Budget) -> Page<'_>;
}

impl Paged for Lines<'_> {
    fn count(&self) -> usize {
        Lines::count(self)
    }

    fn total_units(&self) -> usize {
        Lines::total_units(self)
    }

    fn line_units(&self, i: usize) -> usize {
        utf16_len(self.line(i))
    }

    fn page(&self, from: Position, budget: Budget) -> Page<'_> {
        page(self, from, budget)
    }
}

/// Whether a text of `units` UTF-16 units and `line_count` lines is within `budget` unchanged.
pub fn fits(units: usize, line_count: usize, budget: Budget) -> bool {
    units <= budget.units && line_count <= budget.lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn counts_utf16_units() {
        assert_eq!(utf16_len("abc"), 3);
        assert_eq!(utf16_len("é"), 1);
        assert_eq!(utf16_len("€"), 1);
        assert_eq!(utf16_len("😀"), 2);
        assert_eq!(utf16_len("a😀é\n"), 5);
    }

    #[test]
    fn lines_follow_newlines() {
        let l = Lines::new("a\r\nb\n\nc");
        assert_eq!(l.count(), 4);
        assert_eq!(l.line(0), "a\r\n");
        assert_eq!(l.line(2), "\n");
        assert_eq!(l.line(3), "c");
        assert_eq!(
            Lines::new("a\n").count(),
            1,
            "a trailing newline adds no line"
        );
        assert_eq!(Lines::new("").count(), 0);
        assert_eq!(Lines::new("\n").count(), 1);
    }

    #[test]
    fn whole_lines_then_a_cut_inside_a_long_line() {
        let text = "ab\ncd\n0123456789\n";
        let l = Lines::new(text);
        let b = Budget {
            lines: 10,
            units: 6,
        };
        let p = page(&l, Position::default(), b);
        assert_eq!((p.body, p.more), ("ab\ncd\n", true));
        let p = page(&l, p.end, b);
        assert_eq!(p.body, "012345");
        assert_eq!(p.end, Position { line: 2, unit: 6 });
        let p = page(&l, p.end, b);
        assert_eq!((p.body, p.more), ("6789\n", false));
    }

    #[test]
    fn never_splits_a_surrogate_pair() {
        let text = "a😀😀";
        let l = Lines::new(text);
        let p = page(&l, Position::default(), Budget { lines: 5, units: 2 });
        assert_eq!(p.body, "a");
        let p = page(&l, p.end, Budget { lines: 5, units: 2 });
        assert_eq!(p.body, "😀");
    }

    proptest! {
        /// T1, T4, T5: every page is within budget, holds no lone surrogate, advances, the last
        /// page says so, and the pages put together are the text.
        #[test]
        fn pages_cover_the_text_within_budget(
            text in "(\\PC|\\r\\n|\\n|😀|é){0,300}",
            lines in 1usize..8,
            units in 2usize..40,
        ) {
            let l = Lines::new(&text);
            let budget = Budget { lines, units };
            let mut at = Position::default();
            let mut joined = String::new();
            let mut steps = 0;
            loop {
                let p = page(&l, at, budget);
                prop_assert!(p.units <= units);
                prop_assert_eq!(p.units, utf16_len(p.body));
                prop_assert!(p.body.lines().count() <= lines);
                // &str cannot hold a lone surrogate; its UTF-16 form must round-trip.
                let utf16: Vec<u16> = p.body.encode_utf16().collect();
                prop_assert_eq!(String::from_utf16(&utf16).unwrap(), p.body);
                joined.push_str(p.body);
                if !p.more {
                    prop_assert!(l.is_end(p.end) || text.is_empty());
                    break;
                }
                prop_assert!(p.end > at, "a page advances");
                at = p.end;
                steps += 1;
                prop_assert!(steps <= text.len() + 1);
            }
            prop_assert_eq!(joined, text);
        }
    }
}
