//! Edits that pay (docs/cache.md): a change to history sluice already forwarded rewrites the
//! provider's cached prefix from where it is made, so before `recent` prunes a viewed image the
//! change is priced with the provider's cache model ([`super::cache`]). While the session's
//! cache is warm an edit is made only when it pays back within `horizon_requests`, and then
//! everything pending goes in one rewrite; on a cold cache, or when a hard limit forces it,
//! everything pending is made at once. `recent` keeps its promise: at least `recent_count`
//! newest images on every request; only when the older ones go changes.
//!
//! Then, for Anthropic, where the edits of later requests will start: an anchor breakpoint on
//! the last block of the history no pending edit touches, so a later edit rewrites only from
//! there ([`anchor`]), and for a conversation that marks no breakpoint at all, the one a careful
//! client sets (the newest block).
//!
//! Pure: the session's last forwarded request and the clock come in through the context, so
//! every replica decides the same, and a failed request changes nothing (A9).

use super::attach::state::{self, Candidate, Decision, Recent};
use super::attach::{Item, Media};
use super::cache::{self, Provider, Rates, Ttl};
use super::policy::{Breakpoints, CacheLimits, EditPolicy};
use super::view::{Edit, Span};
use super::{Context, RequestView};

/// Tokens a placeholder line costs the model (`[image #k: image/png 1280×800, …]`).
const PLACEHOLDER_TOKENS: u64 = 40;
/// Bytes of JSON text per token, for what lies between images (a conservative reading:
/// Claude's tokenizer gives 3.2-4.5 on agents' JSON).
const BYTES_PER_TOKEN: u64 = 4;
/// Images one Anthropic request may carry at up to 8,000 px; past it the limit is 2,000 px.
const MANY_IMAGES: usize = 20;

/// Whether the provider's cache still holds what the session last sent: its last forwarded
/// request is younger than the TTL (`ttl_seconds`, else the 5 minutes a breakpoint asks by
/// default). A session never forwarded is cold.
pub fn warm(last_ms: u64, now_ms: u64, limits: &CacheLimits) -> bool {
    let ttl = match limits.ttl_seconds {
        0 => Ttl::Short.seconds(),
        s => s,
    };
    last_ms > 0 && now_ms.saturating_sub(last_ms) < ttl.saturating_mul(1000)
}

/// The cache model's prices for this request's provider and model.
pub fn rates(view: &RequestView<'_>, limits: &CacheLimits) -> Rates {
    let model = view.model.as_deref().unwrap_or("");
    Rates {
        ttl_seconds: (limits.ttl_seconds > 0).then_some(limits.ttl_seconds),
        ..Rates::published(view.shapes.cache_provider(), model)
    }
}

/// An image of the request: where it stands, whether a tool result carries it, its size, the
/// base64 it came as.
pub(super) struct Placed<'i> {
    pub at: usize,
    pub in_tool_result: bool,
    pub item: &'i Item,
}

impl Placed<'_> {
    /// Tokens it costs shown.
    fn tokens(&self, view: &RequestView<'_>) -> u64 {
        match &self.item.media {
            Media::Image(c) => view.shapes.tokenizer().image(c.width, c.height),
            _ => PLACEHOLDER_TOKENS,
        }
    }

    /// The base64 bytes it takes in the received body.
    fn base64(&self) -> u64 {
        match (&self.item.base64, &self.item.media) {
            (Some(b), _) => b.len() as u64,
            (None, Media::Image(c)) => c.bytes.len() as u64 * 4 / 3,
            _ => 0,
        }
    }
}

/// The delivery decisions of a request's images, with `recent` pruning made when it pays
/// (economic) or as A4 batches it (eager); and how many prunes were put off.
pub(super) fn plan(
    view: &RequestView<'_>,
    ctx: &Context<'_>,
    candidates: &[Candidate],
    placed: &[Placed<'_>],
) -> (Vec<Decision>, usize) {
    let images = ctx.policy.images;
    let eager = Recent {
        count: images.recent_count,
        batch: images.prune_batch,
    };
    if ctx.policy.cache.policy == EditPolicy::Eager {
        return (state::plan(ctx.state, candidates, eager), 0);
    }
    let all = state::plan(
        ctx.state,
        candidates,
        Recent {
            count: images.recent_count,
            batch: 1,
        },
    );
    let kept = state::plan(
        ctx.state,
        candidates,
        Recent {
            count: usize::MAX,
            batch: 1,
        },
    );
    let pruned: Vec<usize> = (0..all.len())
        .filter(|&i| all[i] == Decision::Pruned && kept[i] != Decision::Pruned)
        .collect();
    let Some(&first) = pruned.first() else {
        return (all, 0);
    };
    // Kept, the request would carry these.
    let shown: Vec<usize> = (0..kept.len())
        .filter(|&i| kept[i] == Decision::Eligible)
        .collect();
    let shown_bytes: u64 = shown
        .iter()
        .filter_map(|&i| placed.get(i))
        .map(Placed::base64)
        .sum();
    let forced = shown.len() > images.max_images
        || shown_bytes > images.max_total_bytes
        || (shown.len() > MANY_IMAGES && view.shapes.limits_many_images());
    let warm = warm(ctx.state.last_ms, ctx.now_ms, ctx.policy.cache);
    if forced || !warm {
        return (all, 0);
    }
    let Some(at) = placed.get(first).map(|p| p.at) else {
        return (all, 0);
    };
    // Tokens after the edit as the request would be forwarded without it: the received bytes
    // less every image's base64, then each image at what it costs shown or as a placeholder.
    let mut after_bytes = (view.body.len().saturating_sub(at)) as u64;
    let mut after_images = 0;
    for (i, p) in placed.iter().enumerate().filter(|(_, p)| p.at >= at) {
        after_bytes = after_bytes.saturating_sub(p.base64());
        after_images += match kept.get(i) {
            Some(Decision::Eligible) => p.tokens(view),
            _ => PLACEHOLDER_TOKENS,
        };
    }
    let after = after_bytes / BYTES_PER_TOKEN + after_images;
    let removed: Vec<u64> = pruned
        .iter()
        .filter_map(|&i| placed.get(i))
        .map(|p| p.tokens(view).saturating_sub(PLACEHOLDER_TOKENS))
        .collect();
    let rates = rates(view, ctx.policy.cache);
    // What keeping them has cost so far: the newest pending image became pending with this
    // request, each older one a request earlier (one image a turn, as screenshot agents send).
    let kept_so_far: f64 = removed
        .iter()
        .rev()
        .enumerate()
        .map(|(age, &t)| rates.read * t as f64 * (age + 1) as f64)
        .sum();
    let removed: u64 = removed.iter().sum();
    let horizon = ctx.policy.cache.horizon_requests;
    // Made when it pays back within the horizon, and not before keeping the images has cost
    // as much as the rewrite: edits then come at the rate that makes the bill smallest (one
    // rewrite every √(2·rewrite / (read·image)) images), not one per turn.
    if cache::edit_pays(&rates, after, removed, horizon, warm)
        && kept_so_far >= cache::rewrite_cost(&rates, after, removed)
    {
        (all, 0)
    } else {
        (kept, pruned.len())
    }
}

/// A tool result block an anchor may go on: where its closing brace stands, and whether the
/// client marked it already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub close: usize,
    pub marked: bool,
}

/// Anthropic's breakpoints sluice adds (`breakpoints = "auto"`): an anchor on the last tool
/// result before `settled_end` (the first byte a pending or present edit touches), in a slot the
/// client left free; and, for a conversation with no breakpoint at all, a top-level marker (the
/// newest block). Never more than four in all, never on a block the client marked, none when
/// the client asks for 1-hour entries (a 5-minute anchor must not come before them).
pub(super) fn anchor(
    view: &RequestView<'_>,
    limits: &CacheLimits,
    settled_end: Option<usize>,
    made: &[Edit],
) -> Vec<Edit> {
    if limits.breakpoints == Breakpoints::Off || view.shapes.cache_provider() != Provider::Anthropic
    {
        return Vec::new();
    }
    let body = view.body.as_bytes();
    let under_way = view.tool_results.len() + view.user_images.len() > 0;
    if settled_end.is_none() && !under_way {
        return Vec::new();
    }
    // The body is scanned for markers only as far as the decision needs: the first one says
    // the client sets its own; all of them are counted only when an anchor may go in.
    let marker = view.shapes.breakpoint_field();
    let marked = memchr::memmem::find(body, marker).is_some();
    if marked && memchr::memmem::find(body, b"\"1h\"").is_some() {
        return Vec::new();
    }
    let mut edits = Vec::new();
    let rates = rates(view, limits);
    // A conversation under way (it carries tool results), long enough to cache.
    // Sizes are the forwarded request's: a spilled log before a slot no longer counts.
    if !marked && under_way && forwarded(body.len(), made) / BYTES_PER_TOKEN >= rates.min_tokens {
        edits.extend(top_marker(view));
    }
    let Some(end) = settled_end else {
        return edits;
    };
    let marks = match marked {
        true => memchr::memmem::find_iter(body, marker).count(),
        false => edits.len(),
    };
    if marks >= cache::MAX_BREAKPOINTS {
        return edits;
    }
    let slot = view
        .tool_results
        .iter()
        .rev()
        .filter_map(|r| r.slot)
        .find(|s| s.close < end);
    // Below the model's minimum an entry is not written: no anchor.
    if let Some(slot) =
        slot.filter(|s| !s.marked && forwarded(s.close, made) / BYTES_PER_TOKEN >= rates.min_tokens)
    {
        edits.push(Edit {
            span: Span {
                start: slot.close,
                end: slot.close,
            },
            with: view.shapes.block_breakpoint().into(),
        });
    }
    edits
}

/// Where offset `at` of the received body stands in the forwarded one: moved by every edit
/// that ends at or before it (edits never overlap).
fn forwarded(at: usize, made: &[Edit]) -> u64 {
    let (grown, shrunk) =
        made.iter()
            .filter(|e| e.span.end <= at)
            .fold((0u64, 0u64), |(g, s), e| {
                let (new, old) = (
                    e.with.len() as u64,
                    e.span.end.saturating_sub(e.span.start) as u64,
                );
                (g + new.saturating_sub(old), s + old.saturating_sub(new))
            });
    (at as u64 + grown).saturating_sub(shrunk)
}

/// The top-level marker, right after the body's opening brace.
fn top_marker(view: &RequestView<'_>) -> Option<Edit> {
    let open = view.body.find('{')?;
    view.body.get(..open)?.trim().is_empty().then(|| Edit {
        span: Span {
            start: open + 1,
            end: open + 1,
        },
        with: view.shapes.top_breakpoint().into(),
    })
}
