//! Policy values: what a route asks of the projection (lifetimes, modalities, page and image
//! limits), as plain values. `crate::config` loads them and supplies their defaults; the core
//! only reads them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::exit::text::Budget;

/// What a model accepts as input (SPEC M1): a route without `image` is shown placeholders.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Modality {
    Text,
    Image,
    /// Audio from tool results is sent where the dialect takes it (OpenAI chat's `input_audio`);
    /// elsewhere it is stored and named by a placeholder (docs/audio.md).
    Audio,
}

/// How long an attachment is shown (SPEC A3, M5).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Lifetime {
    Once,
    Recent,
    Retain,
}

/// The text exit's budgets (SPEC T1, `[routes.exit]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PageLimits {
    pub max_lines: usize,
    pub max_units: usize,
}

/// Image budgets and delivery parameters (SPEC A4-A6, `[routes.images]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ImageLimits {
    pub max_images: usize,
    pub max_total_bytes: u64,
    pub max_image_bytes: u64,
    pub max_dimension: u32,
    pub recent_count: usize,
    pub prune_batch: usize,
    pub default_lifetime: Lifetime,
    pub downscale: bool,
}

/// Audio budgets and delivery parameters (`[routes.audio]`, docs/audio.md): the image rules
/// (A3-A6) applied to audio files, measured in the files' own bytes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AudioLimits {
    /// Audio files sent in one request.
    pub max_audio: usize,
    /// Their bytes together.
    pub max_total_bytes: u64,
    /// One file's bytes; a larger file is refused for good on this route.
    pub max_audio_bytes: u64,
    pub recent_count: usize,
    pub prune_batch: usize,
    pub default_lifetime: Lifetime,
}

/// What a request without `max_tokens` is assumed to ask for, at most: the common default output
/// budget of today's agents (Claude Code and Codex ask for 32k at most).
pub const DEFAULT_OUTPUT_TOKENS: u64 = 32_000;

/// The context-window guard (`[routes.context]`, docs/context-guard.md): when a request's
/// estimated input passes `trigger` of the room its window leaves after the requested output,
/// the oldest tool results are retired, in one batch, down to `target` of that room.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ContextLimits {
    /// The model's context window in tokens; 0 turns the guard off.
    pub window_tokens: u64,
    pub trigger: f64,
    pub target: f64,
    /// Tool results of the last this many assistant turns are never retired.
    pub keep_recent_turns: usize,
    /// The output a request is assumed to ask for when it names no `max_tokens` (or its
    /// dialect's name for it); by default [`ContextLimits::output_tokens`]'s rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// How input is counted; by default the dialect's: Claude for Anthropic, o200k for OpenAI.
    pub tokenizer: Option<crate::tokens::Tokenizer>,
}

impl ContextLimits {
    pub fn enabled(&self) -> bool {
        self.window_tokens > 0
    }

    /// The output assumed for a request that names none: `output_tokens` when set, else a
    /// quarter of the window up to [`DEFAULT_OUTPUT_TOKENS`] (docs/context-guard.md), so a
    /// small window alone is a working guard.
    pub fn output_tokens(&self) -> u64 {
        self.output_tokens
            .unwrap_or_else(|| DEFAULT_OUTPUT_TOKENS.min(self.window_tokens / 4))
    }
}

/// When edits to history the provider has cached are made (`[routes.cache] policy`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EditPolicy {
    /// When they pay back within `horizon_requests` (WIRE.md), at once on a cold cache or
    /// when a hard limit forces them (docs/cache.md).
    Economic,
    /// As soon as the rules allow (A4 as written).
    Eager,
}

/// Whether sluice adds Anthropic cache breakpoints in the slots a client leaves free.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Breakpoints {
    Auto,
    Off,
}

/// Later requests an edit may count on to pay back its rewrite: a screenshot agent's turns
/// between two idle gaps are commonly a few dozen, and a longer horizon makes an edit that
/// never pays back look cheap.
pub const DEFAULT_HORIZON_REQUESTS: u64 = 20;

/// `[routes.cache]` (SPEC 9.1, docs/cache.md): how edits to already-sent history meet the
/// provider's prompt cache.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheLimits {
    pub policy: EditPolicy,
    pub breakpoints: Breakpoints,
    pub horizon_requests: u64,
    /// How long the provider keeps an entry; 0: from the client's breakpoints (300 s, or
    /// 3,600 s when they ask for `"ttl":"1h"`).
    pub ttl_seconds: u64,
}

impl Default for CacheLimits {
    fn default() -> Self {
        CacheLimits {
            policy: EditPolicy::Economic,
            breakpoints: Breakpoints::Auto,
            horizon_requests: DEFAULT_HORIZON_REQUESTS,
            ttl_seconds: 0,
        }
    }
}

/// Everything the projection needs to know of a request's route.
#[derive(Debug, Clone, Copy)]
pub struct Policy<'a> {
    pub pages: &'a PageLimits,
    pub images: &'a ImageLimits,
    pub accepts_images: bool,
    pub audio: &'a AudioLimits,
    /// The route lists `audio` in its `input_modalities` (the dialect must take audio too).
    pub accepts_audio: bool,
    /// The read tool's name in this request (C1; suffixed when a client tool has the name).
    pub read_tool: &'a str,
    /// `tool_lifetimes`: tool-name glob → lifetime (M5).
    pub tool_lifetimes: &'a BTreeMap<String, Lifetime>,
    pub context: &'a ContextLimits,
    pub cache: &'a CacheLimits,
}

impl Policy<'_> {
    pub fn budget(&self) -> Budget {
        Budget {
            lines: self.pages.max_lines,
            units: self.pages.max_units,
        }
    }
}
