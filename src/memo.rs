//! The memos of projection, shared by all workers: bounded moka caches behind the core's
//! [`Memos`] trait, so an agent resending its history every turn pays for each tool result and
//! image once. Entries live at most half the store's idle TTL: a remembered page or image is
//! recomputed, and its artifact stored again (refreshing its expiry), before the artifact it
//! names can expire (S2).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::image::{Checked, Refusal};
use crate::projection::attach::extract::Extracted;
use crate::projection::attach::{Item, Media};
use crate::projection::exit::Memoized;
use crate::projection::memos::{Fresh, Memos};
use crate::projection::shapes::Shapes;
use crate::projection::{Raw, ToolResult};
use crate::tenant::Tenant;

/// Projected tool results, bounded by the bytes of their replacements.
const PAGE_MEMO_BYTES: u64 = 16 * 1024 * 1024;
/// Extracted images (decoded and base64), so a screenshot resent every turn is decoded and
/// checked once.
const EXTRACT_MEMO_BYTES: u64 = 64 * 1024 * 1024;
/// Downscaled images, by content and policy (A6: same input, same output).
const SHRINK_MEMO_BYTES: u64 = 32 * 1024 * 1024;
/// Token counts of the context guard, per fragment of a request (docs/context-guard.md): 32
/// bytes an entry, so a million fragments, far more than the live sessions of a gateway hold.
const TOKEN_MEMO_ENTRIES: u64 = 1 << 20;

/// A memo's cache. Its keys are already hashes, seeded per process, so the cache's own hash
/// need only spread them: foldhash's, not moka's default SipHash, which took a third of a
/// lookup's instructions, and an agent's turn makes one lookup per tool result of its history
/// (callgrind, docs/runtime.md).
type Cache<K, V> = moka::sync::Cache<K, V, foldhash::fast::RandomState>;

pub struct Memo {
    pages: Cache<u128, Memoized>,
    extracted: Cache<u128, Option<Arc<Extracted>>>,
    users: Cache<u128, Option<Arc<Item>>>,
    shrunk: Cache<(u128, u32, u64), Result<Checked, Refusal>>,
    /// Compiled `tool_lifetimes` globs (compiling one costs far more than matching it).
    globs: moka::sync::Cache<String, Option<globset::GlobMatcher>>,
    tokens: Cache<u128, u64>,
    /// Per process: the memo never leaves it, and a random seed keeps its keys unguessable.
    seed: u64,
}

/// Bytes an item holds (base64 and decoded), for the weighers.
fn item_bytes(item: &Item) -> usize {
    item.base64.as_ref().map_or(0, |b| b.len())
        + match &item.media {
            Media::Image(c) => c.bytes.len(),
            _ => 0,
        }
}

fn weight(bytes: usize) -> u32 {
    u32::try_from(bytes + 64).unwrap_or(u32::MAX)
}

impl Memo {
    /// Memos for a store whose artifacts expire after `ttl` idle.
    pub fn new(ttl: Duration) -> Memo {
        Memo {
            pages: moka::sync::Cache::builder()
                .max_capacity(PAGE_MEMO_BYTES)
                .time_to_live(ttl / 2)
                .weigher(|_, v: &Memoized| weight(v.as_ref().map_or(0, Bytes::len)))
                .build_with_hasher(Default::default()),
            extracted: moka::sync::Cache::builder()
                .max_capacity(EXTRACT_MEMO_BYTES)
                .time_to_live(ttl / 2)
                .weigher(|_, v: &Option<Arc<Extracted>>| {
                    weight(v.as_ref().map_or(0, |e| {
                        e.text.len() + e.items.iter().map(item_bytes).sum::<usize>()
                    }))
                })
                .build_with_hasher(Default::default()),
            users: moka::sync::Cache::builder()
                .max_capacity(EXTRACT_MEMO_BYTES / 2)
                .time_to_live(ttl / 2)
                .weigher(|_, v: &Option<Arc<Item>>| weight(v.as_deref().map_or(0, item_bytes)))
                .build_with_hasher(Default::default()),
            shrunk: moka::sync::Cache::builder()
                .max_capacity(SHRINK_MEMO_BYTES)
                .weigher(|_, v: &Result<Checked, Refusal>| {
                    weight(v.as_ref().map_or(0, |c| c.bytes.len()))
                })
                .build_with_hasher(Default::default()),
            globs: moka::sync::Cache::new(1024),
            tokens: moka::sync::Cache::builder()
                .max_capacity(TOKEN_MEMO_ENTRIES)
                .time_to_idle(ttl / 2)
                .build_with_hasher(Default::default()),
            seed: uuid::Uuid::new_v4().as_u64_pair().0,
        }
    }

    /// Remembers a tool result's text-exit outcome, once its artifact is stored.
    pub fn insert_page(&self, key: u128, value: Memoized) {
        self.pages.insert(key, value);
    }

    /// The key of `parts` for `tenant`: XXH3 over the tenant's key and the parts. In one shot
    /// over a stack buffer when they fit, as every key here does (the streaming hasher's setup
    /// cost more than hashing 48 bytes); the same value either way.
    fn key(&self, tenant: &Tenant, parts: &[&[u8]]) -> u128 {
        let tenant = &tenant.key()[..];
        let mut buf = [0u8; 128];
        let len = tenant.len() + parts.iter().map(|p| p.len()).sum::<usize>();
        if len > buf.len() {
            let mut h = xxhash_rust::xxh3::Xxh3::with_seed(self.seed);
            std::iter::once(tenant)
                .chain(parts.iter().copied())
                .for_each(|p| h.update(p));
            return h.digest128();
        }
        let mut at = 0;
        for part in std::iter::once(tenant).chain(parts.iter().copied()) {
            buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        xxhash_rust::xxh3::xxh3_128_with_seed(&buf[..len], self.seed)
    }
}

impl Default for Memo {
    fn default() -> Self {
        Memo::new(Duration::from_secs(crate::config::DEFAULT_IDLE_TTL_SECONDS))
    }
}

impl Memos for Memo {
    fn seed(&self) -> u64 {
        self.seed
    }

    fn page(&self, key: u128) -> Option<Memoized> {
        self.pages.get(&key)
    }

    fn tool_images(
        &self,
        shapes: &dyn Shapes,
        result: &ToolResult<'_>,
        tenant: &Tenant,
    ) -> Option<Arc<Extracted>> {
        // A hash and a lookup first: agents resend their history every turn, and a result seen
        // before, with or without images, costs no search (xxh3 is much faster than the byte
        // search for image markers on text full of near-matches).
        let key = self.key(tenant, &[&[shapes.tag()], &result.digest.to_le_bytes()]);
        self.extracted
            .get_with(key, || Fresh.tool_images(shapes, result, tenant))
    }

    fn known_tool_images(
        &self,
        shapes: &dyn Shapes,
        result: &ToolResult<'_>,
        tenant: &Tenant,
    ) -> Option<Option<Arc<Extracted>>> {
        self.extracted
            .get(&self.key(tenant, &[&[shapes.tag()], &result.digest.to_le_bytes()]))
    }

    fn user_image(
        &self,
        shapes: &dyn Shapes,
        part: Raw<'_>,
        k: usize,
        tenant: &Tenant,
    ) -> Option<Arc<Item>> {
        // The part (a base64 image, often megabytes) is hashed on its own by twox-hash's XXH3,
        // which runs on AVX2 where the CPU has it; the short rest by the streaming one.
        let content = twox_hash::XxHash3_128::oneshot_with_seed(self.seed, part.get().as_bytes());
        let key = self.key(
            tenant,
            &[
                &[shapes.tag()],
                &(k as u64).to_le_bytes(),
                &content.to_le_bytes(),
            ],
        );
        self.users
            .get_with(key, || Fresh.user_image(shapes, part, k, tenant))
    }

    fn tokens(&self, key: u128) -> Option<u64> {
        self.tokens.get(&key)
    }

    fn keep_tokens(&self, key: u128, tokens: u64) {
        self.tokens.insert(key, tokens);
    }

    fn glob_matches(&self, pattern: &str, name: &str) -> bool {
        self.globs
            .get_with_by_ref(pattern, || {
                globset::Glob::new(pattern)
                    .ok()
                    .map(|g| g.compile_matcher())
            })
            .is_some_and(|m| m.is_match(name))
    }

    fn shrink(
        &self,
        image: &Checked,
        max_dimension: u32,
        max_bytes: u64,
    ) -> Result<Checked, Refusal> {
        let key = (
            twox_hash::XxHash3_128::oneshot_with_seed(self.seed, &image.bytes),
            max_dimension,
            max_bytes,
        );
        self.shrunk
            .get_with(key, || Fresh.shrink(image, max_dimension, max_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key made in one shot is the key the streaming hasher makes, for parts that fit the
    /// buffer and parts that do not.
    #[test]
    fn a_key_is_the_xxh3_of_the_tenant_key_and_its_parts() {
        let memo = Memo::default();
        let tenant = Tenant::anonymous();
        let long = vec![7u8; 300];
        for parts in [
            vec![&b"digest-16-bytes!"[..]],
            vec![&b"12345678"[..], &b"a content digest"[..]],
            vec![&long[..]],
            vec![&[][..]],
        ] {
            let mut h = xxhash_rust::xxh3::Xxh3::with_seed(memo.seed);
            h.update(tenant.key());
            parts.iter().for_each(|part| h.update(part));
            assert_eq!(memo.key(&tenant, &parts), h.digest128());
        }
        assert_ne!(memo.key(&tenant, &[b"a"]), memo.key(&tenant, &[b"b"]));
    }
}
