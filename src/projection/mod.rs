//! The pure core (docs/architecture.md): a request's [`RequestView`], the policy of its route
//! and its session's delivery state go in; the [`Projection`] comes out — byte edits, artifacts
//! to store, the state delta to commit on success, and what happened, for metrics and headers.
//! No I/O, no runtime, no caches (those come in through [`Memos`]), no provider JSON written
//! (the dialect writes it through [`shapes::Shapes`]).
//!
//! - [`view`]: the view, edits and the splice (P1, P2).
//! - [`artifact`]: content addressing (S3, T7).
//! - [`policy`]: lifetimes, modalities, budgets.
//! - [`exit`]: the text exit: pages, notices, cursors (T1-T7).
//! - [`attach`]: images found, checked, selected under budgets; the delivery state (M, A).
//! - `pictures`, `sounds`: each image's and audio file's fate in a request; [`edits`]: the one
//!   decision their `recent` pruning goes through, priced with the [`cache`] model.
//! - `rewrite`: the decisions written back into the request's parts.
//! - [`guard`]: the context-window guard: estimate, retire the oldest tool results.
//! - [`project`]: the one function that puts these together.

use std::sync::Arc;

use crate::tenant::Tenant;
use attach::extract::Extracted;
use attach::state::{self, Delta, SessionState};
use attach::{Item, Media};

pub mod artifact;
pub mod attach;
pub mod cache;
pub mod edits;
pub mod exit;
pub mod guard;
pub mod memos;
mod pictures;
pub mod policy;
mod rewrite;
pub mod shapes;
mod sounds;
pub mod view;

use memos::Memos;
use policy::{Lifetime, Policy};
pub use view::{
    splice, splice_shared, Edit, Raw, RequestView, Rope, Span, SpliceError, ToolResult, UserImage,
};

/// What a request's projection changed, for the `x-sluice-projection` header (SPEC O3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    pub spilled: usize,
    pub embedded: usize,
    pub deferred: usize,
    pub refused: usize,
    pub placeholders: usize,
    /// Tool results shown retired by the context guard; `None` where the guard is off.
    pub retired: Option<usize>,
    /// History edits put off because they would not pay back yet (docs/cache.md).
    pub deferred_edits: usize,
}

impl Summary {
    pub fn header_value(&self) -> String {
        let mut value = format!(
            "spilled={}; embedded={}; deferred={}; refused={}; placeholders={}",
            self.spilled, self.embedded, self.deferred, self.refused, self.placeholders
        );
        if let Some(retired) = self.retired {
            value.push_str(&format!("; retired={retired}"));
        }
        if self.deferred_edits > 0 {
            value.push_str(&format!("; deferred_edits={}", self.deferred_edits));
        }
        value
    }
}

/// The result of projecting one request: pure data, for the caller to act on.
#[derive(Debug, Default)]
pub struct Projection {
    pub edits: Vec<Edit>,
    pub summary: Summary,
    /// Artifacts (spilled text, media bytes) to store before the request may be forwarded.
    pub spills: Vec<exit::Spill>,
    /// Text-exit memo entries to keep once the spills are stored.
    pub memos: Vec<(u128, exit::Memoized)>,
    /// What happened to each image, for the metrics.
    pub images: Vec<ImageEvent>,
    /// The session state changes to commit if the response completes (A9).
    pub delta: Delta,
    /// Image placeholders that name an artifact the read tool can show again (C5).
    pub rereadable: usize,
    /// Tool-result images shown now that a later request will replace by such a placeholder
    /// (`once`, `recent`): offering the read tool now, not then, spares one rewrite of the
    /// provider's whole cached prefix (docs/cache.md).
    pub rereadable_later: usize,
    /// What the context guard did, where it looked at the request.
    pub context: Option<guard::Report>,
    /// What happened to each audio item, for the metrics (docs/audio.md).
    pub audio: Vec<AudioEvent>,
}

pub use sounds::AudioEvent;

/// An attachment's lifetime (M5): the hint on the item, else the first `tool_lifetimes` glob
/// that matches the tool's name, else the route's default for its kind (`default`).
fn lifetime_of(
    hint: Option<Lifetime>,
    tool: Option<&str>,
    policy: &Policy<'_>,
    memo: &dyn Memos,
    default: Lifetime,
) -> Lifetime {
    if let Some(hint) = hint {
        return hint;
    }
    if let Some(tool) = tool {
        for (glob, lifetime) in policy.tool_lifetimes {
            if memo.glob_matches(glob, tool) {
                return *lifetime;
            }
        }
    }
    default
}

/// One image's fate in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageEvent {
    /// `embedded`, `deferred`, `refused` or `placeholder`.
    pub outcome: &'static str,
    pub reason: &'static str,
    /// Base64 bytes embedded.
    pub bytes: u64,
    pub downscaled: bool,
    /// Its size as embedded (0 × 0 for a URL passed on or an image not shown).
    pub width: u32,
    pub height: u32,
    /// The tool result it is in, by index in the view; `None` for a user image.
    pub result: Option<usize>,
    /// Its artifact, when it has bytes sluice stored.
    pub artifact: Option<artifact::ArtifactId>,
}

/// What projection needs besides the view: who asks, under which route's policy, and the memos
/// of earlier projections.
pub struct Context<'a> {
    pub tenant: &'a Tenant,
    pub policy: Policy<'a>,
    pub memo: &'a dyn Memos,
    /// The session's delivery state before this request (A3, A4).
    pub state: &'a SessionState,
    /// The clock (ms since the epoch), for whether the provider's cache is still warm
    /// (`edits`).
    pub now_ms: u64,
}

/// The images of a request, found and checked (remembered per content): the part of
/// projection that needs no session state, done first so a request without images can skip the
/// session store entirely.
#[derive(Clone)]
pub struct Prepared {
    extracted: Vec<Option<Arc<Extracted>>>,
    users: Vec<Option<Arc<Item>>>,
}

impl Prepared {
    pub fn new(view: &RequestView<'_>, tenant: &Tenant, memo: &dyn Memos) -> Prepared {
        let extracted = view
            .tool_results
            .iter()
            .map(|r| memo.tool_images(view.shapes, r, tenant))
            .collect();
        let mut per_message = std::collections::HashMap::new();
        let users = view
            .user_images
            .iter()
            .map(|u| {
                let k = per_message.entry(u.item).or_insert(0usize);
                *k += 1;
                memo.user_image(view.shapes, u.part, *k, tenant)
            })
            .collect();
        Prepared { extracted, users }
    }

    /// The request's images found cheaply when it carries none: every tool result is one the
    /// memo knows holds no image, or a new one without an image marker (remembered now).
    /// `None` when it has a user image, or a tool result that holds images or may: finding and
    /// checking them is CPU work (docs/runtime.md).
    pub fn without_images(
        view: &RequestView<'_>,
        tenant: &Tenant,
        memo: &dyn Memos,
    ) -> Option<Prepared> {
        if !view.user_images.is_empty() {
            return None;
        }
        for result in &view.tool_results {
            match memo.known_tool_images(view.shapes, result, tenant) {
                Some(None) => {}
                Some(Some(_)) => return None,
                None if view.shapes.may_hold_media(result.content.get()) => return None,
                None => {
                    memo.tool_images(view.shapes, result, tenant);
                }
            }
        }
        Some(Prepared {
            extracted: vec![None; view.tool_results.len()],
            users: Vec::new(),
        })
    }

    /// Whether the request carries any image, and so needs its session's delivery state.
    pub fn has_images(&self) -> bool {
        self.extracted.iter().any(Option::is_some) || self.users.iter().any(Option::is_some)
    }

    /// How many images the request carries.
    pub fn images(&self) -> usize {
        self.extracted
            .iter()
            .flatten()
            .map(|e| e.items.len())
            .sum::<usize>()
            + self.users.iter().flatten().count()
    }
}

/// Projects a request: images first (M1-M5, A1, A5-A7), then the text exit on what text
/// remains (T2, section 3). When nothing needs changing the edits are empty and the body is
/// forwarded as sent (P1).
pub fn project(view: &RequestView<'_>, ctx: &Context<'_>) -> Projection {
    project_prepared(view, ctx, Prepared::new(view, ctx.tenant, ctx.memo))
}

/// [`project`] with the images already found, under the route's context guard
/// ([`guard::project`]).
pub fn project_prepared(
    view: &RequestView<'_>,
    ctx: &Context<'_>,
    prepared: Prepared,
) -> Projection {
    guard::project(view, ctx, prepared)
}

/// Projects a request with the tool results `retired` names (by index) shown retired: the
/// retired results' lines, the media decided (images, then audio, their `recent` pruning
/// through the one edit decision), one delta for both, the request written back, then the
/// breakpoints sluice adds.
pub(super) fn project_with(
    view: &RequestView<'_>,
    ctx: &Context<'_>,
    prepared: Prepared,
    retired: &[bool],
) -> Projection {
    let mut out = Projection::default();
    let mut media = prepared;
    // Retired results first: one line each; their images leave the request (A10).
    guard::show_retired(view, ctx, &mut media.extracted, retired, &mut out);
    // Every image's artifact goes to the store each time; the store's cache makes a known one
    // free, and a stale one is stored again, refreshing its expiry.
    for e in media.extracted.iter().flatten() {
        out.spills.extend(media_artifacts(&e.items));
    }
    out.spills
        .extend(media_artifacts(media.users.iter().flatten().map(|i| &**i)));
    // Images, then audio on its own gate and budgets; one delivery state (docs/audio.md).
    let sounds_priced = sounds::priced(view, ctx, &media.extracted);
    let images = pictures::decide(view, ctx, &media, &sounds_priced, &mut out);
    let audio = sounds::decide(view, ctx, &media.extracted, &images.forwarded, &mut out);
    out.delta = if audio.candidates.is_empty() {
        state::settle(
            ctx.state,
            &images.candidates,
            &images.decisions,
            &images.shown,
        )
    } else {
        state::settle(
            ctx.state,
            &[&images.candidates[..], &audio.candidates].concat(),
            &[&images.decisions[..], &audio.decisions].concat(),
            &[&images.shown[..], &audio.sent].concat(),
        )
    };
    // The session's cache clock moves with each request that carries images or audio.
    out.delta.touch |= !images.candidates.is_empty() || !audio.candidates.is_empty();
    rewrite::write_back(view, ctx, &media, (&images, &audio), retired, &mut out);
    // Anthropic: breakpoints in the slots the client left free (docs/cache.md).
    let anchors = edits::anchor(view, ctx, images.settled_end, &out.edits, &media);
    out.delta.touch |= anchors.own;
    out.delta.paused |= anchors.paused;
    out.edits.extend(anchors.edits);
    out
}

fn media_artifacts<'a>(items: impl IntoIterator<Item = &'a Item>) -> Vec<exit::Spill> {
    items
        .into_iter()
        .filter_map(|item| match (&item.media, item.id) {
            (Media::Image(image), Some(id)) => Some(exit::Spill {
                id,
                bytes: image.bytes.clone(),
            }),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests;
