//! Tenants (SPEC section 1, S3, S4): who calls, as a SHA-256 fingerprint of the credential. The
//! credential itself is never kept; the fingerprint is never printed.

use http::HeaderMap;
use sha2::{Digest, Sha256};

/// A caller, identified by a fingerprint of its credential.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Tenant([u8; 32]);

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tenant(<redacted>)")
    }
}

impl Tenant {
    /// The tenant of a request's credential: its `x-api-key` or `x-goog-api-key`, else its
    /// `Authorization` bearer token (the same key sent any way is the same tenant). An empty or
    /// blank value counts as absent, so it never wins over a present one. `None` without a
    /// credential.
    pub fn of_request(headers: &HeaderMap) -> Option<Tenant> {
        let api_key = headers.get("x-api-key").map(|v| v.as_bytes());
        let goog_key = headers.get("x-goog-api-key").map(|v| v.as_bytes());
        let bearer = headers.get(http::header::AUTHORIZATION).map(|v| {
            // `Bearer ` with nothing after it reaches us as `Bearer` (the parser trims the
            // space): the scheme alone is no credential.
            let v = v.as_bytes().trim_ascii();
            match v.get(..6) {
                Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer") => match v.get(6) {
                    None => &[][..],
                    Some(b' ' | b'\t') => &v[7..],
                    Some(_) => v,
                },
                _ => v,
            }
        });
        [api_key, goog_key, bearer]
            .into_iter()
            .flatten()
            .find(|c| !c.trim_ascii().is_empty())
            .map(Tenant::from_credential)
    }

    /// The tenant a route names for requests without a credential (`routes.tenant`).
    pub fn named(name: &str) -> Tenant {
        let mut h = Sha256::new();
        h.update(b"sluice-named-tenant\0");
        h.update(name.as_bytes());
        Tenant(h.finalize().into())
    }

    /// Whose share a request without a credential and without a route's named tenant counts
    /// against (`[limits]`): its source address's. Only shares are kept under it, never data.
    pub fn of_address(ip: std::net::IpAddr) -> Tenant {
        let mut h = Sha256::new();
        h.update(b"sluice-address-tenant\0");
        h.update(ip.to_string().as_bytes());
        Tenant(h.finalize().into())
    }

    /// The tenant of requests without a credential and without a named tenant: they share it,
    /// so sluice's own endpoints refuse them (401) and only in-band reads reach their artifacts.
    pub fn anonymous() -> Tenant {
        // Hashed once: every request without a credential is of this tenant.
        static ANONYMOUS: std::sync::LazyLock<Tenant> =
            std::sync::LazyLock::new(|| Tenant::from_credential(b""));
        ANONYMOUS.clone()
    }

    pub fn from_credential(credential: &[u8]) -> Tenant {
        let mut h = Sha256::new();
        h.update(b"sluice-tenant\0");
        h.update(credential.trim_ascii());
        Tenant(h.finalize().into())
    }

    /// Key material for tenant-scoped MACs and ids. Never leaves the process.
    pub fn key(&self) -> &[u8; 32] {
        &self.0
    }

    /// A name for the tenant's storage namespace; reveals neither credential nor fingerprint.
    pub fn namespace(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"sluice-namespace\0");
        h.update(self.0);
        let digest = h.finalize();
        digest[..16].iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn one_key_one_tenant_however_it_is_sent() {
        let a = Tenant::of_request(&headers(&[("x-api-key", "sk-1")])).unwrap();
        let b = Tenant::of_request(&headers(&[("authorization", "Bearer sk-1")])).unwrap();
        let c = Tenant::of_request(&headers(&[("authorization", "bearer sk-2")])).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(Tenant::of_request(&HeaderMap::new()), None);
        // An empty key never wins over a present bearer token.
        let d = Tenant::of_request(&headers(&[
            ("x-api-key", " "),
            ("authorization", "Bearer sk-1"),
        ]));
        assert_eq!(d, Some(a.clone()));
        assert_eq!(
            Tenant::of_request(&headers(&[("x-api-key", ""), ("authorization", "Bearer ")])),
            None
        );
        // The scheme alone, as it arrives once the parser trimmed `Bearer `'s space (S3: 401).
        for bare in ["Bearer", "bearer  ", "BEARER\t"] {
            assert_eq!(
                Tenant::of_request(&headers(&[("authorization", bare)])),
                None,
                "{bare:?}"
            );
        }
        assert!(Tenant::of_request(&headers(&[("authorization", "Bearerish")])).is_some());
        assert_ne!(Tenant::named("sidecar"), Tenant::anonymous());
        assert_eq!(format!("{a:?}"), "Tenant(<redacted>)");
        assert_eq!(a.namespace().len(), 32);
        assert!(!a.namespace().contains("sk-1"));
    }
}
