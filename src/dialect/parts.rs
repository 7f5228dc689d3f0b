//! Content parts of the OpenAI and Anthropic dialects as the core reads them
//! ([`crate::projection::shapes::Part`]): text parts in any of their names, Anthropic's
//! `image` with a base64 or URL `source`, chat's `image_url` object and Responses'
//! `input_image` string, each with its cache breakpoint and sluice's lifetime hint (`_meta`).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::projection::attach::Extras;
use crate::projection::shapes::{Part, PartKind};

#[derive(Deserialize)]
struct Fields<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<crate::json::Str<'a>>,
    #[serde(borrow)]
    text: Option<crate::json::Str<'a>>,
    #[serde(borrow)]
    cache_control: Option<&'a RawValue>,
    /// Anthropic: `{"type":"base64","media_type","data"}` or `{"type":"url","url"}`.
    #[serde(borrow)]
    source: Option<Source<'a>>,
    /// Responses: a data URL or a remote URL; chat: `{url, detail}`.
    #[serde(borrow)]
    image_url: Option<ImageUrl<'a>>,
    #[serde(borrow, rename = "_meta")]
    meta: Option<&'a RawValue>,
}

/// Borrowed from the body where the JSON has no escapes, as base64 has none: a screenshot's
/// megabyte is not copied to be read.
#[derive(Deserialize)]
struct Source<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<crate::json::Str<'a>>,
    #[serde(borrow)]
    media_type: Option<crate::json::Str<'a>>,
    #[serde(borrow)]
    data: Option<crate::json::Str<'a>>,
    #[serde(borrow)]
    url: Option<crate::json::Str<'a>>,
}

/// Responses puts a string here; chat an object `{url, detail}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum ImageUrl<'a> {
    Plain(#[serde(borrow)] Cow<'a, str>),
    Object {
        #[serde(borrow)]
        url: Cow<'a, str>,
    },
}

impl<'a> ImageUrl<'a> {
    fn url(self) -> Cow<'a, str> {
        match self {
            ImageUrl::Plain(u) | ImageUrl::Object { url: u } => u,
        }
    }
}

/// Whether a part's `type` names text, in any of these dialects' names for it.
fn is_text(kind: Option<&str>) -> bool {
    matches!(kind, Some("text" | "input_text" | "output_text"))
}

/// Reads one part (see the module doc).
pub(crate) fn read(json: &str) -> Option<Part<'_>> {
    let p: Fields = serde_json::from_str(json).ok()?;
    let kind = match p.kind.as_deref() {
        k if is_text(k) => PartKind::Text(p.text.map(|t| t.0).unwrap_or_default()),
        Some("image") => match p.source {
            Some(Source {
                kind: Some(k),
                data: Some(data),
                media_type,
                ..
            }) if &*k == "base64" => PartKind::Image {
                base64: data.0,
                mime: media_type.map(|m| m.0),
            },
            Some(Source { url: Some(url), .. }) => PartKind::ImageUrl(url.0),
            _ => PartKind::Other,
        },
        Some("input_image" | "image_url") => match p.image_url {
            Some(url) => PartKind::ImageUrl(url.url()),
            None => PartKind::Other,
        },
        _ => PartKind::Other,
    };
    Some(Part {
        kind,
        breakpoint: p.cache_control,
        meta: p.meta,
    })
}

/// A native image part's fields besides its type, its image (`source`, `image_url`'s URL) and
/// sluice's lifetime hint (`_meta`, M5), in the order the client sent them; `None` when there
/// are none (the common case, which then costs one scan of the part).
pub(crate) fn extras(part: &str) -> Option<Extras> {
    type Members<'a> = indexmap::IndexMap<Cow<'a, str>, &'a RawValue>;
    let fields: Members = serde_json::from_str(part).ok()?;
    let mut out = Extras::default();
    let push = |to: &mut String, key: &str, value: &RawValue| {
        to.push(',');
        to.push_str(&Value::String(key.to_string()).to_string());
        to.push(':');
        to.push_str(value.get());
    };
    for (key, value) in &fields {
        match key.as_ref() {
            "type" | "source" | "_meta" => {}
            "image_url" if value.get().starts_with('{') => {
                let inner: Members = serde_json::from_str(value.get()).ok()?;
                for (k, v) in inner.iter().filter(|(k, _)| k.as_ref() != "url") {
                    push(&mut out.inner, k, v);
                }
            }
            "image_url" => {}
            other => push(&mut out.outer, other, value),
        }
    }
    (!out.outer.is_empty() || !out.inner.is_empty()).then_some(out)
}
