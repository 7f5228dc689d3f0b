//! The projection seam: the view of a request that projection stages edit, the edits they
//! produce, and the splice that applies them to the original bytes (SPEC P1, P2).
//!
//! A dialect reads the body once into a [`RequestView`]: borrowed slices of the original bytes
//! with their spans. [`project`] turns a view into [`Edit`]s; [`splice`] writes them into a copy
//! of the original body, leaving every byte outside the edited spans as the client sent it.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

use std::sync::Arc;

use crate::dialect::Dialect;
use crate::projection::artifact::ArtifactId;
use crate::projection::attach::extract::Extracted;
use crate::projection::attach::state::{self, Candidate, Decision, Delta, SessionState};
use crate::tenant::Tenant;
use attach::{Embedded, Item, Limits, Media, Outcome};

pub mod artifact;
pub mod attach;
pub mod exit;
pub mod memos;
pub mod policy;

use memos::Memos;
use policy::{Lifetime, Policy};

/// A half-open byte range `[start, end)` in the request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

/// One tool result of the history (SPEC section 1): an OpenAI `tool` message, a Responses
/// `function_call_output` item, an Anthropic `tool_result` block.
#[derive(Debug)]
pub struct ToolResult<'a> {
    /// Index of the message (or input item) that holds it.
    pub item: usize,
    /// `tool_call_id`, `call_id` or `tool_use_id`: the source of what it carries.
    pub source: Cow<'a, str>,
    /// The name of the tool that was called, when the history still holds the call.
    pub tool_name: Option<Cow<'a, str>>,
    /// The result's content value (`content` or `output`): a string or an array of parts.
    pub content: &'a RawValue,
    /// Where `content` stands in the body.
    pub span: Span,
}

/// An image a user message carries (a platform attachment, SPEC A5).
#[derive(Debug)]
pub struct UserImage<'a> {
    pub item: usize,
    /// The whole content part (`image_url`, `input_image` or `image` block).
    pub part: &'a RawValue,
    pub span: Span,
}

/// What projection may look at and edit in one request.
#[derive(Debug)]
pub struct RequestView<'a> {
    pub dialect: Dialect,
    /// The whole request body the spans point into.
    pub body: &'a [u8],
    pub model: Option<Cow<'a, str>>,
    pub stream: bool,
    /// Messages (chat, Anthropic) or input items (Responses) in the history.
    pub items: usize,
    pub tool_results: Vec<ToolResult<'a>>,
    pub user_images: Vec<UserImage<'a>>,
    /// The request's `tools` as sent (where the read tool is added, C1).
    pub tools: Option<&'a RawValue>,
    /// A conversation id the client already sends: Responses `prompt_cache_key`, Anthropic
    /// `metadata.user_id`.
    pub conversation: Option<Cow<'a, str>>,
    /// The conversation's root as sent: system prompt and first user message (raw JSON), for
    /// the session fingerprint when there is no explicit session.
    pub root: Vec<&'a str>,
}

impl<'a> RequestView<'a> {
    /// A view with nothing to project: the body is JSON but not of the dialect's shape. The
    /// model is still read when it can be, so the request is routed as the client meant.
    pub fn empty(dialect: Dialect, body: &'a [u8]) -> Self {
        #[derive(Deserialize)]
        struct ModelOnly<'a> {
            #[serde(borrow)]
            model: Option<Cow<'a, str>>,
        }
        let model = serde_json::from_slice::<ModelOnly>(body)
            .ok()
            .and_then(|m| m.model);
        Self {
            dialect,
            body,
            model,
            stream: false,
            items: 0,
            tool_results: Vec::new(),
            user_images: Vec::new(),
            tools: None,
            conversation: None,
            root: Vec::new(),
        }
    }
}

/// A replacement of the bytes in `span` by `with`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub span: Span,
    pub with: Bytes,
}

/// What a request's projection changed, for the `x-sluice-projection` header (SPEC O3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    pub spilled: usize,
    pub embedded: usize,
    pub deferred: usize,
    pub refused: usize,
    pub placeholders: usize,
}

impl Summary {
    pub fn header_value(&self) -> String {
        format!(
            "spilled={}; embedded={}; deferred={}; refused={}; placeholders={}",
            self.spilled, self.embedded, self.deferred, self.refused, self.placeholders
        )
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
    /// Every image of the request in arrival order, with its source and lifetime (M5), for
    /// the delivery state.
    pub attachments: Vec<Attachment>,
    /// The session state changes to commit if the response completes (A9).
    pub delta: Delta,
    /// Image placeholders that name an artifact the read tool can show again (C5).
    pub rereadable: usize,
}

/// An image of the request as the delivery state sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The tool call (`tool_call_id`, `call_id`, `tool_use_id`) or `user:<message index>`.
    pub source: String,
    /// Its number within the source.
    pub k: usize,
    pub id: Option<ArtifactId>,
    pub lifetime: Lifetime,
    pub outcome: &'static str,
}

/// The source an image came from (a tool call id, or a fingerprint of the user's image part),
/// and the tool's name when known.
fn source_of<'v>(view: &'v RequestView<'_>, place: Place) -> (String, Option<&'v str>) {
    match place {
        Place::Tool(ri, _) => {
            let r = &view.tool_results[ri];
            (r.source.to_string(), r.tool_name.as_deref())
        }
        Place::User(ui) => {
            let part = view.user_images[ui].part.get();
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

/// An image's lifetime (M5): the hint on the item, else the first `tool_lifetimes` glob that
/// matches the tool's name, else the route's default.
fn lifetime_of(item: &Item, tool: Option<&str>, policy: &Policy<'_>, memo: &dyn Memos) -> Lifetime {
    if let Some(hint) = item.lifetime {
        return hint;
    }
    if let Some(tool) = tool {
        for (glob, lifetime) in policy.tool_lifetimes {
            if memo.glob_matches(glob, tool) {
                return *lifetime;
            }
        }
    }
    policy.images.default_lifetime
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
}

/// What projection needs besides the view: who asks, under which route's policy, and the memos
/// of earlier projections.
pub struct Context<'a> {
    pub tenant: &'a Tenant,
    pub policy: Policy<'a>,
    pub memo: &'a dyn Memos,
    /// The session's delivery state before this request (A3, A4).
    pub state: &'a SessionState,
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
pub struct Prepared {
    extracted: Vec<Option<Arc<Extracted>>>,
    users: Vec<Option<Arc<Item>>>,
}

impl Prepared {
    pub fn new(view: &RequestView<'_>, tenant: &Tenant, memo: &dyn Memos) -> Prepared {
        let extracted = view
            .tool_results
            .iter()
            .map(|r| memo.tool_images(r.content, tenant))
            .collect();
        let mut per_message = std::collections::HashMap::new();
        let users = view
            .user_images
            .iter()
            .map(|u| {
                let k = per_message.entry(u.item).or_insert(0usize);
                *k += 1;
                memo.user_image(u.part, *k, tenant)
            })
            .collect();
        Prepared { extracted, users }
    }

    /// Whether the request carries any image, and so needs its session's delivery state.
    pub fn has_images(&self) -> bool {
        self.extracted.iter().any(Option::is_some) || self.users.iter().any(Option::is_some)
    }
}

/// Projects a request: images first (M1-M5, A1, A5-A7), then the text exit on what text
/// remains (T2, section 3). When nothing needs changing the edits are empty and the body is
/// forwarded as sent (P1).
pub fn project(view: &RequestView<'_>, ctx: &Context<'_>) -> Projection {
    project_prepared(view, ctx, Prepared::new(view, ctx.tenant, ctx.memo))
}

/// [`project`] with the images already found.
pub fn project_prepared(
    view: &RequestView<'_>,
    ctx: &Context<'_>,
    prepared: Prepared,
) -> Projection {
    let policy = exit::Policy {
        tenant: ctx.tenant,
        budget: ctx.policy.budget(),
        read_tool: ctx.policy.read_tool,
    };
    let mut out = Projection::default();
    // Extract the images of tool results (remembered per content) and user messages.
    let Prepared { extracted, users } = prepared;
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
    // The delivery state decides first which images may be shown at all (A3, A4, A10).
    let candidates: Vec<Candidate> = places
        .iter()
        .filter_map(|&(_, _, place)| {
            let item = item_at(place)?;
            let (source, tool) = source_of(view, place);
            Some(Candidate {
                key: identity(&source, item),
                lifetime: lifetime_of(item, tool, &ctx.policy, ctx.memo),
                showable: accepts && !matches!(item.media, Media::Refused(_)),
            })
        })
        .collect();
    let recent = state::Recent {
        count: ctx.policy.images.recent_count,
        batch: ctx.policy.images.prune_batch,
    };
    let decisions = state::plan(ctx.state, &candidates, recent);
    let eligible: Vec<&Item> = items
        .iter()
        .zip(&decisions)
        .filter(|(_, d)| matches!(d, Decision::Eligible | Decision::NotShowable))
        .map(|(item, _)| *item)
        .collect();
    let limits = Limits::new(
        ctx.policy.images,
        accepts,
        view.dialect == Dialect::AnthropicMessages,
    );
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
    out.delta = state::settle(ctx.state, &candidates, &decisions, &embedded);
    let mut tool_outcomes: Vec<Vec<Outcome>> = extracted
        .iter()
        .map(|e| vec![Outcome::Deferred; e.as_ref().map_or(0, |e| e.items.len())])
        .collect();
    let mut user_outcomes: Vec<Option<Outcome>> = vec![None; users.len()];
    for ((_, _, place), outcome) in places.iter().zip(decided) {
        let ev = event(&outcome);
        out.images.push(ev);
        if let Some(item) = item_at(*place) {
            let (source, tool) = source_of(view, *place);
            out.attachments.push(Attachment {
                source,
                k: item.k,
                id: item.id,
                lifetime: lifetime_of(item, tool, &ctx.policy, ctx.memo),
                outcome: ev.outcome,
            });
        }
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
        for (item, outcome) in e.items.iter().zip(outcomes) {
            if let Some(note) = attach::note(item, outcome) {
                text.push('\n');
                text.push_str(&note);
            }
        }
        if let Some((page, spill)) = exit::page_text(&text, &policy) {
            text = page;
            out.summary.spilled += 1;
            out.spills.push(spill);
        }
        let (content, chat_parts) = render_tool_content(view.dialect, result, e, outcomes, &text);
        out.edits.push(Edit {
            span: result.span,
            with: Bytes::from(content),
        });
        if !chat_parts.is_empty() {
            chat_turns.push((result.item, chat_parts));
        }
    }
    // The other tool results: the text exit alone.
    let text = exit::project(view, &policy, ctx.memo, &|i| extracted[i].is_some());
    out.edits.extend(text.edits);
    out.summary.spilled += text.spilled;
    out.spills.extend(text.spills);
    out.memos = text.memos;
    // User images written back when they changed or are not shown.
    for (ui, (item, outcome)) in users.iter().zip(&user_outcomes).enumerate() {
        if let (Some(item), Some(outcome)) = (item, outcome) {
            if let Some(with) =
                render_user_part(view.dialect, view.user_images[ui].part, item, outcome)
            {
                out.edits.push(Edit {
                    span: view.user_images[ui].span,
                    with: Bytes::from(with),
                });
            }
        }
    }
    // OpenAI chat: each turn's images in one user message after its tool messages (A7).
    if !chat_turns.is_empty() {
        out.edits.extend(chat_image_messages(view, chat_turns));
    }
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

fn event(outcome: &Outcome) -> ImageEvent {
    let (name, reason, bytes, downscaled) = match outcome {
        Outcome::Embed(e) => ("embedded", "", e.base64.len() as u64, e.downscaled),
        Outcome::KeepRemote => ("embedded", "remote", 0, false),
        Outcome::Deferred => ("deferred", "budget", 0, false),
        Outcome::Refused(r) => ("refused", r.reason(), 0, false),
        Outcome::Gated => ("placeholder", "no_image_input", 0, false),
        Outcome::Retired => ("placeholder", "shown_before", 0, false),
    };
    ImageEvent {
        outcome: name,
        reason,
        bytes,
        downscaled,
    }
}

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

fn data_url(e: &Embedded) -> String {
    format!("data:{};base64,{}", e.mime, e.base64)
}

/// What an image part shows: bytes sluice embeds, or a URL passed on.
enum Image<'a> {
    Data(&'a Embedded),
    Url(&'a str),
}

/// An image part in the dialect's shape, with the fields the client sent on its own part
/// (`detail`, `cache_control`, …) written back (P2).
fn image_part(dialect: Dialect, image: &Image<'_>, extras: Option<&attach::Extras>) -> String {
    let (outer, inner) = extras.map_or(("", ""), |x| (x.outer.as_str(), x.inner.as_str()));
    let url = |image: &Image<'_>| match image {
        Image::Data(em) => json_string(&data_url(em)),
        Image::Url(url) => json_string(url),
    };
    match (dialect, image) {
        (Dialect::AnthropicMessages, Image::Data(em)) => format!(
            r#"{{"type":"image","source":{{"type":"base64","media_type":"{}","data":"{}"}}{outer}}}"#,
            em.mime, em.base64
        ),
        (Dialect::AnthropicMessages, Image::Url(_)) => format!(
            r#"{{"type":"image","source":{{"type":"url","url":{}}}{outer}}}"#,
            url(image)
        ),
        (Dialect::OpenAiResponses, _) => format!(
            r#"{{"type":"input_image","image_url":{}{outer}}}"#,
            url(image)
        ),
        (Dialect::OpenAiChat, _) => format!(
            r#"{{"type":"image_url","image_url":{{"url":{}{inner}}}{outer}}}"#,
            url(image)
        ),
    }
}

/// A tool result's new content: its text, then its shown images where the dialect allows images
/// in tool results, then its other parts. For OpenAI chat, the images come back separately, to
/// go in a user message after the turn.
fn render_tool_content(
    dialect: Dialect,
    result: &ToolResult<'_>,
    e: &Extracted,
    outcomes: &[Outcome],
    text: &str,
) -> (String, Vec<String>) {
    let text_json = json_string(text);
    let mut parts: Vec<String> = Vec::new();
    let mut chat_parts: Vec<String> = Vec::new();
    let text_type = if dialect == Dialect::OpenAiResponses {
        "input_text"
    } else {
        "text"
    };
    parts.push(format!(r#"{{"type":"{text_type}","text":{text_json}}}"#));
    for (item, outcome) in e.items.iter().zip(outcomes) {
        let image = match (outcome, &item.media) {
            (Outcome::Embed(em), _) => Image::Data(em),
            (Outcome::KeepRemote, Media::Remote(url)) => Image::Url(url),
            _ => continue,
        };
        let part = image_part(dialect, &image, item.extras.as_deref());
        if dialect == Dialect::OpenAiChat {
            chat_parts.push(format!(
                r#"{{"type":"text","text":{}}}"#,
                json_string(&item.reference())
            ));
            chat_parts.push(part);
        } else {
            parts.push(part);
        }
    }
    parts.extend(e.others.iter().cloned());
    if let (Some(cc), Some(last)) = (&e.cache_control, parts.last_mut()) {
        if last.ends_with('}') && !last.contains("\"cache_control\"") {
            last.pop();
            last.push_str(",\"cache_control\":");
            last.push_str(cc);
            last.push('}');
        }
    }
    let content = if dialect == Dialect::OpenAiChat && result.content.get().starts_with('"') {
        text_json
    } else {
        format!("[{}]", parts.join(","))
    };
    (content, chat_parts)
}

/// A user image part as it must be sent, or `None` to leave its bytes untouched (P1).
fn render_user_part(
    dialect: Dialect,
    part_raw: &RawValue,
    item: &Item,
    outcome: &Outcome,
) -> Option<String> {
    let text_type = if dialect == Dialect::OpenAiResponses {
        "input_text"
    } else {
        "text"
    };
    match outcome {
        Outcome::KeepRemote => None,
        Outcome::Embed(em) if !em.downscaled && !em.relabelled => None,
        Outcome::Embed(em) => {
            // Rewrite the part with the right label (and the smaller bytes), keeping its other
            // fields (`detail`, `cache_control`).
            let mut part: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(part_raw.get()).ok()?;
            match dialect {
                Dialect::AnthropicMessages => {
                    let source = serde_json::json!({
                        "type": "base64", "media_type": em.mime, "data": &*em.base64
                    });
                    part.insert("source".into(), source);
                }
                Dialect::OpenAiResponses => {
                    part.insert("image_url".into(), data_url(em).into());
                }
                // `image_url` is an object in chat; a client's bare string becomes one.
                Dialect::OpenAiChat => match part.get_mut("image_url") {
                    Some(serde_json::Value::Object(url)) => {
                        url.insert("url".into(), data_url(em).into());
                    }
                    _ => {
                        let url = serde_json::json!({ "url": data_url(em) });
                        part.insert("image_url".into(), url);
                    }
                },
            }
            Some(serde_json::Value::Object(part).to_string())
        }
        other => {
            let text = attach::note(item, other).unwrap_or_else(|| item.reference());
            let mut part = format!(r#"{{"type":"{text_type}","text":{}"#, json_string(&text));
            // Anthropic blocks may carry a cache breakpoint; it stays where it was (P2).
            if dialect == Dialect::AnthropicMessages {
                #[derive(serde::Deserialize)]
                struct Marker<'a> {
                    #[serde(borrow)]
                    cache_control: Option<&'a RawValue>,
                }
                if let Some(cc) = serde_json::from_str::<Marker>(part_raw.get())
                    .ok()
                    .and_then(|m| m.cache_control)
                {
                    part.push_str(",\"cache_control\":");
                    part.push_str(cc.get());
                }
            }
            part.push('}');
            Some(part)
        }
    }
}

/// Inserts, after the last tool message of each turn that has shown images, one user message
/// holding them, each after its reference (A7).
fn chat_image_messages(view: &RequestView<'_>, turns: Vec<(usize, Vec<String>)>) -> Vec<Edit> {
    let Some(spans) = std::str::from_utf8(view.body)
        .ok()
        .and_then(crate::dialect::openai_chat::message_spans)
    else {
        return Vec::new();
    };
    let mut by_end: Vec<(usize, Vec<String>)> = Vec::new();
    for (message, parts) in turns {
        let mut last = message;
        while last + 1 < spans.len() && spans[last + 1].1 {
            last += 1;
        }
        match by_end.iter_mut().find(|(end, _)| *end == last) {
            Some((_, all)) => all.extend(parts),
            None => by_end.push((last, parts)),
        }
    }
    by_end
        .into_iter()
        .filter_map(|(last, parts)| {
            let end = spans.get(last)?.0.end;
            Some(Edit {
                span: Span { start: end, end },
                with: Bytes::from(format!(
                    r#",{{"role":"user","content":[{}]}}"#,
                    parts.join(",")
                )),
            })
        })
        .collect()
}

/// Edits that cannot be applied together.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpliceError {
    #[error("edit {0:?} lies outside the body")]
    OutOfBounds(Span),
    #[error("edits {0:?} and {1:?} overlap")]
    Overlap(Span, Span),
}

/// Applies `edits` to `body`. Bytes outside the edited spans are copied unchanged (P2); with no
/// edits the original buffer is returned without a copy (P1). Edits may come in any order.
pub fn splice(body: &Bytes, mut edits: Vec<Edit>) -> Result<Bytes, SpliceError> {
    if edits.is_empty() {
        return Ok(body.clone());
    }
    edits.sort_by_key(|e| e.span);
    let mut size = body.len();
    let mut prev: Option<Span> = None;
    for edit in &edits {
        let Span { start, end } = edit.span;
        if start > end || end > body.len() {
            return Err(SpliceError::OutOfBounds(edit.span));
        }
        if let Some(p) = prev {
            if p.end > start {
                return Err(SpliceError::Overlap(p, edit.span));
            }
        }
        prev = Some(edit.span);
        size = size - (end - start) + edit.with.len();
    }
    let mut out = BytesMut::with_capacity(size);
    let mut at = 0;
    for edit in &edits {
        out.extend_from_slice(&body[at..edit.span.start]);
        out.extend_from_slice(&edit.with);
        at = edit.span.end;
    }
    out.extend_from_slice(&body[at..]);
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouteConfig;
    use crate::memo::Memo;
    use proptest::prelude::*;

    fn edit(start: usize, end: usize, with: &str) -> Edit {
        Edit {
            span: Span { start, end },
            with: Bytes::copy_from_slice(with.as_bytes()),
        }
    }

    #[test]
    fn no_edits_returns_the_same_buffer() {
        let body = Bytes::from_static(b"{\"a\" :  1}");
        let out = splice(&body, Vec::new()).unwrap();
        assert_eq!(out.as_ptr(), body.as_ptr(), "P1: no copy, same bytes");
    }

    #[test]
    fn edits_in_any_order_replace_only_their_spans() {
        let body = Bytes::from_static(b"0123456789");
        let out = splice(&body, vec![edit(7, 9, "xy z"), edit(1, 3, "")]).unwrap();
        assert_eq!(&out[..], b"03456xy z9");
    }

    #[test]
    fn overlapping_or_outside_edits_are_errors() {
        let body = Bytes::from_static(b"0123456789");
        assert!(matches!(
            splice(&body, vec![edit(1, 5, ""), edit(4, 6, "")]),
            Err(SpliceError::Overlap(..))
        ));
        assert!(matches!(
            splice(&body, vec![edit(8, 11, "")]),
            Err(SpliceError::OutOfBounds(..))
        ));
    }

    /// P2 at the seam: replacing a tool result's content through its view span changes those
    /// bytes only; unknown fields, whitespace, key order and number formats survive.
    #[test]
    fn an_edited_request_changes_only_its_spliced_spans() {
        let cases = [
            (Dialect::OpenAiChat, "{ \"x_unknown\" : {\"n\": 1.50e3},\n \"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\",\"function\":{\"name\":\"ls\"}}]},\n\t{\"tool_call_id\":\"c1\", \"content\" :\"old\\nout\", \"role\":\"tool\"}], \"model\":\"m\", \"temperature\": 0.70 }"),
            (Dialect::OpenAiResponses, "{\"input\":[{\"output\":[{\"type\":\"input_text\",\"text\":\"old\"}],  \"type\":\"function_call_output\",\"call_id\":\"f\"}],\"model\":\"m\",\"z\":-0.0}"),
            (Dialect::AnthropicMessages, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"cache_control\":{\"type\":\"ephemeral\"},\"type\":\"tool_result\",\"tool_use_id\":\"t\",\"content\":\"old\"}]}],  \"max_tokens\":1e2}"),
        ];
        for (dialect, body) in cases {
            let body = Bytes::from(body);
            let view = dialect.read_view(&body).unwrap();
            let span = view.tool_results[0].span;
            drop(view);
            let out = splice(
                &body,
                vec![Edit {
                    span,
                    with: Bytes::from_static(b"\"new\""),
                }],
            )
            .unwrap();
            assert_eq!(
                &out[..span.start],
                &body[..span.start],
                "{dialect:?}: prefix untouched"
            );
            assert_eq!(
                &out[span.start + 5..],
                &body[span.end..],
                "{dialect:?}: suffix untouched"
            );
            let mut before: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let after: serde_json::Value = serde_json::from_slice(&out).unwrap();
            // The only semantic change is the replaced content.
            let pointer = match dialect {
                Dialect::OpenAiChat => "/messages/1/content",
                Dialect::OpenAiResponses => "/input/0/output",
                Dialect::AnthropicMessages => "/messages/0/content/0/content",
            };
            *before.pointer_mut(pointer).unwrap() = serde_json::json!("new");
            assert_eq!(before, after, "{dialect:?}");
        }
    }

    /// M5: the hint on the item, else the tool's glob, else the route default.
    #[test]
    fn each_image_gets_its_lifetime() {
        use base64::Engine;
        let png = crate::image::tests::encode(
            &crate::image::tests::picture(4, 4),
            ::image::ImageFormat::Png,
        );
        let data = base64::engine::general_purpose::STANDARD.encode(&png);
        let mcp = |meta: serde_json::Value| {
            serde_json::json!({"content": [{"type": "image", "data": data, "mimeType": "image/png", "_meta": meta}]}).to_string()
        };
        let body = serde_json::json!({"model": "m", "messages": [
            {"role": "assistant", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "take_screenshot", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "render", "arguments": "{}"}},
                {"id": "c", "type": "function", "function": {"name": "take_screenshot", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": mcp(serde_json::json!({}))},
            {"role": "tool", "tool_call_id": "b", "content": mcp(serde_json::json!({}))},
            {"role": "tool", "tool_call_id": "c", "content": mcp(serde_json::json!({"sluice/lifetime": "retain"}))}
        ]})
        .to_string();
        let view = Dialect::OpenAiChat.read_view(body.as_bytes()).unwrap();
        let tenant = Tenant::from_credential(b"k");
        let route = RouteConfig::default();
        let memo = Memo::default();
        let p = project(
            &view,
            &Context {
                tenant: &tenant,
                policy: route.policy(&route.read_tool),
                memo: &memo,
                state: &SessionState::default(),
            },
        );
        let lifetimes: Vec<_> = p
            .attachments
            .iter()
            .map(|a| (a.source.as_str(), a.lifetime))
            .collect();
        assert_eq!(
            lifetimes,
            [
                ("a", Lifetime::Recent),
                ("b", Lifetime::Once),
                ("c", Lifetime::Retain)
            ]
        );
        assert!(
            !String::from_utf8_lossy(&splice(&Bytes::from(body.clone()), p.edits).unwrap())
                .contains("sluice/lifetime"),
            "hint stripped"
        );
    }

    /// Arbitrary JSON values, biased towards the shapes projection looks at.
    fn arb_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::json;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "(\\PC|\\n|data:image/png;base64,|iVBORw0KGgo=|image|\"){0,40}"
                .prop_map(serde_json::Value::from),
            Just(json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"})),
            Just(json!({"type": "text", "text": "x".repeat(50)})),
            Just(
                json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}})
            ),
            Just(json!({"type": "input_image", "image_url": "data:image/gif;base64,R0lGODlh"})),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::vec(
                    ("(type|content|text|data|role|image_url|output)", inner),
                    0..4
                )
                .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// S5, P2: whatever a client sends, projection never panics, and a JSON request stays
        /// JSON after its edits are spliced in; with no edits it is unchanged (P1).
        #[test]
        fn projection_never_breaks_json(content in arb_value(), user in arb_value(), small in any::<bool>()) {
            use serde_json::json;
            let mut route = RouteConfig::default();
            if small {
                route.exit.max_lines = 3;
                route.exit.max_units = 1024;
                route.images.max_images = 1;
            }
            let tenant = Tenant::from_credential(b"k");
            let memo = Memo::default();
            let bodies = [
                (Dialect::OpenAiChat, json!({"model": "m", "messages": [
                    {"role": "user", "content": user.clone()},
                    {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "c", "content": content.clone()},
                    {"role": "tool", "tool_call_id": "d", "content": content.to_string()}]})),
                (Dialect::OpenAiResponses, json!({"model": "m", "input": [
                    {"role": "user", "content": user.clone()},
                    {"type": "function_call_output", "call_id": "c", "output": content.clone()},
                    {"type": "function_call_output", "call_id": "d", "output": content.to_string()}]})),
                (Dialect::AnthropicMessages, json!({"model": "m", "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": content.clone()},
                                                 {"type": "tool_result", "tool_use_id": "d", "content": content.to_string()}]},
                    {"role": "user", "content": user.clone()}]})),
            ];
            for (dialect, body) in bodies {
                let body = Bytes::from(body.to_string());
                let view = dialect.read_view(&body).unwrap();
                let p = project(&view, &Context { tenant: &tenant, policy: route.policy(&route.read_tool), memo: &memo, state: &SessionState::default() });
                let unchanged = p.edits.is_empty();
                let out = splice(&body, p.edits).unwrap();
                prop_assert!(serde_json::from_slice::<serde_json::Value>(&out).is_ok(), "{dialect:?}: {}", String::from_utf8_lossy(&out));
                if unchanged {
                    prop_assert_eq!(&out, &body);
                }
            }
        }
    }

    proptest! {
        /// P2: whatever edits are made, the bytes between them are the original bytes.
        #[test]
        fn splice_keeps_every_untouched_byte(
            body in proptest::collection::vec(any::<u8>(), 0..200),
            cuts in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), "[a-z]{0,5}"), 0..6),
        ) {
            let body = Bytes::from(body);
            // Build non-overlapping spans from sorted cut points.
            let mut points: Vec<(usize, usize, String)> = cuts
                .into_iter()
                .map(|(a, b, s)| {
                    let (a, b) = (a.index(body.len() + 1), b.index(body.len() + 1));
                    (a.min(b), a.max(b), s)
                })
                .collect();
            points.sort();
            let mut edits = Vec::new();
            let mut last = 0;
            for (a, b, s) in points {
                if a >= last {
                    edits.push(edit(a, b, &s));
                    last = b.max(a + 1);
                }
            }
            let out = splice(&body, edits.clone()).unwrap();
            // The same edits applied one by one, from the last, with std's Vec::splice.
            let mut expect = body.to_vec();
            for e in edits.iter().rev() {
                expect.splice(e.span.start..e.span.end, e.with.iter().copied());
            }
            prop_assert_eq!(&out[..], &expect[..]);
        }
    }
}
