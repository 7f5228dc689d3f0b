//! sluice's own errors and the one place that turns each into a status and a dialect-shaped
//! body (SPEC P4). The match is exhaustive, so a new variant must choose its status.

use bytes::Bytes;
use http::StatusCode;

use crate::dialect::Family;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("request body is not valid JSON: {0}")]
    BadJson(String),
    #[error("request body exceeds the limit of {limit} bytes")]
    BodyTooLarge { limit: u64 },
    #[error("could not read the request body")]
    ClientBody,
    #[error("the request body did not arrive in time (within {seconds} s, at 1 KiB/s or more after the first 5 s)")]
    BodyTimeout { seconds: f64 },
    #[error("sluice is holding as many request bodies as it may; try again shortly")]
    Overloaded,
    #[error("the request body's content-encoding {0:?} is not supported (gzip, deflate, br, zstd or identity)")]
    UnsupportedEncoding(String),
    #[error("the request body cannot be decoded: {0}")]
    BadEncoding(String),
    #[error("no route for dialect {dialect} and model {model:?}")]
    NoRoute {
        dialect: &'static str,
        model: String,
    },
    #[error("no such endpoint: {0}")]
    NotFound(String),
    #[error("upstream is unreachable")]
    UpstreamUnreachable,
    #[error("upstream did not answer within {0}")]
    UpstreamTimeout(&'static str),
    #[error("the artifact store is unavailable")]
    StoreUnavailable,
    #[error("the cursor is malformed")]
    BadCursor,
    #[error("a credential (Authorization or x-api-key) is needed to read sluice's artifacts")]
    Unauthorized,
    #[error(
        "over this gateway's per-client {limit} limit ([limits]); retry after {retry_after} s"
    )]
    TenantLimited {
        /// Which share: one of [`TENANT_LIMITS`].
        limit: &'static str,
        /// Seconds until a retry would be admitted (at least 1).
        retry_after: u64,
    },
    #[error("internal error")]
    Internal,
}

/// The per-tenant shares a request can be refused for (`[limits]`), as metric labels.
/// `address` is a connection refused before any request: its source address held its cap.
pub const TENANT_LIMITS: [&str; 4] = ["concurrency", "rate", "body", "address"];

impl GatewayError {
    /// Every value `kind` returns, so the error counter starts at zero for each (alert rules
    /// then see a series before the first error).
    pub const KINDS: [&'static str; 16] = [
        "bad_json",
        "body_too_large",
        "client_body",
        "body_timeout",
        "overloaded",
        "unsupported_encoding",
        "bad_encoding",
        "no_route",
        "not_found",
        "upstream_unreachable",
        "upstream_timeout",
        "store_unavailable",
        "bad_cursor",
        "unauthorized",
        "tenant_limited",
        "internal",
    ];

    /// Low-cardinality name for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            GatewayError::BadJson(_) => "bad_json",
            GatewayError::BodyTooLarge { .. } => "body_too_large",
            GatewayError::ClientBody => "client_body",
            GatewayError::BodyTimeout { .. } => "body_timeout",
            GatewayError::Overloaded => "overloaded",
            GatewayError::UnsupportedEncoding(_) => "unsupported_encoding",
            GatewayError::BadEncoding(_) => "bad_encoding",
            GatewayError::NoRoute { .. } => "no_route",
            GatewayError::NotFound(_) => "not_found",
            GatewayError::UpstreamUnreachable => "upstream_unreachable",
            GatewayError::UpstreamTimeout(_) => "upstream_timeout",
            GatewayError::StoreUnavailable => "store_unavailable",
            GatewayError::BadCursor => "bad_cursor",
            GatewayError::Unauthorized => "unauthorized",
            GatewayError::TenantLimited { .. } => "tenant_limited",
            GatewayError::Internal => "internal",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::BadJson(_)
            | GatewayError::ClientBody
            | GatewayError::BadEncoding(_)
            | GatewayError::BadCursor => StatusCode::BAD_REQUEST,
            GatewayError::UnsupportedEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            GatewayError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            GatewayError::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::Unauthorized => StatusCode::UNAUTHORIZED,
            GatewayError::TenantLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            GatewayError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::NoRoute { .. } | GatewayError::NotFound(_) => StatusCode::NOT_FOUND,
            GatewayError::UpstreamUnreachable => StatusCode::BAD_GATEWAY,
            GatewayError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The body in `family`'s error shape. Client errors say what was wrong; server errors say
    /// little (the log has the rest).
    pub fn body(&self, family: Family) -> Bytes {
        let message = format!("sluice: {self}");
        family.error_body(self.status(), self.kind(), &message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_a_fitting_status_and_shape() {
        let cases = [
            (GatewayError::BadJson("x".into()), 400),
            (GatewayError::BodyTooLarge { limit: 1 }, 413),
            (GatewayError::ClientBody, 400),
            (GatewayError::BodyTimeout { seconds: 1.0 }, 408),
            (GatewayError::Overloaded, 503),
            (GatewayError::UnsupportedEncoding("compress".into()), 415),
            (GatewayError::BadEncoding("cut".into()), 400),
            (
                GatewayError::NoRoute {
                    dialect: "openai-chat",
                    model: "m".into(),
                },
                404,
            ),
            (GatewayError::NotFound("/x".into()), 404),
            (GatewayError::UpstreamUnreachable, 502),
            (GatewayError::UpstreamTimeout("first byte"), 504),
            (GatewayError::StoreUnavailable, 503),
            (GatewayError::BadCursor, 400),
            (GatewayError::Unauthorized, 401),
            (
                GatewayError::TenantLimited {
                    limit: "rate",
                    retry_after: 2,
                },
                429,
            ),
            (GatewayError::Internal, 500),
        ];
        for (err, status) in cases {
            assert_eq!(err.status().as_u16(), status, "{err}");
            let v: serde_json::Value = serde_json::from_slice(&err.body(Family::OpenAi)).unwrap();
            assert_eq!(v["error"]["code"], err.kind());
            let v: serde_json::Value =
                serde_json::from_slice(&err.body(Family::Anthropic)).unwrap();
            assert_eq!(v["type"], "error");
            assert!(v["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("sluice: "));
        }
    }
}
