//! A request body as it is received, chunk by chunk: kept as text for its view, with the hashes
//! of its 4 KiB blocks taken while each chunk is in hand, so a resumed reading
//! (`super::resume`) compares hashes instead of reading cold bytes.

use std::sync::Arc;

use bytes::Bytes;

use super::resume::{blocks_of, hash, BLOCK};

/// A body received as text, with its blocks hashed while it was in hand, so reading it later
/// costs no pass over bytes that are no longer in the cache.
#[derive(Debug, Clone)]
pub struct Received {
    store: Store,
    blocks: Arc<[u64]>,
}

impl Received {
    /// Its text, when `body` is its very bytes (`None` when it is not): as checked while it
    /// arrived, or, for a body that came in one chunk, checked now, once (std's check only to
    /// say where it is not UTF-8).
    pub(super) fn text_of<'a>(
        &'a self,
        body: &[u8],
    ) -> Option<Result<&'a str, std::str::Utf8Error>> {
        let bytes = self.store.bytes();
        if bytes.as_ptr() != body.as_ptr() || bytes.len() != body.len() {
            return None;
        }
        Some(match &self.store {
            Store::Text(text) => Ok(text.as_str()),
            Store::Chunk(chunk) => {
                simdutf8::basic::from_utf8(chunk).or_else(|_| std::str::from_utf8(chunk))
            }
        })
    }

    /// Its blocks' hashes.
    pub(super) fn blocks(&self) -> Arc<[u64]> {
        self.blocks.clone()
    }
}

/// A [`Received`] body's bytes.
#[derive(Debug, Clone)]
enum Store {
    /// Chunks copied into one buffer, checked as UTF-8 as each arrived.
    Text(Arc<String>),
    /// The one chunk the whole body came in, as hyper read it: not copied, and checked as
    /// UTF-8 when its view is read ([`Received::text_of`]), right after.
    Chunk(Bytes),
}

impl Store {
    fn bytes(&self) -> &[u8] {
        match self {
            Store::Text(text) => text.as_bytes(),
            Store::Chunk(bytes) => bytes,
        }
    }
}

/// The buffer behind a [`Received`] body's bytes.
struct Shared(Arc<String>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// A body being received chunk by chunk ([`Received`]). Most bodies arrive in one chunk (a
/// 200 KB one at 1,000 req/s came in one read in nine requests of ten, docs/runtime.md): that
/// chunk is kept as it is, and its blocks hashed at the end. From a second chunk on, the chunks
/// are copied into one buffer, sized by the declared length, each checked as UTF-8 and hashed
/// as it arrives. A body that turns out not to be UTF-8 is kept as bytes; its view will say
/// where it is not.
pub struct Receiving {
    /// The first chunk, until a second comes.
    first: Option<Bytes>,
    /// What the buffer is sized to when a second chunk comes.
    capacity: usize,
    text: String,
    /// The start of a character the last chunk ended inside.
    pending: Vec<u8>,
    blocks: Vec<u64>,
    /// Set once a byte is not UTF-8: the bytes from then on.
    bytes: Option<Vec<u8>>,
}

impl Receiving {
    pub fn with_capacity(bytes: usize) -> Self {
        Receiving {
            first: None,
            capacity: bytes,
            text: String::new(),
            pending: Vec::new(),
            blocks: Vec::new(),
            bytes: None,
        }
    }

    pub fn push(&mut self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        match self.first.take() {
            None if self.text.is_empty() && self.pending.is_empty() && self.bytes.is_none() => {
                self.first = Some(chunk);
                return;
            }
            None => {}
            Some(first) => {
                self.text
                    .reserve(self.capacity.max(first.len() + chunk.len()));
                self.blocks.reserve(self.capacity / BLOCK);
                self.take(&first);
            }
        }
        self.take(&chunk);
    }

    /// One chunk into the buffer: checked, and the blocks it completes hashed.
    fn take(&mut self, mut chunk: &[u8]) {
        if let Some(bytes) = &mut self.bytes {
            bytes.extend_from_slice(chunk);
            return;
        }
        // The rest of a character split between chunks.
        while let (false, Some((&next, rest))) = (self.pending.is_empty(), chunk.split_first()) {
            self.pending.push(next);
            chunk = rest;
            match std::str::from_utf8(&self.pending) {
                Ok(c) => {
                    self.text.push_str(c);
                    self.pending.clear();
                }
                Err(e) if e.error_len().is_some() => return self.broken(chunk),
                Err(_) => {}
            }
        }
        // simdutf8's check: a third of std's instructions per byte on this ASCII-heavy text,
        // chosen at run time for the CPU (AVX2 or SSE4.2), with std's `valid_up_to` and
        // `error_len`.
        match simdutf8::compat::from_utf8(chunk) {
            Ok(text) => self.text.push_str(text),
            Err(e) if e.error_len().is_none() => {
                let (valid, rest) = chunk.split_at(e.valid_up_to());
                self.text
                    .push_str(std::str::from_utf8(valid).unwrap_or_default());
                self.pending.extend_from_slice(rest);
            }
            Err(_) => return self.broken(chunk),
        }
        let done = self.text.len() / BLOCK;
        for k in self.blocks.len()..done {
            let block = self.text.as_bytes().get(k * BLOCK..(k + 1) * BLOCK);
            self.blocks.push(block.map_or(0, hash));
        }
    }

    /// From here on the body is bytes: what was text so far, then `chunk` and what follows.
    fn broken(&mut self, chunk: &[u8]) {
        let mut bytes = std::mem::take(&mut self.text).into_bytes();
        bytes.append(&mut self.pending);
        bytes.extend_from_slice(chunk);
        self.bytes = Some(bytes);
    }

    /// The body's bytes, and what was checked of them if they were all text (or, for a body
    /// that came in one chunk, what is to be checked).
    pub fn finish(mut self) -> (Bytes, Option<Received>) {
        if let Some(first) = self.first.take() {
            let received = Received {
                blocks: blocks_of(&first).into(),
                store: Store::Chunk(first.clone()),
            };
            return (first, Some(received));
        }
        if !self.pending.is_empty() {
            // It ended inside a character.
            let pending = std::mem::take(&mut self.pending);
            self.broken(&pending);
        }
        match self.bytes {
            Some(bytes) => (Bytes::from(bytes), None),
            None => {
                let text = Arc::new(self.text);
                let received = Received {
                    blocks: self.blocks.into(),
                    store: Store::Text(text.clone()),
                };
                (Bytes::from_owner(Shared(text)), Some(received))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::resume::Text;
    use proptest::prelude::*;

    proptest! {
        /// However a body is cut into chunks, even inside a character, what is received is its
        /// bytes, checked as text with its blocks hashed when it is UTF-8, and left as bytes
        /// when it is not.
        #[test]
        fn a_body_received_in_any_chunks_is_its_bytes_checked(
            text in "(a|é|日本|😀|\\\\n|\"){0,3000}",
            broken in proptest::option::of((any::<prop::sample::Index>(), 0x80u8..0xff)),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let mut bytes = text.into_bytes();
            if let Some((at, byte)) = broken {
                let at = at.index(bytes.len() + 1);
                bytes.insert(at, byte);
            }
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut receiving = Receiving::with_capacity(bytes.len());
            let (mut from, mut pieces) = (0, 0);
            for cut in cuts.into_iter().chain([bytes.len()]) {
                receiving.push(Bytes::copy_from_slice(&bytes[from..cut]));
                pieces += usize::from(cut > from);
                from = cut;
            }
            let (body, received) = receiving.finish();
            prop_assert_eq!(&body[..], &bytes[..]);
            let utf8 = std::str::from_utf8(&bytes).is_ok();
            // One chunk is kept as it came and checked when read; more are checked as they come.
            prop_assert_eq!(received.is_some(), utf8 || pieces == 1);
            if let Some(received) = &received {
                prop_assert_eq!(&received.blocks[..], &blocks_of(&bytes)[..]);
                let text = Text::of(&body, Some(received));
                prop_assert_eq!(text.is_ok(), utf8);
                if let Ok(text) = text {
                    prop_assert_eq!(text.text.as_ptr(), received.store.bytes().as_ptr(), "no copy");
                    prop_assert_eq!(text.text.as_ptr(), body.as_ptr(), "the bytes forwarded");
                }
            }
        }
    }
}
