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
/// `content-length` (recomputed) and sluice's own `x-sluice-*` removed; `host` the upstream's
/// (made once per route for a plain `http` one, else left to the client); the credential
/// replaced when the route has its own key (S4).
pub fn request_headers(mut headers: HeaderMap, route: &Route, family: Family) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    match &route.host {
        Some(host) => headers.insert(header::HOST, host.clone()),
        None => headers.remove(header::HOST),
    };
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
        for name in crate::dialect::CREDENTIAL_HEADERS {
            headers.remove(name);
        }
        let (name, value) = family.credential(key);
        headers.insert(name, value);
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
    // Most requests carry none, and an HTTP/1.1 provider's answers only `Connection:
    // keep-alive`: one pass over the names notes which are here (a bit each, `keep-alive` the
    // last), and only those are removed. Nothing is allocated unless `Connection` names a
    // header besides those.
    let mut here = 0u8;
    for name in headers.keys() {
        if *name == KEEP_ALIVE {
            here |= 1 << HOP_BY_HOP.len();
        } else if let Some(i) = HOP_BY_HOP.iter().position(|hop| hop == name) {
            here |= 1 << i;
        }
    }
    if here == 0 {
        return;
    }
    // The names `Connection` lists (RFC 9110 section 7.6.1), besides those removed below.
    fn others<'v>(values: impl Iterator<Item = &'v HeaderValue>) -> impl Iterator<Item = &'v str> {
        values
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty() && !is_hop_by_hop(t))
    }
    if others(headers.get_all(header::CONNECTION).iter())
        .next()
        .is_some()
    {
        let listed: Vec<HeaderValue> = headers
            .get_all(header::CONNECTION)
            .iter()
            .cloned()
            .collect();
        for token in others(listed.iter()) {
            headers.remove(token);
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if here & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    if here & (1 << HOP_BY_HOP.len()) != 0 {
        headers.remove(KEEP_ALIVE);
    }
}

/// Whether `token` names a header [`strip_hop_by_hop`] removes anyway (any case).
fn is_hop_by_hop(token: &str) -> bool {
    token.eq_ignore_ascii_case(KEEP_ALIVE.as_str())
        || HOP_BY_HOP
            .iter()
            .any(|name| token.eq_ignore_ascii_case(name.as_str()))
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
        assert_eq!(names, vec!["authorization", "host", "openai-organization"]);
        assert_eq!(out["authorization"], "Bearer client");
        // The client's `Host` named sluice; the upstream gets its own.
        assert_eq!(out["host"], "up");
    }

    #[test]
    fn host_is_the_upstreams_own_for_plain_http_and_left_to_the_client_for_https() {
        for (base, host) in [
            ("http://up", Some("up")),
            ("http://up:80/v1", Some("up")),
            (
                "http://user:secret@127.0.0.1:18101",
                Some("127.0.0.1:18101"),
            ),
            ("http://[::1]:8080", Some("[::1]:8080")),
            ("https://api.example.com", None),
            ("https://api.example.com:8443", None),
        ] {
            let t = RouteTable::new(&[RouteConfig {
                name: "r".into(),
                dialects: vec![Dialect::OpenAiChat],
                upstream: base.into(),
                ..RouteConfig::default()
            }])
            .unwrap();
            let route = t.select(Dialect::OpenAiChat, "m").unwrap();
            let mut h = HeaderMap::new();
            h.insert("host", "sluice:8080".parse().unwrap());
            let out = request_headers(h, route, Family::OpenAi);
            assert_eq!(out.get("host").map(|v| v.to_str().unwrap()), host, "{base}");
        }
    }

    #[test]
    fn a_response_loses_exactly_its_hop_by_hop_headers() {
        let mut h = HeaderMap::new();
        h.insert("connection", "Keep-Alive, X-Hop, close".parse().unwrap());
        h.append("connection", "upgrade".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-hop", "1".parse().unwrap());
        h.insert("close", "named by a token".parse().unwrap());
        h.insert("upgrade", "h2c".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("content-type", "text/event-stream".parse().unwrap());
        h.insert("x-request-id", "r".parse().unwrap());
        let out = response_headers(h);
        let mut names: Vec<_> = out.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, vec!["content-type", "x-request-id"]);
        // What an HTTP/1.1 provider sends: only `Connection` goes.
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive".parse().unwrap());
        h.insert("content-length", "2".parse().unwrap());
        let out = response_headers(h);
        assert_eq!(
            out.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            ["content-length"]
        );
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
