//! Unit tests of configuration loading: layering, dotted key paths in errors, redaction, and
//! the example config documenting every key.

use super::*;

/// Loads `toml` as the config file under the environment `env`, in a figment jail (which
/// serialises tests that touch the process environment).
#[allow(clippy::result_large_err)] // figment::Jail's own error type
fn load(toml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let mut out = None;
    figment::Jail::expect_with(|jail| {
        jail.create_file("sluice.toml", toml)?;
        for (k, v) in env {
            jail.set_env(k, v);
        }
        out = Some(Config::load(Some(Path::new("sluice.toml"))));
        Ok(())
    });
    out.unwrap_or_else(|| Err(ConfigError::at("test", "jail did not run")))
}

#[test]
fn defaults_route_each_provider() {
    let c = load("", &[]).unwrap();
    assert_eq!(c.routes.len(), 3);
    assert_eq!(c.routes[0].upstream, "https://api.openai.com");
    assert_eq!(c.routes[1].dialects, vec![Dialect::AnthropicMessages]);
    assert_eq!(c.routes[2].dialects, vec![Dialect::GeminiGenerate]);
    assert_eq!(
        c.routes[2].upstream,
        "https://generativelanguage.googleapis.com"
    );
    assert_eq!(c.routes[0].exit.max_units, 30_000);
}

#[test]
fn misspelled_key_is_named_by_dotted_path() {
    let err = load(
        "[[routes]]\nname='a'\ndialects=['openai-chat']\nupstream='http://x'\n[routes.exit]\nmax_line=3\n",
        &[],
    )
    .unwrap_err();
    assert_eq!(err.key, "routes.0.exit.max_line", "{err}");
    let err = load("listn = '1.2.3.4:1'\n", &[]).unwrap_err();
    assert_eq!(err.key, "listn", "{err}");
}

#[test]
fn env_overrides_file_with_double_underscore() {
    let c = load(
        "listen = '127.0.0.1:1'\n",
        &[
            ("SLUICE_LISTEN", "127.0.0.1:2"),
            ("SLUICE_STORE__BACKEND", "redis"),
            ("SLUICE_MAX_BODY_BYTES", "1024"),
            ("SLUICE_CONFIG", "/ignored"),
            ("SLUICE_OPENAI_KEY", "a route's key, not config"),
            ("OTHER", "x"),
        ],
    )
    .unwrap();
    assert_eq!(c.listen, "127.0.0.1:2");
    assert_eq!(c.store.backend, StoreBackend::Redis);
    assert_eq!(c.max_body_bytes, 1024);
}

#[test]
fn unknown_env_key_is_an_error() {
    let err = load("", &[("SLUICE_STORE__BAKEND", "redis")]).unwrap_err();
    assert_eq!(err.key, "store.bakend", "{err}");
}

#[test]
fn bad_values_name_their_key() {
    let err = load(
        "[[routes]]\nname='a'\ndialects=['openai-chat']\nupstream='nope'\n",
        &[],
    )
    .unwrap_err();
    assert_eq!(err.key, "routes.0.upstream");
    let err = load(
        "[[routes]]\nname='a'\ndialects=['openai-chatt']\nupstream='http://x'\n",
        &[],
    )
    .unwrap_err();
    assert!(err.key.starts_with("routes.0.dialects"), "{err}");
    let err = load("[upstream]\nidle_timeout_seconds = -1\n", &[]).unwrap_err();
    assert_eq!(err.key, "upstream.idle_timeout_seconds");
}

#[test]
fn redaction_hides_redis_password() {
    let mut c = Config::default();
    c.store.redis_url = "redis://u:hunter2@h:6379/0".into();
    let shown = c.redacted_toml();
    assert!(!shown.contains("hunter2"));
    assert!(shown.contains("***"));
}

/// The example config documents every key there is, and is itself valid.
#[test]
fn example_config_is_valid_and_names_every_key() {
    let example = include_str!("../../config/sluice.example.toml");
    load(example, &[]).unwrap();
    fn keys(value: &toml::Value, out: &mut Vec<String>) {
        match value {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    out.push(k.clone());
                    keys(v, out);
                }
            }
            toml::Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    keys(&toml::Value::try_from(Config::default()).unwrap(), &mut all);
    for key in all {
        assert!(
            example.contains(&format!("{key} ="))
                || example.contains(&format!("\"{key}\" ="))
                || example.contains(&format!("[{key}]"))
                || example.contains(&format!("[[{key}]]"))
                || example.contains(&format!(".{key}]")),
            "config/sluice.example.toml does not document `{key}`"
        );
    }
}

/// `[inspector]`: its bounds and prices are checked by their dotted paths; a price left out
/// keeps the provider's published value, a price given replaces only itself.
#[test]
fn inspector_keys_are_checked_and_prices_layer_over_the_published_ones() {
    let err = load("[inspector]\nkeep_turns = 0\n", &[]).unwrap_err();
    assert_eq!(err.key, "inspector.keep_turns", "{err}");
    let err = load("[inspector.prices.openai]\ncache_read = -1\n", &[]).unwrap_err();
    assert_eq!(err.key, "inspector.prices.openai.cache_read", "{err}");
    let config = load(
        "[inspector.prices.anthropic]\ncache_read = 0.08\n",
        &[("SLUICE_INSPECTOR__ENABLED", "true")],
    )
    .unwrap();
    assert!(config.inspector.enabled);
    let anthropic = config.inspector.prices.of(Dialect::AnthropicMessages);
    assert_eq!((anthropic.cache_read, anthropic.cache_write), (0.08, 1.25));
    let openai = config.inspector.prices.of(Dialect::OpenAiChat);
    assert_eq!(openai, crate::config::inspector::Price::OPENAI);
    let err = load("[inspector.prices.gemini]\ncache_write = -0.5\n", &[]).unwrap_err();
    assert_eq!(err.key, "inspector.prices.gemini.cache_write", "{err}");
    // Gemini's table is its own: the model's minimum unless set, and set from the environment.
    let config = load(
        "",
        &[("SLUICE_INSPECTOR__PRICES__GEMINI__CACHE_READ", "0.25")],
    )
    .unwrap();
    let rates = config
        .inspector
        .prices
        .rates(Dialect::GeminiGenerate, "gemini-2.5-flash");
    assert_eq!((rates.read, rates.min_tokens), (0.25, 2048));
    let chat = config.inspector.prices.rates(Dialect::OpenAiChat, "gpt-5");
    assert_eq!(chat.read, 0.1);
}

/// Every top-level key can be set from the environment (O1): a new table left out of
/// `TOP_LEVEL_KEYS` would be silently ignored there.
#[test]
fn every_top_level_key_is_read_from_the_environment() {
    let defaults = toml::Value::try_from(Config::default()).unwrap();
    for key in defaults.as_table().unwrap().keys() {
        assert!(
            TOP_LEVEL_KEYS.contains(&key.as_str()),
            "SLUICE_{} is not read",
            key.to_uppercase()
        );
    }
}

/// `[routes.audio]` (docs/audio.md): its keys load, a zero batch and a misspelled key are named
/// by their dotted paths.
#[test]
fn audio_keys_load_and_are_checked() {
    let route = "[[routes]]\nname='a'\ndialects=['openai-chat']\nupstream='http://x'\ninput_modalities=['text','audio']\n[routes.audio]\n";
    let c = load(
        &format!("{route}max_audio = 2\ndefault_lifetime = 'retain'\n"),
        &[],
    )
    .unwrap();
    let audio = &c.routes[0].audio;
    assert_eq!(
        (audio.max_audio, audio.default_lifetime),
        (2, Lifetime::Retain)
    );
    assert_eq!(audio.max_audio_bytes, DEFAULT_MAX_AUDIO_BYTES);
    assert!(c.routes[0].policy("r").accepts_audio);
    let err = load(&format!("{route}prune_batch = 0\n"), &[]).unwrap_err();
    assert_eq!(err.key, "routes.0.audio.prune_batch", "{err}");
    let err = load(&format!("{route}max_clips = 1\n"), &[]).unwrap_err();
    assert_eq!(err.key, "routes.0.audio.max_clips", "{err}");
    assert!(!load("", &[]).unwrap().routes[0].policy("r").accepts_audio);
}

/// `[routes.context]` (issue #41): a window alone is a working guard, its assumed output
/// following the window; a value that cannot work names itself and what to change.
#[test]
fn a_context_window_alone_works_and_a_bad_value_says_what_to_change() {
    let route = |context: &str| {
        format!("[[routes]]\nname='a'\ndialects=['openai-chat']\nupstream='http://x'\n[routes.context]\n{context}")
    };
    let small = load(&route("window_tokens = 20000\n"), &[]).unwrap();
    let context = &small.routes[0].context;
    assert_eq!(
        context.output_tokens(),
        5_000,
        "a quarter of a small window"
    );
    let large = load(&route("window_tokens = 400000\n"), &[]).unwrap();
    assert_eq!(large.routes[0].context.output_tokens(), 32_000, "capped");
    let set = load(&route("window_tokens = 20000\noutput_tokens = 8000\n"), &[]).unwrap();
    assert_eq!(set.routes[0].context.output_tokens(), 8_000, "as set");

    let err = load(
        &route("window_tokens = 20000\noutput_tokens = 32000\n"),
        &[],
    )
    .unwrap_err();
    assert_eq!(err.key, "routes.0.context.output_tokens");
    assert!(err.message.contains("below 20000"), "{err}");
    assert!(err.message.contains("leave it out"), "{err}");
    let err = load(&route("window_tokens = 20000\ntarget = 0.95\n"), &[]).unwrap_err();
    assert_eq!(err.key, "routes.0.context.target");
    assert!(err.message.contains("below trigger (0.9)"), "{err}");
}

/// `[store.blobs]` (#39): S3 needs a bucket, a URL endpoint and a prefix that ends in '/';
/// every key is read from the environment too.
#[test]
fn blob_storage_keys_are_checked_and_read_from_the_environment() {
    use crate::config::blobs::BlobsBackend;
    let err = load("[store.blobs]\nbackend = \"s3\"\n", &[]).unwrap_err();
    assert_eq!(err.key, "store.blobs.bucket", "{err}");
    let err = load(
        "[store.blobs]\nbackend = \"s3\"\nbucket = \"b\"\nendpoint = \"127.0.0.1:8333\"\n",
        &[],
    )
    .unwrap_err();
    assert_eq!(err.key, "store.blobs.endpoint", "{err}");
    let err = load(
        "[store.blobs]\nbackend = \"s3\"\nbucket = \"b\"\nprefix = \"artifacts\"\n",
        &[],
    )
    .unwrap_err();
    assert_eq!(err.key, "store.blobs.prefix", "{err}");
    let config = load(
        "",
        &[
            ("SLUICE_STORE__BLOBS__BACKEND", "s3"),
            ("SLUICE_STORE__BLOBS__BUCKET", "team-artifacts"),
            ("SLUICE_STORE__BLOBS__ENDPOINT", "http://127.0.0.1:8333"),
        ],
    )
    .unwrap();
    assert_eq!(config.store.blobs.backend, BlobsBackend::S3);
    assert_eq!(config.store.blobs.bucket, "team-artifacts");
    assert_eq!(config.store.blobs.prefix, "artifacts/");
    assert_eq!(
        load("", &[]).unwrap().store.blobs.backend,
        BlobsBackend::Store
    );
}
