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

use bytes::Bytes;

use crate::tenant::Tenant;
use attach::extract::Extracted;
use attach::state::{self, Candidate, Decision, Delta, SessionState};
use attach::{Item, Limits, Media, Outcome};

pub mod artifact;
pub mod attach;
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
pub use view::{splice, Edit, RequestView, Span, SpliceError, ToolResult, UserImage};

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
            match memo.known_tool_images(result.content, tenant) {
                Some(None) => {}
                Some(Some(_)) => return None,
                None if attach::extract::may_hold_images(result.content.get()) => return None,
                None => {
                    memo.tool_images(result.content, tenant);
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
        sounds::take(e, &mut out);
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
    out.delta = state::settle(ctx.state, &candidates, &decisions, &embedded);
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
        let (content, chat_parts) = render_tool_content(view.shapes, result, e, outcomes, &text);
        out.edits.push(Edit {
            span: result.span,
            with: Bytes::from(content),
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
                    with: Bytes::from(with),
                });
            }
        }
    }
    // OpenAI chat: each turn's images in one user message after its tool messages (A7).
    if !chat_turns.is_empty() {
        out.edits
            .extend(view.shapes.after_turns(view.body.as_bytes(), chat_turns));
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
mod tests {
    use super::*;
    use crate::config::RouteConfig;
    use crate::dialect::Dialect;
    use crate::memo::Memo;
    use proptest::prelude::*;

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
        // The delivery state records each image under its source (`<source>#<k>#<content>`).
        let lifetimes: Vec<_> = p
            .delta
            .records
            .iter()
            .map(|(key, r)| (key.split('#').next().unwrap_or(""), r.lifetime))
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

    #[test]
    fn only_requests_without_images_are_prepared_cheaply() {
        let tenant = Tenant::from_credential(b"k");
        let memo = Memo::default();
        let chat = |content: serde_json::Value| {
            serde_json::json!({"model": "m", "messages": [
                {"role": "tool", "tool_call_id": "a", "content": content}]})
            .to_string()
        };
        let text = chat(serde_json::json!("plain output"));
        let view = Dialect::OpenAiChat.read_view(text.as_bytes()).unwrap();
        let light = Prepared::without_images(&view, &tenant, &memo).unwrap();
        assert!(!light.has_images());
        // Remembered now: the next turn costs a lookup, no search.
        let content = view.tool_results[0].content;
        assert!(matches!(
            memo.known_tool_images(content, &tenant),
            Some(None)
        ));
        let png = crate::image::tests::encode(
            &crate::image::tests::picture(4, 4),
            ::image::ImageFormat::Png,
        );
        use base64::Engine;
        let data = base64::engine::general_purpose::STANDARD.encode(&png);
        let image = chat(
            serde_json::json!([{"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}")}}]),
        );
        let view = Dialect::OpenAiChat.read_view(image.as_bytes()).unwrap();
        assert!(Prepared::without_images(&view, &tenant, &memo).is_none());
        assert!(Prepared::new(&view, &tenant, &memo).has_images());
        assert!(
            Prepared::without_images(&view, &tenant, &memo).is_none(),
            "known to hold images"
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
}
