//! Attachments (SPEC sections 4 and 5): images found in tool results and user messages, the
//! route gate (A1), per-request budgets in arrival order (A5, A6), and how each image is written
//! back in its dialect (A7). Pure: decisions and text; the caller edits and stores.

pub mod extract;
pub mod state;

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use crate::image::{downscale, Checked, Refusal};
use crate::projection::artifact::ArtifactId;
use crate::projection::policy::{ImageLimits, Lifetime};

/// Anthropic refuses images over 2000 px on the long edge once a request holds more than 20.
pub const ANTHROPIC_MANY_IMAGES: usize = 20;
pub const ANTHROPIC_MANY_IMAGES_EDGE: u32 = 2000;

/// What an image item holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Media {
    /// Checked bytes.
    Image(Checked),
    /// A URL sluice never fetches (no SSRF): passed on as it is, counted as an image.
    Remote(String),
    /// Bytes that cannot be shown, and why (A6).
    Refused(Refusal),
}

/// One image of a source (a tool result or a user message), numbered `k` from 1 within it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub k: usize,
    pub media: Media,
    /// The media artifact its bytes are stored as (M4).
    pub id: Option<ArtifactId>,
    /// An explicit lifetime hint found on the item (M5).
    pub lifetime: Option<Lifetime>,
    /// The base64 text the image came as, to embed it again without re-encoding.
    pub base64: Option<Arc<str>>,
    /// The client's other fields on a native image part, written back on the rebuilt part.
    pub extras: Option<Arc<Extras>>,
}

/// Fields a client sent on a native image part besides the image itself (`detail`,
/// `cache_control`, …), as JSON fragments that each start with a comma: `outer` beside the
/// part's `type`, `inner` inside chat's `image_url` object beside its `url` (P2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extras {
    pub outer: String,
    pub inner: String,
}

impl Item {
    /// The stable reference that stands where the image stood (M3).
    pub fn reference(&self) -> String {
        let k = self.k;
        match (&self.media, &self.id) {
            (Media::Image(image), Some(id)) => format!(
                "[image #{k}: {} {}×{}, {} KB, artifact://{id}]",
                image.kind.mime(),
                image.width,
                image.height,
                (image.bytes.len() as u64).div_ceil(1024)
            ),
            (Media::Image(image), None) => {
                format!(
                    "[image #{k}: {} {}×{}]",
                    image.kind.mime(),
                    image.width,
                    image.height
                )
            }
            (Media::Remote(url), _) => format!("[image #{k}: {url}]"),
            (Media::Refused(refusal), _) => format!("[image #{k}: not shown: {refusal}]"),
        }
    }
}

/// What happens to one image in this request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Shown, as these bytes (the original, or downscaled) in base64.
    Embed(Arc<Embedded>),
    /// A remote image, passed on as it is.
    KeepRemote,
    /// No room in this request; it waits for a later one (A5). Not terminal.
    Deferred,
    /// The route takes no images (A1).
    Gated,
    /// Cannot be shown, for good (A6).
    Refused(Refusal),
    /// Shown before and no longer attached: `once` after its showing, or pruned or released
    /// (A3, A4, A10).
    Retired,
}

/// An image as it will be embedded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Embedded {
    pub mime: &'static str,
    pub base64: Arc<str>,
    pub downscaled: bool,
    /// The label it came with was wrong (or missing): the bytes decided (M2).
    pub relabelled: bool,
    /// Its size as shown, in pixels (for the token estimate).
    pub width: u32,
    pub height: u32,
}

impl Embedded {
    /// `image` as embedded, reusing `base64` when it is the image's own encoding.
    pub fn of(image: &Checked, base64: Option<&Arc<str>>, downscaled: bool) -> Embedded {
        Embedded {
            mime: image.kind.mime(),
            base64: match base64 {
                Some(b) if !downscaled => b.clone(),
                _ => Arc::from(STANDARD.encode(&image.bytes)),
            },
            downscaled,
            relabelled: image.relabelled,
            width: image.width,
            height: image.height,
        }
    }
}

/// The budgets one request's images must fit (A5, A6), from the route.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub accepts_images: bool,
    pub max_images: usize,
    pub max_total_bytes: u64,
    pub max_image_bytes: u64,
    pub max_dimension: u32,
    pub downscale: bool,
    /// Apply Anthropic's "more than 20 images caps each at 2000 px" rule.
    pub anthropic: bool,
}

impl Limits {
    pub fn new(config: &ImageLimits, accepts_images: bool, anthropic: bool) -> Limits {
        Limits {
            accepts_images,
            max_images: config.max_images,
            max_total_bytes: config.max_total_bytes,
            max_image_bytes: config.max_image_bytes,
            max_dimension: config.max_dimension,
            downscale: config.downscale,
            anthropic,
        }
    }
}

/// Decides every image of a request, in arrival (history) order: the gate first, then each
/// image's own limits (refused, or downscaled when the route allows it), then the request's
/// count and byte budgets (what does not fit waits). Sizes are base64 lengths, as Anthropic
/// counts them. `shrink` downscales (the caller caches it).
pub fn select(
    items: &[&Item],
    limits: &Limits,
    shrink: &dyn Fn(&Checked, u32, u64) -> Result<Checked, Refusal>,
) -> Vec<Outcome> {
    if !limits.accepts_images {
        return items
            .iter()
            .map(|item| match &item.media {
                Media::Refused(r) => Outcome::Refused(r.clone()),
                _ => Outcome::Gated,
            })
            .collect();
    }
    let mut count = 0usize;
    let mut total = 0u64;
    let mut out: Vec<Outcome> = Vec::with_capacity(items.len());
    let mut edges: Vec<Option<u32>> = Vec::with_capacity(items.len());
    for item in items {
        let (outcome, edge) = match &item.media {
            Media::Refused(r) => (Outcome::Refused(r.clone()), None),
            Media::Remote(_) if count < limits.max_images => {
                count += 1;
                (Outcome::KeepRemote, None)
            }
            Media::Remote(_) => (Outcome::Deferred, None),
            Media::Image(image) => match fit(image, item.base64.as_ref(), limits, shrink) {
                Err(r) => (Outcome::Refused(r), None),
                Ok(embedded) => {
                    let size = embedded.0.base64.len() as u64;
                    if count < limits.max_images && total + size <= limits.max_total_bytes {
                        count += 1;
                        total += size;
                        (Outcome::Embed(Arc::new(embedded.0)), Some(embedded.1))
                    } else {
                        (Outcome::Deferred, None)
                    }
                }
            },
        };
        out.push(outcome);
        edges.push(edge);
    }
    // Anthropic: with more than 20 images, every one must be at most 2000 px; rather than
    // shrink them all, show the first 20 and let the rest wait.
    let shown = out
        .iter()
        .filter(|o| matches!(o, Outcome::Embed(_) | Outcome::KeepRemote))
        .count();
    let too_big = edges
        .iter()
        .flatten()
        .any(|&e| e > ANTHROPIC_MANY_IMAGES_EDGE);
    if limits.anthropic && shown > ANTHROPIC_MANY_IMAGES && too_big {
        let mut kept = 0;
        for o in &mut out {
            if matches!(o, Outcome::Embed(_) | Outcome::KeepRemote) {
                kept += 1;
                if kept > ANTHROPIC_MANY_IMAGES {
                    *o = Outcome::Deferred;
                }
            }
        }
    }
    out
}

/// The image as it can be embedded under the per-image limits, with its long edge; or why not.
fn fit(
    image: &Checked,
    base64: Option<&Arc<str>>,
    limits: &Limits,
    shrink: &dyn Fn(&Checked, u32, u64) -> Result<Checked, Refusal>,
) -> Result<(Embedded, u32), Refusal> {
    let over_edge = image.long_edge() > limits.max_dimension;
    let cap = limits.max_image_bytes.min(limits.max_total_bytes);
    let over_bytes = image.base64_len() > cap;
    if !over_edge && !over_bytes {
        return Ok((Embedded::of(image, base64, false), image.long_edge()));
    }
    if limits.downscale {
        let small = shrink(image, limits.max_dimension, cap)?;
        return Ok((Embedded::of(&small, None, true), small.long_edge()));
    }
    if over_edge {
        return Err(Refusal::TooManyPixels {
            width: image.width,
            height: image.height,
            limit: limits.max_dimension,
        });
    }
    Err(Refusal::TooLarge {
        bytes: image.base64_len(),
        limit: cap,
    })
}

/// The note written where an image that is not shown would have been.
pub fn note(item: &Item, outcome: &Outcome) -> Option<String> {
    let k = item.k;
    match outcome {
        Outcome::Gated => Some(format!(
            "[image #{k}: no visual content was provided: this model does not accept images]"
        )),
        Outcome::Deferred => Some(match item.id {
            Some(id) => format!(
                "[image #{k}: not shown in this request (its image budget is full); it will be shown in a later one (artifact://{id})]"
            ),
            None => format!(
                "[image #{k}: not shown in this request (its image budget is full); it will be shown in a later one]"
            ),
        }),
        Outcome::Refused(r) if !matches!(item.media, Media::Refused(_)) => {
            Some(format!("[image #{k}: not shown: {r}]"))
        }
        Outcome::Retired => Some(match item.id {
            Some(id) => format!(
                "[image #{k}: shown earlier and no longer attached; it can be read again with the read tool: {{\"url\":\"artifact://{id}\"}}]"
            ),
            None => format!("[image #{k}: shown earlier and no longer attached]"),
        }),
        _ => None,
    }
}

/// The default downscaler.
pub fn shrink(image: &Checked, max_dimension: u32, max_bytes: u64) -> Result<Checked, Refusal> {
    downscale(image, max_dimension, max_bytes)
}

#[cfg(test)]
mod tests;
