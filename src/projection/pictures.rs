//! Images in a request (SPEC sections 4 and 5): each one's fate, decided in arrival (document)
//! order — first what the session's delivery state allows (A3, A4, A10), with `recent` pruning
//! made when it pays (`edits`, docs/cache.md), then the route's gate and the request's budgets
//! (A1, A5, A6, [`attach::select`]). The outcomes are counted here, for the header, the metrics
//! and the inspector; the request is written back elsewhere (`rewrite`). Audio is decided the
//! same way, on its own gate and budgets (`sounds`).

use super::attach::state::{self, Candidate, Decision};
use super::attach::{self, Item, Limits, Media, Outcome};
use super::edits::{self, Priced};
use super::policy::Lifetime;
use super::{artifact, lifetime_of, Context, ImageEvent, Prepared, Projection, RequestView};

/// Where an image of the request stands.
#[derive(Clone, Copy)]
enum Place {
    /// Item `1` of tool result `0`.
    Tool(usize, usize),
    /// User image `0` of the view.
    User(usize),
}

/// Every image of the request decided.
pub(super) struct Decided {
    /// Per tool result (by index in the view), one outcome per image it carries.
    pub tool: Vec<Vec<Outcome>>,
    /// Per user image of the view, its outcome.
    pub users: Vec<Option<Outcome>>,
    /// The candidates the delivery state tracks, their decisions and whether each is shown,
    /// for the request's one `settle`.
    pub candidates: Vec<Candidate>,
    pub decisions: Vec<Decision>,
    pub shown: Vec<bool>,
    /// Where the history stops being settled: the first image a later request may take out
    /// (shown now, not retained) or this one takes out (pruned now). An anchor goes before it.
    pub settled_end: Option<usize>,
    /// The images as this request forwards them, for the audio decision's count of what an
    /// edit rewrites; empty when the request has no audio.
    pub forwarded: Vec<Priced>,
}

/// Decides every image of the request and records its events and summary counts in `out`.
/// `sounds` are the request's audio files as the edit decision prices them.
pub(super) fn decide(
    view: &RequestView<'_>,
    ctx: &Context<'_>,
    media: &Prepared,
    sounds: &[Priced],
    out: &mut Projection,
) -> Decided {
    let (extracted, users) = (&media.extracted, &media.users);
    // Every image, in arrival (document) order.
    let mut places: Vec<(usize, usize, Place)> = Vec::new();
    for (ri, e) in extracted.iter().enumerate() {
        if let (Some(e), Some(result)) = (e, view.tool_results.get(ri)) {
            let at = result.span.start;
            places.extend((0..e.items.len()).map(|ii| (at, ii, Place::Tool(ri, ii))));
        }
    }
    for (ui, u) in users.iter().enumerate() {
        if let (Some(_), Some(image)) = (u, view.user_images.get(ui)) {
            places.push((image.span.start, 0, Place::User(ui)));
        }
    }
    places.sort_by_key(|&(at, sub, _)| (at, sub));
    let item_at = |place: Place| -> Option<&Item> {
        match place {
            Place::Tool(ri, ii) => extracted.get(ri)?.as_ref()?.items.get(ii),
            Place::User(ui) => users.get(ui)?.as_deref(),
        }
    };
    // Only places that hold an item from here on: every list below is one for one with them.
    places.retain(|&(_, _, p)| item_at(p).is_some());
    let items: Vec<&Item> = places.iter().filter_map(|&(_, _, p)| item_at(p)).collect();
    let placed: Vec<edits::Placed> = places
        .iter()
        .zip(&items)
        .map(|(&(at, _, place), item)| edits::Placed {
            at,
            in_tool_result: matches!(place, Place::Tool(..)),
            item,
        })
        .collect();
    let accepts = ctx.policy.accepts_images;
    // The delivery state decides first which images may be shown at all (A3, A4, A10).
    let candidates: Vec<Candidate> = places
        .iter()
        .zip(&items)
        .map(|(&(_, _, place), item)| {
            let (source, tool) = source_of(view, place);
            Candidate {
                key: identity(&source, item),
                lifetime: lifetime_of(
                    item.lifetime,
                    tool,
                    &ctx.policy,
                    ctx.memo,
                    ctx.policy.images.default_lifetime,
                ),
                showable: accepts && !matches!(item.media, Media::Refused(_)),
            }
        })
        .collect();
    // Recent pruning, made when it pays (docs/cache.md).
    let priced: Vec<Priced> = placed.iter().map(|p| p.priced(view)).collect();
    let caps = edits::Caps::images(view, ctx);
    let (decisions, deferred) = edits::plan(view, ctx, &candidates, &priced, sounds, caps);
    out.summary.deferred_edits += deferred;
    // Then the route's gate and the request's budgets, over what the state allows.
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
    let outcomes: Vec<Outcome> = decisions
        .iter()
        .map(|d| match d {
            Decision::Eligible | Decision::NotShowable => {
                selected.next().unwrap_or(Outcome::Deferred)
            }
            Decision::Consumed | Decision::Pruned | Decision::Released => Outcome::Retired,
        })
        .collect();
    let shown: Vec<bool> = outcomes
        .iter()
        .map(|o| matches!(o, Outcome::Embed(_) | Outcome::KeepRemote))
        .collect();
    let settled_end = candidates
        .iter()
        .zip(&decisions)
        .zip(&shown)
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
        .zip(&shown)
        .zip(&placed)
        .filter(|((c, &shown), p)| {
            shown && c.lifetime != Lifetime::Retain && p.in_tool_result && p.item.id.is_some()
        })
        .count();
    let forwarded = match extracted.iter().flatten().any(|e| !e.audio.is_empty()) {
        true => priced
            .iter()
            .zip(&shown)
            .map(|(p, &shown)| p.forwarded(shown))
            .collect(),
        false => Vec::new(),
    };
    // What happened, in document order.
    let mut tool: Vec<Vec<Outcome>> = extracted
        .iter()
        .map(|e| vec![Outcome::Deferred; e.as_ref().map_or(0, |e| e.items.len())])
        .collect();
    let mut user: Vec<Option<Outcome>> = vec![None; users.len()];
    for ((&(_, _, place), item), outcome) in places.iter().zip(&items).zip(outcomes) {
        let result = match place {
            Place::Tool(ri, _) => Some(ri),
            Place::User(_) => None,
        };
        out.images.push(event(&outcome, result, item.id));
        if matches!(outcome, Outcome::Retired | Outcome::Deferred) && item.id.is_some() {
            out.rereadable += 1;
        }
        match outcome {
            Outcome::Embed(_) | Outcome::KeepRemote => out.summary.embedded += 1,
            Outcome::Deferred => out.summary.deferred += 1,
            Outcome::Refused(_) => out.summary.refused += 1,
            Outcome::Gated | Outcome::Retired => out.summary.placeholders += 1,
        }
        match place {
            Place::Tool(ri, ii) => {
                if let Some(slot) = tool.get_mut(ri).and_then(|t| t.get_mut(ii)) {
                    *slot = outcome;
                }
            }
            Place::User(ui) => {
                if let Some(slot) = user.get_mut(ui) {
                    *slot = Some(outcome);
                }
            }
        }
    }
    Decided {
        tool,
        users: user,
        candidates,
        decisions,
        shown,
        settled_end,
        forwarded,
    }
}

/// The source an image came from (a tool call id, or a fingerprint of the user's image part),
/// and the tool's name when known.
fn source_of<'v>(view: &'v RequestView<'_>, place: Place) -> (String, Option<&'v str>) {
    let fingerprint = |part: &str| xxhash_rust::xxh3::xxh3_64(part.as_bytes());
    match place {
        Place::Tool(ri, _) => match view.tool_results.get(ri) {
            Some(r) => (r.source.to_string(), r.tool_name.as_deref()),
            None => (String::new(), None),
        },
        Place::User(ui) => {
            let Some(image) = view.user_images.get(ui) else {
                return (String::new(), None);
            };
            if let Some(r) = image.beside.and_then(|ri| view.tool_results.get(ri)) {
                // One source per image: its tool call's, told apart from images in the result.
                let part = fingerprint(image.part.get());
                return (
                    format!("{}:beside:{part:016x}", r.source),
                    r.tool_name.as_deref(),
                );
            }
            (format!("user:{:016x}", fingerprint(image.part.get())), None)
        }
    }
}

/// An image's identity, independent of its position in the history: its source, its number
/// within the source, and its content.
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

/// One image's fate, for the metrics, the header and the inspector.
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
