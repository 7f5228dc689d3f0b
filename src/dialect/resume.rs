//! Reading a long request from where the reading of an earlier turn of its conversation left
//! off (runtime issue, docs/runtime.md "The resumed view"). An agent resends its whole history
//! every turn; its view, read afresh, costs a scan of every byte of it. So the reading of a long
//! body leaves a [`Trail`]: after each element of its message array, a hash of the body's bytes
//! up to there and what the view had found by then. The next body of the conversation whose
//! bytes up to one of those marks hash the same is read from that mark on. Anything the walk does
//! not expect (a field twice, a value of the wrong shape, bad JSON) gives up and the body is read
//! whole, by the same reader as a short body, so the view is always the one a whole reading
//! gives (a property test in each dialect holds the two equal).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use xxhash_rust::xxh3::Xxh3;

use super::{span_in, Dialect};
use crate::projection::Span;

/// Bodies shorter than this are read whole and leave no trail: the scan costs less than the
/// hashing and the table.
pub const RESUME_FROM: usize = 256 * 1024;
/// A body's trail is found under a hash of its first bytes (the request's head and the start of
/// its first messages, the same every turn of a conversation).
const KEY_BYTES: usize = 64 * 1024;
/// What the table holds at most, by the trails' estimated size; a trail is a few hundred bytes
/// per message.
const TABLE_BYTES: u64 = 32 * 1024 * 1024;
/// A conversation idle this long reads its next body whole.
const IDLE: Duration = Duration::from_secs(30 * 60);

/// A place in a body's message array, just after one of its elements (or just after the `[`):
/// where a later body may resume, if its bytes before `at` hash to `hash`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mark {
    pub at: usize,
    pub hash: u128,
    /// How many messages lie before it.
    pub messages: usize,
    /// How far each of the dialect's lists had grown by then.
    pub counts: [usize; 3],
}

/// What one body's reading leaves for the next: its marks, and the dialect's findings in a form
/// that does not borrow the body (spans into it, and the few strings that had escapes).
#[derive(Debug)]
pub(super) struct Trail<F> {
    pub marks: Vec<Mark>,
    pub found: F,
}

/// Text the view found: a span of the body, or (when it had escapes) the unescaped text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Piece {
    At(Span),
    Own(String),
}

impl Piece {
    /// `text` by its span when it lies in `body` (borrowed from it), else as its own copy.
    pub fn of(body: &str, text: &str) -> Piece {
        let start = (text.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
        if start <= body.len() && text.len() <= body.len() - start {
            Piece::At(span_in(body, text))
        } else {
            Piece::Own(text.to_owned())
        }
    }

    pub fn text<'a>(&self, body: &'a str) -> Cow<'a, str> {
        match self {
            Piece::At(span) => Cow::Borrowed(body.get(span.start..span.end).unwrap_or_default()),
            Piece::Own(s) => Cow::Owned(s.clone()),
        }
    }

    pub fn weight(&self) -> usize {
        match self {
            Piece::At(_) => 16,
            Piece::Own(s) => 24 + s.len(),
        }
    }
}

/// The text of `span` in `body` (empty if the span does not fall on characters, which a span the
/// reader took from this body never does).
pub(super) fn at(body: &str, span: Span) -> &str {
    body.get(span.start..span.end).unwrap_or_default()
}

/// The trails of the bodies read lately, by dialect and first bytes. Only hashes of the bytes and
/// spans are kept, never the bytes; a trail is used only by a body whose bytes hash the same.
pub struct Resumes {
    anthropic: moka::sync::Cache<u64, Arc<Trail<super::anthropic::Found>>>,
}

impl Default for Resumes {
    fn default() -> Self {
        Resumes {
            anthropic: moka::sync::Cache::builder()
                .max_capacity(TABLE_BYTES)
                .weigher(|_, trail: &Arc<Trail<super::anthropic::Found>>| {
                    let bytes =
                        trail.marks.len() * std::mem::size_of::<Mark>() + trail.found.weight();
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .time_to_idle(IDLE)
                .build(),
        }
    }
}

impl Resumes {
    pub(super) fn key(dialect: Dialect, body: &str) -> u64 {
        let head = body.as_bytes().get(..KEY_BYTES).unwrap_or(body.as_bytes());
        xxhash_rust::xxh3::xxh3_64_with_seed(head, dialect as u64)
    }

    pub(super) fn anthropic(&self, key: u64) -> Option<Arc<Trail<super::anthropic::Found>>> {
        self.anthropic.get(&key)
    }

    pub(super) fn keep_anthropic(&self, key: u64, trail: Trail<super::anthropic::Found>) {
        self.anthropic.insert(key, Arc::new(trail));
    }
}

impl<F> Trail<F> {
    /// The last of its marks that `body` agrees with, and the hash state there; `None` when the
    /// body differs before the first.
    pub fn agreed(&self, body: &str) -> Option<(Mark, Hashed)> {
        let mut hashed = Hashed::default();
        let mut agreed = None;
        for mark in &self.marks {
            if hashed.to(body, mark.at) != Some(mark.hash) {
                break;
            }
            agreed = Some((*mark, hashed.clone()));
        }
        agreed
    }
}

/// A running hash of a body's first bytes.
#[derive(Clone, Default)]
pub(super) struct Hashed {
    hasher: Xxh3,
    upto: usize,
}

impl Hashed {
    /// The hash of `body[..at]`; `None` if `at` is before what was hashed or past the body.
    pub fn to(&mut self, body: &str, at: usize) -> Option<u128> {
        self.hasher.update(body.as_bytes().get(self.upto..at)?);
        self.upto = at;
        Some(self.hasher.digest128())
    }
}

/// A reader's place in a body, for walking its top-level object and message array by hand.
pub(super) struct Cursor<'a> {
    pub body: &'a str,
    pub at: usize,
}

impl<'a> Cursor<'a> {
    /// The next byte that is not JSON whitespace, without taking it.
    pub fn peek(&mut self) -> Option<u8> {
        let rest = self.body.as_bytes().get(self.at..)?;
        let skip = rest
            .iter()
            .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            .unwrap_or(rest.len());
        self.at += skip;
        rest.get(skip).copied()
    }

    /// Takes `byte`, after whitespace, if it is next.
    pub fn eat(&mut self, byte: u8) -> bool {
        let next = self.peek() == Some(byte);
        self.at += usize::from(next);
        next
    }

    /// Reads one JSON value as `T`, borrowing from the body; `None` if it is not one.
    pub fn value<T: Deserialize<'a>>(&mut self) -> Option<T> {
        let rest = self.body.get(self.at..)?;
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<T>();
        let value = values.next()?.ok()?;
        self.at += values.byte_offset();
        Some(value)
    }

    /// Whether only whitespace is left.
    pub fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }
}
