//! The OpenAI and Anthropic dialects' shapes as the core reads and writes them ([`Shapes`]):
//! text and image parts, user image parts rewritten or replaced by notes, and OpenAI chat's
//! user message of a turn's images. (Gemini's are its own: `super::gemini`.)

use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// The three dialects whose shapes are written here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Classic {
    OpenAiChat,
    OpenAiResponses,
    AnthropicMessages,
}
use crate::projection::attach::{Embedded, Extras};
use crate::projection::shapes::{ImageRef, Part, Shapes};
use crate::projection::{Edit, Raw, Rope, Span};

use crate::json::{concat, string as json_string};

fn data_url(e: &Embedded) -> String {
    concat(&["data:", e.mime, ";base64,", &e.base64])
}

/// [`data_url`] as a JSON string: its media type and base64 need no escapes, so the base64 is
/// copied once.
fn data_url_json(e: &Embedded) -> String {
    concat(&["\"data:", e.mime, ";base64,", &e.base64, "\""])
}

impl Classic {
    /// The `type` of a text content part in a request (`text`, or Responses' `input_text`).
    fn text_type(self) -> &'static str {
        match self {
            Classic::OpenAiResponses => "input_text",
            Classic::OpenAiChat | Classic::AnthropicMessages => "text",
        }
    }
}

impl Shapes for Classic {
    fn tag(&self) -> u8 {
        *self as u8
    }

    fn tokenizer(&self) -> crate::tokens::Tokenizer {
        match self {
            Classic::AnthropicMessages => crate::tokens::Tokenizer::Claude,
            Classic::OpenAiChat | Classic::OpenAiResponses => crate::tokens::Tokenizer::O200k,
        }
    }

    fn part<'a>(&self, json: &'a str) -> Option<Part<'a>> {
        super::parts::read(json)
    }

    fn part_extras(&self, json: &str) -> Option<Extras> {
        super::parts::extras(json)
    }

    fn text_part(&self, text_json: &str, breakpoint: Option<&str>) -> String {
        // A client's breakpoint stays where it was, whatever the dialect (P2).
        match breakpoint {
            Some(cc) => concat(&[
                r#"{"type":""#,
                self.text_type(),
                r#"","text":"#,
                text_json,
                r#","cache_control":"#,
                cc,
                "}",
            ]),
            None => concat(&[
                r#"{"type":""#,
                self.text_type(),
                r#"","text":"#,
                text_json,
                "}",
            ]),
        }
    }

    fn keep_breakpoint(&self, last: &mut Rope, breakpoint: &str) {
        if last.ends_with(b'}') && !last.has(b"\"cache_control\"") {
            last.pop();
            last.push(concat(&[",\"cache_control\":", breakpoint, "}"]));
        }
    }

    fn images_in_tool_results(&self) -> bool {
        *self != Classic::OpenAiChat
    }

    fn takes_audio(&self) -> bool {
        *self == Classic::OpenAiChat
    }

    fn audio_part(&self, format: &str, base64: &str) -> String {
        format!(
            r#"{{"type":"input_audio","input_audio":{{"data":"{base64}","format":"{format}"}}}}"#
        )
    }

    fn limits_many_images(&self) -> bool {
        *self == Classic::AnthropicMessages
    }

    fn cache_provider(&self) -> crate::projection::cache::Provider {
        match self {
            Classic::AnthropicMessages => crate::projection::cache::Provider::Anthropic,
            Classic::OpenAiChat | Classic::OpenAiResponses => {
                crate::projection::cache::Provider::OpenAi
            }
        }
    }

    fn breakpoint_field(&self) -> &'static [u8] {
        match self {
            Classic::AnthropicMessages => b"\"cache_control\"",
            Classic::OpenAiChat | Classic::OpenAiResponses => b"",
        }
    }

    fn block_breakpoint(&self, long: bool) -> &'static str {
        match (self, long) {
            (Classic::AnthropicMessages, false) => r#","cache_control":{"type":"ephemeral"}"#,
            (Classic::AnthropicMessages, true) => {
                r#","cache_control":{"type":"ephemeral","ttl":"1h"}"#
            }
            (Classic::OpenAiChat | Classic::OpenAiResponses, _) => "",
        }
    }

    fn top_breakpoint(&self, long: bool) -> &'static str {
        match (self, long) {
            (Classic::AnthropicMessages, false) => r#""cache_control":{"type":"ephemeral"},"#,
            (Classic::AnthropicMessages, true) => {
                r#""cache_control":{"type":"ephemeral","ttl":"1h"},"#
            }
            (Classic::OpenAiChat | Classic::OpenAiResponses, _) => "",
        }
    }

    fn image_part(&self, image: &ImageRef<'_>, extras: Option<&Extras>) -> Rope {
        let (outer, inner) = extras.map_or(("", ""), |x| (x.outer.as_str(), x.inner.as_str()));
        let url = || match image {
            ImageRef::Data(em) => data_url_json(em),
            ImageRef::Url(url) => json_string(url),
        };
        match (self, image) {
            // The base64 is shared, not copied: it is sent from where it is kept.
            (Classic::AnthropicMessages, ImageRef::Data(em)) => {
                let mut part = Rope::from(concat(&[
                    r#"{"type":"image","source":{"type":"base64","media_type":""#,
                    em.mime,
                    r#"","data":""#,
                ]));
                part.push(em.base64.clone());
                part.push(concat(&[r#""}"#, outer, "}"]));
                part
            }
            (Classic::AnthropicMessages, ImageRef::Url(_)) => format!(
                r#"{{"type":"image","source":{{"type":"url","url":{}}}{outer}}}"#,
                url()
            )
            .into(),
            (Classic::OpenAiResponses, ImageRef::Data(em)) => {
                let mut part = Rope::from(concat(&[
                    r#"{"type":"input_image","image_url":"data:"#,
                    em.mime,
                    ";base64,",
                ]));
                part.push(em.base64.clone());
                part.push(concat(&["\"", outer, "}"]));
                part
            }
            (Classic::OpenAiResponses, ImageRef::Url(_)) => {
                concat(&[r#"{"type":"input_image","image_url":"#, &url(), outer, "}"]).into()
            }
            (Classic::OpenAiChat, _) => concat(&[
                r#"{"type":"image_url","image_url":{"url":"#,
                &url(),
                inner,
                "}",
                outer,
                "}",
            ])
            .into(),
        }
    }

    fn user_image_part(&self, part: Raw<'_>, em: &Embedded) -> Option<String> {
        let mut part: Map<String, Value> = serde_json::from_str(part.get()).ok()?;
        match self {
            Classic::AnthropicMessages => {
                let source = serde_json::json!({
                    "type": "base64", "media_type": em.mime, "data": &*em.base64
                });
                part.insert("source".into(), source);
            }
            Classic::OpenAiResponses => {
                part.insert("image_url".into(), data_url(em).into());
            }
            // `image_url` is an object in chat; a client's bare string becomes one.
            Classic::OpenAiChat => match part.get_mut("image_url") {
                Some(Value::Object(url)) => {
                    url.insert("url".into(), data_url(em).into());
                }
                _ => {
                    let url = serde_json::json!({ "url": data_url(em) });
                    part.insert("image_url".into(), url);
                }
            },
        }
        Some(Value::Object(part).to_string())
    }

    fn user_note_part(&self, part: Raw<'_>, text_json: &str) -> String {
        let mut out = format!(r#"{{"type":"{}","text":{text_json}"#, self.text_type());
        // Anthropic blocks may carry a cache breakpoint; it stays where it was (P2).
        if *self == Classic::AnthropicMessages {
            #[derive(serde::Deserialize)]
            struct Marker<'a> {
                #[serde(borrow)]
                cache_control: Option<&'a RawValue>,
            }
            if let Some(cc) = serde_json::from_str::<Marker>(part.get())
                .ok()
                .and_then(|m| m.cache_control)
            {
                out.push_str(",\"cache_control\":");
                out.push_str(cc.get());
            }
        }
        out.push('}');
        out
    }

    fn after_turns(&self, body: &[u8], turns: Vec<(usize, Vec<String>)>) -> Vec<Edit> {
        if *self != Classic::OpenAiChat || turns.is_empty() {
            return Vec::new();
        }
        let Some(spans) = std::str::from_utf8(body)
            .ok()
            .and_then(super::openai_chat::message_spans)
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
                    with: crate::projection::Rope::from(format!(
                        r#",{{"role":"user","content":[{}]}}"#,
                        parts.join(",")
                    )),
                })
            })
            .collect()
    }
}
