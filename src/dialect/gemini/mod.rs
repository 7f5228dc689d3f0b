//! The Gemini API (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent`,
//! `:countTokens`, and the `/v1/` forms): the model is named by the path; `functionResponse`
//! parts of `contents` are tool results (the whole `functionResponse` object is the result's
//! content: its `response` and its media `parts`); `inlineData` image parts of `user` contents
//! are user images. The API's JSON takes field names in lowerCamelCase or snake_case; both
//! are read. Its shapes for the core are `shapes.rs`, for the read tool's rounds `wire.rs`.

mod shapes;
mod wire;

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{count, digest, span_of, Endpoint, Text};
use crate::projection::{Raw, RequestView, ToolResult, UserImage};

pub(crate) use shapes::Gemini;

/// The path prefixes the API's model methods take.
const PREFIXES: [&str; 3] = ["/v1beta/models/", "/v1/models/", "/v1alpha/models/"];

/// The projected endpoint a Gemini path names: the model and whether it only counts tokens.
pub(super) fn endpoint(path: &str) -> Option<Endpoint> {
    let rest = PREFIXES.iter().find_map(|p| path.strip_prefix(p))?;
    let (model, method) = rest.rsplit_once(':')?;
    let counts = match method {
        "generateContent" | "streamGenerateContent" => false,
        "countTokens" => true,
        _ => return None,
    };
    (!model.is_empty()).then(|| Endpoint {
        dialect: super::Dialect::GeminiGenerate,
        counts,
        model: Some(model.to_string()),
    })
}

/// Moves a `key=` query parameter into `x-goog-api-key` (unless that header is set), so no
/// URL sluice holds, forwards or logs carries the key; the provider takes either.
pub(super) fn key_to_header(parts: &mut http::request::Parts) {
    let Some(query) = parts.uri.query() else {
        return;
    };
    let mut key = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("key=") {
            Some(value) => {
                key.get_or_insert(value);
                false
            }
            None => true,
        })
        .collect();
    let Some(key) = key else {
        return;
    };
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(key).collect();
    if !parts.headers.contains_key("x-goog-api-key") {
        if let Ok(mut value) = http::HeaderValue::from_bytes(&decoded) {
            value.set_sensitive(true);
            parts.headers.insert("x-goog-api-key", value);
        }
    }
    let path_and_query = match kept.is_empty() {
        true => parts.uri.path().to_string(),
        false => format!("{}?{}", parts.uri.path(), kept.join("&")),
    };
    let mut uri = std::mem::take(&mut parts.uri).into_parts();
    uri.path_and_query = http::uri::PathAndQuery::try_from(path_and_query).ok();
    parts.uri = http::Uri::from_parts(uri).unwrap_or_default();
}

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    model: Text<'a>,
    #[serde(borrow, default)]
    contents: Vec<Content<'a>>,
    #[serde(borrow, rename = "systemInstruction", alias = "system_instruction")]
    system: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, rename = "generationConfig", alias = "generation_config")]
    generation: Option<Generation<'a>>,
}

#[derive(Deserialize)]
struct Generation<'a> {
    #[serde(borrow, rename = "maxOutputTokens", alias = "max_output_tokens")]
    max_output: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Content<'a> {
    #[serde(borrow)]
    role: Text<'a>,
    #[serde(borrow, default)]
    parts: Vec<&'a RawValue>,
}

/// The members of a part the reader looks at.
#[derive(Deserialize)]
pub(super) struct PartFields<'a> {
    #[serde(borrow, rename = "functionResponse", alias = "function_response")]
    pub response: Option<&'a RawValue>,
    #[serde(borrow, rename = "inlineData", alias = "inline_data")]
    pub inline: Option<Inline<'a>>,
}

/// `inlineData`: base64 bytes and their media type. Borrowed where the JSON has no escapes,
/// as base64 has none.
#[derive(Deserialize)]
pub(super) struct Inline<'a> {
    #[serde(borrow, rename = "mimeType", alias = "mime_type")]
    pub mime: Text<'a>,
    #[serde(borrow)]
    pub data: Text<'a>,
}

/// A `functionResponse`'s name and id.
#[derive(Deserialize)]
struct Answered<'a> {
    #[serde(borrow)]
    name: Text<'a>,
    #[serde(borrow)]
    id: Text<'a>,
}

pub(super) fn read(body: &str) -> Result<RequestView<'_>, serde_json::Error> {
    let request: Request = serde_json::from_str(body)?;
    let mut tool_results = Vec::new();
    let mut user_images = Vec::new();
    let mut root: Vec<Cow<'_, str>> = request
        .system
        .map(|s| Cow::Borrowed(s.get()))
        .into_iter()
        .collect();
    for (item, content) in request.contents.iter().enumerate() {
        let role = content.role.as_deref().unwrap_or("user");
        if role == "user" && root.len() < 2 {
            root.extend(content.parts.first().map(|p| Cow::Borrowed(p.get())));
        }
        // Gemini CLI puts a tool's images beside its function response, in the same content.
        let mut beside = None;
        for part in &content.parts {
            let Ok(fields) = serde_json::from_str::<PartFields>(part.get()) else {
                continue;
            };
            if let Some(response) = fields.response {
                let answered = serde_json::from_str::<Answered>(response.get()).ok();
                let name = answered.as_ref().and_then(|a| a.name.clone());
                let id = answered.and_then(|a| a.id);
                let Some(source) = id.or_else(|| name.clone()) else {
                    continue;
                };
                beside = Some(tool_results.len());
                tool_results.push(ToolResult {
                    item,
                    source: source.0,
                    tool_name: name.map(|n| n.0),
                    content: Raw::from(response),
                    span: span_of(body, response),
                    digest: digest(response.get()),
                    slot: None,
                });
            } else if let Some(inline) = fields.inline.filter(|_| role == "user") {
                if inline.mime.is_some_and(|m| m.starts_with("image/")) {
                    user_images.push(UserImage {
                        item,
                        part: Raw::from(*part),
                        span: span_of(body, part),
                        beside,
                    });
                }
            }
        }
    }
    Ok(RequestView {
        shapes: &Gemini,
        body,
        model: request.model.map(|m| m.0),
        tool_results,
        user_images,
        tools: request.tools.map(Raw::from),
        conversation: None,
        root,
        max_output: request.generation.and_then(|g| count(g.max_output)),
    })
}

#[cfg(test)]
mod tests;
