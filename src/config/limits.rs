//! `[limits]`: what one tenant may hold of a shared gateway (docs/reliability.md, "Tenants").
//! Every key is per tenant, and 0 means no limit.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Requests per second and burst are held below this, so a bucket's arithmetic stays exact.
const MAX_RATE: f64 = 1_000_000.0;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Requests of one tenant in flight at once; the next gets 429.
    pub tenant_concurrency: u32,
    /// Sustained requests per second of one tenant (a token bucket).
    pub tenant_requests_per_second: f64,
    /// The bucket's size: requests a tenant may send at once after a quiet spell; 0 = the rate.
    pub tenant_burst: u32,
    /// Request body bytes one tenant may hold buffered at once; 0 = a fair share of
    /// `max_inflight_body_bytes` ([`LimitsConfig::body_share`]). Applies once any per-tenant
    /// limit is set.
    pub tenant_inflight_body_bytes: u64,
    /// Connections open at once from one source address; the next is answered 429 and closed.
    pub address_connections: u32,
}

impl LimitsConfig {
    /// Whether any per-tenant limit is set (none: requests skip the tenant table entirely).
    pub fn any(&self) -> bool {
        self.tenant_concurrency > 0
            || self.tenant_requests_per_second > 0.0
            || self.tenant_inflight_body_bytes > 0
    }

    /// The body bytes one tenant may hold at once: `tenant_inflight_body_bytes`, or for 0 a
    /// quarter of `max_inflight_body_bytes` (so at least four tenants fill it), never below
    /// `max_body_bytes` (one tenant can always send its largest request) nor above the whole.
    pub fn body_share(&self, max_inflight_body_bytes: u64, max_body_bytes: u64) -> u64 {
        match self.tenant_inflight_body_bytes {
            0 => (max_inflight_body_bytes / 4)
                .max(max_body_bytes)
                .min(max_inflight_body_bytes),
            n => n,
        }
    }

    /// The bucket's size when a rate is set: `tenant_burst`, else the rate itself (at least 1).
    pub fn burst(&self) -> f64 {
        match self.tenant_burst {
            0 => self.tenant_requests_per_second.ceil().max(1.0),
            b => f64::from(b),
        }
    }

    /// Checks the keys, given the body limits they share (`max_body_bytes`).
    pub(super) fn validate(&self, max_body_bytes: u64) -> Result<(), ConfigError> {
        let rate = self.tenant_requests_per_second;
        if !rate.is_finite() || !(0.0..=MAX_RATE).contains(&rate) {
            return Err(ConfigError::at(
                "limits.tenant_requests_per_second",
                format!("must be from 0 (no limit) to {MAX_RATE}"),
            ));
        }
        if self.tenant_burst > 0 && rate == 0.0 {
            return Err(ConfigError::at(
                "limits.tenant_burst",
                "sizes the bucket of tenant_requests_per_second, which is 0 (no limit): set the rate too, or leave the burst at 0",
            ));
        }
        if f64::from(self.tenant_burst) > MAX_RATE {
            return Err(ConfigError::at(
                "limits.tenant_burst",
                format!("must be at most {MAX_RATE}"),
            ));
        }
        if self.tenant_inflight_body_bytes > 0 && self.tenant_inflight_body_bytes < max_body_bytes {
            return Err(ConfigError::at(
                "limits.tenant_inflight_body_bytes",
                format!("is below max_body_bytes ({max_body_bytes}): a tenant could never send its largest request; raise it, lower max_body_bytes, or set 0 for a fair share"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_say_what_to_change_when_they_cannot_work() {
        assert!(LimitsConfig::default().validate(1 << 20).is_ok());
        assert!(!LimitsConfig::default().any());
        let bad = [
            LimitsConfig {
                tenant_requests_per_second: -1.0,
                ..Default::default()
            },
            LimitsConfig {
                tenant_requests_per_second: f64::NAN,
                ..Default::default()
            },
            LimitsConfig {
                tenant_burst: 5,
                ..Default::default()
            },
            LimitsConfig {
                tenant_inflight_body_bytes: 1 << 20,
                ..Default::default()
            },
        ];
        for limits in bad {
            let err = limits.validate(2 << 20).unwrap_err();
            assert!(err.key.starts_with("limits."), "{err:?}");
        }
        let rate = LimitsConfig {
            tenant_requests_per_second: 2.5,
            ..Default::default()
        };
        assert!(rate.any());
        assert_eq!(rate.burst(), 3.0);
        let addresses = LimitsConfig {
            address_connections: 10,
            ..Default::default()
        };
        assert!(addresses.validate(1 << 20).is_ok());
        let bytes = LimitsConfig {
            tenant_inflight_body_bytes: 64 << 20,
            ..Default::default()
        };
        assert!(bytes.any() && bytes.validate(64 << 20).is_ok());
        assert_eq!(bytes.body_share(256 << 20, 32 << 20), 64 << 20);
    }

    /// SPEC 9.1 `tenant_inflight_body_bytes = 0`: a quarter of the whole, never below one
    /// largest request, never above the whole.
    #[test]
    fn the_fair_body_share_is_a_quarter_within_bounds() {
        let fair = LimitsConfig::default();
        assert_eq!(fair.body_share(256 << 20, 32 << 20), 64 << 20);
        assert_eq!(fair.body_share(256 << 20, 100 << 20), 100 << 20);
        assert_eq!(fair.body_share(64 << 20, 64 << 20), 64 << 20);
    }
}
