//! The three wire APIs: which paths they own, how their errors look, how a request body is read
//! into the [`crate::projection::RequestView`], and how the core's decisions are
//! written in each provider's JSON (`render.rs`, the core's
//! [`Shapes`](crate::projection::shapes::Shapes)). Provider shapes are still also read in the
//! read tool (`crate::read`) and in the core's parsing of tool-result parts
//! (docs/architecture.md lists where).

mod anthropic;
pub mod blocks;
pub mod completion;
mod gathered;
mod gemini;
pub mod openai_chat;
mod openai_responses;
mod parts;
mod received;
mod render;
pub mod resume;
pub mod sse;
pub mod stitch;
pub mod usage;
pub mod wire;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::projection::{RequestView, Span};

/// A provider wire API (SPEC section 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dialect {
    #[serde(rename = "openai-chat")]
    OpenAiChat,
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    #[serde(rename = "anthropic-messages")]
    AnthropicMessages,
    #[serde(rename = "gemini-generate")]
    GeminiGenerate,
}

/// Which provider's conventions (error shape, credential header) apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    OpenAi,
    Anthropic,
    Google,
}

/// A projected endpoint a request names: its dialect, whether it only counts tokens (it shows
/// the model nothing), and the model when the path names it (Gemini).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub dialect: Dialect,
    pub counts: bool,
    pub model: Option<String>,
}

impl Dialect {
    pub const ALL: [Dialect; 4] = [
        Dialect::OpenAiChat,
        Dialect::OpenAiResponses,
        Dialect::AnthropicMessages,
        Dialect::GeminiGenerate,
    ];

    /// The dialect whose projected endpoint `path` is (SPEC section 9), if any.
    pub fn from_path(path: &str) -> Option<Dialect> {
        Dialect::endpoint(path).map(|e| e.dialect)
    }

    /// The projected endpoint `path` names (a `POST`), if any.
    pub fn endpoint(path: &str) -> Option<Endpoint> {
        let fixed = |dialect, counts| {
            Some(Endpoint {
                dialect,
                counts,
                model: None,
            })
        };
        match path {
            "/v1/chat/completions" => fixed(Dialect::OpenAiChat, false),
            "/v1/responses" => fixed(Dialect::OpenAiResponses, false),
            "/v1/messages" => fixed(Dialect::AnthropicMessages, false),
            "/v1/messages/count_tokens" => fixed(Dialect::AnthropicMessages, true),
            _ => gemini::endpoint(path),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::OpenAiChat => "openai-chat",
            Dialect::OpenAiResponses => "openai-responses",
            Dialect::AnthropicMessages => "anthropic-messages",
            Dialect::GeminiGenerate => "gemini-generate",
        }
    }

    /// The dialect's shapes, as the core writes them.
    pub fn shapes(self) -> &'static dyn crate::projection::shapes::Shapes {
        match self {
            Dialect::OpenAiChat => &render::Classic::OpenAiChat,
            Dialect::OpenAiResponses => &render::Classic::OpenAiResponses,
            Dialect::AnthropicMessages => &render::Classic::AnthropicMessages,
            Dialect::GeminiGenerate => &gemini::Gemini,
        }
    }

    pub fn family(self) -> Family {
        match self {
            Dialect::OpenAiChat | Dialect::OpenAiResponses => Family::OpenAi,
            Dialect::AnthropicMessages => Family::Anthropic,
            Dialect::GeminiGenerate => Family::Google,
        }
    }

    /// Normalises a request's head before anything reads it: a credential the client put in
    /// the URL (Gemini's `?key=`) moves into its header, so no URL sluice holds carries it.
    pub fn normalise_head(self, parts: &mut http::request::Parts) {
        if self == Dialect::GeminiGenerate {
            gemini::key_to_header(parts);
        }
    }

    /// Reads `body` into a view of what projection may edit. `Err` only for bytes that are not
    /// JSON at all (P4: 400); JSON of an unexpected shape gives an empty view, so the request is
    /// forwarded untouched and the provider answers it as it would without sluice.
    pub fn read_view(self, body: &[u8]) -> Result<RequestView<'_>, serde_json::Error> {
        self.read_text(utf8(body)?)
    }

    /// [`Dialect::read_view`], resumed where an earlier body of the same conversation was read
    /// to when its bytes agree that far (`resume`); the view is the same either way. Also says
    /// how many of the body's bytes were read before, and so not scanned again.
    ///
    /// `received` is what was checked of the body as it arrived, if anything; it spares this
    /// reading its own pass over the bytes.
    pub fn read_view_resumed<'a>(
        self,
        body: &'a [u8],
        received: Option<&'a resume::Received>,
        resumes: &resume::Resumes,
    ) -> Result<(RequestView<'a>, usize), serde_json::Error> {
        if body.len() < resume::RESUME_FROM {
            return Ok((self.read_view(body)?, 0));
        }
        let checked = resume::Text::of(body, received).map_err(|e| not_utf8(&e))?;
        let walked = match self {
            Dialect::AnthropicMessages => {
                resume::read::<anthropic::Reading>(self, &checked, resumes)
            }
            Dialect::OpenAiChat => resume::read::<openai_chat::Reading>(self, &checked, resumes),
            Dialect::OpenAiResponses => {
                resume::read::<openai_responses::Reading>(self, &checked, resumes)
            }
            // Read whole every time (no resumed reading yet).
            Dialect::GeminiGenerate => None,
        };
        match walked {
            Some(read) => Ok(read),
            None => Ok((self.read_text(checked.text)?, 0)),
        }
    }

    fn read_text(self, text: &str) -> Result<RequestView<'_>, serde_json::Error> {
        let parsed = match self {
            Dialect::OpenAiChat => openai_chat::read(text),
            Dialect::OpenAiResponses => openai_responses::read(text),
            Dialect::AnthropicMessages => anthropic::read(text),
            Dialect::GeminiGenerate => gemini::read(text),
        };
        match parsed {
            Ok(view) => Ok(view),
            // A key twice where sluice reads: the provider would read the last one, unprojected,
            // so it is refused rather than guessed at.
            Err(e) if e.to_string().starts_with("duplicate field") => Err(e),
            Err(e) if e.classify() == serde_json::error::Category::Data => {
                // The shape was unexpected before the end was reached: the rest must still be
                // JSON (and within the nesting limit) to be forwarded.
                serde_json::from_str::<serde::de::IgnoredAny>(text)?;
                Ok(RequestView::empty(self.shapes(), text))
            }
            Err(e) => Err(e),
        }
    }
}

/// The body as text: JSON is UTF-8 (RFC 8259), and a provider would refuse anything else.
fn utf8(body: &[u8]) -> Result<&str, serde_json::Error> {
    std::str::from_utf8(body).map_err(|e| not_utf8(&e))
}

fn not_utf8(e: &std::str::Utf8Error) -> serde_json::Error {
    <serde_json::Error as serde::de::Error>::custom(format_args!(
        "the body is not UTF-8 (at byte {})",
        e.valid_up_to()
    ))
}

impl Family {
    /// Whether `path` is a provider's API path that passes through when it is not projected
    /// (P5): `/v1/…`, and Gemini's `/v1beta/…`.
    pub fn is_api_path(path: &str) -> bool {
        path.starts_with("/v1/") || path.starts_with("/v1beta/")
    }

    /// The family a non-projected API request belongs to (P5): Anthropic's and Google's paths
    /// and headers say so; everything else is OpenAI-style.
    pub fn of_request(path: &str, headers: &http::HeaderMap) -> Family {
        if path.starts_with("/v1beta/")
            || headers.contains_key("x-goog-api-key")
            || path.starts_with("/v1/models/") && path.contains(':')
        {
            return Family::Google;
        }
        if path.starts_with("/v1/messages")
            || path == "/v1/complete"
            || headers.contains_key("anthropic-version")
            || headers.contains_key("x-api-key")
        {
            Family::Anthropic
        } else {
            Family::OpenAi
        }
    }

    /// An error body in the family's own shape (P4), for an error of `status`; `code` is
    /// sluice's name for the error.
    pub fn error_body(self, status: http::StatusCode, code: &str, message: &str) -> Bytes {
        use http::StatusCode as S;
        let value = match self {
            Family::OpenAi => {
                let kind = match status {
                    S::NOT_FOUND => "not_found_error",
                    S::GATEWAY_TIMEOUT => "timeout_error",
                    // What OpenAI's own request-rate 429s say.
                    S::TOO_MANY_REQUESTS => "requests",
                    s if s.is_client_error() => "invalid_request_error",
                    _ => "api_error",
                };
                serde_json::json!({
                    "error": {"message": message, "type": kind, "param": null, "code": code}
                })
            }
            Family::Anthropic => {
                let kind = match status {
                    S::PAYLOAD_TOO_LARGE => "request_too_large",
                    S::NOT_FOUND => "not_found_error",
                    S::UNAUTHORIZED => "authentication_error",
                    S::TOO_MANY_REQUESTS => "rate_limit_error",
                    s if s.is_client_error() => "invalid_request_error",
                    _ => "api_error",
                };
                serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
            }
            Family::Google => {
                // google.rpc.Code names, as the Gemini API answers them.
                let name = match status {
                    S::NOT_FOUND => "NOT_FOUND",
                    S::UNAUTHORIZED => "UNAUTHENTICATED",
                    S::TOO_MANY_REQUESTS => "RESOURCE_EXHAUSTED",
                    S::SERVICE_UNAVAILABLE => "UNAVAILABLE",
                    S::GATEWAY_TIMEOUT | S::REQUEST_TIMEOUT => "DEADLINE_EXCEEDED",
                    s if s.is_client_error() => "INVALID_ARGUMENT",
                    _ => "INTERNAL",
                };
                serde_json::json!({"error": {"code": status.as_u16(), "message": message,
                    "status": name}})
            }
        };
        Bytes::from(value.to_string())
    }

    /// The header a route's own key goes in, and its value.
    pub fn credential(self, key: &http::HeaderValue) -> (http::HeaderName, http::HeaderValue) {
        match self {
            Family::OpenAi => {
                let mut bearer = http::HeaderValue::from_bytes(
                    &[b"Bearer ".as_slice(), key.as_bytes()].concat(),
                )
                .unwrap_or_else(|_| key.clone());
                bearer.set_sensitive(true);
                (http::header::AUTHORIZATION, bearer)
            }
            Family::Anthropic => (http::HeaderName::from_static("x-api-key"), key.clone()),
            Family::Google => (http::HeaderName::from_static("x-goog-api-key"), key.clone()),
        }
    }
}

/// The headers a client's credential may come in, whatever the dialect (a route's own key
/// replaces all of them).
pub const CREDENTIAL_HEADERS: [&str; 3] = ["authorization", "x-api-key", "x-goog-api-key"];

impl Family {
    /// The headers a provider of this family tells its request limit with, on a 429 sluice
    /// gives for a tenant's share (docs/timeouts-and-errors.md): `requests` allowed, none
    /// left, the share free again after `seconds` (at `at`). OpenAI gives the wait as a
    /// duration, Anthropic as an RFC 3339 time; Gemini has no such headers (`retry-after` only).
    pub fn rate_limit_headers(
        self,
        headers: &mut http::HeaderMap,
        requests: u64,
        seconds: u64,
        at: std::time::SystemTime,
    ) {
        use http::HeaderValue;
        let (limit, remaining, reset, value) = match self {
            Family::OpenAi => (
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
                HeaderValue::from_str(&format!("{seconds}s")).ok(),
            ),
            Family::Anthropic => (
                "anthropic-ratelimit-requests-limit",
                "anthropic-ratelimit-requests-remaining",
                "anthropic-ratelimit-requests-reset",
                time::OffsetDateTime::from(at)
                    .replace_nanosecond(0)
                    .ok()
                    .and_then(|t| {
                        t.format(&time::format_description::well_known::Rfc3339)
                            .ok()
                    })
                    .and_then(|t| HeaderValue::from_str(&t).ok()),
            ),
            Family::Google => return,
        };
        headers.insert(limit, HeaderValue::from(requests));
        headers.insert(remaining, HeaderValue::from_static("0"));
        if let Some(value) = value {
            headers.insert(reset, value);
        }
    }
}

/// The byte span of `raw` inside `whole`. `raw` must have been borrowed from `whole` by
/// serde_json; both are the same allocation, so the difference of their addresses is the offset.
/// A token count a request names (`max_tokens` and its kin): a non-negative integer, else none.
pub(crate) fn count(raw: Option<&RawValue>) -> Option<u64> {
    raw.and_then(|r| r.get().trim().parse().ok())
}

pub(crate) fn span_of(whole: &str, raw: &RawValue) -> Span {
    span_in(whole, raw.get())
}

/// The byte span of `text`, a slice of `whole`.
pub(crate) fn span_in(whole: &str, raw: &str) -> Span {
    let start = raw.as_ptr() as usize - whole.as_ptr() as usize;
    Span {
        start,
        end: start + raw.len(),
    }
}

/// The [`crate::projection::ToolResult::digest`] of a tool result's content.
pub(crate) fn digest(content: &str) -> u128 {
    twox_hash::XxHash3_128::oneshot_with_seed(resume::seed(), content.as_bytes())
}

/// A string field that may be absent; borrowed when it has no escapes ([`crate::json::Str`]).
pub(crate) type Text<'a> = Option<crate::json::Str<'a>>;

/// Parses an array value into its elements' raw values; `None` if it is not an array.
pub(crate) fn elements(raw: &RawValue) -> Option<Vec<&RawValue>> {
    elements_in(raw.get())
}

/// [`elements`] of a value's JSON text.
pub(crate) fn elements_in(raw: &str) -> Option<Vec<&RawValue>> {
    if !raw.starts_with('[') {
        return None;
    }
    serde_json::from_str(raw).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_dialects() {
        assert_eq!(
            Dialect::from_path("/v1/chat/completions"),
            Some(Dialect::OpenAiChat)
        );
        assert_eq!(
            Dialect::from_path("/v1/messages/count_tokens"),
            Some(Dialect::AnthropicMessages)
        );
        assert_eq!(Dialect::from_path("/v1/models"), None);
    }

    #[test]
    fn error_bodies_have_each_family_shape() {
        let v: serde_json::Value = serde_json::from_slice(&Family::OpenAi.error_body(
            http::StatusCode::BAD_REQUEST,
            "x",
            "m",
        ))
        .unwrap();
        assert_eq!(v["error"]["message"], "m");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let v: serde_json::Value = serde_json::from_slice(&Family::Anthropic.error_body(
            http::StatusCode::BAD_REQUEST,
            "x",
            "m",
        ))
        .unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["message"], "m");
    }

    #[test]
    fn syntax_errors_fail_and_shape_errors_give_empty_views() {
        for d in Dialect::ALL {
            assert!(d.read_view(b"{\"model\": ").is_err());
            assert!(d.read_view(b"\xff\xfe").is_err());
            let view = d.read_view(b"[1,2,3]").unwrap();
            assert!(view.tool_results.is_empty());
            let view = d
                .read_view(br#"{"model":"m","messages":7,"input":false}"#)
                .unwrap();
            assert_eq!(
                view.model.as_deref(),
                Some("m"),
                "still routed by its model"
            );
            assert!(view.tool_results.is_empty());
        }
    }

    #[test]
    fn deep_nesting_neither_overflows_nor_panics() {
        // 100,000 levels would overflow a recursive parser's stack (S5); serde_json skips
        // unread values iteratively, so this returns, and the provider judges the request.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let inside = format!(
            r#"{{"model":"m","messages":[{{"role":"tool","content":{deep}}}],"input":{deep}}}"#
        );
        for d in Dialect::ALL {
            assert!(d
                .read_view(deep.as_bytes())
                .is_ok_and(|v| v.tool_results.is_empty()));
            assert!(d.read_view(inside.as_bytes()).is_ok(), "{d:?}");
        }
    }
}
