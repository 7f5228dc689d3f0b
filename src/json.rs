//! Panic-free edits of JSON that came from a client or a provider. Reading with `value["k"]`
//! never panics (serde_json answers `Null` for a missing key or a value of another kind), but
//! writing through it does: `value["k"] = …` panics when `value` is not an object, and
//! `value[0]` when it is not an array of that length (SPEC P4). Every write into untrusted JSON
//! goes through these instead; `tests/lint.rs` keeps it so.

use serde_json::Value;

/// `text` as a JSON string, quoted and escaped, written once into a buffer of about its size.
pub fn string(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len() + 2);
    // Writing a `str` into a `Vec` cannot fail, and serde_json writes UTF-8.
    let _ = serde_json::to_writer(&mut out, text);
    String::from_utf8(out).unwrap_or_default()
}

/// `pieces` joined into one buffer of exactly their size (a part holding an image's base64,
/// written without growing).
pub fn concat(pieces: &[&str]) -> String {
    let mut out = String::with_capacity(pieces.iter().map(|p| p.len()).sum());
    for piece in pieces {
        out.push_str(piece);
    }
    out
}

/// A string read from JSON text, borrowed from it when the string has no escapes. serde borrows
/// a `#[serde(borrow)]` field only when its type is exactly `Cow<str>`: an `Option<Cow<str>>`
/// is always copied (serde-rs/serde#1497), which for a tool result's text or an image's base64
/// is a megabyte copied to be read. Inside this newtype the `Cow` is exactly that, so an
/// `Option<Str>` field (`dialect::Text`) borrows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Str<'a>(#[serde(borrow)] pub std::borrow::Cow<'a, str>);

impl std::ops::Deref for Str<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

/// Sets `key` to `new` when `value` is an object; anything else is left as it is. Whether it
/// was set.
pub fn set(value: &mut Value, key: &str, new: impl Into<Value>) -> bool {
    match value.as_object_mut() {
        Some(object) => {
            object.insert(key.to_string(), new.into());
            true
        }
        None => false,
    }
}

/// The member `key` of `value`, when `value` is an object that has it.
pub fn member_mut<'a>(value: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    value.as_object_mut()?.get_mut(key)
}

/// The first element of the array member `key` of `value` (chat's `choices[0]`).
pub fn first_mut<'a>(value: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    member_mut(value, key)?.as_array_mut()?.first_mut()
}

/// `raw` JSON with every lone UTF-16 surrogate escape (`\ud83d` not followed by its low half,
/// or a low half alone) replaced by `\ufffd`; `None` when there is none. JSON allows them (a JS
/// tool that cuts a string mid-emoji writes one), but they have no UTF-8 form, so serde_json
/// cannot read such a string as text; once replaced, the text can be budgeted like any other.
pub fn without_lone_surrogates(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let hex = |at: usize| -> Option<u16> {
        let digits = raw.get(at..at + 4)?;
        u16::from_str_radix(digits, 16).ok()
    };
    // The escape `\uXXXX` starting at `at`, if there is one.
    let escape = |at: usize| -> Option<u16> {
        (bytes.get(at) == Some(&b'\\') && bytes.get(at + 1) == Some(&b'u'))
            .then(|| hex(at + 2))
            .flatten()
    };
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut i = 0;
    while let Some(found) = memchr::memchr(b'\\', &bytes[i..]) {
        let at = i + found;
        let Some(unit) = escape(at) else {
            // `\\`, `\"` and the like: skip the escaped character (a backslash may end the text).
            i = (at + 2).min(bytes.len());
            continue;
        };
        let high = (0xD800..0xDC00).contains(&unit);
        let low = (0xDC00..0xE000).contains(&unit);
        let paired = high && escape(at + 6).is_some_and(|next| (0xDC00..0xE000).contains(&next));
        if paired {
            i = at + 12;
        } else if high || low {
            let fixed = out.get_or_insert_with(|| String::with_capacity(raw.len()));
            fixed.push_str(&raw[copied..at]);
            fixed.push_str("\\ufffd");
            copied = at + 6;
            i = at + 6;
        } else {
            i = at + 6;
        }
    }
    let mut fixed = out?;
    fixed.push_str(&raw[copied..]);
    Some(fixed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::borrow::Cow;

    #[derive(serde::Deserialize)]
    struct Field<'a> {
        #[serde(borrow)]
        text: Option<Str<'a>>,
    }

    #[test]
    fn strings_are_quoted_and_escaped_as_serde_json_does() {
        for text in ["", "plain", "a \"quote\" and \\ and \n\t\u{1}", "é ✓ 😀"] {
            assert_eq!(string(text), serde_json::Value::from(text).to_string());
        }
        assert_eq!(concat(&["a", "", "bc"]), "abc");
    }

    #[test]
    fn optional_strings_borrow_from_the_body_unless_escaped() {
        let read = |raw: &'static str| serde_json::from_str::<Field>(raw).unwrap().text;
        assert!(matches!(
            read(r#"{"text":"plain"}"#),
            Some(Str(Cow::Borrowed("plain")))
        ));
        // An escape needs its own copy, unescaped.
        assert!(matches!(read(r#"{"text":"a\nb"}"#), Some(Str(Cow::Owned(s))) if s == "a\nb"));
        assert!(read(r#"{"text":null}"#).is_none());
        assert!(read("{}").is_none());
        assert!(serde_json::from_str::<Field>(r#"{"text":3}"#).is_err());
    }

    #[test]
    fn lone_surrogates_become_replacement_characters() {
        let fixed = |s: &str| without_lone_surrogates(s);
        assert_eq!(fixed(r#""ok \ud83d\ude00 pair""#), None);
        assert_eq!(
            fixed(r#""plain \n \\ud83d text""#),
            None,
            "an escaped backslash"
        );
        assert_eq!(fixed(r#""cut \ud83d""#).as_deref(), Some(r#""cut \ufffd""#));
        assert_eq!(
            fixed(r#""\ude00 and \uD83D\u0041""#).as_deref(),
            Some(r#""\ufffd and \ufffd\u0041""#)
        );
        let read: String = serde_json::from_str(&fixed(r#""a\ud83db""#).unwrap()).unwrap();
        assert_eq!(read, "a\u{fffd}b");
        // Found by the fuzzer: a text that ends in a backslash.
        assert_eq!(
            fixed("a\\ud838 4d a\\"),
            Some("a\\ufffd 4d a\\".to_string())
        );
        assert_eq!(fixed("\\"), None);
    }

    #[test]
    fn writes_into_values_of_another_kind_do_nothing() {
        for mut v in [json!(1), json!("s"), json!([1]), json!(null), json!(true)] {
            let before = v.clone();
            assert!(!set(&mut v, "k", 1));
            assert_eq!(v, before);
            assert!(member_mut(&mut v, "k").is_none());
            assert!(first_mut(&mut v, "k").is_none());
        }
        let mut v = json!({"choices": [], "x": {"y": 1}});
        assert!(first_mut(&mut v, "choices").is_none());
        assert!(set(member_mut(&mut v, "x").unwrap(), "z", 2));
        assert_eq!(v["x"], json!({"y": 1, "z": 2}));
    }
}
