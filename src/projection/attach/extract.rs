//! Finding images in tool results and user messages (SPEC M1): native image parts, MCP image
//! items and embedded image resources serialised into the tool text (also nested in a larger
//! JSON document), and `data:image/…;base64,` URLs in text. Each image found is checked from
//! its bytes (M2) and its place in the text gets a stable reference (M3). Audio is found in
//! the same places in tool results (MCP `audio` items, `audio/*` resources, `data:audio/`
//! URLs), checked, stored, and named by a reference line; no model is sent its base64
//! (docs/audio.md).

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{Item, Media};
use crate::audio::{AudioRefusal, CheckedAudio};
use crate::image::{check, decode_base64, Refusal};
use crate::projection::artifact::{ArtifactId, ArtifactKind};
use crate::projection::policy::Lifetime;
use crate::projection::shapes::{Content, PartKind, Shapes};
use crate::projection::Raw;
use crate::tenant::Tenant;

/// Decoded bytes one image may have before it is refused unread (base64 text of 64 MiB).
pub const MAX_IMAGE_DECODE_BYTES: u64 = 48 * 1024 * 1024;
/// Images one tool result may carry; more are refused (S5).
pub const MAX_ITEMS_PER_SOURCE: usize = 200;

/// A tool result with its images taken out.
#[derive(Debug, Clone, Default)]
pub struct Extracted {
    /// The result's text, a reference where each image stood.
    pub text: String,
    pub items: Vec<Item>,
    /// Parts that are neither text nor image (documents, …), kept as they were.
    pub others: Vec<String>,
    /// The cache breakpoint of the result's last part, to keep on the last part written back.
    pub breakpoint: Option<String>,
    /// The audio the result carried, each now a reference line in `text`.
    pub audio: Vec<Sound>,
}

/// An audio item of a tool result, numbered `k` from 1 within it: checked, and stored as a
/// media artifact when it can be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sound {
    pub k: usize,
    pub checked: Result<CheckedAudio, AudioRefusal>,
    pub id: Option<ArtifactId>,
    /// An explicit lifetime hint found on the item (M5).
    pub lifetime: Option<Lifetime>,
    /// The base64 text the audio came as, to send it without encoding it again.
    pub base64: Option<Arc<str>>,
}

impl Sound {
    /// The line that stands where the audio stood, the same whatever the route does with it:
    /// what it is and where it is kept; or why it cannot be used. A note after the result's
    /// text says when it is not sent (`projection::sounds`).
    pub fn reference(&self) -> String {
        let k = self.k;
        match (&self.checked, &self.id) {
            (Ok(audio), Some(id)) => {
                let length = audio
                    .millis
                    .map(|ms| format!(" {:.1} s,", ms as f64 / 1000.0))
                    .unwrap_or_default();
                format!(
                    "[audio #{k}: {}{length} {} KB, artifact://{id}]",
                    audio.kind.name(),
                    (audio.bytes.len() as u64).div_ceil(1024)
                )
            }
            (Err(refusal), _) => format!("[audio #{k}: not used: {refusal}]"),
            (Ok(audio), None) => format!("[audio #{k}: {}]", audio.kind.name()),
        }
    }
}

/// Whether `raw` may hold an image at all: a quick byte search that lets the common case (a tool
/// result of plain text) skip the parse. Two SIMD searches, for `image` and `blob`, each
/// occurrence then checked for the forms images take (`data:image/`, an `"image"`,
/// `"input_image"` or `"image_url"` key or type, an MCP resource `"blob"`), raw or escaped
/// inside a JSON string.
pub fn may_hold_images(raw: &str) -> bool {
    let b = raw.as_bytes();
    let image = memchr::memmem::find_iter(b, b"image").any(|at| {
        let after = &b[at + 5..];
        let before = &b[..at];
        let after = after.strip_prefix(b"_url").unwrap_or(after);
        after.starts_with(b"/") && before.ends_with(b"data:")
            || after.starts_with(b"\"")
            || after.starts_with(b"\\\"")
    });
    let audio = || {
        memchr::memmem::find_iter(b, b"audio").any(|at| {
            let after = &b[at + 5..];
            after.starts_with(b"/") && b[..at].ends_with(b"data:")
                || after.starts_with(b"\"")
                || after.starts_with(b"\\\"")
        })
    };
    image
        || memchr::memmem::find_iter(b, b"blob").any(|at| {
            let after = &b[at + 4..];
            after.starts_with(b"\"") || after.starts_with(b"\\\"")
        })
        || audio()
}

struct Finder<'t> {
    tenant: &'t Tenant,
    items: Vec<Item>,
    audio: Vec<Sound>,
}

impl Finder<'_> {
    /// Checks one image and returns the reference that takes its place in the text.
    fn image(&mut self, data: &str, declared: Option<&str>, lifetime: Option<Lifetime>) -> String {
        let k = self.items.len() + 1;
        let media = if self.items.len() >= MAX_ITEMS_PER_SOURCE {
            Media::Refused(Refusal::TooLarge {
                bytes: self.items.len() as u64,
                limit: MAX_ITEMS_PER_SOURCE as u64,
            })
        } else {
            match decode_base64(data.trim(), MAX_IMAGE_DECODE_BYTES) {
                Ok(bytes) => match check(bytes.into(), declared) {
                    Ok(image) => Media::Image(image),
                    Err(refusal) => Media::Refused(refusal),
                },
                Err(refusal) => Media::Refused(refusal),
            }
        };
        let base64 = matches!(media, Media::Image(_)).then(|| Arc::from(data.trim()));
        let id = match &media {
            Media::Image(image) => Some(ArtifactId::for_content(
                self.tenant,
                ArtifactKind::Media,
                &image.bytes,
            )),
            _ => None,
        };
        let item = Item {
            k,
            media,
            id,
            lifetime,
            base64,
            extras: None,
        };
        let reference = item.reference();
        self.items.push(item);
        reference
    }

    /// Checks one audio item and returns the line that takes its place in the text.
    fn audio(&mut self, data: &str, declared: Option<&str>, lifetime: Option<Lifetime>) -> String {
        let k = self.audio.len() + 1;
        let checked = if self.audio.len() >= MAX_ITEMS_PER_SOURCE {
            Err(AudioRefusal::TooLarge {
                bytes: self.audio.len() as u64,
                limit: MAX_ITEMS_PER_SOURCE as u64,
            })
        } else {
            crate::audio::from_base64(data, declared)
        };
        let id = checked
            .as_ref()
            .ok()
            .map(|a| ArtifactId::for_content(self.tenant, ArtifactKind::Media, &a.bytes));
        let base64 = checked.is_ok().then(|| Arc::from(data.trim()));
        let sound = Sound {
            k,
            checked,
            id,
            lifetime,
            base64,
        };
        let reference = sound.reference();
        self.audio.push(sound);
        reference
    }

    /// Remembers the fields of the native part the last image came in (P2: `detail` and the
    /// like survive the rebuild).
    fn keep_extras(&mut self, shapes: &dyn Shapes, part: &str) {
        if let Some(item) = self.items.last_mut() {
            item.extras = shapes.part_extras(part).map(Arc::new);
        }
    }

    fn remote(&mut self, url: &str) -> String {
        let item = Item {
            k: self.items.len() + 1,
            media: Media::Remote(url.to_string()),
            id: None,
            lifetime: None,
            base64: None,
            extras: None,
        };
        let reference = item.reference();
        self.items.push(item);
        reference
    }

    /// The text with its data URLs and MCP image items replaced by references.
    fn text(&mut self, text: &str) -> String {
        let trimmed = text.trim_start();
        if (trimmed.starts_with('{') || trimmed.starts_with('[')) && may_hold_images(text) {
            if let Ok(mut doc) = serde_json::from_str::<Value>(text) {
                if self.walk(&mut doc) {
                    return serde_json::to_string(&doc).unwrap_or_else(|_| text.to_string());
                }
            }
        }
        self.data_urls(text)
    }

    /// Replaces MCP image items and image resources anywhere in a JSON document by text items
    /// holding their references; data URLs in its strings too. Whether anything changed.
    fn walk(&mut self, value: &mut Value) -> bool {
        match value {
            Value::Object(map) => {
                if let Some(reference) = self.mcp_item(map) {
                    *value = serde_json::json!({"type": "text", "text": reference});
                    return true;
                }
                let mut changed = false;
                for v in map.values_mut() {
                    changed |= self.walk(v);
                }
                changed
            }
            Value::Array(items) => {
                let mut changed = false;
                for v in items {
                    changed |= self.walk(v);
                }
                changed
            }
            Value::String(s) if s.contains("data:image/") || s.contains("data:audio/") => {
                let replaced = self.data_urls(s);
                let changed = replaced != *s;
                *s = replaced;
                changed
            }
            _ => false,
        }
    }

    /// An MCP `{"type":"image"|"audio","data","mimeType"}` item or a `{"type":"resource"}`
    /// whose resource is an image or audio blob: its reference, with an image's `_meta`
    /// lifetime hint read (M5).
    fn mcp_item(&mut self, map: &Map<String, Value>) -> Option<String> {
        let lifetime = hint(map.get("_meta"));
        match map.get("type")?.as_str()? {
            "image" => {
                let data = map.get("data")?.as_str()?;
                let mime = map.get("mimeType").and_then(Value::as_str);
                Some(self.image(data, mime, lifetime))
            }
            "audio" => {
                let data = map.get("data")?.as_str()?;
                let mime = map.get("mimeType").and_then(Value::as_str);
                Some(self.audio(data, mime, lifetime))
            }
            "resource" => {
                let resource = map.get("resource")?.as_object()?;
                let mime = resource.get("mimeType").and_then(Value::as_str)?;
                let data = resource.get("blob")?.as_str()?;
                if mime.starts_with("audio/") {
                    let lifetime = lifetime.or(hint(resource.get("_meta")));
                    return Some(self.audio(data, Some(mime), lifetime));
                }
                if !mime.starts_with("image/") {
                    return None;
                }
                Some(self.image(data, Some(mime), lifetime.or(hint(resource.get("_meta")))))
            }
            _ => None,
        }
    }

    /// `data:image/<type>;base64,<data>` and `data:audio/<type>;base64,<data>` URLs in plain
    /// text, each replaced by its reference.
    fn data_urls(&mut self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        loop {
            let found = [("data:image/", false), ("data:audio/", true)]
                .into_iter()
                .filter_map(|(marker, audio)| rest.find(marker).map(|at| (at, marker, audio)))
                .min_by_key(|(at, _, _)| *at);
            let Some((at, marker, audio)) = found else {
                break;
            };
            out.push_str(&rest[..at]);
            let url = &rest[at..];
            let Some(comma) = url.find(";base64,").filter(|&c| c < 64) else {
                out.push_str(marker);
                rest = &url[marker.len()..];
                continue;
            };
            let mime = &url["data:".len()..comma];
            let data_start = comma + ";base64,".len();
            let data_len = url[data_start..]
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
                .count();
            let data = &url[data_start..data_start + data_len];
            let reference = if audio {
                self.audio(data, Some(mime), None)
            } else {
                self.image(data, Some(mime), None)
            };
            out.push_str(&reference);
            rest = &url[data_start + data_len..];
        }
        out.push_str(rest);
        out
    }
}

/// A lifetime hint in an item's `_meta` (`"sluice/lifetime"` or `"lifetime"`).
fn hint(meta: Option<&Value>) -> Option<Lifetime> {
    let meta = meta?.as_object()?;
    let value = meta
        .get("sluice/lifetime")
        .or_else(|| meta.get("lifetime"))?;
    serde_json::from_value(value.clone()).ok()
}

/// Takes the images out of a tool result's content (a string or an array of parts, read by the
/// dialect's `shapes`). `None` when it holds none, so the caller leaves it to the text exit
/// alone.
pub fn from_result(shapes: &dyn Shapes, content: Raw<'_>, tenant: &Tenant) -> Option<Extracted> {
    let raw = content.get();
    if !shapes.may_hold_media(raw) {
        return None;
    }
    let mut finder = Finder {
        tenant,
        items: Vec::new(),
        audio: Vec::new(),
    };
    let mut out = Extracted::default();
    let parts = match shapes.content(raw)? {
        Content::Text(text) => {
            out.text = finder.text(&text);
            Vec::new()
        }
        Content::Parts(parts) => parts,
    };
    let mut texts: Vec<String> = Vec::new();
    let count = parts.len();
    for (i, (part, read)) in parts.into_iter().enumerate() {
        let Some(p) = read else {
            out.others.push(part.to_string());
            continue;
        };
        let last = i + 1 == count;
        if last {
            out.breakpoint = p.breakpoint.map(|c| c.get().to_string());
        }
        let others_before = out.others.len();
        let lifetime = p
            .meta
            .and_then(|m| serde_json::from_str::<Value>(m.get()).ok())
            .and_then(|m| hint(Some(&m)));
        match p.kind {
            PartKind::Text(text) => texts.push(finder.text(&text)),
            PartKind::Image { base64, mime } => {
                texts.push(finder.image(&base64, mime.as_deref(), lifetime));
                finder.keep_extras(shapes, part);
            }
            PartKind::ImageUrl(url) if is_data_url(&url) => {
                let (mime, data) = split_data_url(&url);
                texts.push(finder.image(data, mime, lifetime));
                finder.keep_extras(shapes, part);
            }
            PartKind::ImageUrl(url) => {
                texts.push(finder.remote(&url));
                finder.keep_extras(shapes, part);
            }
            PartKind::Audio { base64, mime } => {
                texts.push(finder.audio(&base64, mime.as_deref(), lifetime));
            }
            PartKind::Other => out.others.push(part.to_string()),
        }
        if last && out.others.len() > others_before {
            // The last part is kept as it was, its own breakpoint with it.
            out.breakpoint = None;
        }
    }
    if count > 0 {
        out.text = texts.join("\n");
    }
    if finder.items.is_empty() && finder.audio.is_empty() {
        return None;
    }
    out.items = finder.items;
    out.audio = finder.audio;
    Some(out)
}

/// `data:<mime>;base64,<data>` → (mime, data). Anything else: no mime, and the whole string as
/// data (which then fails the base64 check, as it should).
/// The scheme and the `;base64,` marker are matched in any case (RFC 2397: `data:IMAGE/PNG;
/// BASE64,…` is the same URL).
pub fn split_data_url(url: &str) -> (Option<&str>, &str) {
    if !is_data_url(url) {
        return (None, url);
    }
    let rest = &url["data:".len()..];
    // The marker follows the media type and its parameters: within the first few hundred bytes.
    let marker = rest
        .as_bytes()
        .windows(8)
        .take(512)
        .position(|w| w.eq_ignore_ascii_case(b";base64,"));
    match marker {
        Some(at) => (Some(&rest[..at]), &rest[at + 8..]),
        None => (None, url),
    }
}

/// Whether `url` is a `data:` URL (the scheme in any case).
pub fn is_data_url(url: &str) -> bool {
    url.get(.."data:".len())
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("data:"))
}

/// A user message's image part, read by the dialect's `shapes`, as an item numbered `k`.
pub fn user_part(shapes: &dyn Shapes, part: Raw<'_>, k: usize, tenant: &Tenant) -> Option<Item> {
    let p = shapes.part(part.get())?;
    let mut finder = Finder {
        tenant,
        items: Vec::new(),
        audio: Vec::new(),
    };
    match p.kind {
        PartKind::Image { base64, mime } => {
            finder.image(&base64, mime.as_deref(), None);
        }
        PartKind::ImageUrl(url) if is_data_url(&url) => {
            let (mime, data) = split_data_url(&url);
            finder.image(data, mime, None);
        }
        PartKind::ImageUrl(url) => {
            finder.remote(&url);
        }
        _ => return None,
    }
    let mut item = finder.items.pop()?;
    item.k = k;
    Some(item)
}
