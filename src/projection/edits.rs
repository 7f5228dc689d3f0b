//! Edits that pay (docs/cache.md): a change to history sluice already forwarded rewrites the
//! provider's cached prefix from where it is made, so before `recent` prunes a viewed image or
//! audio file the change is priced with the provider's cache model ([`super::cache`]). While
//! the session's cache is warm an edit is made only when it pays back within
//! `horizon_requests`, and then everything pending goes in one rewrite; on a cold cache, or
//! when a hard limit forces it, everything pending is made at once. `recent` keeps its
//! promise: at least `recent_count` newest images (audio files, on their own count) on every
//! request; only when the older ones go changes.
//!
//! Then, for Anthropic, where the edits of later requests will start: an anchor breakpoint on
//! the last block of the history no pending edit touches, so a later edit rewrites only from
//! there ([`anchor`]), and for a conversation that marks no breakpoint at all, the one a careful
//! client sets (the newest block).
//!
//! Pure: the session's last forwarded request and the clock come in through the context, so
//! every replica decides the same, and a failed request changes nothing (A9).

use super::attach::extract::Extracted;
use super::attach::state::{self, Candidate, Decision, Recent, SessionState};
use super::attach::{Item, Media};
use super::cache::{self, Provider, Rates, Ttl};
use super::policy::{Breakpoints, CacheLimits, EditPolicy};
use super::view::{Edit, Span};
use super::{Context, Prepared, RequestView};

/// Tokens a placeholder line costs the model (`[image #k: image/png 1280×800, …]`).
const PLACEHOLDER_TOKENS: u64 = 40;
/// Bytes of JSON text per token, for what lies between images (a conservative reading:
/// Claude's tokenizer gives 3.2-4.5 on agents' JSON).
const BYTES_PER_TOKEN: u64 = 4;
/// Images one Anthropic request may carry at up to 8,000 px; past it the limit is 2,000 px.
const MANY_IMAGES: usize = 20;

/// Whether the provider's cache still holds what the session last sent: its last forwarded
/// request is younger than the TTL (`ttl_seconds`, else the 5 minutes a breakpoint asks by
/// default; an hour once sluice's own breakpoints ask for it, [`Keep`]). A session never
/// forwarded is cold.
pub fn warm(state: &SessionState, now_ms: u64, limits: &CacheLimits) -> bool {
    let ttl = if state.paused { Ttl::Long } else { Ttl::Short };
    state.last_ms > 0 && now_ms.saturating_sub(state.last_ms) < ttl_ms(limits, ttl)
}

fn ttl_ms(limits: &CacheLimits, ttl: Ttl) -> u64 {
    cache::lifetime_ms((limits.ttl_seconds > 0).then_some(limits.ttl_seconds), ttl)
}

/// How long the breakpoints sluice sets in a conversation that marks none ask the provider to
/// keep their entries. Five minutes, until the session comes back after a pause that 5-minute
/// entries did not outlast and a 1-hour one would have (its last request older than the short
/// TTL, younger than the long one): then an hour, for the rest of the session. A 1-hour entry
/// costs 2× to write instead of 1.25×, 0.75× more on each turn's new tokens; each later pause
/// it outlasts reads the whole conversation at 0.1× instead of writing it again at 1.25×. A
/// person who paused once will pause again; a brisk loop never pays the premium.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    /// The breakpoints ask for 1-hour entries.
    pub long: bool,
    /// This request is the one after the first such pause ([`state::Delta::paused`]).
    pub paused: bool,
}

impl Keep {
    pub fn of(state: &SessionState, now_ms: u64, limits: &CacheLimits) -> Keep {
        let idle = now_ms.saturating_sub(state.last_ms);
        let paused = state.last_ms > 0
            && idle >= ttl_ms(limits, Ttl::Short)
            && idle < ttl_ms(limits, Ttl::Long);
        Keep {
            long: state.paused || paused,
            paused: paused && !state.paused,
        }
    }
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
    /// The image as the decision prices it: what it costs shown, and its base64, which is also
    /// what the image budgets count (A5).
    pub fn priced(&self, view: &RequestView<'_>) -> Priced {
        let tokens = match &self.item.media {
            Media::Image(c) => view.shapes.tokenizer().image(c.width, c.height),
            _ => PLACEHOLDER_TOKENS,
        };
        let base64 = match (&self.item.base64, &self.item.media) {
            (Some(b), _) => b.len() as u64,
            (None, Media::Image(c)) => c.bytes.len() as u64 * 4 / 3,
            _ => 0,
        };
        Priced {
            at: self.at,
            tokens,
            base64,
            size: base64,
        }
    }
}

/// A media item (an image or an audio file) as the decision prices it: where it stands, what
/// it costs the model shown, the base64 it takes in the received body, and its size as its
/// budget counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Priced {
    pub at: usize,
    pub tokens: u64,
    pub base64: u64,
    pub size: u64,
}

impl Priced {
    /// The same item as forwarded in this request: its tokens when it is shown, a placeholder
    /// line's when it is not.
    pub fn forwarded(self, shown: bool) -> Priced {
        Priced {
            tokens: if shown {
                self.tokens
            } else {
                PLACEHOLDER_TOKENS
            },
            ..self
        }
    }
}

/// What one kind of media answers to: A4's `recent` counts, and the hard limits that force a
/// prune when keeping would pass them (the request's count and bytes, and for Anthropic's
/// images the count past which its size limit drops).
#[derive(Debug, Clone, Copy)]
pub(super) struct Caps {
    pub recent_count: usize,
    pub prune_batch: usize,
    pub max_count: usize,
    pub max_bytes: u64,
    pub many: Option<usize>,
}

impl Caps {
    /// The caps of a request's images.
    pub fn images(view: &RequestView<'_>, ctx: &Context<'_>) -> Caps {
        let images = ctx.policy.images;
        Caps {
            recent_count: images.recent_count,
            prune_batch: images.prune_batch,
            max_count: images.max_images,
            max_bytes: images.max_total_bytes,
            many: view.shapes.limits_many_images().then_some(MANY_IMAGES),
        }
    }

    /// The caps of a request's audio files (`[routes.audio]`, counted on the files' bytes).
    pub fn audio(ctx: &Context<'_>) -> Caps {
        let audio = ctx.policy.audio;
        Caps {
            recent_count: audio.recent_count,
            prune_batch: audio.prune_batch,
            max_count: audio.max_audio,
            max_bytes: audio.max_total_bytes,
            many: None,
        }
    }
}

/// The delivery decisions of one kind of media (`candidates`, priced one for one in `priced`),
/// with `recent` pruning made when it pays (economic) or as A4 batches it (eager); and how
/// many prunes were put off. `others` are the request's media of the other kind as forwarded,
/// counted at their tokens, not their base64, in what an edit rewrites.
pub(super) fn plan(
    view: &RequestView<'_>,
    ctx: &Context<'_>,
    candidates: &[Candidate],
    priced: &[Priced],
    others: &[Priced],
    caps: Caps,
) -> (Vec<Decision>, usize) {
    let eager = Recent {
        count: caps.recent_count,
        batch: caps.prune_batch,
    };
    if ctx.policy.cache.policy == EditPolicy::Eager {
        return (state::plan(ctx.state, candidates, eager), 0);
    }
    let all = state::plan(
        ctx.state,
        candidates,
        Recent {
            count: caps.recent_count,
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
        .filter_map(|&i| priced.get(i))
        .map(|p| p.size)
        .sum();
    let forced = shown.len() > caps.max_count
        || shown_bytes > caps.max_bytes
        || caps.many.is_some_and(|many| shown.len() > many);
    let warm = warm(ctx.state, ctx.now_ms, ctx.policy.cache);
    if forced || !warm {
        return (all, 0);
    }
    let Some(at) = priced.get(first).map(|p| p.at) else {
        return (all, 0);
    };
    // Tokens after the edit as the request would be forwarded without it: the received bytes
    // less every item's base64, then each item at what it costs shown or as a placeholder.
    let kept_now = priced
        .iter()
        .zip(&kept)
        .map(|(p, d)| p.forwarded(*d == Decision::Eligible));
    let mut after_bytes = (view.body.len().saturating_sub(at)) as u64;
    let mut after_media = 0;
    for p in kept_now
        .chain(others.iter().copied())
        .filter(|p| p.at >= at)
    {
        after_bytes = after_bytes.saturating_sub(p.base64);
        after_media += p.tokens;
    }
    let after = after_bytes / BYTES_PER_TOKEN + after_media;
    let removed: Vec<u64> = pruned
        .iter()
        .filter_map(|&i| priced.get(i))
        .map(|p| p.tokens.saturating_sub(PLACEHOLDER_TOKENS))
        .collect();
    let rates = rates(view, ctx.policy.cache);
    // What keeping them has cost so far: the newest pending item became pending with this
    // request, each older one a request earlier (one a turn, as screenshot agents send).
    let kept_so_far: f64 = removed
        .iter()
        .rev()
        .enumerate()
        .map(|(age, &t)| rates.read * t as f64 * (age + 1) as f64)
        .sum();
    let removed: u64 = removed.iter().sum();
    let horizon = ctx.policy.cache.horizon_requests;
    // Made when it pays back within the horizon, and not before keeping the items has cost
    // as much as the rewrite: edits then come at the rate that makes the bill smallest (one
    // rewrite every √(2·rewrite / (read·item)) items), not one per turn.
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

/// The breakpoints [`anchor`] adds, and what they mean for the session's state.
#[derive(Debug, Default)]
pub(super) struct Anchors {
    pub edits: Vec<Edit>,
    /// The conversation marks no breakpoint and sluice set the one at its newest block: the
    /// session's cache clock moves with this request ([`state::Delta::touch`]).
    pub own: bool,
    /// ... and this request came after the session's first pause ([`Keep::paused`]).
    pub paused: bool,
}

/// Anthropic's breakpoints sluice adds (`breakpoints = "auto"`): an anchor on the last tool
/// result before `settled_end` (the first byte a pending or present edit touches), in a slot the
/// client left free; and, for a conversation with no breakpoint at all, a top-level marker (the
/// newest block), both then asking for the TTL [`Keep`] chooses. Never more than four in all,
/// never on a block the client marked, none when the client asks for 1-hour entries (a
/// 5-minute anchor must not come before them).
pub(super) fn anchor(
    view: &RequestView<'_>,
    ctx: &Context<'_>,
    settled_end: Option<usize>,
    made: &[Edit],
    media: &Prepared,
) -> Anchors {
    let limits = ctx.policy.cache;
    let mut out = Anchors::default();
    if limits.breakpoints == Breakpoints::Off || view.shapes.cache_provider() != Provider::Anthropic
    {
        return out;
    }
    let body = view.body.as_bytes();
    let under_way = view.tool_results.len() + view.user_images.len() > 0;
    if settled_end.is_none() && !under_way {
        return out;
    }
    // The client's markers are looked for only as far as the decision needs: the first one
    // says the client sets its own; all of them are counted only when an anchor may go in.
    let marker = view.shapes.breakpoint_field();
    let client = Marks::of(view.body, &view.tool_results, media, marker);
    let marked = client.marked(marker);
    if marked && client.asks_long() {
        return out;
    }
    let rates = rates(view, limits);
    // sluice's own breakpoints choose their TTL; next to the client's they are 5-minute ones.
    let keep = match marked {
        true => Keep {
            long: false,
            paused: false,
        },
        false => Keep::of(ctx.state, ctx.now_ms, limits),
    };
    // A conversation under way (it carries tool results), long enough to cache.
    // Sizes are the forwarded request's: a spilled log before a slot no longer counts.
    if !marked && under_way && forwarded(body.len(), made) / BYTES_PER_TOKEN >= rates.min_tokens {
        if let Some(top) = top_marker(view, keep.long) {
            out.edits.push(top);
            out.own = true;
            out.paused = keep.paused;
        }
    }
    let Some(end) = settled_end else {
        return out;
    };
    let marks = match marked {
        true => client.count(marker),
        false => out.edits.len(),
    };
    if marks >= cache::MAX_BREAKPOINTS {
        return out;
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
        out.edits.push(Edit {
            span: Span {
                start: slot.close,
                end: slot.close,
            },
            with: view.shapes.block_breakpoint(keep.long).into(),
        });
    }
    out
}

/// Whether sluice may set the breakpoint of a conversation that marks none (Anthropic,
/// `breakpoints = "auto"`, tool results, no marker of the client's, long enough to cache):
/// such a request needs the session's cache clock ([`Keep`]) even when nothing else of it
/// does. On the safe side: the request as received.
pub fn may_mark_own(view: &RequestView<'_>, limits: &CacheLimits, media: &Prepared) -> bool {
    if limits.breakpoints == Breakpoints::Off
        || view.shapes.cache_provider() != Provider::Anthropic
        || view.tool_results.is_empty()
        || (view.body.len() as u64) / BYTES_PER_TOKEN < rates(view, limits).min_tokens
    {
        return false;
    }
    let marker = view.shapes.breakpoint_field();
    !Marks::of(view.body, &view.tool_results, media, marker).marked(marker)
}

/// A marker's 1-hour TTL, as the client writes it.
const LONG_TTL: &[u8] = b"\"1h\"";

/// Where the client's breakpoints can be in the request as it is forwarded: the body outside
/// the tool results whose content is one string and those sluice writes again with their media
/// (their base64, megabytes each in a screenshot session, holds none; scanning it cost 0.8 ms a
/// request at 15 MB), and what the rewritten results keep of the client's parts: their last
/// part's breakpoint, the parts kept as they were, an image part's other fields. Text anywhere
/// else that spells a marker counts too, and so do the fields of an image a request no longer
/// shows: on the safe side.
struct Marks<'b> {
    pieces: Vec<&'b [u8]>,
    /// The rewritten results' last-part breakpoints (their values, without the field's name).
    kept: Vec<&'b [u8]>,
}

impl<'b> Marks<'b> {
    fn of(
        body: &'b str,
        results: &[super::ToolResult<'_>],
        media: &'b Prepared,
        marker: &[u8],
    ) -> Marks<'b> {
        let body = body.as_bytes();
        let mut marks = Marks {
            pieces: Vec::new(),
            kept: Vec::new(),
        };
        // A result whose content is one JSON string holds no marker (a quote inside it is
        // escaped), whatever its length; one rewritten with its media holds what it keeps.
        let mut skipped: Vec<(Span, Option<&Extracted>)> = results
            .iter()
            .zip(
                media
                    .extracted
                    .iter()
                    .map(Option::as_deref)
                    .chain(std::iter::repeat(None)),
            )
            .filter(|(r, e)| e.is_some() || r.content.get().starts_with('"'))
            .map(|(r, e)| (r.span, e))
            .collect();
        skipped.sort_by_key(|(span, _)| span.start);
        let mut at = 0;
        for (span, e) in skipped {
            marks.pieces.extend(body.get(at..span.start));
            at = at.max(span.end);
            let Some(e) = e else { continue };
            marks.pieces.extend(e.others.iter().map(String::as_bytes));
            for extras in e.items.iter().filter_map(|i| i.extras.as_deref()) {
                marks.pieces.push(extras.outer.as_bytes());
                marks.pieces.push(extras.inner.as_bytes());
            }
            // Written back on the last part unless that part carries a marker already: with
            // no other parts kept, the last image's part, which keeps its own fields.
            let last_marked = e.others.is_empty()
                && e.items
                    .last()
                    .and_then(|i| i.extras.as_deref())
                    .is_some_and(|x| memchr::memmem::find(x.outer.as_bytes(), marker).is_some());
            if !last_marked {
                marks
                    .kept
                    .extend(e.breakpoint.as_deref().map(str::as_bytes));
            }
        }
        marks.pieces.extend(body.get(at..));
        marks
    }

    /// Whether the client marks any breakpoint.
    fn marked(&self, marker: &[u8]) -> bool {
        !self.kept.is_empty()
            || self
                .pieces
                .iter()
                .any(|p| memchr::memmem::find(p, marker).is_some())
    }

    /// Whether the client asks for 1-hour entries anywhere.
    fn asks_long(&self) -> bool {
        self.pieces
            .iter()
            .chain(&self.kept)
            .any(|p| memchr::memmem::find(p, LONG_TTL).is_some())
    }

    /// How many markers the forwarded request carries of the client's.
    fn count(&self, marker: &[u8]) -> usize {
        let counted: usize = self
            .pieces
            .iter()
            .map(|p| memchr::memmem::find_iter(p, marker).count())
            .sum();
        counted + self.kept.len()
    }
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
fn top_marker(view: &RequestView<'_>, long: bool) -> Option<Edit> {
    let open = view.body.find('{')?;
    view.body.get(..open)?.trim().is_empty().then(|| Edit {
        span: Span {
            start: open + 1,
            end: open + 1,
        },
        with: view.shapes.top_breakpoint(long).into(),
    })
}
