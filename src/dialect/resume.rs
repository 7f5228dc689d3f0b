//! Reading a long request from where the reading of an earlier turn of its conversation left
//! off (runtime issue, docs/runtime.md "The resumed view"). An agent resends its whole history
//! every turn; its view, read afresh, costs a scan of every byte of it. So the reading of a long
//! body leaves a [`Trail`]: the hashes of its 4 KiB blocks and, after each element of its list
//! (messages or input items), a [`Mark`] with what the view had found by then. The next body of
//! the conversation whose bytes up to one of those marks hash the same is read from that mark
//! on. A long body's blocks are hashed, and its UTF-8 checked, as it arrives ([`Receiving`]),
//! so a resumed reading compares hashes instead of reading cold bytes. Anything the walk does
//! not expect (a field twice, a value of the wrong shape, bad JSON) gives up and the body is read
//! whole, by the same reader as a short body, so the view is always the one a whole reading
//! gives (a property test in each dialect holds the two equal).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;

pub use super::received::{Received, Receiving};
use super::{span_in, Dialect};
use crate::projection::{RequestView, Span};

/// Bodies shorter than this are read whole and leave no trail: the scan costs less than the
/// hashing and the table.
pub const RESUME_FROM: usize = 64 * 1024;
/// A body's trails are found under a hash of its first bytes (the request's head and the start
/// of its first messages, the same every turn of a conversation).
const KEY_BYTES: usize = 16 * 1024;
/// Trails kept under one key.
const TRAILS_PER_KEY: usize = 4;
/// What the table holds at most, by the trails' estimated size; a trail is a few hundred bytes
/// per message.
const TABLE_BYTES: u64 = 32 * 1024 * 1024;
/// A conversation idle this long reads its next body whole.
const IDLE: Duration = Duration::from_secs(30 * 60);

/// Bodies are hashed in blocks of this many bytes, as they are received ([`Receiving`]).
pub(super) const BLOCK: usize = 4096;

/// The seed of every hash here and of the tool results' digests: random per process, so no
/// one can make two different contents hash alike.
pub(super) fn seed() -> u64 {
    static SEED: std::sync::LazyLock<u64> =
        std::sync::LazyLock::new(|| uuid::Uuid::new_v4().as_u64_pair().0);
    *SEED
}

/// XXH3 by twox-hash, which picks AVX2 at run time where the CPU has it: half the
/// instructions of xxhash-rust's SSE2 build on a 200 KB body (callgrind, docs/runtime.md). The
/// hashes here, keyed by a per-process seed, never leave the process.
pub(super) fn hash(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot_with_seed(seed(), bytes)
}

/// The hashes of `text`'s whole blocks.
pub(super) fn blocks_of(text: &[u8]) -> Vec<u64> {
    text.chunks_exact(BLOCK).map(hash).collect()
}

/// The hash of the bytes of `body` from the start of the block `at` falls in, to `at`.
fn tail(body: &str, at: usize) -> Option<u64> {
    body.as_bytes().get(at - at % BLOCK..at).map(hash)
}

/// A place in a body's message array, just after one of its elements (or just after the `[`):
/// where a later body may resume, if its bytes before `at` are the same.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mark {
    pub at: usize,
    /// The hash of the bytes from the start of `at`'s block to `at` (the blocks before are in
    /// the trail's `blocks`).
    pub tail: u64,
    /// How many messages lie before it.
    pub messages: usize,
    /// How far each of the dialect's lists had grown by then.
    pub counts: [usize; 3],
}

impl Mark {
    pub fn at(body: &str, at: usize, messages: usize, counts: [usize; 3]) -> Option<Mark> {
        Some(Mark {
            at,
            tail: tail(body, at)?,
            messages,
            counts,
        })
    }
}

/// What one body's reading leaves for the next: its blocks' hashes, its marks, and the dialect's
/// findings in a form that does not borrow the body (spans into it, and the few strings that
/// had escapes).
#[derive(Debug)]
pub(super) struct Trail<F> {
    pub blocks: Arc<[u64]>,
    pub marks: Vec<Mark>,
    pub found: F,
}

impl<F> Trail<F> {
    /// The last of its marks `body` agrees with: every byte before it the same, as far as the
    /// blocks' hashes and the mark's tail tell. `None` when the body differs before the first.
    pub fn agreed(&self, body: &Text<'_>) -> Option<Mark> {
        let same = self
            .blocks
            .iter()
            .zip(body.blocks.iter())
            .take_while(|(a, b)| a == b)
            .count();
        self.marks
            .iter()
            .rev()
            .filter(|m| m.at / BLOCK <= same)
            .find(|m| tail(body.text, m.at) == Some(m.tail))
            .copied()
    }
}

/// A body as text, with its blocks' hashes.
pub(super) struct Text<'a> {
    pub text: &'a str,
    pub blocks: Arc<[u64]>,
}

impl<'a> Text<'a> {
    /// `body` as text: the checks and hashes made as it was received when `received` holds
    /// these very bytes, else made now.
    pub fn of(
        body: &'a [u8],
        received: Option<&'a Received>,
    ) -> Result<Text<'a>, std::str::Utf8Error> {
        match received.and_then(|r| r.text_of(body).map(|text| (text, r))) {
            Some((text, r)) => Ok(Text {
                text: text?,
                blocks: r.blocks(),
            }),
            None => {
                let text = std::str::from_utf8(body)?;
                Ok(Text {
                    text,
                    blocks: blocks_of(body).into(),
                })
            }
        }
    }
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

/// The trails of a first-bytes key, the newest first: conversations that start alike (an agent's
/// sub-agents, with one system prompt) each keep theirs.
/// Keyed by a seeded hash already, so spread by foldhash rather than SipHash (as the memos).
pub(super) type Table<F> =
    moka::sync::Cache<u64, Arc<Vec<Arc<Trail<F>>>>, foldhash::fast::RandomState>;

/// What a dialect's trail keeps ([`Walk::Found`]): its size for the table, and its table.
pub(super) trait Kept: Sized + Send + Sync + 'static {
    /// Bytes it takes, roughly.
    fn weight(&self) -> usize;
    fn table(resumes: &Resumes) -> &Table<Self>;
}

/// The trails of the bodies read lately, by dialect and first bytes. Only hashes of the bytes and
/// spans are kept, never the bytes; a trail is used only by a body whose bytes hash the same.
pub struct Resumes {
    pub(super) anthropic: Table<super::anthropic::Found>,
    pub(super) chat: Table<super::openai_chat::Found>,
    pub(super) responses: Table<super::openai_responses::Found>,
}

fn table<F: Kept>() -> Table<F> {
    moka::sync::Cache::builder()
        .max_capacity(TABLE_BYTES / 3)
        .weigher(|_, trails: &Arc<Vec<Arc<Trail<F>>>>| {
            let bytes: usize = trails
                .iter()
                .map(|trail| {
                    trail.marks.len() * std::mem::size_of::<Mark>()
                        + trail.blocks.len() * 8
                        + trail.found.weight()
                })
                .sum();
            u32::try_from(bytes).unwrap_or(u32::MAX)
        })
        .time_to_idle(IDLE)
        .build_with_hasher(Default::default())
}

impl Default for Resumes {
    fn default() -> Self {
        Resumes {
            anthropic: table(),
            chat: table(),
            responses: table(),
        }
    }
}

impl Resumes {
    fn key(dialect: Dialect, body: &str) -> u64 {
        let head = body.as_bytes().get(..KEY_BYTES).unwrap_or(body.as_bytes());
        twox_hash::XxHash3_64::oneshot_with_seed(seed() ^ dialect as u64, head)
    }
}

/// How a dialect's reading is walked ([`walk`]): its top-level fields, and the list (messages or
/// input items) walked element by element.
pub(super) trait Walk<'a>: Sized {
    /// What the trail keeps of the reading, by spans.
    type Found: Kept;
    type Element: Deserialize<'a>;
    fn start(body: &'a str) -> Self;
    /// Carries on from what an earlier body had found before `mark` (its bytes up to there are
    /// this body's).
    fn resume(body: &'a str, found: &Self::Found, mark: &Mark) -> Self;
    /// Reads the top-level field `key` at the cursor, or says it is the list (an array, next);
    /// `None` where the whole reading would fail or read it differently.
    fn field(&mut self, key: &str, cur: &mut Cursor<'a>) -> Option<Field>;
    /// The list's `[` is reached: the fields before it go in the trail.
    fn list_opened(&mut self);
    fn element(&mut self, n: usize, element: &Self::Element);
    /// How far each of the reading's lists has grown.
    fn counts(&self) -> [usize; 3];
    fn finish(self) -> (RequestView<'a>, Self::Found);
}

/// What a top-level field was ([`Walk::field`]).
pub(super) enum Field {
    Read,
    List,
}

/// Reads `body` by walking it, resumed from the trail of its dialect's table when one agrees
/// with it, and leaves its own trail there; also says where it resumed (0: from the start).
/// `None` where the walk meets what it does not expect: the caller reads the body whole, which
/// gives the view or the error as for any body.
pub(super) fn read<'a, W: Walk<'a>>(
    dialect: Dialect,
    body: &Text<'a>,
    resumes: &Resumes,
) -> Option<(RequestView<'a>, usize)> {
    let key = Resumes::key(dialect, body.text);
    let table = W::Found::table(resumes);
    let trails = table.get(&key).unwrap_or_default();
    // The trail this body agrees with furthest.
    let agreed = trails
        .iter()
        .filter_map(|t| Some((t, t.agreed(body)?)))
        .max_by_key(|(_, mark)| mark.at);
    let (view, trail, at) = walk::<W>(body, agreed.map(|(t, m)| (&**t, m)))?;
    if !trail.marks.is_empty() {
        // It takes the place of the trail it continues: one it agrees with to its last message,
        // or to the one before (whose bytes the client's cache marker may have changed). A trail
        // it shares only a start with is another conversation's, and stays.
        let continued = |t: &Arc<Trail<W::Found>>| {
            agreed.is_some_and(|(a, mark)| {
                let last = a.marks.last().map_or(0, |m| m.messages);
                Arc::ptr_eq(a, t) && mark.messages + 1 >= last
            })
        };
        let kept = std::iter::once(Arc::new(trail))
            .chain(trails.iter().filter(|t| !continued(t)).cloned())
            .take(TRAILS_PER_KEY)
            .collect();
        table.insert(key, Arc::new(kept));
    }
    Some((view, at))
}

/// The walk itself: from the last mark of `trail` the body agrees with, else from the start.
pub(super) fn walk<'a, W: Walk<'a>>(
    body: &Text<'a>,
    agreed: Option<(&Trail<W::Found>, Mark)>,
) -> Option<(RequestView<'a>, Trail<W::Found>, usize)> {
    let text = body.text;
    let mut cur = Cursor { body: text, at: 0 };
    let mut marks = Vec::new();
    let mut first = agreed.is_none();
    let resumed_at = agreed.as_ref().map_or(0, |(_, mark)| mark.at);
    let mut walk = match agreed {
        Some((trail, mark)) => {
            let mut walk = W::resume(text, &trail.found, &mark);
            marks.extend(trail.marks.iter().take_while(|m| m.at <= mark.at));
            cur.at = mark.at;
            elements(&mut cur, &mut walk, &mut marks, mark.messages)?;
            walk
        }
        None => {
            if !cur.eat(b'{') {
                return None;
            }
            W::start(text)
        }
    };
    // The top-level object's fields, from the start or from the end of the list.
    loop {
        if cur.eat(b'}') {
            break;
        }
        if !first && !cur.eat(b',') {
            return None;
        }
        first = false;
        let key: Key = cur.value()?;
        if !cur.eat(b':') {
            return None;
        }
        if let Field::List = walk.field(&key.0, &mut cur)? {
            if !cur.eat(b'[') {
                return None;
            }
            walk.list_opened();
            marks.push(Mark::at(text, cur.at, 0, walk.counts())?);
            elements(&mut cur, &mut walk, &mut marks, 0)?;
        }
    }
    if !cur.at_end() {
        return None;
    }
    let (view, found) = walk.finish();
    let trail = Trail {
        blocks: body.blocks.clone(),
        marks,
        found,
    };
    Some((view, trail, resumed_at))
}

/// Walks the list from after its `[` or after element number `n` - 1, to after its `]`.
fn elements<'a, W: Walk<'a>>(
    cur: &mut Cursor<'a>,
    walk: &mut W,
    marks: &mut Vec<Mark>,
    mut n: usize,
) -> Option<()> {
    loop {
        if cur.eat(b']') {
            return Some(());
        }
        if n > 0 && !cur.eat(b',') {
            return None;
        }
        let element: W::Element = cur.value()?;
        walk.element(n, &element);
        n += 1;
        marks.push(Mark::at(cur.body, cur.at, n, walk.counts())?);
    }
}

/// An object key, borrowed from the body when it has no escapes.
pub(super) struct Key<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Key<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<Key<'a>>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Key<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(Visit(std::marker::PhantomData))
    }
}

/// The fields read so far, one bit each: a walk that meets one twice gives up (the whole
/// reading refuses a known field twice).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Seen(u8);

impl Seen {
    /// Takes field number `bit`; `None` if it was taken before.
    pub fn take(&mut self, bit: u8) -> Option<()> {
        let mask = 1u8.checked_shl(u32::from(bit))?;
        (self.0 & mask == 0).then(|| self.0 |= mask)
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

/// The resumed view's property, for the fuzz target (`crate::fuzzing::resumed_view`): `body`,
/// received in chunks of `chunk` bytes, is its bytes, checked as text when it is UTF-8; `earlier`
/// walked from the start, and `body` walked from `earlier`'s trail, each give the view the whole
/// reading gives, when they do not give up. Panics where that does not hold.
#[allow(clippy::panic)] // a violated property must crash the fuzzer
pub(crate) fn check_walks(dialect: Dialect, earlier: &[u8], body: &[u8], chunk: usize) {
    let mut receiving = Receiving::with_capacity(body.len());
    for piece in body.chunks(chunk.max(1)) {
        receiving.push(Bytes::copy_from_slice(piece));
    }
    let (bytes, received) = receiving.finish();
    assert_eq!(&bytes[..], body, "received bytes differ");
    let utf8 = std::str::from_utf8(body).is_ok();
    assert!(
        received.is_some() || !utf8,
        "a UTF-8 body was not received as text"
    );
    let (Ok(earlier), Some(received)) = (Text::of(earlier, None), received) else {
        return;
    };
    let Ok(body) = Text::of(&bytes, Some(&received)) else {
        assert!(!utf8, "a received body is not its own text");
        return;
    };
    match dialect {
        Dialect::AnthropicMessages => {
            agree::<super::anthropic::Reading>(&earlier, &body, super::anthropic::read)
        }
        Dialect::OpenAiChat => {
            agree::<super::openai_chat::Reading>(&earlier, &body, super::openai_chat::read)
        }
        Dialect::OpenAiResponses => agree::<super::openai_responses::Reading>(
            &earlier,
            &body,
            super::openai_responses::read,
        ),
        // Gemini bodies are read whole: nothing to agree with.
        Dialect::GeminiGenerate => {}
    }
}

fn agree<'a, W: Walk<'a>>(
    earlier: &Text<'a>,
    body: &Text<'a>,
    whole: fn(&'a str) -> Result<RequestView<'a>, serde_json::Error>,
) {
    let whole = |text: &'a str| whole(text).ok().map(|v| format!("{v:?}"));
    let first = walk::<W>(earlier, None);
    if let Some((view, ..)) = &first {
        assert_eq!(
            Some(format!("{view:?}")),
            whole(earlier.text),
            "walked from the start"
        );
    }
    let trail = first.map(|(_, trail, _)| trail);
    let agreed = trail.as_ref().and_then(|t| Some((t, t.agreed(body)?)));
    if let Some((view, ..)) = walk::<W>(body, agreed) {
        assert_eq!(Some(format!("{view:?}")), whole(body.text), "resumed");
    }
}

/// Test support for each dialect's property test: the bodies of a generated conversation. Each
/// step pushes an element of kind `k` (ops 0 to 3), moves the client's marker onto the newest
/// element (4: it changes bytes an earlier body had), changes the model (5) or the first element
/// (6: no mark agrees), or makes that one body odd (7) in one of `oddities` ways, the first
/// `gives_up` of which the walk may give up on. `body` renders the elements, the model and the
/// way it is odd (7: not odd).
#[cfg(test)]
pub(super) fn conversation_bodies(
    steps: &[(u8, u8, u8)],
    (oddities, gives_up): (u8, u8),
    element: impl Fn(u8, usize, bool) -> String,
    body: impl Fn(&[String], u8, u8) -> String,
) -> Vec<(String, bool)> {
    let (mut kinds, mut marked, mut model, mut bodies) = (Vec::new(), None, 0u8, Vec::new());
    for &(op, k, odd) in steps {
        match op {
            0..=3 => kinds.push(k),
            4 => marked = kinds.len().checked_sub(1),
            5 => model = model.wrapping_add(1),
            6 => {
                if let Some(first) = kinds.first_mut() {
                    *first = first.wrapping_add(1)
                }
            }
            _ => {}
        }
        let odd = if op == 7 { odd % oddities } else { 7 };
        let elements: Vec<String> = kinds
            .iter()
            .enumerate()
            .map(|(n, &k)| element(k, n, marked == Some(n)))
            .collect();
        bodies.push((body(&elements, model, odd), odd < gives_up));
    }
    bodies
}

/// Test support for each dialect's walk: over a conversation's bodies, each walked from the
/// previous trail (and from none) gives the whole reading's view, or gives up, which only an
/// odd body may make it do.
#[cfg(test)]
pub(super) fn walked_as_whole<F>(
    bodies: &[(String, bool)],
    walk: impl Fn(&Text<'_>, Option<&Trail<F>>) -> Option<(String, Trail<F>)>,
    whole: impl Fn(&str) -> Option<String>,
) -> Result<(), String> {
    let mut trail: Option<Trail<F>> = None;
    for (body, odd) in bodies {
        let text = Text::of(body.as_bytes(), None).map_err(|e| e.to_string())?;
        let expected = whole(body);
        if let Some((view, _)) = walk(&text, None) {
            if Some(&view) != expected.as_ref() {
                return Err(format!(
                    "walked from the start: {view}\nwhole: {expected:?}\n{body}"
                ));
            }
        }
        match walk(&text, trail.as_ref()) {
            Some((view, next)) => {
                if Some(&view) != expected.as_ref() {
                    return Err(format!("resumed: {view}\nwhole: {expected:?}\n{body}"));
                }
                trail = Some(next);
            }
            None if *odd => {}
            None => return Err(format!("an ordinary body was not walked: {body}")),
        }
    }
    Ok(())
}
