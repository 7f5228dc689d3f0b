//! Token estimates for the context-window guard (docs/context-guard.md): text counted with
//! OpenAI's published tokenizers (o200k, cl100k, through `bpe-openai`, which ships their
//! ranks), Claude's estimated from o200k by a calibrated factor (Anthropic publishes no
//! tokenizer for its current models), images by each provider's published formula. Pure and
//! panic-free; the caller memoizes.

use serde::{Deserialize, Serialize};

/// How a route's input is counted.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Tokenizer {
    /// GPT-4o, GPT-4.1, GPT-5, o-series.
    O200k,
    /// GPT-4, GPT-3.5.
    Cl100k,
    /// Claude: o200k scaled by [`CLAUDE_PER_O200K`].
    Claude,
    /// Gemini: o200k scaled by [`GEMINI_PER_O200K_TENTHS`] (Google publishes no tokenizer
    /// for its current models).
    Gemini,
}

/// Gemini tokens per o200k token, in tenths: a margin over o200k, not yet measured against the
/// API's `countTokens` (docs/gemini.md).
pub const GEMINI_PER_O200K_TENTHS: u64 = 11;

/// Claude tokens per o200k token, in tenths: Claude's tokenizers split text into more pieces
/// than o200k does (docs/context-guard.md has the measurement behind this value); rounding
/// up keeps the guard on the safe side.
pub const CLAUDE_PER_O200K_TENTHS: u64 = 12;

/// Text tokens per byte of JSON at most, in tenths: a token is at least one byte of the text,
/// and a JSON string is never shorter than the text it carries.
const MAX_TENTHS_PER_BYTE: u64 = CLAUDE_PER_O200K_TENTHS;

/// Strings this long or longer are checked for being a base64 payload.
const PAYLOAD_MIN_BYTES: usize = 256;

impl Tokenizer {
    /// The tokens of `text`.
    pub fn count(self, text: &str) -> u64 {
        match self {
            Tokenizer::O200k => bpe_openai::o200k_base().count(text) as u64,
            Tokenizer::Cl100k => bpe_openai::cl100k_base().count(text) as u64,
            Tokenizer::Claude => {
                let o200k = bpe_openai::o200k_base().count(text) as u64;
                (o200k * CLAUDE_PER_O200K_TENTHS).div_ceil(10)
            }
            Tokenizer::Gemini => {
                let o200k = bpe_openai::o200k_base().count(text) as u64;
                (o200k * GEMINI_PER_O200K_TENTHS).div_ceil(10)
            }
        }
    }

    /// Loads the tokenizer's tables now (tens of milliseconds), so the first request that
    /// needs them does not wait.
    pub fn warm(self) {
        self.count("warm");
    }

    /// An upper bound of the text tokens a JSON body of `bytes` bytes can carry.
    pub fn most_for_bytes(bytes: usize) -> u64 {
        (bytes as u64).saturating_mul(MAX_TENTHS_PER_BYTE) / 10 + 1
    }

    /// The tokens an image of `width` × `height` costs, by the provider's published formula:
    /// Anthropic resizes to a long edge of at most 1568 px and about 1.2 megapixels (1,600 tokens), then
    /// charges width × height / 750; OpenAI (detail `high`, the costlier case) fits the image in
    /// 2048 × 2048, scales its short side down to 768, then charges 170 per 512-pixel tile plus
    /// 85. An image whose size is unknown (0 × 0) costs the most the formula can give.
    pub fn image(self, width: u32, height: u32) -> u64 {
        let (w, h) = (f64::from(width), f64::from(height));
        match self {
            Tokenizer::Claude => {
                if width == 0 || height == 0 {
                    return 1600;
                }
                let scale = (1568.0 / w.max(h))
                    .min((1_200_000.0 / (w * h)).sqrt())
                    .min(1.0);
                let (w, h) = ((w * scale).round(), (h * scale).round());
                (((w * h) / 750.0).ceil() as u64).min(1600)
            }
            // Gemini: 258 tokens for an image of at most 384 px a side, else 258 per 768 px tile.
            Tokenizer::Gemini => {
                if width <= 384 && height <= 384 {
                    return 258;
                }
                258 * (w / 768.0).ceil().max(1.0) as u64 * (h / 768.0).ceil().max(1.0) as u64
            }
            Tokenizer::O200k | Tokenizer::Cl100k => {
                if width == 0 || height == 0 {
                    return 85 + 170 * 8;
                }
                let fit = (2048.0 / w.max(h)).min(1.0);
                let (w, h) = (w * fit, h * fit);
                let short = (768.0 / w.min(h)).min(1.0);
                let (w, h) = (w * short, h * short);
                let tiles = (w / 512.0).ceil() * (h / 512.0).ceil();
                85 + 170 * tiles as u64
            }
        }
    }

    /// The tokens an audio file costs: 10 a second, what OpenAI's launch price of its audio
    /// models ($100 per million audio tokens, about $0.06 a minute) works out to. A file whose
    /// length is unknown (an MP3) is taken to last as long as its bytes at 32 kbit/s, speech's
    /// lowest common rate, so the estimate errs high.
    pub fn audio(millis: Option<u64>, bytes: u64) -> u64 {
        let millis = millis.unwrap_or(bytes / 4);
        millis.div_ceil(100)
    }

    /// A short name for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Tokenizer::O200k => "o200k",
            Tokenizer::Cl100k => "cl100k",
            Tokenizer::Claude => "claude",
            Tokenizer::Gemini => "gemini",
        }
    }
}

/// The text a fragment of JSON carries, for counting: each string value decoded (object keys
/// are structure, not text), joined by newlines, which stand for the structure between them
/// as a provider's prompt template does (a few tokens per message). Base64 payloads — `data:`
/// URLs and long runs of the base64 alphabet — are left out: a provider reads them as images
/// or files, counted apart ([`json_payloads`]). `fragment` may be any slice of a JSON text
/// that starts and ends outside a string; an unterminated string ends the scan.
pub fn json_text(fragment: &str) -> String {
    let mut out = String::new();
    for (literal, escaped) in Strings::of(fragment) {
        let inner = literal.get(1..literal.len() - 1).unwrap_or_default();
        if is_payload(inner) {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        if escaped {
            match serde_json::from_str::<String>(literal) {
                Ok(text) => out.push_str(&text),
                Err(_) => out.push_str(inner),
            }
        } else {
            out.push_str(inner);
        }
    }
    out
}

/// The base64 payloads among a fragment's string values (as [`json_text`] leaves them out),
/// without their quotes.
pub fn json_payloads(fragment: &str) -> impl Iterator<Item = &str> {
    Strings::of(fragment)
        .map(|(literal, _)| literal.get(1..literal.len() - 1).unwrap_or_default())
        .filter(|inner| is_payload(inner))
}

/// The string values of a JSON fragment (keys skipped), each as its literal with quotes and
/// whether it holds an escape.
struct Strings<'a> {
    fragment: &'a str,
    at: usize,
}

impl<'a> Strings<'a> {
    fn of(fragment: &'a str) -> Self {
        Strings { fragment, at: 0 }
    }
}

impl<'a> Iterator for Strings<'a> {
    type Item = (&'a str, bool);

    fn next(&mut self) -> Option<(&'a str, bool)> {
        let bytes = self.fragment.as_bytes();
        loop {
            let open = bytes
                .get(self.at..)
                .and_then(|rest| memchr::memchr(b'"', rest))?;
            let start = self.at + open;
            let mut scan = start + 1;
            let mut escaped = false;
            let end = loop {
                match bytes
                    .get(scan..)
                    .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
                {
                    None => {
                        self.at = bytes.len();
                        return None;
                    }
                    Some(k) if bytes.get(scan + k) == Some(&b'\\') => {
                        escaped = true;
                        scan += k + 2;
                    }
                    Some(k) => break scan + k,
                }
            };
            self.at = end + 1;
            let next = bytes
                .get(self.at..)
                .and_then(|rest| rest.iter().find(|b| !b.is_ascii_whitespace()));
            if next == Some(&b':') {
                continue;
            }
            if let Some(literal) = self.fragment.get(start..=end) {
                return Some((literal, escaped));
            }
        }
    }
}

/// Whether a long string is a base64 payload rather than text.
fn is_payload(s: &str) -> bool {
    if s.len() < PAYLOAD_MIN_BYTES {
        return false;
    }
    if s.starts_with("data:") {
        return true;
    }
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-' | b'_'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn o200k_counts_as_openai_publishes() {
        // tiktoken's own examples: "hello world" is 2 tokens in both encodings.
        assert_eq!(Tokenizer::O200k.count("hello world"), 2);
        assert_eq!(Tokenizer::Cl100k.count("hello world"), 2);
        assert_eq!(Tokenizer::O200k.count(""), 0);
        let o = Tokenizer::O200k.count("The quick brown fox jumps over the lazy dog.");
        assert_eq!(
            Tokenizer::Claude.count("The quick brown fox jumps over the lazy dog."),
            (o * 12).div_ceil(10)
        );
    }

    #[test]
    fn audio_costs_ten_tokens_a_second() {
        assert_eq!(Tokenizer::audio(Some(1500), 24_000), 15);
        assert_eq!(Tokenizer::audio(Some(1), 16), 1);
        // An MP3 of 40 KB: ten seconds at 32 kbit/s.
        assert_eq!(Tokenizer::audio(None, 40_000), 100);
    }

    #[test]
    fn images_cost_what_the_providers_publish() {
        // Anthropic's table: 1000×1000 ≈ 1334 tokens; 200×200 ≈ 54; 1092×1092 ≈ 1590.
        assert_eq!(Tokenizer::Claude.image(200, 200), 54);
        assert_eq!(Tokenizer::Claude.image(1000, 1000), 1334);
        assert_eq!(Tokenizer::Claude.image(1092, 1092), 1590);
        assert_eq!(
            Tokenizer::Claude.image(8000, 8000),
            1599,
            "resized to about 1.2 MP first"
        );
        // OpenAI's examples: 1024×1024 high is 765; 2048×4096 high is 1105.
        assert_eq!(Tokenizer::O200k.image(1024, 1024), 765);
        assert_eq!(Tokenizer::O200k.image(2048, 4096), 1105);
        assert_eq!(Tokenizer::O200k.image(0, 0), 1445);
    }

    #[test]
    fn json_text_reads_strings_and_leaves_payloads_out() {
        let b64 = "QUJD".repeat(200);
        let fragment = format!(
            r#"{{"role":"user","content":[{{"type":"text","text":"a\nb \"q\""}},{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{b64}"}}}},{{"data":"{b64}"}}],"n":12}}"#
        );
        assert_eq!(json_text(&fragment), "user\ntext\na\nb \"q\"\nimage_url");
        // A slice between two values, and an unterminated string.
        assert_eq!(json_text(r#"},{"role":"tool","content":"#), "tool");
        assert_eq!(json_text(r#"{"a" : "b" , "c":["d", "e"]}"#), "b\nd\ne");
        assert_eq!(json_text(r#""ok","cut"#), "ok");
        assert_eq!(json_text(r#""\"#), "");
    }

    #[test]
    fn the_byte_bound_holds() {
        for text in [
            "hello world",
            "ééé ßß 日本語テキスト",
            "a\n\n\nb",
            "😀😀😀",
            "x",
        ] {
            let json = serde_json::to_string(text).unwrap();
            for t in [Tokenizer::O200k, Tokenizer::Cl100k, Tokenizer::Claude] {
                assert!(
                    t.count(&json_text(&json)) <= Tokenizer::most_for_bytes(json.len()),
                    "{t:?} {text}"
                );
            }
        }
    }

    proptest! {
        /// Whatever the bytes, reading them as JSON text never panics, and what it keeps is no
        /// longer than the input plus its separators.
        #[test]
        fn json_text_never_panics(s in "(\\PC|\"|\\\\|\\n){0,200}") {
            let out = json_text(&s);
            prop_assert!(out.len() <= s.len() * 2 + 1);
        }
    }
}
