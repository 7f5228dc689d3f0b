//! Routing: the first route whose dialects include the request's dialect and whose model globs
//! match its model (SPEC section 9, "first match wins").

use globset::{Glob, GlobSet, GlobSetBuilder};
use http::HeaderValue;

use crate::config::{ConfigError, RouteConfig};
use crate::dialect::{Dialect, Family};

/// A configured route, compiled for matching and forwarding.
pub struct Route {
    pub config: RouteConfig,
    models: GlobSet,
    /// The base URL's scheme and authority, parsed once for every request's URI.
    origin: (http::uri::Scheme, http::uri::Authority),
    /// The base URL's path without its trailing `/` (empty for none): the request path's prefix.
    prefix: String,
    /// The `Host` header of every request to a plain `http` upstream (its host, and its port
    /// when that is not 80), made once here rather than per request by the upstream pool.
    /// `None` for `https`, whose connection may be h2, where the authority goes as
    /// `:authority` and the pool sets `Host` only when it speaks HTTP/1.1.
    pub host: Option<HeaderValue>,
    /// The route's own credential (from `api_key_env`), marked sensitive so it is never printed.
    pub api_key: Option<HeaderValue>,
    /// The tenant of requests without a credential (`tenant`), if the route names one.
    pub tenant: Option<crate::tenant::Tenant>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("name", &self.config.name)
            .field("base", &self.config.upstream)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Route {
    /// The upstream URI for a request: the base URL with the request's path appended and its
    /// query kept. Built from the parsed base, so the host is not parsed again per request, and
    /// without a base path the client's path and query are taken as they are (not parsed).
    pub fn uri(&self, uri: &http::Uri) -> Result<http::Uri, http::Error> {
        let path_and_query = match uri.path_and_query() {
            Some(pq) if self.prefix.is_empty() => pq.clone(),
            asked => {
                let asked = asked.map_or("/", http::uri::PathAndQuery::as_str);
                http::uri::PathAndQuery::try_from(format!("{}{asked}", self.prefix))?
            }
        };
        let (scheme, authority) = self.origin.clone();
        http::Uri::builder()
            .scheme(scheme)
            .authority(authority)
            .path_and_query(path_and_query)
            .build()
    }
}

/// `Host` for an HTTP/1.1 request to `authority`: its host and, unless it is the scheme's
/// `default` port, its port (never a user name or password a URL carried); what hyper-util's
/// client sent.
pub fn host_header(authority: &http::uri::Authority, default: u16) -> Option<HeaderValue> {
    let host = authority.host();
    match authority.port_u16() {
        Some(port) if port != default => HeaderValue::from_str(&format!("{host}:{port}")).ok(),
        _ => HeaderValue::from_str(host).ok(),
    }
}

pub struct RouteTable {
    routes: Vec<Route>,
}

impl RouteTable {
    /// Compiles the routes; reads each `api_key_env` from the environment once, at startup.
    pub fn new(configs: &[RouteConfig]) -> Result<Self, ConfigError> {
        let mut routes = Vec::with_capacity(configs.len());
        for (i, config) in configs.iter().enumerate() {
            if config.context.enabled() {
                // The tokenizers' tables load on first use: at startup, not in a request.
                use crate::tokens::Tokenizer;
                config.context.tokenizer.unwrap_or(Tokenizer::O200k).warm();
            }
            let mut set = GlobSetBuilder::new();
            for (j, glob) in config.models.iter().enumerate() {
                let glob = Glob::new(glob).map_err(|e| ConfigError {
                    key: format!("routes.{i}.models.{j}"),
                    message: e.kind().to_string(),
                })?;
                set.add(glob);
            }
            let models = set.build().map_err(|e| ConfigError {
                key: format!("routes.{i}.models"),
                message: e.to_string(),
            })?;
            let api_key = if config.api_key_env.is_empty() {
                None
            } else {
                let key = std::env::var(&config.api_key_env).map_err(|_| ConfigError {
                    key: format!("routes.{i}.api_key_env"),
                    message: format!("environment variable {} is not set", config.api_key_env),
                })?;
                let mut value = HeaderValue::from_str(key.trim()).map_err(|_| ConfigError {
                    key: format!("routes.{i}.api_key_env"),
                    message: "the key is not a valid header value".into(),
                })?;
                value.set_sensitive(true);
                Some(value)
            };
            let base = config.upstream.trim_end_matches('/').to_string();
            let base_url = reqwest::Url::parse(&base).map_err(|e| ConfigError {
                key: format!("routes.{i}.upstream"),
                message: e.to_string(),
            })?;
            let bad = |message: String| ConfigError {
                key: format!("routes.{i}.upstream"),
                message,
            };
            let parsed: http::Uri = base_url
                .as_str()
                .parse()
                .map_err(|e: http::uri::InvalidUri| bad(e.to_string()))?;
            let origin = match (parsed.scheme(), parsed.authority()) {
                (Some(scheme), Some(authority)) => (scheme.clone(), authority.clone()),
                _ => return Err(bad("an upstream URL needs a scheme and a host".into())),
            };
            let prefix = parsed.path().trim_end_matches('/').to_string();
            let host = (origin.0 == http::uri::Scheme::HTTP)
                .then(|| host_header(&origin.1, 80))
                .flatten();
            routes.push(Route {
                origin,
                prefix,
                host,
                config: config.clone(),
                models,
                api_key,
                tenant: (!config.tenant.is_empty())
                    .then(|| crate::tenant::Tenant::named(&config.tenant)),
            });
        }
        Ok(Self { routes })
    }

    /// The route for a projected request. A request without a model matches as the empty name.
    pub fn select(&self, dialect: Dialect, model: &str) -> Option<&Route> {
        self.place(dialect, model).map(|(_, route)| route)
    }

    /// [`RouteTable::select`], with the route's place in the table (see [`RouteTable::get`]).
    pub fn place(&self, dialect: Dialect, model: &str) -> Option<(usize, &Route)> {
        self.routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.config.dialects.contains(&dialect) && r.models.is_match(model))
    }

    /// The route at a place [`RouteTable::place`] gave.
    pub fn get(&self, place: usize) -> Option<&Route> {
        self.routes.get(place)
    }

    /// Whether a `dialect` body of `bytes` bytes may reach the context guard's trigger on some
    /// route (at the route's default output): its front then runs on the blocking pool, where
    /// its tokens are counted without reading its view twice (docs/context-guard.md).
    pub fn may_guard(&self, dialect: Dialect, bytes: usize) -> bool {
        let most = crate::tokens::Tokenizer::most_for_bytes(bytes);
        self.routes.iter().any(|r| {
            let c = &r.config.context;
            c.enabled()
                && r.config.dialects.contains(&dialect)
                && most as f64
                    >= c.window_tokens.saturating_sub(c.output_tokens()) as f64 * c.trigger
        })
    }

    /// The route for a pass-through request (P5): the first that serves a dialect of `family`.
    pub fn select_family(&self, family: Family) -> Option<&Route> {
        self.routes
            .iter()
            .find(|r| r.config.dialects.iter().any(|d| d.family() == family))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, dialects: &[Dialect], models: &[&str]) -> RouteConfig {
        RouteConfig {
            name: name.into(),
            dialects: dialects.to_vec(),
            models: models.iter().map(|m| m.to_string()).collect(),
            upstream: format!("http://{name}.example/"),
            ..RouteConfig::default()
        }
    }

    #[test]
    fn first_matching_route_wins() {
        let table = RouteTable::new(&[
            route("mini", &[Dialect::OpenAiChat], &["gpt-*-mini", "o?-mini"]),
            route(
                "openai",
                &[Dialect::OpenAiChat, Dialect::OpenAiResponses],
                &["*"],
            ),
            route("claude", &[Dialect::AnthropicMessages], &["claude-*"]),
        ])
        .unwrap();
        let name = |d, m| table.select(d, m).map(|r| r.config.name.clone());
        assert_eq!(
            name(Dialect::OpenAiChat, "gpt-4o-mini").as_deref(),
            Some("mini")
        );
        assert_eq!(
            name(Dialect::OpenAiChat, "o3-mini").as_deref(),
            Some("mini")
        );
        assert_eq!(
            name(Dialect::OpenAiChat, "gpt-4o").as_deref(),
            Some("openai")
        );
        assert_eq!(
            name(Dialect::OpenAiResponses, "").as_deref(),
            Some("openai")
        );
        assert_eq!(name(Dialect::AnthropicMessages, "gpt-4o"), None);
        let root: http::Uri = "/".parse().unwrap();
        assert_eq!(
            table
                .select(Dialect::OpenAiChat, "x")
                .unwrap()
                .uri(&root)
                .unwrap(),
            "http://openai.example/"
        );
        assert_eq!(
            table.select_family(Family::Anthropic).unwrap().config.name,
            "claude"
        );
    }

    #[test]
    fn base_paths_prefix_the_request_path() {
        let mut gw = route("gw", &[Dialect::OpenAiChat], &["*"]);
        gw.upstream = "https://gw.example/openai/".into();
        let mut direct = route("direct", &[Dialect::AnthropicMessages], &["*"]);
        direct.upstream = "http://127.0.0.1:8080".into();
        let table = RouteTable::new(&[gw, direct]).unwrap();
        let uri: http::Uri = "/v1/chat/completions?beta=true".parse().unwrap();
        assert_eq!(
            table
                .select(Dialect::OpenAiChat, "m")
                .unwrap()
                .uri(&uri)
                .unwrap(),
            "https://gw.example/openai/v1/chat/completions?beta=true"
        );
        // Without a base path the client's own path and query go as they came.
        assert_eq!(
            table
                .select(Dialect::AnthropicMessages, "m")
                .unwrap()
                .uri(&uri)
                .unwrap(),
            "http://127.0.0.1:8080/v1/chat/completions?beta=true"
        );
    }
}
