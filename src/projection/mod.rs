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
//! - [`guard`]: the context-window guard: estimate, retire the oldest tool results.
//! - [`project`]: the one function that puts these together.

use std::sync::Arc;

use crate::tenant::Tenant;
use attach::extract::Extracted;
use attach::state::{self, Candidate, Decision, Delta, SessionState};
use attach::{Item, Limits, Media, Outcome};

pub mod artifact;
pub mod attach;
pub mod cache;
pub mod edits;
pub mod exit;
pub mod guard;
pub mod memos;
pub mod policy;
mod rewrite;
pub mod shapes;
mod sounds;
pub mod view;

use memos::Memos;
use policy::{Lifetime, Policy};
use rewrite::{render_tool_content, render_user_part};
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

/// The source an image came from (a tool call id, or a fingerprint of the user's image part),
/// and the tool's name when known.
fn source_of<'v>(view: &'v RequestView<'_>, place: Place) -> (String, Option<&'v str>) {
    match place {
        Place::Tool(ri, _) => {
            let r = &view.tool_results[ri];
            (r.source.to_string(), r.tool_name.as_deref())
        }
        Place::User(ui) => {
            let image = &view.user_images[ui];
            if let Some(r) = image.beside.and_then(|ri| view.tool_results.get(ri)) {
                // One source per image: its tool call's, told apart from images in the result.
                let part = xxhash_rust::xxh3::xxh3_64(image.part.get().as_bytes());
                return (
                    format!("{}:beside:{part:016x}", r.source),
                    r.tool_name.as_deref(),
                );
            }
            let part = image.part.get();
            (
                format!("user:{:016x}", xxhash_rust::xxh3::xxh3_64(part.as_bytes())),
                None,
            )
        }
    }
}

/// An attachment's identity, independent of its position in the history: its source, its
/// number within the source, and its content.
fn identity(source: &str, item: &Item) -> String {
    let content = match (&item.media, item.id) {
        (_, Some(id)) => id.to_string(),
        (Media::Remote(url), _) => {
            format!("url:{:016x}", xxhash_rust::xxh3::xxh3_64(url.as_bytes()))
        }
        _ => "none".to_string(),
    };
    format!("{source}#{}#{content}", item.k)
}

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

/// Where an image of the request stands.
#[derive(Clone, Copy)]
enum Place {
    /// Item `1` of tool result `0`.
    Tool(usize, usize),
    /// User image `0` of the view.
    User(usize),
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

/// Projects a request with the tool results `retired` names (by index) shown retired.
pub(super) fn project_with(
    view: &RequestView<'_>,
    ctx: &Context<'_>,
    prepared: Prepared,
    retired: &[bool],
) -> Projection {
    let is_retired = |i: usize| retired.get(i).copied().unwrap_or(false);
    let policy = exit::Policy {
        tenant: ctx.tenant,
        budget: ctx.policy.budget(),
        read_tool: ctx.policy.read_tool,
    };
    let mut out = Projection::default();
    // Extract the images of tool results (remembered per content) and user messages.
    let Prepared {
        mut extracted,
        users,
    } = prepared;
    // Retired results first: one line each; their images leave the request (A10).
    guard::show_retired(view, ctx, &mut extracted, retired, &mut out);
    // Every image's artifact goes to the store each time; the store's cache makes a known one
    // free, and a stale one is stored again, refreshing its expiry.
    for e in extracted.iter().flatten() {
        out.spills.extend(media_artifacts(&e.items));
    }
    out.spills
        .extend(media_artifacts(users.iter().flatten().map(|i| &**i)));
    // Every image, in arrival (document) order.
    let mut places: Vec<(usize, usize, Place)> = Vec::new();
    for (ri, e) in extracted.iter().enumerate() {
        if let Some(e) = e {
            let at = view.tool_results[ri].span.start;
            places.extend((0..e.items.len()).map(|ii| (at, ii, Place::Tool(ri, ii))));
        }
    }
    for (ui, u) in users.iter().enumerate() {
        if u.is_some() {
            places.push((view.user_images[ui].span.start, 0, Place::User(ui)));
        }
    }
    places.sort_by_key(|&(at, sub, _)| (at, sub));
    let item_at = |place: Place| -> Option<&Item> {
        match place {
            Place::Tool(ri, ii) => extracted[ri].as_ref().map(|e| &e.items[ii]),
            Place::User(ui) => users[ui].as_deref(),
        }
    };
    let items: Vec<&Item> = places.iter().filter_map(|&(_, _, p)| item_at(p)).collect();
    let accepts = ctx.policy.accepts_images;
    let placed: Vec<edits::Placed> = places
        .iter()
        .filter_map(|&(at, _, place)| {
            Some(edits::Placed {
                at,
                in_tool_result: matches!(place, Place::Tool(..)),
                item: item_at(place)?,
            })
        })
        .collect();
    // The delivery state decides first which images may be shown at all (A3, A4, A10).
    let candidates: Vec<Candidate> = places
        .iter()
        .filter_map(|&(_, _, place)| {
            let item = item_at(place)?;
            let (source, tool) = source_of(view, place);
            Some(Candidate {
                key: identity(&source, item),
                lifetime: lifetime_of(
                    item.lifetime,
                    tool,
                    &ctx.policy,
                    ctx.memo,
                    ctx.policy.images.default_lifetime,
                ),
                showable: accepts && !matches!(item.media, Media::Refused(_)),
            })
        })
        .collect();
    // Recent pruning, made when it pays (docs/cache.md).
    let priced: Vec<edits::Priced> = placed.iter().map(|p| p.priced(view)).collect();
    let sounds = sounds::priced(view, ctx, &extracted);
    let caps = edits::Caps::images(view, ctx);
    let (decisions, deferred) = edits::plan(view, ctx, &candidates, &priced, &sounds, caps);
    out.summary.deferred_edits = deferred;
    let eligible: Vec<&Item> = items
        .iter()
        .zip(&decisions)
        .filter(|(_, d)| matches!(d, Decision::Eligible | Decision::NotShowable))
        .map(|(item, _)| *item)
        .collect();
    let limits = Limits::new(ctx.policy.images, accepts, view.shapes.limits_many_images());
    let shrink =
        |image: &crate::image::Checked, edge: u32, bytes: u64| ctx.memo.shrink(image, edge, bytes);
    let mut selected = attach::select(&eligible, &limits, &shrink).into_iter();
    let decided: Vec<Outcome> = decisions
        .iter()
        .map(|d| match d {
            Decision::Eligible | Decision::NotShowable => {
                selected.next().unwrap_or(Outcome::Deferred)
            }
            Decision::Consumed | Decision::Pruned | Decision::Released => Outcome::Retired,
        })
        .collect();
    let embedded: Vec<bool> = decided
        .iter()
        .map(|o| matches!(o, Outcome::Embed(_) | Outcome::KeepRemote))
        .collect();
    // Where the history stops being settled: the first image a later request may take out
    // (shown now, not retained) or this one takes out (pruned now). An anchor goes before it.
    let settled_end = candidates
        .iter()
        .zip(&decisions)
        .zip(&embedded)
        .zip(&placed)
        .filter(|(((c, d), &shown), _)| {
            (shown && c.lifetime != Lifetime::Retain)
                || (**d == Decision::Pruned
                    && ctx.state.status(&c.key) != Some(state::Status::Pruned))
        })
        .map(|(_, p)| p.at)
        .min();
    out.rereadable_later = candidates
        .iter()
        .zip(&embedded)
        .zip(&placed)
        .filter(|((c, &shown), p)| {
            shown && c.lifetime != Lifetime::Retain && p.in_tool_result && p.item.id.is_some()
        })
        .count();

    // Audio: its own gate, budgets and recent pruning; one delivery state (docs/audio.md).
    let pictures: Vec<edits::Priced> = match extracted.iter().flatten().any(|e| !e.audio.is_empty())
    {
        true => priced
            .iter()
            .zip(&embedded)
            .map(|(p, &shown)| p.forwarded(shown))
            .collect(),
        false => Vec::new(),
    };
    let audio = sounds::decide(view, ctx, &extracted, &pictures, &mut out);
    let has_media = !candidates.is_empty() || !audio.candidates.is_empty();
    out.delta = if audio.candidates.is_empty() {
        state::settle(ctx.state, &candidates, &decisions, &embedded)
    } else {
        state::settle(
            ctx.state,
            &[candidates, audio.candidates].concat(),
            &[decisions, audio.decisions].concat(),
            &[embedded, audio.sent].concat(),
        )
    };
    let mut tool_outcomes: Vec<Vec<Outcome>> = extracted
        .iter()
        .map(|e| vec![Outcome::Deferred; e.as_ref().map_or(0, |e| e.items.len())])
        .collect();
    let mut user_outcomes: Vec<Option<Outcome>> = vec![None; users.len()];
    for ((_, _, place), outcome) in places.iter().zip(decided) {
        let result = match *place {
            Place::Tool(ri, _) => Some(ri),
            Place::User(_) => None,
        };
        let artifact = item_at(*place).and_then(|i| i.id);
        out.images.push(event(&outcome, result, artifact));
        if matches!(outcome, Outcome::Retired | Outcome::Deferred)
            && item_at(*place).is_some_and(|i| i.id.is_some())
        {
            out.rereadable += 1;
        }
        match outcome {
            Outcome::Embed(_) | Outcome::KeepRemote => out.summary.embedded += 1,
            Outcome::Deferred => out.summary.deferred += 1,
            Outcome::Refused(_) => out.summary.refused += 1,
            Outcome::Gated | Outcome::Retired => out.summary.placeholders += 1,
        }
        match *place {
            Place::Tool(ri, ii) => tool_outcomes[ri][ii] = outcome,
            Place::User(ui) => user_outcomes[ui] = Some(outcome),
        }
    }
    // Tool results with images: their text (references, notes) through the text exit, then
    // written back with the images the dialect's way (A7).
    let mut chat_turns: Vec<(usize, Vec<String>)> = Vec::new();
    for (ri, e) in extracted.iter().enumerate() {
        let Some(e) = e else { continue };
        let result = &view.tool_results[ri];
        let outcomes = &tool_outcomes[ri];
        let mut text = e.text.clone();
        let heard = audio.heard.get(ri).map_or(&[][..], Vec::as_slice);
        let notes = e
            .items
            .iter()
            .zip(outcomes)
            .map(|(i, o)| attach::note(i, o));
        let audio_notes = e.audio.iter().zip(heard).map(|(s, h)| sounds::note(s, h));
        for note in notes.chain(audio_notes).flatten() {
            text.push('\n');
            text.push_str(&note);
        }
        if let Some((page, spill)) = exit::page_text(&text, &policy) {
            text = page;
            out.summary.spilled += 1;
            out.spills.push(spill);
        }
        let (content, chat_parts) =
            render_tool_content(view.shapes, result, e, (outcomes, heard), &text);
        out.edits.push(Edit {
            span: result.span,
            with: content,
        });
        if !chat_parts.is_empty() {
            chat_turns.push((result.item, chat_parts));
        }
    }
    // The other tool results: the text exit alone.
    let text = exit::project(view, &policy, ctx.memo, &|i| {
        extracted[i].is_some() || is_retired(i)
    });
    out.edits.extend(text.edits);
    out.summary.spilled += text.spilled;
    out.spills.extend(text.spills);
    out.memos = text.memos;
    // User images written back when they changed or are not shown.
    for (ui, (item, outcome)) in users.iter().zip(&user_outcomes).enumerate() {
        if let (Some(item), Some(outcome)) = (item, outcome) {
            if let Some(with) =
                render_user_part(view.shapes, view.user_images[ui].part, item, outcome)
            {
                out.edits.push(Edit {
                    span: view.user_images[ui].span,
                    with: with.into(),
                });
            }
        }
    }
    // OpenAI chat: each turn's images in one user message after its tool messages (A7).
    if !chat_turns.is_empty() {
        out.edits
            .extend(view.shapes.after_turns(view.body.as_bytes(), chat_turns));
    }
    // The session's cache clock moves with each request that carries images or audio.
    out.delta.touch |= has_media;
    // Anthropic: breakpoints in the slots the client left free (docs/cache.md).
    let anchors = edits::anchor(view, ctx.policy.cache, settled_end, &out.edits);
    out.edits.extend(anchors);
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

fn event(
    outcome: &Outcome,
    result: Option<usize>,
    artifact: Option<artifact::ArtifactId>,
) -> ImageEvent {
    let (name, reason, bytes, downscaled) = match outcome {
        Outcome::Embed(e) => ("embedded", "", e.base64.len() as u64, e.downscaled),
        Outcome::KeepRemote => ("embedded", "remote", 0, false),
        Outcome::Deferred => ("deferred", "budget", 0, false),
        Outcome::Refused(r) => ("refused", r.reason(), 0, false),
        Outcome::Gated => ("placeholder", "no_image_input", 0, false),
        Outcome::Retired => ("placeholder", "shown_before", 0, false),
    };
    let (width, height) = match outcome {
        Outcome::Embed(e) => (e.width, e.height),
        _ => (0, 0),
    };
    ImageEvent {
        outcome: name,
        reason,
        bytes,
        downscaled,
        width,
        height,
        result,
        artifact,
    }
}

#[cfg(test)]
mod tests;
