//! Audio in tool results (docs/audio.md): each file's fate in a request, by the image rules
//! applied to audio — the route's gate (A1: `audio` in `input_modalities`, and a dialect that
//! takes audio), the delivery state (A3, A4, A10: `once`, `recent`, `retain`, committed on
//! success), and `[routes.audio]` budgets in arrival order (A5, A6). A file that is sent goes,
//! like a chat image, in the user message after its turn's tool messages (A7); every other one
//! keeps its reference line, with a note saying why it was not sent.

use std::sync::Arc;

use super::attach::extract::{Extracted, Sound};
use super::attach::state::{Candidate, Decision};
use super::edits::{self, Priced};
use super::policy::AudioLimits;
use super::{artifact::ArtifactId, exit, lifetime_of, Context, Projection, RequestView};

/// One audio file's fate in a request, for metrics, headers and the inspector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AudioEvent {
    /// `embedded`, `deferred`, `refused` or `placeholder`, as for images.
    pub outcome: &'static str,
    pub reason: &'static str,
    /// The file's bytes, when it was sent.
    pub bytes: u64,
    /// Its length, where its header says it (WAV).
    pub millis: Option<u64>,
    /// The tool result it is in, by index in the view.
    pub result: usize,
    pub artifact: Option<ArtifactId>,
}

/// What happens to one audio file in this request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// Sent to the model as an `input_audio` part in this format.
    Sent(&'static str),
    /// No room in this request's audio budget; sent in a later one (A5). Not terminal.
    Deferred,
    /// The route, or its wire API, takes no audio (A1): stored and named only.
    Gated(&'static str),
    /// Can never be sent on this route (A6), and why; or its bytes failed their check (the
    /// reference says so).
    Refused(Option<String>, &'static str),
    /// Sent before and no longer attached: `once` after its sending, pruned or released.
    Retired,
}

/// Every audio file of the request decided: per tool result (by index in the view; empty when
/// the request has no audio), one [`Heard`] per file; the candidates the delivery state tracks, with their decisions and
/// whether each was sent, for the request's one `settle`.
#[derive(Default)]
pub(super) struct Decided {
    pub heard: Vec<Vec<Heard>>,
    pub candidates: Vec<Candidate>,
    pub decisions: Vec<Decision>,
    pub sent: Vec<bool>,
}

/// Decides the request's audio and records its artifacts, events and summary counts in `out`.
pub(super) fn decide(
    view: &RequestView<'_>,
    ctx: &Context<'_>,
    extracted: &[Option<Arc<Extracted>>],
    pictures: &[Priced],
    out: &mut Projection,
) -> Decided {
    if extracted.iter().flatten().all(|e| e.audio.is_empty()) {
        // The common case: nothing to decide, nothing allocated.
        return Decided::default();
    }
    let limits = ctx.policy.audio;
    let gate = gate(view, ctx);
    let mut d = Decided {
        heard: vec![Vec::new(); extracted.len()],
        ..Decided::default()
    };
    // First each file on its own: refused, gated, or a candidate for the delivery state.
    // Where each candidate stands (result, file), its size and the format it is sent in.
    let mut places: Vec<(usize, usize, u64, &'static str)> = Vec::new();
    let mut priced: Vec<Priced> = Vec::new();
    for (ri, e) in extracted.iter().enumerate() {
        let Some(e) = e else { continue };
        let result = &view.tool_results[ri];
        for (si, sound) in e.audio.iter().enumerate() {
            if let (Ok(audio), Some(id)) = (&sound.checked, sound.id) {
                out.spills.push(exit::Spill {
                    id,
                    bytes: audio.bytes.clone(),
                });
            }
            let heard = match (&sound.checked, gate) {
                (Err(refusal), _) => Heard::Refused(None, refusal.reason()),
                (Ok(_), Some(why)) => Heard::Gated(why),
                (Ok(audio), None) => match sendable(audio, limits) {
                    Err(refused) => refused,
                    Ok(format) => {
                        let lifetime = lifetime_of(
                            sound.lifetime,
                            result.tool_name.as_deref(),
                            &ctx.policy,
                            ctx.memo,
                            limits.default_lifetime,
                        );
                        d.candidates.push(Candidate {
                            key: identity(&result.source, sound),
                            lifetime,
                            showable: true,
                        });
                        places.push((ri, si, audio.bytes.len() as u64, format));
                        priced.push(price(result.span.start, sound, audio));
                        Heard::Deferred
                    }
                },
            };
            d.heard[ri].push(heard);
        }
    }
    // Then the candidates: what the state allows (A3, and A4's `recent` pruning made when it
    // pays, as for images: docs/cache.md), then the budgets in arrival order.
    let caps = edits::Caps::audio(ctx);
    let deferred;
    (d.decisions, deferred) = edits::plan(view, ctx, &d.candidates, &priced, pictures, caps);
    out.summary.deferred_edits += deferred;
    let (mut count, mut total) = (0usize, 0u64);
    for (&(ri, si, size, format), decision) in places.iter().zip(&d.decisions) {
        let (heard, sent) = match decision {
            Decision::Eligible
                if count < limits.max_audio && total + size <= limits.max_total_bytes =>
            {
                count += 1;
                total += size;
                (Heard::Sent(format), true)
            }
            Decision::Eligible | Decision::NotShowable => (Heard::Deferred, false),
            Decision::Consumed | Decision::Pruned | Decision::Released => (Heard::Retired, false),
        };
        d.heard[ri][si] = heard;
        d.sent.push(sent);
    }
    // What happened, in document order.
    for (ri, heard) in d.heard.iter().enumerate() {
        let Some(e) = &extracted[ri] else { continue };
        for (sound, heard) in e.audio.iter().zip(heard) {
            out.audio.push(event(sound, heard, ri));
            match heard {
                Heard::Sent(_) => out.summary.embedded += 1,
                Heard::Deferred => out.summary.deferred += 1,
                Heard::Refused(..) => out.summary.refused += 1,
                Heard::Gated(_) | Heard::Retired => out.summary.placeholders += 1,
            }
            if matches!(heard, Heard::Deferred | Heard::Retired) && sound.id.is_some() {
                out.rereadable += 1;
            }
        }
    }
    d
}

/// Why the route sends no audio at all (A1), if it does not.
fn gate(view: &RequestView<'_>, ctx: &Context<'_>) -> Option<&'static str> {
    match (ctx.policy.accepts_audio, view.shapes.takes_audio()) {
        (false, _) => Some("this model does not accept audio"),
        (true, false) => Some("this API takes no audio input"),
        (true, true) => None,
    }
}

/// A file as the edit decision prices it (`edits::plan`): it stands at its tool result, costs
/// `tokens::Tokenizer::audio` sent, and its budget counts its own bytes.
fn price(at: usize, sound: &Sound, audio: &crate::audio::CheckedAudio) -> Priced {
    let size = audio.bytes.len() as u64;
    Priced {
        at,
        tokens: crate::tokens::Tokenizer::audio(audio.millis, size),
        base64: sound
            .base64
            .as_ref()
            .map_or(size * 4 / 3, |b| b.len() as u64),
        size,
    }
}

/// Every usable audio file of the request as forwarded if nothing prunes it, for the image
/// decision's count of what an edit rewrites: sent where the route sends audio, a reference
/// line where not. Empty, and unallocated, when the request has no audio.
pub(super) fn priced(
    view: &RequestView<'_>,
    ctx: &Context<'_>,
    extracted: &[Option<Arc<Extracted>>],
) -> Vec<Priced> {
    if extracted.iter().flatten().all(|e| e.audio.is_empty()) {
        return Vec::new();
    }
    let sent = gate(view, ctx).is_none();
    let mut out = Vec::new();
    for (e, result) in extracted.iter().zip(&view.tool_results) {
        let Some(e) = e else { continue };
        for sound in &e.audio {
            if let Ok(audio) = &sound.checked {
                out.push(price(result.span.start, sound, audio).forwarded(sent));
            }
        }
    }
    out
}

/// The format a file is sent in (`input_audio`'s `wav` or `mp3`); or why this route can never
/// send it (A6): a container its API does not take, or over the per-file or per-request bytes.
fn sendable(
    audio: &crate::audio::CheckedAudio,
    limits: &AudioLimits,
) -> Result<&'static str, Heard> {
    let Some(format) = audio.kind.input_format() else {
        let why = format!("this API takes WAV or MP3 audio, not {}", audio.kind.name());
        return Err(Heard::Refused(Some(why), "unsupported_format"));
    };
    let size = audio.bytes.len() as u64;
    let cap = limits.max_audio_bytes.min(limits.max_total_bytes);
    if size > cap {
        let why = format!(
            "{} KB is over this route's audio limit of {} KB",
            size.div_ceil(1024),
            cap / 1024
        );
        return Err(Heard::Refused(Some(why), "too_large"));
    }
    Ok(format)
}

/// An audio file's identity in the delivery state: its source, its number there and its
/// content, apart from images' (`#a`).
fn identity(source: &str, sound: &Sound) -> String {
    let content = sound
        .id
        .map_or_else(|| "none".to_string(), |id| id.to_string());
    format!("{source}#a{}#{content}", sound.k)
}

/// The note written after a tool result's text for an audio file that is not sent.
pub(super) fn note(sound: &Sound, heard: &Heard) -> Option<String> {
    let k = sound.k;
    let id = sound.id?;
    match heard {
        Heard::Sent(_) | Heard::Refused(None, _) => None,
        Heard::Gated(why) => Some(format!("[audio #{k}: not sent to the model: {why}]")),
        Heard::Refused(Some(why), _) => Some(format!("[audio #{k}: not sent: {why}]")),
        Heard::Deferred => Some(format!(
            "[audio #{k}: not sent in this request (its audio budget is full); it will be sent in a later one (artifact://{id})]"
        )),
        Heard::Retired => Some(format!(
            "[audio #{k}: sent earlier and no longer attached; it can be heard again with the read tool: {{\"url\":\"artifact://{id}\"}}]"
        )),
    }
}

fn event(sound: &Sound, heard: &Heard, result: usize) -> AudioEvent {
    let audio = sound.checked.as_ref().ok();
    let (outcome, reason) = match heard {
        Heard::Sent(_) => ("embedded", ""),
        Heard::Deferred => ("deferred", "budget"),
        Heard::Gated(_) => ("placeholder", "no_audio_input"),
        Heard::Refused(_, reason) => ("refused", *reason),
        Heard::Retired => ("placeholder", "shown_before"),
    };
    AudioEvent {
        outcome,
        reason,
        bytes: match heard {
            Heard::Sent(_) => audio.map_or(0, |a| a.bytes.len() as u64),
            _ => 0,
        },
        millis: audio.and_then(|a| a.millis),
        result,
        artifact: sound.id,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{project, Context, Projection};
    use crate::config::{Lifetime, Modality, RouteConfig};
    use crate::dialect::Dialect;
    use crate::memo::Memo;
    use crate::projection::attach::state::{apply, SessionState};
    use crate::projection::policy::EditPolicy;
    use crate::tenant::Tenant;
    use base64::Engine;
    use serde_json::json;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// A chat request with one tool result per clip (`call_1`, …), each an MCP audio item, and
    /// a screenshot in the first.
    fn request(clips: &[Vec<u8>], png: &str) -> String {
        let mut messages = vec![json!({"role": "user", "content": "go"})];
        for (i, clip) in clips.iter().enumerate() {
            let id = format!("call_{}", i + 1);
            messages.push(
                json!({"role": "assistant", "tool_calls": [{"id": id, "type": "function",
                "function": {"name": "record", "arguments": "{}"}}]}),
            );
            let mut content =
                vec![json!({"type": "audio", "data": b64(clip), "mimeType": "audio/wav"})];
            if i == 0 {
                content.push(json!({"type": "image", "data": png, "mimeType": "image/png"}));
            }
            messages.push(json!({"role": "tool", "tool_call_id": id,
                "content": json!({"content": content}).to_string()}));
        }
        json!({"model": "m", "messages": messages}).to_string()
    }

    fn run(body: &str, route: &RouteConfig, state: &SessionState, d: Dialect) -> Projection {
        run_at(body, route, state, d, 0)
    }

    /// [`run`] with the clock at `now_ms`.
    fn run_at(
        body: &str,
        route: &RouteConfig,
        state: &SessionState,
        d: Dialect,
        now_ms: u64,
    ) -> Projection {
        let view = d.read_view(body.as_bytes()).unwrap();
        let tenant = Tenant::from_credential(b"k");
        let memo = Memo::default();
        project(
            &view,
            &Context {
                tenant: &tenant,
                policy: route.policy(&route.read_tool),
                memo: &memo,
                state,
                now_ms,
            },
        )
    }

    fn outcomes(p: &Projection) -> Vec<&'static str> {
        p.audio.iter().map(|a| a.outcome).collect()
    }

    fn audio_route() -> RouteConfig {
        let mut route = RouteConfig::default();
        route.input_modalities.push(Modality::Audio);
        route
    }

    /// A4 for audio, on its own count: `recent` files past `recent_count` are pruned oldest
    /// first once viewed; the request's image, counted apart, is shown all the same.
    #[test]
    fn recent_audio_is_pruned_on_its_own_count_a4() {
        let mut route = audio_route();
        route.cache.policy = EditPolicy::Eager;
        route.audio.default_lifetime = Lifetime::Recent;
        route.audio.recent_count = 1;
        route.audio.prune_batch = 1;
        route.images.recent_count = 1;
        route.images.default_lifetime = Lifetime::Recent;
        let png = b64(&crate::image::tests::encode(
            &crate::image::tests::picture(4, 4),
            ::image::ImageFormat::Png,
        ));
        let (a, b) = (crate::audio::tests::wav(100), crate::audio::tests::wav(200));
        let mut state = SessionState::default();
        let first = run(
            &request(std::slice::from_ref(&a), &png),
            &route,
            &state,
            Dialect::OpenAiChat,
        );
        assert_eq!(outcomes(&first), ["embedded"]);
        assert_eq!(first.summary.embedded, 2, "the audio and the image");
        apply(&mut state, &first.delta, 1);
        let second = run(&request(&[a, b], &png), &route, &state, Dialect::OpenAiChat);
        assert_eq!(outcomes(&second), ["placeholder", "embedded"]);
        assert_eq!(second.audio[0].reason, "shown_before");
        assert_eq!(
            second.images.iter().map(|i| i.outcome).collect::<Vec<_>>(),
            ["embedded"],
            "images are pruned on their own count"
        );
        assert_eq!(second.rereadable, 1, "the pruned file can be heard again");
    }

    /// A4 through the edit decision (docs/cache.md): while the session's cache is warm a
    /// pending prune waits until it pays (a short clip never does: it costs fewer tokens than
    /// its placeholder), and `deferred_edits` counts it; a cold cache, or `max_audio` passed if
    /// it were kept, makes it now. The newest `recent_count` files are sent every time.
    #[test]
    fn recent_audio_is_pruned_when_the_cache_is_cold_or_a_limit_forces_it_a4() {
        let mut route = audio_route();
        route.audio.default_lifetime = Lifetime::Recent;
        route.audio.recent_count = 1;
        route.audio.prune_batch = 1;
        let (a, b) = (crate::audio::tests::wav(100), crate::audio::tests::wav(200));
        let chat = Dialect::OpenAiChat;
        let mut state = SessionState::default();
        let first = run_at(
            &request(std::slice::from_ref(&a), ""),
            &route,
            &state,
            chat,
            10,
        );
        assert_eq!(outcomes(&first), ["embedded"]);
        assert!(
            first.delta.touch,
            "a request with audio moves the cache clock"
        );
        apply(&mut state, &first.delta, 1_000);
        let both = request(&[a, b], "");
        let warm = run_at(&both, &route, &state, chat, 2_000);
        assert_eq!(outcomes(&warm), ["embedded", "embedded"]);
        assert_eq!(warm.summary.deferred_edits, 1);
        let cold = run_at(&both, &route, &state, chat, 1_000 + 301_000);
        assert_eq!(outcomes(&cold), ["placeholder", "embedded"]);
        assert_eq!(cold.summary.deferred_edits, 0);
        route.audio.max_audio = 1;
        let forced = run_at(&both, &route, &state, chat, 2_000);
        assert_eq!(outcomes(&forced), ["placeholder", "embedded"]);
        assert_eq!(forced.summary.deferred_edits, 0);
    }

    /// A3, A10: `once` is consumed only by the delta of a completed request; an audio file
    /// whose source left the history is released for good.
    #[test]
    fn once_is_consumed_by_the_delta_and_released_with_its_source_a3_a10() {
        let route = audio_route();
        let clip = crate::audio::tests::wav(100);
        let body = request(std::slice::from_ref(&clip), "");
        let mut state = SessionState::default();
        let first = run(&body, &route, &state, Dialect::OpenAiChat);
        assert_eq!(outcomes(&first), ["embedded"]);
        // Not applied (a failed request): sent again.
        assert_eq!(
            outcomes(&run(&body, &route, &state, Dialect::OpenAiChat)),
            ["embedded"]
        );
        apply(&mut state, &first.delta, 1);
        let again = run(&body, &route, &state, Dialect::OpenAiChat);
        assert_eq!(outcomes(&again), ["placeholder"]);
        assert!(again.delta.records.is_empty(), "nothing new to record");
        let gone = run(&request(&[], ""), &route, &state, Dialect::OpenAiChat);
        assert_eq!(gone.delta.records.len(), 1, "released: {:?}", gone.delta);
        apply(&mut state, &gone.delta, 2);
        assert!(state.records.is_empty() && state.released.len() == 1);
    }

    /// A1: no state is kept for audio a route cannot send; the placeholder says why.
    #[test]
    fn gated_audio_keeps_no_state_a1() {
        let clip = crate::audio::tests::wav(100);
        let body = request(std::slice::from_ref(&clip), "");
        for (route, dialect) in [
            (RouteConfig::default(), Dialect::OpenAiChat),
            (audio_route(), Dialect::AnthropicMessages),
        ] {
            let body = if dialect == Dialect::AnthropicMessages {
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text",
                     "text": json!({"content": [{"type": "audio", "data": b64(&clip), "mimeType": "audio/wav"}]}).to_string()}]}]}]})
                .to_string()
            } else {
                body.clone()
            };
            let p = run(&body, &route, &SessionState::default(), dialect);
            assert_eq!(outcomes(&p), ["placeholder"], "{dialect:?}");
            assert!(p.delta.records.is_empty(), "{dialect:?}");
            assert_eq!(p.rereadable, 0);
            let out = crate::projection::splice(&bytes::Bytes::from(body), p.edits).unwrap();
            let out = String::from_utf8_lossy(&out);
            assert!(
                out.contains("[audio #1: not sent to the model: this"),
                "{out}"
            );
            assert!(!out.contains("input_audio") && !out.contains(&b64(&clip)[..40]));
        }
    }
}
