//! A route's configuration (`[[routes]]`, SPEC section 9): its keys, defaults and checks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    AudioConfig, ConfigError, ContextConfig, ExitConfig, ImagesConfig, Lifetime, Modality,
    DEFAULT_MAX_READ_STEPS,
};
use crate::dialect::Dialect;
use crate::projection::policy::Policy;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RouteConfig {
    pub name: String,
    pub dialects: Vec<Dialect>,
    pub models: Vec<String>,
    pub upstream: String,
    pub api_key_env: String,
    /// The tenant of requests on this route that carry no credential (a sidecar whose agent
    /// sends none, with `api_key_env` supplying the provider key); empty: such requests are
    /// projected, but sluice's own endpoints answer them 401.
    pub tenant: String,
    pub input_modalities: Vec<Modality>,
    pub read_tool: String,
    /// Rounds of read calls sluice answers for one request before the model must answer (C2).
    pub max_read_steps: usize,
    pub exit: ExitConfig,
    pub images: ImagesConfig,
    pub audio: AudioConfig,
    pub tool_lifetimes: BTreeMap<String, Lifetime>,
    pub context: ContextConfig,
    pub cache: crate::projection::policy::CacheLimits,
}

impl Default for RouteConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            dialects: Vec::new(),
            models: vec!["*".into()],
            upstream: String::new(),
            api_key_env: String::new(),
            tenant: String::new(),
            input_modalities: vec![Modality::Text, Modality::Image],
            read_tool: "sluice_read".into(),
            max_read_steps: DEFAULT_MAX_READ_STEPS,
            exit: ExitConfig::default(),
            images: ImagesConfig::default(),
            audio: AudioConfig::default(),
            tool_lifetimes: BTreeMap::from([("*screenshot*".to_string(), Lifetime::Recent)]),
            context: ContextConfig::default(),
            cache: Default::default(),
        }
    }
}

impl RouteConfig {
    /// What the projection needs of this route; `read_tool` is the tool's name in the request.
    pub fn policy<'a>(&'a self, read_tool: &'a str) -> Policy<'a> {
        Policy {
            pages: &self.exit,
            images: &self.images,
            accepts_images: self.input_modalities.contains(&Modality::Image),
            audio: &self.audio,
            accepts_audio: self.input_modalities.contains(&Modality::Audio),
            read_tool,
            tool_lifetimes: &self.tool_lifetimes,
            context: &self.context,
            cache: &self.cache,
        }
    }

    pub(super) fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(ConfigError::at(format!("{at}.name"), "is required"));
        }
        if self.dialects.is_empty() {
            return Err(ConfigError::at(
                format!("{at}.dialects"),
                "name at least one of openai-chat, openai-responses, anthropic-messages",
            ));
        }
        if self.models.is_empty() {
            return Err(ConfigError::at(
                format!("{at}.models"),
                "name at least one model glob (\"*\" for all)",
            ));
        }
        for (j, glob) in self.models.iter().enumerate() {
            globset::Glob::new(glob)
                .map_err(|e| ConfigError::at(format!("{at}.models.{j}"), e.kind().to_string()))?;
        }
        let url = reqwest::Url::parse(&self.upstream).map_err(|e| {
            ConfigError::at(
                format!("{at}.upstream"),
                format!("{e} (want a base URL such as https://api.openai.com)"),
            )
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(ConfigError::at(
                format!("{at}.upstream"),
                "must be an http:// or https:// base URL",
            ));
        }
        if !self.api_key_env.is_empty() && std::env::var_os(&self.api_key_env).is_none() {
            return Err(ConfigError::at(
                format!("{at}.api_key_env"),
                format!("environment variable {} is not set", self.api_key_env),
            ));
        }
        if self.read_tool.is_empty()
            || !self
                .read_tool
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            || self.read_tool.len() > 64
        {
            return Err(ConfigError::at(
                format!("{at}.read_tool"),
                "must be 1-64 letters, digits, '_' or '-' (a tool name every provider accepts)",
            ));
        }
        if self.max_read_steps > 16 {
            return Err(ConfigError::at(
                format!("{at}.max_read_steps"),
                "must be at most 16 (each step is a full model call)",
            ));
        }
        if self.exit.max_lines < 2 {
            return Err(ConfigError::at(
                format!("{at}.exit.max_lines"),
                "must be at least 2 (one line of text and the notice)",
            ));
        }
        if self.exit.max_units < 256 {
            return Err(ConfigError::at(
                format!("{at}.exit.max_units"),
                "must be at least 256 (room for the notice)",
            ));
        }
        for (key, batch) in [
            ("images", self.images.prune_batch),
            ("audio", self.audio.prune_batch),
        ] {
            if batch == 0 {
                return Err(ConfigError::at(
                    format!("{at}.{key}.prune_batch"),
                    "must be at least 1",
                ));
            }
        }
        let c = &self.context;
        if !(c.trigger > 0.0 && c.trigger <= 1.0) {
            return Err(ConfigError::at(
                format!("{at}.context.trigger"),
                format!(
                    "is {}; set it above 0 and at most 1 (a share of the window, e.g. 0.9)",
                    c.trigger
                ),
            ));
        }
        if !(c.target > 0.0 && c.target < c.trigger) {
            return Err(ConfigError::at(
                format!("{at}.context.target"),
                format!(
                    "is {}; set it above 0 and below trigger ({}): the guard retires down to less than what sets it off",
                    c.target, c.trigger
                ),
            ));
        }
        if c.enabled() && c.output_tokens() >= c.window_tokens {
            return Err(ConfigError::at(
                format!("{at}.context.output_tokens"),
                format!(
                    "is {}, not below window_tokens ({}), and the output shares the window: set it below {}, or leave it out to follow the window (a quarter of it, up to {})",
                    c.output_tokens(),
                    c.window_tokens,
                    c.window_tokens,
                    crate::projection::policy::DEFAULT_OUTPUT_TOKENS
                ),
            ));
        }
        for glob in self.tool_lifetimes.keys() {
            globset::Glob::new(glob).map_err(|e| {
                ConfigError::at(format!("{at}.tool_lifetimes.{glob}"), e.kind().to_string())
            })?;
        }
        Ok(())
    }
}
