//! `[inspector]` (SPEC 9.1, docs/inspector.md): turn records, and the prompt-cache prices the
//! cache-weighted cost is computed with.

use serde::{Deserialize, Serialize};

use crate::dialect::Dialect;

/// Turns kept per session by default: a working day of an agent's turns, about a megabyte
/// for a session whose requests carry 50 tool results each (docs/inspector.md).
pub const DEFAULT_KEEP_TURNS: u64 = 100;
/// The most turns a session may keep: past it, a record becomes the larger part of the store.
pub const MAX_KEEP_TURNS: u64 = 10_000;

/// What a provider charges for cached input, as multiples of the uncached input price.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Price {
    /// A token read from the cache.
    pub cache_read: f64,
    /// A token written to the cache (Anthropic charges extra for it; OpenAI does not).
    pub cache_write: f64,
    /// The shortest prefix a provider caches.
    pub min_cached_tokens: u64,
    /// How long a cached prefix lives without use.
    pub cache_ttl_seconds: u64,
}

impl Price {
    /// Anthropic's published multipliers: reads at 0.1×, five-minute writes at 1.25×; 1,024
    /// tokens at least (Sonnet, Opus).
    pub const ANTHROPIC: Price = Price {
        cache_read: 0.1,
        cache_write: 1.25,
        min_cached_tokens: 1024,
        cache_ttl_seconds: 300,
    };
    /// OpenAI's: cached input at 0.1× (GPT-5 family; GPT-4.1 is 0.25×, GPT-4o 0.5×), no write
    /// charge, automatic from 1,024 tokens; prefixes live five to ten minutes.
    pub const OPENAI: Price = Price {
        cache_read: 0.1,
        cache_write: 1.0,
        min_cached_tokens: 1024,
        cache_ttl_seconds: 300,
    };
    /// Gemini's implicit cache (2.5 and later): cached input at 0.1×, no write charge, from
    /// 4,096 tokens (2,048 on 2.5 models).
    pub const GEMINI: Price = Price {
        cache_read: 0.1,
        cache_write: 1.0,
        min_cached_tokens: 4096,
        cache_ttl_seconds: 300,
    };
}

impl Default for Price {
    fn default() -> Self {
        Price::OPENAI
    }
}

/// `[inspector]` (SPEC 9.1).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct InspectorConfig {
    pub enabled: bool,
    /// Turns kept per session (the oldest go first).
    pub keep_turns: u64,
    /// Cache multipliers per provider, for the cache-weighted cost.
    pub prices: Prices,
}

impl Default for InspectorConfig {
    fn default() -> Self {
        InspectorConfig {
            enabled: false,
            keep_turns: DEFAULT_KEEP_TURNS,
            prices: Prices::default(),
        }
    }
}

/// `[inspector.prices.anthropic]`, `[inspector.prices.openai]`, `[inspector.prices.gemini]`:
/// any key left out keeps the provider's published value for the model.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Prices {
    pub anthropic: PriceConfig,
    pub openai: PriceConfig,
    pub gemini: PriceConfig,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PriceConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    /// A token written under a one-hour breakpoint (Anthropic's 2×).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write_1h: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_cached_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_ttl_seconds: Option<u64>,
}

impl PriceConfig {
    fn over(self, base: Price) -> Price {
        Price {
            cache_read: self.cache_read.unwrap_or(base.cache_read),
            cache_write: self.cache_write.unwrap_or(base.cache_write),
            min_cached_tokens: self.min_cached_tokens.unwrap_or(base.min_cached_tokens),
            cache_ttl_seconds: self.cache_ttl_seconds.unwrap_or(base.cache_ttl_seconds),
        }
    }
}

impl Prices {
    /// The exact cache model's prices for `model` on `dialect`: the published ones for that
    /// model (`projection::cache::Rates::published`), with any key the config sets in their
    /// place.
    pub fn rates(&self, dialect: Dialect, model: &str) -> crate::projection::cache::Rates {
        use crate::projection::cache::{Provider, Rates};
        let (provider, over) = match dialect {
            Dialect::AnthropicMessages => (Provider::Anthropic, self.anthropic),
            Dialect::OpenAiChat | Dialect::OpenAiResponses => (Provider::OpenAi, self.openai),
            Dialect::GeminiGenerate => (Provider::Gemini, self.gemini),
        };
        let base = Rates::published(provider, model);
        Rates {
            read: over.cache_read.unwrap_or(base.read),
            write_short: over.cache_write.unwrap_or(base.write_short),
            write_long: over.cache_write_1h.unwrap_or(base.write_long),
            min_tokens: over.min_cached_tokens.unwrap_or(base.min_tokens),
            ttl_seconds: over.cache_ttl_seconds.or(base.ttl_seconds),
        }
    }

    pub fn of(&self, dialect: Dialect) -> Price {
        match dialect {
            Dialect::AnthropicMessages => self.anthropic.over(Price::ANTHROPIC),
            Dialect::OpenAiChat | Dialect::OpenAiResponses => self.openai.over(Price::OPENAI),
            Dialect::GeminiGenerate => self.gemini.over(Price::GEMINI),
        }
    }

    /// Multipliers are non-negative; `key` is where these prices sit in the config.
    pub fn check(&self, key: &str) -> Result<(), String> {
        for (name, p) in [
            ("anthropic", self.anthropic),
            ("openai", self.openai),
            ("gemini", self.gemini),
        ] {
            for (field, v) in [
                ("cache_read", p.cache_read),
                ("cache_write", p.cache_write),
                ("cache_write_1h", p.cache_write_1h),
            ] {
                if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
                    return Err(format!("{key}.prices.{name}.{field}"));
                }
            }
        }
        Ok(())
    }
}
