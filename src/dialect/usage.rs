//! What the provider says a request used (docs/inspector.md): input tokens, how many of them
//! its prompt cache served or took, and output tokens, read from a whole response body or from
//! the events of a stream that carry them (Anthropic `message_start` and `message_delta`,
//! Responses `response.completed`, a chat chunk with `usage`).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::Dialect;

/// The provider's own count of a request's input and output.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Usage {
    /// Input tokens billed at the full rate (Anthropic `input_tokens`; OpenAI's prompt or
    /// input tokens less the cached ones).
    pub input: u64,
    pub output: u64,
    /// Input tokens read from the provider's cache.
    pub cached: u64,
    /// Input tokens written to the cache (Anthropic).
    pub cache_creation: u64,
}

impl Usage {
    /// All input tokens, however billed.
    pub fn total_input(&self) -> u64 {
        self.input + self.cached + self.cache_creation
    }

    /// Adds what a later event says: each field keeps its largest value (a stream repeats
    /// counts as they grow, never splits them).
    pub fn merge(&mut self, more: Usage) {
        self.input = self.input.max(more.input);
        self.output = self.output.max(more.output);
        self.cached = self.cached.max(more.cached);
        self.cache_creation = self.cache_creation.max(more.cache_creation);
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Counts {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    prompt_tokens_details: Option<Details>,
    input_tokens_details: Option<Details>,
    #[serde(rename = "promptTokenCount", alias = "prompt_token_count")]
    prompt_token_count: Option<u64>,
    #[serde(
        rename = "cachedContentTokenCount",
        alias = "cached_content_token_count"
    )]
    cached_content_token_count: Option<u64>,
    #[serde(rename = "candidatesTokenCount", alias = "candidates_token_count")]
    candidates_token_count: Option<u64>,
    #[serde(rename = "thoughtsTokenCount", alias = "thoughts_token_count")]
    thoughts_token_count: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Details {
    cached_tokens: Option<u64>,
}

/// The places a body or event carries its usage.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Carrier<'a> {
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
    #[serde(borrow)]
    message: Option<&'a RawValue>,
    #[serde(borrow)]
    response: Option<&'a RawValue>,
    #[serde(borrow, rename = "usageMetadata", alias = "usage_metadata")]
    usage_metadata: Option<&'a RawValue>,
}

impl Counts {
    fn usage(self, dialect: Dialect) -> Usage {
        match dialect {
            Dialect::GeminiGenerate => {
                let total = self.prompt_token_count.unwrap_or(0);
                let cached = self.cached_content_token_count.unwrap_or(0).min(total);
                Usage {
                    input: total - cached,
                    output: self.candidates_token_count.unwrap_or(0)
                        + self.thoughts_token_count.unwrap_or(0),
                    cached,
                    cache_creation: 0,
                }
            }
            Dialect::AnthropicMessages => Usage {
                input: self.input_tokens.unwrap_or(0),
                output: self.output_tokens.unwrap_or(0),
                cached: self.cache_read_input_tokens.unwrap_or(0),
                cache_creation: self.cache_creation_input_tokens.unwrap_or(0),
            },
            Dialect::OpenAiChat | Dialect::OpenAiResponses => {
                let total = self.prompt_tokens.or(self.input_tokens).unwrap_or(0);
                let cached = self
                    .prompt_tokens_details
                    .or(self.input_tokens_details)
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0)
                    .min(total);
                Usage {
                    input: total - cached,
                    output: self.completion_tokens.or(self.output_tokens).unwrap_or(0),
                    cached,
                    cache_creation: 0,
                }
            }
        }
    }
}

/// The usage a response body or a stream event carries: at its top (`usage`), or in the
/// `message` (Anthropic `message_start`) or `response` (Responses events) it wraps.
pub fn of_json(dialect: Dialect, json: &str) -> Option<Usage> {
    let carrier: Carrier = serde_json::from_str(json).ok()?;
    let raw = carrier
        .usage
        .or(carrier.usage_metadata)
        .filter(|u| u.get() != "null")
        .or_else(|| {
            [carrier.message, carrier.response]
                .into_iter()
                .flatten()
                .find_map(|inner| of_inner(inner.get()))
        })?;
    let counts: Counts = serde_json::from_str(raw.get()).ok()?;
    Some(counts.usage(dialect))
}

/// A `usage` object already parsed.
pub fn of_value(dialect: Dialect, usage: &serde_json::Value) -> Option<Usage> {
    let counts: Counts = serde_json::from_value(usage.clone()).ok()?;
    Some(counts.usage(dialect))
}

fn of_inner(json: &str) -> Option<&RawValue> {
    #[derive(Deserialize)]
    struct Inner<'a> {
        #[serde(borrow)]
        usage: Option<&'a RawValue>,
    }
    serde_json::from_str::<Inner>(json)
        .ok()?
        .usage
        .filter(|u| u.get() != "null")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_from_each_dialects_bodies_and_events() {
        let anthropic = r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":12,"cache_read_input_tokens":3000,"cache_creation_input_tokens":40,"output_tokens":1}}}"#;
        let u = of_json(Dialect::AnthropicMessages, anthropic).unwrap();
        assert_eq!(
            (u.input, u.cached, u.cache_creation, u.total_input()),
            (12, 3000, 40, 3052)
        );
        let chat = r#"{"choices":[],"usage":{"prompt_tokens":5000,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":4096}}}"#;
        let u = of_json(Dialect::OpenAiChat, chat).unwrap();
        assert_eq!((u.input, u.cached, u.output), (904, 4096, 9));
        let responses = r#"{"type":"response.completed","response":{"output":[],"usage":{"input_tokens":2000,"output_tokens":7,"input_tokens_details":{"cached_tokens":1024}}}}"#;
        let u = of_json(Dialect::OpenAiResponses, responses).unwrap();
        assert_eq!((u.input, u.cached, u.output), (976, 1024, 7));
        assert_eq!(
            of_json(Dialect::OpenAiChat, r#"{"choices":[],"usage":null}"#),
            None
        );
        assert_eq!(of_json(Dialect::OpenAiChat, "not json"), None);
    }
}
