//! sluice: a gateway between AI agents and LLM provider APIs.
//!
//! An agent points its SDK's base URL at sluice. sluice forwards each request to the provider,
//! but first *projects* it: tool output and images are kept within fixed budgets, and per
//! session sluice remembers what the model has already seen. The request path is described once,
//! in [`server`]; data flows from the edges (sockets, stores) inward to the pure projection and
//! back out as byte edits spliced into the original request.
//!
//! - [`config`]: defaults < TOML file < `SLUICE_` environment, validated with dotted key paths.
//! - [`server`]: listeners, dispatch, admin endpoints, graceful shutdown.
//! - [`dialect`]: the three wire APIs; reads a request into a [`projection::RequestView`].
//! - [`projection`]: the view, the edits, the splice (pure).
//! - [`exit`]: the text exit: budgets, pages, notices, cursors (pure).
//! - [`read`]: the read tool sluice offers the model and answers itself (Continue, C1–C4).
//! - [`store`]: artifact stores (embedded files; Redis in shared mode).
//! - [`tenant`]: who calls, as a fingerprint of the credential.
//! - [`route`]: dialect + model glob → upstream.
//! - [`upstream`]: pooled client, header policy, streamed relay.
//! - [`encoding`]: content codings sluice decodes (compressed request and response bodies).
//! - [`error`]: sluice's own errors and their dialect-shaped bodies.
//! - [`metrics`]: every Prometheus metric.
//! - [`json`]: panic-free edits of untrusted JSON.

pub mod config;
pub mod dialect;
pub mod encoding;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod image;
pub mod json;
pub mod memo;
pub mod metrics;
pub mod projection;
pub mod read;
pub mod route;
pub mod server;
pub mod store;
pub mod tenant;
pub mod upstream;
