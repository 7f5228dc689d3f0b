//! The header policy in both directions: hop-by-hop headers never cross, sluice's own
//! `x-sluice-*` headers stay with it, and a route's own credential replaces the client's (S4).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::dialect::Family;
use crate::route::Route;

/// Headers that describe one hop of a connection, never forwarded (RFC 9110 section 7.6.1).
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// `Keep-Alive` (RFC 9112 appendix C.2.2), hop-by-hop too; named once, not parsed per request.
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// Request headers for the upstream, edited in place from the client's: hop-by-hop headers,
/// `host`, `content-length` (recomputed) and sluice's own `x-sluice-*` removed; the credential
/// replaced when the route has its own key (S4).
pub fn request_headers(mut headers: HeaderMap, route: &Route, family: Family) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    if headers.keys().any(|n| n.as_str().starts_with("x-sluice-")) {
        let ours: Vec<HeaderName> = headers
            .keys()
            .filter(|n| n.as_str().starts_with("x-sluice-"))
            .cloned()
            .collect();
        for name in ours {
            headers.remove(name);
        }
    }
    if let Some(key) = &route.api_key {
        headers.remove(header::AUTHORIZATION);
        headers.remove("x-api-key");
        match family {
            Family::OpenAi => {
                let mut bearer =
                    HeaderValue::from_bytes(&[b"Bearer ".as_slice(), key.as_bytes()].concat())
                        .unwrap_or_else(|_| key.clone());
                bearer.set_sensitive(true);
                headers.insert(header::AUTHORIZATION, bearer);
            }
            Family::Anthropic => {
                headers.insert(HeaderName::from_static("x-api-key"), key.clone());
            }
        }
    }
    headers
}

/// Response headers for the client, edited in place from the upstream's: hop-by-hop removed.
pub fn response_headers(mut headers: HeaderMap) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    headers
}

/// Removes the headers that describe one hop of a connection, and those that `Connection` names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most requests and responses carry none: one pass over the names instead of a lookup of
    // each hop-by-hop name (a `Connection` header is one of them).
    let hop = |name: &HeaderName| HOP_BY_HOP.contains(name) || *name == KEEP_ALIVE;
    if !headers.keys().any(hop) {
        return;
    }
    for name in connection_tokens(headers) {
        headers.remove(name.as_str());
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(KEEP_ALIVE);
}

/// Header names listed in `Connection`, which are hop-by-hop too.
fn connection_tokens(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouteConfig;
    use crate::dialect::Dialect;
    use crate::route::RouteTable;

    fn table(api_key_env: &str) -> RouteTable {
        RouteTable::new(&[RouteConfig {
            name: "r".into(),
            dialects: vec![Dialect::OpenAiChat, Dialect::AnthropicMessages],
            upstream: "http://up".into(),
            api_key_env: api_key_env.into(),
            ..RouteConfig::default()
        }])
        .unwrap()
    }

    #[test]
    fn strips_hop_by_hop_and_sluice_headers() {
        let t = table("");
        let route = t.select(Dialect::OpenAiChat, "m").unwrap();
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-custom-hop".parse().unwrap());
        h.insert("x-custom-hop", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("host", "sluice".parse().unwrap());
        h.insert("content-length", "12".parse().unwrap());
        h.insert("x-sluice-session", "s".parse().unwrap());
        h.insert("authorization", "Bearer client".parse().unwrap());
        h.insert("openai-organization", "org".parse().unwrap());
        let out = request_headers(h, route, Family::OpenAi);
        let mut names: Vec<_> = out.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, vec!["authorization", "openai-organization"]);
        assert_eq!(out["authorization"], "Bearer client");
    }

    #[test]
    fn route_key_replaces_client_credential() {
        std::env::set_var("SLUICE_TEST_ROUTE_KEY", "sk-route");
        let t = table("SLUICE_TEST_ROUTE_KEY");
        let route = t.select(Dialect::OpenAiChat, "m").unwrap();
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer client".parse().unwrap());
        h.insert("x-api-key", "client".parse().unwrap());
        let out = request_headers(h.clone(), route, Family::OpenAi);
        assert_eq!(out["authorization"], "Bearer sk-route");
        assert!(out.get("x-api-key").is_none());
        assert!(out["authorization"].is_sensitive());
        let out = request_headers(h, route, Family::Anthropic);
        assert_eq!(out["x-api-key"], "sk-route");
        assert!(out.get("authorization").is_none());
    }
}
