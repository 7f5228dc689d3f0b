//! Configuration: built-in defaults < TOML file < `SLUICE_` environment (SPEC O1, section 9).
//!
//! Every key of SPEC section 9 exists here with that name. Keys that end in a unit say it
//! (`_bytes`, `_seconds`). Unknown keys are errors that name their dotted path.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
pub mod blobs;
pub mod inspector;
mod limits;
mod route;

use serde::{Deserialize, Serialize};

use crate::dialect::Dialect;
pub use limits::LimitsConfig;
pub use route::RouteConfig;

pub use crate::projection::policy::{
    AudioLimits as AudioConfig, ContextLimits as ContextConfig, ImageLimits as ImagesConfig,
    Lifetime, Modality, PageLimits as ExitConfig,
};

/// Where the proxy listens by default: loopback, so a sidecar is not reachable from outside the pod
/// unless the operator says so.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
/// Admin listener (health and metrics). 9464 is the port Prometheus exporters conventionally use.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9464";
/// 64 MiB: above Anthropic's 32 MB request limit, so every request a provider accepts fits.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 64 * 1024 * 1024;
/// A TCP + TLS handshake to a provider takes well under a second; 10 s means it is down.
pub const DEFAULT_CONNECT_TIMEOUT_SECONDS: f64 = 10.0;
/// Non-streamed completions send their headers only when the whole answer is ready. The official
/// SDKs wait 600 s by default, so sluice must not give up earlier than its clients do.
pub const DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS: f64 = 600.0;
/// Between two chunks of a stream. Providers send keep-alive events far more often than this;
/// five minutes of silence means the stream is dead.
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: f64 = 300.0;
/// Idle upstream connections are kept this long for reuse (providers close theirs after ~90 s).
pub const DEFAULT_POOL_IDLE_SECONDS: f64 = 60.0;
/// On SIGTERM, in-flight streams get this long to finish. Kubernetes' default grace period is 30 s;
/// the manifests set `terminationGracePeriodSeconds` a little above this.
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: f64 = 25.0;
/// One week: an agent session idle for longer is over.
pub const DEFAULT_IDLE_TTL_SECONDS: u64 = 604_800;
/// The longest idle TTL: ten years. Longer ones overflow the caches' timers and Redis' expiry.
pub const MAX_IDLE_TTL_SECONDS: u64 = 10 * 365 * 24 * 3600;
/// A request body must have arrived within a minute: an agent sends its whole request at once,
/// and a client that trickles it holds a connection for nothing (SPEC 9.1).
pub const DEFAULT_REQUEST_BODY_TIMEOUT_SECONDS: f64 = 60.0;
/// Request bytes buffered at once across all connections (256 MiB): four maximal bodies; more
/// waits for room, then gets 503 (SPEC 9.1).
pub const DEFAULT_MAX_INFLIGHT_BODY_BYTES: u64 = 256 * 1024 * 1024;
/// The most worker threads: more than any machine sluice runs on has cores.
pub const MAX_WORKER_THREADS: usize = 1024;
/// SPEC T1 budgets, from the unified model exit.
pub const DEFAULT_MAX_LINES: usize = 2000;
pub const DEFAULT_MAX_UNITS: usize = 30_000;
/// SPEC section 9 defaults: Anthropic's documented image limits (the stricter provider).
pub const DEFAULT_MAX_IMAGES: usize = 20;
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 30 * 1024 * 1024;
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 5 * 1024 * 1024;
pub const DEFAULT_MAX_DIMENSION: u32 = 8000;
pub const DEFAULT_RECENT_COUNT: usize = 3;
pub const DEFAULT_PRUNE_BATCH: usize = 2;
/// `[routes.audio]` (docs/audio.md). OpenAI documents no count of audio parts per request; ten
/// clips is more than a tool turn brings, few enough that a history of recordings stays cheap.
pub const DEFAULT_MAX_AUDIO: usize = 10;
/// OpenAI's limit for one audio file, 25 MB, which is also the most sluice checks.
pub const DEFAULT_MAX_AUDIO_BYTES: u64 = crate::audio::MAX_AUDIO_BYTES;
/// One maximal file per request: its base64 (33 MB) and a long history stay under the 50 MB
/// payload OpenAI long documented.
pub const DEFAULT_MAX_AUDIO_TOTAL_BYTES: u64 = crate::audio::MAX_AUDIO_BYTES;
/// Act at 90 % of the room: close enough to the window to retire rarely, far enough that the
/// estimate's error (docs/context-guard.md) does not reach the provider's limit.
pub const DEFAULT_CONTEXT_TRIGGER: f64 = 0.9;
/// Retire down to 60 %: a batch then buys many turns before the next one, so the prompt cache
/// is invalidated rarely (Anthropic advises clearing in large batches for this reason).
pub const DEFAULT_CONTEXT_TARGET: f64 = 0.6;
/// nginx's `keepalive_requests` default: an agent's connection lasts hours at its pace, a
/// saturating client's a fraction of a second (docs/runtime.md, "Connections recycled").
pub const DEFAULT_MAX_REQUESTS_PER_CONNECTION: u32 = 1000;
/// The model is usually working on the results of its last two turns.
pub const DEFAULT_KEEP_RECENT_TURNS: usize = 2;
/// Read rounds per request (C2): enough for a few pages, bounded so a model that keeps reading
/// still answers.
pub const DEFAULT_MAX_READ_STEPS: usize = 4;

/// The top-level keys. A `SLUICE_` variable is read as config only when its first segment is
/// one of them, so an operator's own `SLUICE_OPENAI_KEY` (say, named by `api_key_env`) or
/// `SLUICE_LOG` is not mistaken for a misspelled key; below a known key, typos are errors.
const TOP_LEVEL_KEYS: &[&str] = &[
    "listen",
    "admin_listen",
    "max_body_bytes",
    "drain_timeout_seconds",
    "worker_threads",
    "request_body_timeout_seconds",
    "max_connections",
    "max_inflight_body_bytes",
    "max_requests_per_connection",
    "upstream",
    "store",
    "session",
    "routes",
    "inspector",
    "limits",
];

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: String,
    pub admin_listen: String,
    pub max_body_bytes: u64,
    pub drain_timeout_seconds: f64,
    pub worker_threads: usize,
    pub request_body_timeout_seconds: f64,
    /// Connections served at once; 0 derives it from the file-descriptor limit.
    pub max_connections: usize,
    pub max_inflight_body_bytes: u64,
    /// Requests one client connection serves before its last answer says `connection: close`
    /// and the client opens another, which goes to the least-loaded worker (or, behind a
    /// Service, to any replica); 0 keeps a connection for as long as the client does.
    pub max_requests_per_connection: u32,
    pub upstream: UpstreamConfig,
    pub store: StoreConfig,
    pub session: SessionConfig,
    pub routes: Vec<RouteConfig>,
    /// `[inspector]`: turn records, the session API and page (docs/inspector.md).
    pub inspector: inspector::InspectorConfig,
    /// `[limits]`: per-tenant shares of a shared gateway (docs/reliability.md, "Tenants").
    pub limits: LimitsConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    pub connect_timeout_seconds: f64,
    pub first_byte_timeout_seconds: f64,
    pub idle_timeout_seconds: f64,
    pub pool_idle_timeout_seconds: f64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    Embedded,
    Redis,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub backend: StoreBackend,
    pub data_dir: PathBuf,
    pub redis_url: String,
    /// `redis_url` names any node of a Redis Cluster (docs/delivery-state.md).
    pub redis_cluster: bool,
    pub idle_ttl_seconds: u64,
    /// Where artifacts are kept (`[store.blobs]`).
    pub blobs: blobs::BlobsConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    pub header: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.into(),
            admin_listen: DEFAULT_ADMIN_LISTEN.into(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            drain_timeout_seconds: DEFAULT_DRAIN_TIMEOUT_SECONDS,
            worker_threads: 0,
            request_body_timeout_seconds: DEFAULT_REQUEST_BODY_TIMEOUT_SECONDS,
            max_connections: 0,
            max_inflight_body_bytes: DEFAULT_MAX_INFLIGHT_BODY_BYTES,
            max_requests_per_connection: DEFAULT_MAX_REQUESTS_PER_CONNECTION,
            upstream: UpstreamConfig::default(),
            store: StoreConfig::default(),
            session: SessionConfig::default(),
            routes: default_routes(),
            inspector: inspector::InspectorConfig::default(),
            limits: LimitsConfig::default(),
        }
    }
}

/// With no routes configured: OpenAI's two dialects to OpenAI, Anthropic's to Anthropic (SPEC
/// O1), Gemini's to Google.
fn default_routes() -> Vec<RouteConfig> {
    vec![
        RouteConfig {
            name: "openai".into(),
            dialects: vec![Dialect::OpenAiChat, Dialect::OpenAiResponses],
            upstream: "https://api.openai.com".into(),
            ..RouteConfig::default()
        },
        RouteConfig {
            name: "anthropic".into(),
            dialects: vec![Dialect::AnthropicMessages],
            upstream: "https://api.anthropic.com".into(),
            ..RouteConfig::default()
        },
        RouteConfig {
            name: "gemini".into(),
            dialects: vec![Dialect::GeminiGenerate],
            upstream: "https://generativelanguage.googleapis.com".into(),
            ..RouteConfig::default()
        },
    ]
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            connect_timeout_seconds: DEFAULT_CONNECT_TIMEOUT_SECONDS,
            first_byte_timeout_seconds: DEFAULT_FIRST_BYTE_TIMEOUT_SECONDS,
            idle_timeout_seconds: DEFAULT_IDLE_TIMEOUT_SECONDS,
            pool_idle_timeout_seconds: DEFAULT_POOL_IDLE_SECONDS,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::Embedded,
            data_dir: PathBuf::from("./sluice-data"),
            redis_url: "redis://127.0.0.1:6379/0".into(),
            redis_cluster: false,
            idle_ttl_seconds: DEFAULT_IDLE_TTL_SECONDS,
            blobs: blobs::BlobsConfig::default(),
        }
    }
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            header: "x-sluice-session".into(),
        }
    }
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            window_tokens: 0,
            trigger: DEFAULT_CONTEXT_TRIGGER,
            target: DEFAULT_CONTEXT_TARGET,
            keep_recent_turns: DEFAULT_KEEP_RECENT_TURNS,
            output_tokens: None,
            tokenizer: None,
        }
    }
}

impl Default for ExitConfig {
    fn default() -> Self {
        Self {
            max_lines: DEFAULT_MAX_LINES,
            max_units: DEFAULT_MAX_UNITS,
        }
    }
}

impl Default for ImagesConfig {
    fn default() -> Self {
        Self {
            max_images: DEFAULT_MAX_IMAGES,
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
            max_image_bytes: DEFAULT_MAX_IMAGE_BYTES,
            max_dimension: DEFAULT_MAX_DIMENSION,
            recent_count: DEFAULT_RECENT_COUNT,
            prune_batch: DEFAULT_PRUNE_BATCH,
            default_lifetime: Lifetime::Once,
            downscale: false,
        }
    }
}

impl Default for AudioConfig {
    fn default() -> Self {
        Self {
            max_audio: DEFAULT_MAX_AUDIO,
            max_total_bytes: DEFAULT_MAX_AUDIO_TOTAL_BYTES,
            max_audio_bytes: DEFAULT_MAX_AUDIO_BYTES,
            recent_count: DEFAULT_RECENT_COUNT,
            prune_batch: DEFAULT_PRUNE_BATCH,
            default_lifetime: Lifetime::Once,
        }
    }
}

/// A configuration error, always naming the dotted key path it is about.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl ConfigError {
    fn at(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl Config {
    /// Loads defaults, then `path` (if any), then `SLUICE_*` variables of the process
    /// environment (`__` separates levels), and validates the result.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = path {
            if !path.is_file() {
                return Err(ConfigError::at(
                    "config",
                    format!("file {} does not exist or is not a file", path.display()),
                ));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment.merge(
            Env::prefixed("SLUICE_")
                .filter(|key| is_config_variable(key.as_str()))
                .split("__"),
        );
        let config: Config = figment.extract().map_err(figment_error)?;
        config.validate()?;
        Ok(config)
    }

    /// Defaults, then the TOML document `text` (no file, no environment), validated: what
    /// `check-config` does with a file's contents.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let figment =
            Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(text));
        let config: Config = figment.extract().map_err(figment_error)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        parse_addr("listen", &self.listen)?;
        parse_addr("admin_listen", &self.admin_listen)?;
        if self.max_body_bytes == 0 {
            return Err(ConfigError::at("max_body_bytes", "must be above 0"));
        }
        if !(1..=inspector::MAX_KEEP_TURNS).contains(&self.inspector.keep_turns) {
            return Err(ConfigError::at(
                "inspector.keep_turns",
                format!("must be from 1 to {}", inspector::MAX_KEEP_TURNS),
            ));
        }
        self.inspector
            .prices
            .check("inspector")
            .map_err(|key| ConfigError::at(key, "must be a number of 0 or more"))?;
        positive_seconds("drain_timeout_seconds", self.drain_timeout_seconds)?;
        positive_seconds(
            "request_body_timeout_seconds",
            self.request_body_timeout_seconds,
        )?;
        if self.worker_threads > MAX_WORKER_THREADS {
            return Err(ConfigError::at(
                "worker_threads",
                format!("must be at most {MAX_WORKER_THREADS} (0 = one per core)"),
            ));
        }
        if self.max_inflight_body_bytes < self.max_body_bytes {
            return Err(ConfigError::at(
                "max_inflight_body_bytes",
                "must be at least max_body_bytes, or no body of the largest size could be read",
            ));
        }
        // tokio's semaphore counts at most usize::MAX >> 3 permits.
        if self.max_inflight_body_bytes > (u32::MAX as u64) << 16 {
            return Err(ConfigError::at(
                "max_inflight_body_bytes",
                "must be at most 256 TiB",
            ));
        }
        self.limits.validate(self.max_body_bytes)?;
        let up = &self.upstream;
        positive_seconds(
            "upstream.connect_timeout_seconds",
            up.connect_timeout_seconds,
        )?;
        positive_seconds(
            "upstream.first_byte_timeout_seconds",
            up.first_byte_timeout_seconds,
        )?;
        positive_seconds("upstream.idle_timeout_seconds", up.idle_timeout_seconds)?;
        positive_seconds(
            "upstream.pool_idle_timeout_seconds",
            up.pool_idle_timeout_seconds,
        )?;
        self.store
            .blobs
            .check()
            .map_err(|(key, message)| ConfigError::at(key, message))?;
        if self.store.backend == StoreBackend::Redis && !self.store.redis_url.starts_with("redis") {
            return Err(ConfigError::at(
                "store.redis_url",
                "must be a redis:// or rediss:// URL",
            ));
        }
        if self.store.idle_ttl_seconds == 0 || self.store.idle_ttl_seconds > MAX_IDLE_TTL_SECONDS {
            return Err(ConfigError::at(
                "store.idle_ttl_seconds",
                format!("must be from 1 to {MAX_IDLE_TTL_SECONDS} (ten years)"),
            ));
        }
        if http::HeaderName::from_bytes(self.session.header.as_bytes()).is_err() {
            return Err(ConfigError::at(
                "session.header",
                "is not a valid HTTP header name",
            ));
        }
        if self.routes.is_empty() {
            return Err(ConfigError::at("routes", "at least one route is needed"));
        }
        for (i, route) in self.routes.iter().enumerate() {
            route.validate(&format!("routes.{i}"))?;
            if self.routes[..i].iter().any(|r| r.name == route.name) {
                return Err(ConfigError::at(
                    format!("routes.{i}.name"),
                    format!("route name {:?} is used twice", route.name),
                ));
            }
        }
        Ok(())
    }

    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        parse_addr("listen", &self.listen)
    }

    pub fn admin_addr(&self) -> Result<SocketAddr, ConfigError> {
        parse_addr("admin_listen", &self.admin_listen)
    }

    /// Proxy worker threads: `worker_threads`, or one per available core when 0.
    pub fn workers(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.drain_timeout_seconds)
    }

    pub fn request_body_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.request_body_timeout_seconds)
    }

    /// The effective configuration as TOML with secrets redacted (`check-config`, SPEC O1).
    pub fn redacted_toml(&self) -> String {
        let mut shown = self.clone();
        shown.store.redis_url = redact_url(&shown.store.redis_url);
        let mut out = toml::to_string_pretty(&shown)
            .unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"));
        for route in &self.routes {
            if !route.api_key_env.is_empty() {
                let state = if std::env::var_os(&route.api_key_env).is_some() {
                    "set"
                } else {
                    "NOT SET"
                };
                out.push_str(&format!(
                    "# route {:?}: api_key_env {} is {state} (value not shown)\n",
                    route.name, route.api_key_env
                ));
            }
        }
        let ignored = ignored_variables();
        if !ignored.is_empty() {
            out.push_str(&format!(
                "# not config keys, ignored: {}\n",
                ignored.join(", ")
            ));
        }
        out
    }
}

/// Whether the `SLUICE_`-stripped variable name `key` addresses the config tree.
fn is_config_variable(key: &str) -> bool {
    let first = key.split("__").next().unwrap_or(key).to_ascii_lowercase();
    TOP_LEVEL_KEYS.contains(&first.as_str())
}

/// `SLUICE_` variables that are not read as config, for `check-config` to point out.
pub fn ignored_variables() -> Vec<String> {
    std::env::vars()
        .filter_map(|(name, _)| {
            let key = name.strip_prefix("SLUICE_")?;
            let process = ["CONFIG", "LOG", "LOG_FORMAT"].contains(&key);
            (!process && !is_config_variable(key)).then_some(name)
        })
        .collect()
}

fn figment_error(err: figment::Error) -> ConfigError {
    let key = if err.path.is_empty() {
        "config".to_string()
    } else {
        err.path.join(".")
    };
    let message = match &err.kind {
        figment::error::Kind::UnknownField(field, _) => {
            let key = if err.path.last() == Some(field) {
                key.clone()
            } else {
                format!("{key}.{field}")
            };
            return ConfigError::at(key, "unknown key");
        }
        other => other.to_string(),
    };
    ConfigError::at(key, message)
}

fn parse_addr(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse().map_err(|_| {
        ConfigError::at(
            key,
            format!("{value:?} is not an address like 127.0.0.1:8787"),
        )
    })
}

fn positive_seconds(key: &str, value: f64) -> Result<(), ConfigError> {
    if value.is_finite() && value > 0.0 && value < 1e9 {
        Ok(())
    } else {
        Err(ConfigError::at(key, "must be a positive number of seconds"))
    }
}

/// `redis://user:secret@host/0` → `redis://user:***@host/0`.
fn redact_url(raw: &str) -> String {
    match reqwest::Url::parse(raw) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        Ok(url) => url.to_string(),
        Err(_) => "***".into(),
    }
}

#[cfg(test)]
mod tests;
