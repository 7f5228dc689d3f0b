//! What the core needs of a wire API's shapes, as a trait the dialect layer implements
//! (`crate::dialect`): the core decides what a request shows, the dialect writes it in its
//! provider's JSON.

use std::borrow::Cow;

use serde_json::value::RawValue;

use super::attach::{Embedded, Extras};
use super::view::{Edit, Raw, Rope};

/// What an image part shows: bytes sluice embeds, or a URL passed on.
pub enum ImageRef<'a> {
    Data(&'a Embedded),
    Url(&'a str),
}

/// One content part of a tool result (or a user's image part), as its dialect reads it.
pub struct Part<'a> {
    pub kind: PartKind<'a>,
    /// The part's cache breakpoint as JSON, kept on the last part written back (P2).
    pub breakpoint: Option<&'a RawValue>,
    /// sluice's lifetime hint object on the part (`_meta`, M5).
    pub meta: Option<&'a RawValue>,
}

/// What a content part holds.
pub enum PartKind<'a> {
    Text(Cow<'a, str>),
    /// An image as base64, with the media type the part declares.
    Image {
        base64: Cow<'a, str>,
        mime: Option<Cow<'a, str>>,
    },
    /// An image by URL: remote, or a `data:` URL.
    ImageUrl(Cow<'a, str>),
    /// Audio as base64, with the media type the part declares.
    Audio {
        base64: Cow<'a, str>,
        mime: Option<Cow<'a, str>>,
    },
    /// Anything else: kept as it was.
    Other,
}

/// A tool result's content as the core reads it.
pub enum Content<'a> {
    /// A plain string.
    Text(Cow<'a, str>),
    /// Parts, in order: each part's JSON text and how the dialect reads it (`None`: a part it
    /// does not read, kept as it was).
    Parts(Vec<(&'a str, Option<Part<'a>>)>),
}

/// What a tool result's content becomes (see [`Shapes::tool_content`]).
pub struct NewContent<'r> {
    /// Its text, as a JSON string.
    pub text_json: &'r str,
    /// The cache breakpoint the text part carries (that of the last text part it replaces).
    pub text_breakpoint: Option<&'r str>,
    /// Media parts shown, after the text.
    pub media: Vec<Rope>,
    /// Parts the core does not read, kept as they were, after the media.
    pub others: Vec<Rope>,
    /// A cache breakpoint for the last part written, unless it carries one.
    pub last_breakpoint: Option<&'r str>,
    /// Parts even when only text is left (a result that carried images stays in parts, its
    /// shape the same whether they are shown or not).
    pub as_parts: bool,
}

/// One wire API's shapes, as the core reads and writes them.
pub trait Shapes: std::fmt::Debug + Sync {
    /// Reads a tool result's content (its JSON text): a string, or parts; `None` when it is
    /// neither (it is then left as it is).
    fn content<'a>(&self, raw: &'a str) -> Option<Content<'a>> {
        if raw.starts_with('"') {
            return serde_json::from_str::<Cow<str>>(raw)
                .ok()
                .map(Content::Text);
        }
        let parts: Vec<&RawValue> = serde_json::from_str(raw).ok()?;
        Some(Content::Parts(
            parts
                .into_iter()
                .map(|p| (p.get(), self.part(p.get())))
                .collect(),
        ))
    }

    /// A tool result's new content in place of `original`: a string stays a string where
    /// nothing but text is left; otherwise a text part, the media, the other parts.
    fn tool_content(&self, original: Raw<'_>, new: NewContent<'_>) -> Rope {
        let text_only = new.media.is_empty() && new.others.is_empty() && !new.as_parts;
        if text_only && original.get().starts_with('"') {
            return Rope::from(new.text_json.to_string());
        }
        let mut parts: Vec<Rope> = vec![self.text_part(new.text_json, new.text_breakpoint).into()];
        parts.extend(new.media);
        parts.extend(new.others);
        if let (Some(breakpoint), Some(last)) = (new.last_breakpoint, parts.last_mut()) {
            self.keep_breakpoint(last, breakpoint);
        }
        // The parts as pieces: an embedded image's base64 is not copied here.
        let mut content = Rope::from("[");
        for (i, part) in parts.into_iter().enumerate() {
            if i > 0 {
                content.push(",");
            }
            content.push(part);
        }
        content.push("]");
        content
    }

    /// Reads one content part (its JSON text); `None` when it is not an object the dialect reads (it is then
    /// kept as it was).
    fn part<'a>(&self, json: &'a str) -> Option<Part<'a>>;

    /// The fields of a native image part besides its type, image and lifetime hint, to write
    /// back on the part that replaces it (P2); `None` when there are none.
    fn part_extras(&self, json: &str) -> Option<Extras>;

    /// Whether a tool result's content may hold an image or audio at all: a quick byte search
    /// before any parse (MCP items and data URLs in its text, and the dialect's own parts).
    fn may_hold_media(&self, raw: &str) -> bool {
        super::attach::extract::may_hold_images(raw)
    }

    /// A text part holding `text_json` (a JSON string), with `breakpoint` (a cache breakpoint's
    /// JSON) where the dialect has them on parts.
    fn text_part(&self, text_json: &str, breakpoint: Option<&str>) -> String;

    /// Puts `breakpoint` on `last`, the last part written back, unless it carries one.
    fn keep_breakpoint(&self, last: &mut Rope, breakpoint: &str);

    /// A number that differs between dialects (it keys the memo of projected results).
    fn tag(&self) -> u8;

    /// How the provider's input is counted when the route names no tokenizer.
    fn tokenizer(&self) -> crate::tokens::Tokenizer;

    /// Whether a tool result may hold images (A7). Where it may not (OpenAI chat), shown images
    /// go in a user message after the turn's tool messages ([`Shapes::after_turns`]), and a
    /// tool result sent as a string stays a string.
    fn images_in_tool_results(&self) -> bool;

    /// Whether a request may carry audio (OpenAI chat's `input_audio`, in a user message: it
    /// goes where chat's images go, [`Shapes::after_turns`]).
    fn takes_audio(&self) -> bool;

    /// An audio part: base64 data in `format` (`wav`, `mp3`).
    fn audio_part(&self, format: &str, base64: &str) -> String;

    /// Whether the provider lowers its image size limit when a request holds many images
    /// (Anthropic, A5).
    fn limits_many_images(&self) -> bool;

    /// An image part, with the fields the client sent on its own part (`detail`,
    /// `cache_control`, …) written back (P2).
    fn image_part(&self, image: &ImageRef<'_>, extras: Option<&Extras>) -> Rope;

    /// A user's image part rewritten to carry `embedded` (new bytes or a corrected media
    /// type), its other fields kept; `None` when the part cannot be read.
    fn user_image_part(&self, part: Raw<'_>, embedded: &Embedded) -> Option<String>;

    /// A user's image part replaced by a text part holding `text_json` (a JSON string), with a
    /// cache breakpoint kept where the dialect has them on parts.
    fn user_note_part(&self, part: Raw<'_>, text_json: &str) -> String;

    /// Edits that insert, after the last tool message of each turn, one user message holding
    /// that turn's `parts` (turns named by the index of one of their messages). Only for
    /// dialects whose tool results hold no images.
    fn after_turns(&self, body: &[u8], turns: Vec<(usize, Vec<String>)>) -> Vec<Edit>;

    /// Whose prompt cache the requests meet (`super::cache`).
    fn cache_provider(&self) -> super::cache::Provider;

    /// The quoted name of the field that marks a cache breakpoint, as it stands in a body
    /// (Anthropic; empty where the dialect has none).
    fn breakpoint_field(&self) -> &'static [u8];

    /// A cache breakpoint, 5-minute or (`long`) 1-hour, as a field to insert before a block's
    /// closing brace (Anthropic; empty where the dialect has none).
    fn block_breakpoint(&self, long: bool) -> &'static str;

    /// The same as the first field of the request object (it marks the last block).
    fn top_breakpoint(&self, long: bool) -> &'static str;
}
