//! Gemini's shapes as the core reads and writes them ([`Shapes`]). A tool result is a
//! `functionResponse` object: its text is the string member of `response` a tool answers in
//! (`output`, as Gemini CLI writes it, else `content`, `result` or `error`; a response of any
//! other shape is its JSON text), its media the `inlineData` items of its `parts`. Written back,
//! the text goes where it was read from (a response of another shape becomes `{"output":…}`),
//! the shown media into `parts`, every other member as the client sent it.

use std::borrow::Cow;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{Inline, PartFields};
use crate::json::{concat, string as json_string};
use crate::projection::attach::{Embedded, Extras};
use crate::projection::shapes::{Content, ImageRef, NewContent, Part, PartKind, Shapes};
use crate::projection::{Edit, Raw, Rope};

/// The Gemini API.
#[derive(Debug)]
pub struct Gemini;

/// The members of `response` a tool's text is read from, in order of preference.
const TEXT_MEMBERS: [&str; 4] = ["output", "content", "result", "error"];

type Members<'a> = indexmap::IndexMap<Cow<'a, str>, &'a RawValue>;

/// A `functionResponse` object's `response` and `parts`, by the key the client spelled them.
struct Response<'a> {
    members: Members<'a>,
    response_key: Option<Cow<'a, str>>,
    parts_key: Option<Cow<'a, str>>,
}

impl<'a> Response<'a> {
    fn of(raw: &'a str) -> Option<Response<'a>> {
        let members: Members<'a> = serde_json::from_str(raw).ok()?;
        let response_key = members.keys().find(|k| *k == "response").cloned();
        let parts_key = members.keys().find(|k| *k == "parts").cloned();
        Some(Response {
            members,
            response_key,
            parts_key,
        })
    }

    fn response(&self) -> Option<&'a RawValue> {
        self.members.get(self.response_key.as_deref()?).copied()
    }

    fn parts(&self) -> Vec<&'a RawValue> {
        self.parts_key
            .as_deref()
            .and_then(|k| self.members.get(k))
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
            .unwrap_or_default()
    }
}

/// The member of `response` that holds the tool's text, and the text; `None` for a response
/// of another shape.
fn text_member(response: &RawValue) -> Option<(&'static str, Cow<'_, str>)> {
    let members: Members<'_> = serde_json::from_str(response.get()).ok()?;
    TEXT_MEMBERS.iter().find_map(|name| {
        let raw = members.get(*name)?;
        let text = serde_json::from_str::<crate::json::Str>(raw.get()).ok()?;
        Some((*name, text.0))
    })
}

impl Shapes for Gemini {
    fn tag(&self) -> u8 {
        3
    }

    fn tokenizer(&self) -> crate::tokens::Tokenizer {
        crate::tokens::Tokenizer::Gemini
    }

    fn content<'a>(&self, raw: &'a str) -> Option<Content<'a>> {
        let r = Response::of(raw)?;
        let response = r.response()?;
        let text = match text_member(response) {
            Some((_, text)) => text,
            None => Cow::Borrowed(response.get()),
        };
        let mut parts = vec![(
            response.get(),
            Some(Part {
                kind: PartKind::Text(text),
                breakpoint: None,
                meta: None,
            }),
        )];
        parts.extend(r.parts().into_iter().map(|p| (p.get(), self.part(p.get()))));
        Some(Content::Parts(parts))
    }

    fn tool_content(&self, original: Raw<'_>, new: NewContent<'_>) -> Rope {
        let Some(r) = Response::of(original.get()) else {
            return Rope::from(original.get().to_string());
        };
        let response = match r
            .response()
            .and_then(|resp| text_member(resp).map(|(name, _)| (resp, name)))
        {
            // The text goes back where it was read from; the response's other members stay.
            Some((resp, name)) => {
                let mut members: Members<'_> = serde_json::from_str(resp.get()).unwrap_or_default();
                let text = RawValue::from_string(new.text_json.to_string()).ok();
                let mut out = String::from("{");
                for (i, (key, value)) in members.iter_mut().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&json_string(key));
                    out.push(':');
                    match (key.as_ref() == name, &text) {
                        (true, Some(text)) => out.push_str(text.get()),
                        _ => out.push_str(value.get()),
                    }
                }
                out.push('}');
                out
            }
            None => concat(&[r#"{"output":"#, new.text_json, "}"]),
        };
        let mut media: Vec<Rope> = new.media;
        media.extend(new.others);
        let response_key = r.response_key.clone().unwrap_or(Cow::Borrowed("response"));
        let parts_key = r.parts_key.clone().unwrap_or(Cow::Borrowed("parts"));
        let mut out = Rope::from("{");
        let mut first = true;
        let mut member = |out: &mut Rope, key: &str| {
            if !std::mem::take(&mut first) {
                out.push(",");
            }
            out.push(concat(&[&json_string(key), ":"]));
        };
        let mut wrote_parts = false;
        for (key, value) in &r.members {
            if *key == response_key {
                member(&mut out, key);
                out.push(response.clone());
            } else if *key == parts_key {
                wrote_parts = true;
                if !media.is_empty() {
                    member(&mut out, key);
                    push_list(&mut out, std::mem::take(&mut media));
                }
            } else {
                member(&mut out, key);
                out.push(value.get().to_string());
            }
        }
        if r.response_key.is_none() {
            member(&mut out, &response_key);
            out.push(response);
        }
        if !wrote_parts && !media.is_empty() {
            member(&mut out, &parts_key);
            push_list(&mut out, media);
        }
        out.push("}");
        out
    }

    fn part<'a>(&self, json: &'a str) -> Option<Part<'a>> {
        #[derive(serde::Deserialize)]
        struct Text<'a> {
            #[serde(borrow)]
            text: Option<crate::json::Str<'a>>,
        }
        let fields: PartFields<'a> = serde_json::from_str(json).ok()?;
        let kind = match fields.inline {
            Some(Inline {
                mime: Some(mime),
                data: Some(data),
            }) => {
                let (base64, mime) = (data.0, Some(mime.0));
                match mime.as_deref() {
                    Some(m) if m.starts_with("image/") => PartKind::Image { base64, mime },
                    Some(m) if m.starts_with("audio/") => PartKind::Audio { base64, mime },
                    _ => PartKind::Other,
                }
            }
            _ => match serde_json::from_str::<Text>(json).ok()?.text {
                Some(text) => PartKind::Text(text.0),
                None => PartKind::Other,
            },
        };
        Some(Part {
            kind,
            breakpoint: None,
            meta: None,
        })
    }

    fn part_extras(&self, _json: &str) -> Option<Extras> {
        None
    }

    fn may_hold_media(&self, raw: &str) -> bool {
        crate::projection::attach::extract::may_hold_images(raw)
            || memchr::memmem::find(raw.as_bytes(), b"inlineData").is_some()
            || memchr::memmem::find(raw.as_bytes(), b"inline_data").is_some()
    }

    fn text_part(&self, text_json: &str, _breakpoint: Option<&str>) -> String {
        concat(&[r#"{"text":"#, text_json, "}"])
    }

    fn keep_breakpoint(&self, _last: &mut Rope, _breakpoint: &str) {}

    fn images_in_tool_results(&self) -> bool {
        true
    }

    fn takes_audio(&self) -> bool {
        false
    }

    fn audio_part(&self, format: &str, base64: &str) -> String {
        concat(&[
            r#"{"inlineData":{"mimeType":"audio/"#,
            format,
            r#"","data":""#,
            base64,
            r#""}}"#,
        ])
    }

    fn limits_many_images(&self) -> bool {
        false
    }

    fn image_part(&self, image: &ImageRef<'_>, _extras: Option<&Extras>) -> Rope {
        match image {
            // The base64 is shared, not copied: it is sent from where it is kept.
            ImageRef::Data(em) => {
                let mut part = Rope::from(concat(&[
                    r#"{"inlineData":{"mimeType":""#,
                    em.mime,
                    r#"","data":""#,
                ]));
                part.push(em.base64.clone());
                part.push(r#""}}"#);
                part
            }
            ImageRef::Url(url) => {
                concat(&[r#"{"fileData":{"fileUri":"#, &json_string(url), "}}"]).into()
            }
        }
    }

    fn user_image_part(&self, part: Raw<'_>, em: &Embedded) -> Option<String> {
        let mut part: Map<String, Value> = serde_json::from_str(part.get()).ok()?;
        let key = if part.contains_key("inline_data") {
            "inline_data"
        } else {
            "inlineData"
        };
        let inline = serde_json::json!({"mimeType": em.mime, "data": &*em.base64});
        part.insert(key.into(), inline);
        Some(Value::Object(part).to_string())
    }

    fn user_note_part(&self, _part: Raw<'_>, text_json: &str) -> String {
        self.text_part(text_json, None)
    }

    fn after_turns(&self, _body: &[u8], _turns: Vec<(usize, Vec<String>)>) -> Vec<Edit> {
        Vec::new()
    }

    fn cache_provider(&self) -> crate::projection::cache::Provider {
        crate::projection::cache::Provider::Gemini
    }

    fn breakpoint_field(&self) -> &'static [u8] {
        b""
    }

    fn block_breakpoint(&self, _long: bool) -> &'static str {
        ""
    }

    fn top_breakpoint(&self, _long: bool) -> &'static str {
        ""
    }
}

/// Pushes `items` as a JSON list.
fn push_list(out: &mut Rope, items: Vec<Rope>) {
    out.push("[");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(",");
        }
        out.push(item);
    }
    out.push("]");
}
