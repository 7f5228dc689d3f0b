//! Entry points for the coverage-guided fuzz targets (`fuzz/`, run by `fuzz/run.sh`) and for the
//! replay of their corpus as an ordinary test (`tests/fuzz_corpus.rs`). Each takes arbitrary
//! bytes and must return without a panic; where there is a property to hold (edits splice into
//! valid JSON, pages stay within the budget), it is asserted here, so a fuzzer finds its
//! violations as crashes.

#![allow(clippy::panic)] // a violated property must crash the fuzzer

use std::time::Duration;

use bytes::Bytes;

use crate::config::{Config, RouteConfig};
use crate::dialect::completion::Completion;
use crate::dialect::stitch::Stitcher;
use crate::dialect::Dialect;
use crate::encoding::{Coding, Decoder};
use crate::projection::attach::state::SessionState;
use crate::projection::{self, splice};
use crate::tenant::Tenant;

/// A fuzz target: arbitrary bytes in, no panic.
pub type Target = fn(&[u8]);

/// The fuzz targets, by name: `fuzz/fuzz_targets/<name>.rs` and `fuzz/corpus/<name>/`.
pub const TARGETS: [(&str, Target); 7] = [
    ("request", request),
    ("resumed_view", resumed_view),
    ("provider_stream", provider_stream),
    ("image", image),
    ("cursor", cursor),
    ("config", config),
    ("encoding", encoding),
];

/// The dialect a fuzz input's first byte picks, and the rest.
fn dialect(data: &[u8]) -> (Dialect, &[u8]) {
    match data.split_first() {
        Some((b, rest)) => (Dialect::ALL[usize::from(*b) % Dialect::ALL.len()], rest),
        None => (Dialect::OpenAiChat, data),
    }
}

/// The resumed view (docs/runtime.md): two bodies, an earlier turn and the next, separated by
/// a NUL byte (which JSON text never holds); the second is received in chunks the second byte
/// sizes, the first walked from the start and the second from its trail. A walk that does not
/// give up must give the whole reading's view.
pub fn resumed_view(data: &[u8]) {
    let (dialect, rest) = dialect(data);
    let Some((chunk, rest)) = rest.split_first() else {
        return;
    };
    let (earlier, body) = match rest.iter().position(|&b| b == 0) {
        Some(at) => (&rest[..at], rest.get(at + 1..).unwrap_or_default()),
        None => (&rest[..0], rest),
    };
    crate::dialect::resume::check_walks(dialect, earlier, body, usize::from(*chunk) + 1);
}

/// A client request: read into a view, projected under a small budget (so pages, spills and
/// images all happen), spliced; a request that was JSON stays JSON (P2). Then the read tool's
/// request shape over the same bytes.
pub fn request(data: &[u8]) {
    let (dialect, body) = dialect(data);
    let body = Bytes::copy_from_slice(body);
    let Ok(view) = dialect.read_view(&body) else {
        return;
    };
    let tenant = Tenant::from_credential(b"fuzz");
    let mut route = RouteConfig {
        name: "fuzz".into(),
        dialects: vec![dialect],
        upstream: "http://127.0.0.1:1".into(),
        ..RouteConfig::default()
    };
    route.exit.max_lines = 20;
    route.exit.max_units = 400;
    route.images.max_images = 2;
    let memo = crate::memo::Memo::new(Duration::from_secs(60));
    let state = SessionState::default();
    let ctx = projection::Context {
        tenant: &tenant,
        policy: route.policy(&route.read_tool),
        memo: &memo,
        state: &state,
        now_ms: 0,
    };
    let projection = projection::project(&view, &ctx);
    drop(view);
    match splice(&body, projection.edits) {
        Ok(out) => {
            let was_json = serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok();
            if was_json && serde_json::from_slice::<serde::de::IgnoredAny>(&out).is_err() {
                panic!("a projected request is no longer JSON");
            }
        }
        Err(e) => panic!("projection produced edits that do not splice: {e}"),
    }
    if let Some(layout) = crate::read::Layout::read(dialect, &body) {
        let _ = layout.last_item();
    }
}

/// A provider's response stream, fed in uneven pieces to the completion watch and to the
/// stitcher of the read tool's rounds (two rounds of the same bytes), then the non-streamed
/// reply parser on the same bytes.
pub fn provider_stream(data: &[u8]) {
    let (dialect, bytes) = dialect(data);
    let mut watch = Completion::new(dialect);
    let mut stitch = Stitcher::new(dialect, "sluice_read");
    let mut outputs = Vec::new();
    for round in 0..2 {
        let mut rest = bytes;
        let mut step = 1;
        while !rest.is_empty() {
            let (piece, more) = rest.split_at(step.min(rest.len()));
            watch.feed(piece);
            let _ = stitch.feed(piece);
            rest = more;
            step = step * 3 % 97 + 1;
        }
        let _ = stitch.round_complete();
        outputs.push(stitch.output());
        if round == 0 {
            stitch.next_round();
        }
    }
    let _ = watch.is_complete();
    let _ = stitch.finish(&outputs);
    let _ = stitch.error("fuzz");
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) {
        let output = dialect.wire().output(&value);
        let _ = output.read_calls("sluice_read");
        let _ = crate::dialect::wire::merged(dialect.wire(), value, &outputs, "sluice_read");
    }
}

/// Image bytes, raw and as base64 text: the header-only checks (M2), and a deterministic resize
/// for the ones that pass when they are small.
pub fn image(data: &[u8]) {
    let _ = crate::image::check(Bytes::copy_from_slice(data), Some("image/png"));
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(bytes) = crate::image::decode_base64(text, 1 << 20) {
            let _ = crate::image::check(bytes.into(), None);
        }
        let _ = crate::projection::attach::extract::split_data_url(text);
    }
}

/// Cursor and artifact-id text, as the read endpoint and the read tool get them.
pub fn cursor(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ =
        crate::projection::exit::cursor::Cursor::decode(text, &Tenant::from_credential(b"fuzz"));
    let _ = crate::store::ArtifactId::parse(text);
    let _ = crate::json::without_lone_surrogates(text);
}

/// A configuration file (`check-config`).
pub fn config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Config::from_toml(text);
    }
}

/// A compressed body in each coding, with a bound on what it may inflate to.
pub fn encoding(data: &[u8]) {
    let (&which, rest) = match data.split_first() {
        Some(split) => split,
        None => return,
    };
    let coding =
        [Coding::Gzip, Coding::Deflate, Coding::Brotli, Coding::Zstd][usize::from(which) % 4];
    let Some(mut decoder) = Decoder::new(coding) else {
        return;
    };
    let mut total = 0usize;
    let mut sink = |piece: &[u8]| {
        total += piece.len();
        if total > 1 << 22 {
            Err(())
        } else {
            Ok(())
        }
    };
    let mid = rest.len() / 2;
    if decoder.feed(&rest[..mid], &mut sink).is_ok()
        && decoder.feed(&rest[mid..], &mut sink).is_ok()
    {
        let _ = decoder.finish(&mut sink);
    }
}
