//! The context-window guard (docs/context-guard.md): a request whose estimated input passes
//! `trigger` of the room its window leaves after the requested output gets its oldest tool
//! results retired, in one batch, until the estimate is under `target`. A retired result
//! becomes one line naming its artifact and a cursor, so the model can read it again with the
//! read tool; the session remembers it (committed on success, like every delta), so later
//! turns show the same line byte for byte and the prompt cache settles again after each batch.
//!
//! Pure: the estimate is memoized through [`Memos`], per stretch of the body between tool
//! results and per shown result, so a turn counts only what is new in it.

use std::collections::HashMap;

use bytes::Bytes;
use xxhash_rust::xxh3::Xxh3;

use super::attach::extract::Extracted;
use super::exit::cursor::Cursor;
use super::exit::text::{Lines, Position};
use super::exit::{self, Spill};
use super::memos::Memos;
use super::policy::{ContextLimits, EditPolicy, Policy};
use super::shapes::{NewContent, Shapes};
use super::view::Edit;
use super::{Context, Prepared, Projection, RequestView, Span, ToolResult};
use crate::projection::artifact::{ArtifactId, ArtifactKind};
use crate::tokens::Tokenizer;

/// A result whose shown form costs no more than this is never retired: its placeholder would
/// cost about as much, and retiring it would change the prefix for nothing.
const WORTH_RETIRING_TOKENS: u64 = 100;
/// Fragments shorter than this are counted, not memoized.
const MEMO_MIN_BYTES: usize = 64;

/// What the guard did to a request, for the header, the metrics and the logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// The estimated input tokens of the request as forwarded.
    pub estimated: u64,
    /// The room the guard kept the request under: `trigger × (window − output)`.
    pub limit: u64,
    /// Results shown retired in this request (earlier batches and this one).
    pub retired: usize,
    /// Results retired by this request (a new batch).
    pub batch: usize,
    /// Still over the room the window leaves with nothing left to retire: forwarded anyway,
    /// the provider's answer is authoritative.
    pub overflow: bool,
}

/// The guard's thresholds for one request.
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    pub tokenizer: Tokenizer,
    /// The room the window leaves after the requested output.
    pub room: u64,
    pub trigger: u64,
    pub target: u64,
}

impl Thresholds {
    /// The thresholds of `view` under `limits`; `None` when the guard is off.
    pub fn of(view: &RequestView<'_>, limits: &ContextLimits) -> Option<Thresholds> {
        if !limits.enabled() {
            return None;
        }
        let output = view.max_output.unwrap_or_else(|| limits.output_tokens());
        let room = limits.window_tokens.saturating_sub(output);
        Some(Thresholds {
            tokenizer: limits.tokenizer.unwrap_or_else(|| view.shapes.tokenizer()),
            room,
            trigger: (room as f64 * limits.trigger) as u64,
            target: (room as f64 * limits.target) as u64,
        })
    }

    /// Whether the request could reach the trigger at all: the most tokens its bytes can carry
    /// (and `images` images at their dearest) is past it. Below, the guard costs nothing: no
    /// session, no count.
    pub fn engaged(&self, view: &RequestView<'_>, images: usize) -> bool {
        !view.tool_results.is_empty()
            && Tokenizer::most_for_bytes(view.body.len())
                .saturating_add(images as u64 * self.tokenizer.image(0, 0))
                >= self.trigger
    }
}

/// Projects a request under its route's guard: when the estimate passes the trigger, a batch of
/// the oldest tool results is retired and the request projected again with them.
pub fn project(view: &RequestView<'_>, ctx: &Context<'_>, prepared: Prepared) -> Projection {
    let Some(t) = Thresholds::of(view, ctx.policy.context) else {
        return super::project_with(view, ctx, prepared, &[]);
    };
    if !t.engaged(view, prepared.images()) {
        let mut p = super::project_with(view, ctx, prepared, &[]);
        p.summary.retired = Some(0);
        return p;
    }
    let keys: Vec<u64> = view.tool_results.iter().map(key).collect();
    let mut retired: Vec<bool> = keys
        .iter()
        .map(|k| ctx.state.retired.contains_key(k))
        .collect();
    let mut p = super::project_with(view, ctx, prepared.clone(), &retired);
    let mut counted = estimate(view, &p, t.tokenizer, ctx.memo);
    let mut batch = Vec::new();
    if counted.total > acts_above(&t, ctx) {
        batch = select(
            view,
            &counted,
            &retired,
            ctx.policy.context.keep_recent_turns,
            ctx.policy.read_tool,
            t.target,
        );
        if !batch.is_empty() {
            for &i in &batch {
                retired[i] = true;
            }
            p = super::project_with(view, ctx, prepared, &retired);
            counted = estimate(view, &p, t.tokenizer, ctx.memo);
        }
    }
    let shown = retired.iter().filter(|r| **r).count();
    // When the session last forwarded, for whether the provider's cache is cold next time:
    // stamped once a request is past half the target (the next one may then pass the target),
    // so sessions far from the window commit nothing for it.
    p.delta.touch |=
        ctx.policy.cache.policy == EditPolicy::Economic && counted.total > t.target / 2;
    p.delta.retired = batch.iter().filter_map(|&i| keys.get(i).copied()).collect();
    p.summary.retired = Some(shown);
    p.context = Some(Report {
        estimated: counted.total,
        limit: t.trigger,
        retired: shown,
        batch: batch.len(),
        overflow: counted.total > t.room,
    });
    p
}

/// The estimate above which a batch is retired (docs/context-guard.md, "When a batch goes").
/// The trigger, unless the economic policy finds the provider's cache cold: the session
/// forwarded before, longer ago than the TTL, so the provider writes the whole prefix again
/// anyway and a batch down to the target costs no rewrite of its own. Then anything above the
/// target goes now, and the next batch the window forces comes that much later. On a warm
/// cache the guard waits for the trigger: batches every `g` tokens of growth, each rewriting
/// `R`, cost least when `trigger − target` is about √(2·R·g / read price), which at the default
/// thresholds of a 200k window is past the trigger for sessions that grow by more than about
/// 1,200 tokens a turn.
fn acts_above(t: &Thresholds, ctx: &Context<'_>) -> u64 {
    let cold = ctx.policy.cache.policy == EditPolicy::Economic
        && ctx.state.last_ms > 0
        && !super::edits::warm(ctx.state, ctx.now_ms, ctx.policy.cache);
    if cold {
        t.target
    } else {
        t.trigger
    }
}

/// Shows the results `retired` names as their placeholders (memoized; the artifact to store
/// when new). Their images leave the request, and so are released from the delivery state like
/// any image whose source left the history (A10).
pub(super) fn show_retired(
    view: &RequestView<'_>,
    ctx: &Context<'_>,
    extracted: &mut [Option<std::sync::Arc<Extracted>>],
    retired: &[bool],
    out: &mut Projection,
) {
    for (ri, result) in view.tool_results.iter().enumerate() {
        if !retired.get(ri).copied().unwrap_or(false) {
            continue;
        }
        let images = extracted.get_mut(ri).and_then(Option::take);
        let pages = exit::Policy {
            tenant: ctx.tenant,
            budget: ctx.policy.budget(),
            read_tool: ctx.policy.read_tool,
        };
        let key = exit::memo_key(b"retired\0", ctx.memo.seed(), view.shapes, &pages, result);
        let with = match ctx.memo.page(key).flatten() {
            Some(known) => known,
            None => {
                let text = match &images {
                    Some(e) => {
                        let mut text = e.text.clone();
                        for item in &e.items {
                            text.push('\n');
                            text.push_str(&item.reference());
                        }
                        text
                    }
                    None => result_text(view.shapes, result),
                };
                let (with, spill) = placeholder(view, result, &text, &ctx.policy, ctx.tenant);
                out.spills.push(spill);
                out.memos.push((key, Some(with.clone())));
                with
            }
        };
        out.edits.push(Edit {
            span: result.span,
            with: with.into(),
        });
    }
}

/// A tool result's key in the session's retired set: its source and its content.
pub fn key(result: &ToolResult<'_>) -> u64 {
    let mut h = Xxh3::new();
    h.update(result.source.as_bytes());
    h.update(&[0]);
    h.update(result.content.get().as_bytes());
    h.digest()
}

/// The estimate of a projected request: the whole, and what each tool result costs as shown
/// (its images included).
#[derive(Debug, Default)]
pub struct Estimate {
    pub total: u64,
    pub per_result: Vec<u64>,
}

/// Tokens of a JSON fragment, memoized when it is worth it.
fn fragment_tokens(tokenizer: Tokenizer, fragment: &str, memo: &dyn Memos) -> u64 {
    if fragment.len() < MEMO_MIN_BYTES {
        return tokenizer.count(&crate::tokens::json_text(fragment));
    }
    let mut h = Xxh3::with_seed(memo.seed());
    h.update(tokenizer.as_str().as_bytes());
    h.update(fragment.as_bytes());
    let key = h.digest128();
    if let Some(n) = memo.tokens(key) {
        return n;
    }
    let n = tokenizer.count(&crate::tokens::json_text(fragment));
    memo.keep_tokens(key, n);
    n
}

/// Estimates the input tokens of `view` as `p` would forward it: the text between tool
/// results, each result as shown, the bytes the edits add, and the images shown, by formula.
/// What the front adds after planning (hidden read rounds, the read tool) is budgeted by the
/// front, through a smaller window (docs/context-guard.md).
pub fn estimate(
    view: &RequestView<'_>,
    p: &Projection,
    tokenizer: Tokenizer,
    memo: &dyn Memos,
) -> Estimate {
    let on_results: HashMap<Span, Bytes> = p
        .edits
        .iter()
        .map(|e| (e.span, e.with.to_bytes()))
        .collect();
    let mut out = Estimate {
        total: 0,
        per_result: Vec::with_capacity(view.tool_results.len()),
    };
    let mut at = 0;
    let mut result_spans = std::collections::HashSet::new();
    for r in &view.tool_results {
        let before = view.body.get(at..r.span.start).unwrap_or_default();
        out.total += fragment_tokens(tokenizer, before, memo);
        let shown = match on_results.get(&r.span) {
            Some(with) => std::str::from_utf8(with).unwrap_or_default(),
            None => r.content.get(),
        };
        let n = fragment_tokens(tokenizer, shown, memo);
        out.per_result.push(n);
        out.total += n;
        result_spans.insert(r.span);
        at = r.span.end.max(at);
    }
    out.total += fragment_tokens(tokenizer, view.body.get(at..).unwrap_or_default(), memo);
    for e in &p.edits {
        if !result_spans.contains(&e.span) {
            let with = e.with.to_bytes();
            out.total += fragment_tokens(
                tokenizer,
                std::str::from_utf8(&with).unwrap_or_default(),
                memo,
            );
        }
    }
    for image in &p.images {
        if image.outcome != "embedded" {
            continue;
        }
        let n = tokenizer.image(image.width, image.height);
        out.total += n;
        if let Some(cost) = image.result.and_then(|ri| out.per_result.get_mut(ri)) {
            *cost += n;
        }
    }
    for audio in p.audio.iter().filter(|a| a.outcome == "embedded") {
        let n = Tokenizer::audio(audio.millis, audio.bytes);
        out.total += n;
        if let Some(cost) = out.per_result.get_mut(audio.result) {
            *cost += n;
        }
    }
    out
}

/// The turn of each tool result, counted from the end (0 = the last turn): results whose
/// messages follow each other with at most one message between them (the assistant's call)
/// belong to one turn.
pub fn turns_from_end(view: &RequestView<'_>) -> Vec<usize> {
    let mut turn = 0;
    let mut out = vec![0; view.tool_results.len()];
    for i in (0..view.tool_results.len()).rev() {
        if let Some(next) = view.tool_results.get(i + 1) {
            if next.item > view.tool_results[i].item + 1 {
                turn += 1;
            }
        }
        out[i] = turn;
    }
    out
}

/// The results to retire now, oldest first, so that the estimate falls to `target`: never one
/// already retired, one of the last `keep` turns, a read-tool result of the last turn (the
/// model is reading it), or one too small to be worth it.
pub fn select(
    view: &RequestView<'_>,
    estimate: &Estimate,
    retired: &[bool],
    keep: usize,
    read_tool: &str,
    target: u64,
) -> Vec<usize> {
    let turns = turns_from_end(view);
    let placeholder = 60;
    let mut total = estimate.total;
    let mut chosen = Vec::new();
    for (i, r) in view.tool_results.iter().enumerate() {
        if total <= target {
            break;
        }
        let cost = estimate.per_result.get(i).copied().unwrap_or(0);
        let reading = turns[i] == 0 && r.tool_name.as_deref() == Some(read_tool);
        if retired.get(i).copied().unwrap_or(true)
            || turns[i] < keep
            || reading
            || cost <= WORTH_RETIRING_TOKENS
        {
            continue;
        }
        chosen.push(i);
        total = total.saturating_sub(cost) + placeholder;
    }
    chosen
}

/// A retired result as the model sees it: one line, in the result's shape. `text` is what the
/// result carried (its text, its images' references); stored whole as a text artifact.
pub fn placeholder(
    view: &RequestView<'_>,
    result: &ToolResult<'_>,
    text: &str,
    policy: &Policy<'_>,
    tenant: &crate::tenant::Tenant,
) -> (Bytes, Spill) {
    let id = ArtifactId::for_content(tenant, ArtifactKind::Text, text.as_bytes());
    let lines = Lines::new(text);
    let cursor = Cursor {
        artifact: id,
        at: Position::default(),
        end_line: u32::try_from(lines.count()).unwrap_or(u32::MAX),
        budget: policy.budget(),
    }
    .encode(tenant);
    let line = format!(
        "[sluice: tool output retired to save context ({} lines): artifact://{id}; read it with {} {{\"cursor\":\"{cursor}\"}}]",
        lines.count(),
        policy.read_tool
    );
    let json = serde_json::Value::String(line).to_string();
    let new = NewContent {
        text_json: &json,
        text_breakpoint: None,
        media: Vec::new(),
        others: Vec::new(),
        last_breakpoint: None,
        as_parts: false,
    };
    let with = view.shapes.tool_content(result.content, new).to_bytes();
    let spill = Spill {
        id,
        bytes: Bytes::from(text.to_owned()),
    };
    (with, spill)
}

/// The text a tool result carries, as a retired result's artifact holds it.
pub fn result_text(shapes: &dyn Shapes, result: &ToolResult<'_>) -> String {
    exit::result_text(shapes, result.content).unwrap_or_else(|| result.content.get().to_owned())
}

#[cfg(test)]
mod tests;
