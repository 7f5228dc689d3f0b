//! sluice: a gateway between AI agents and LLM provider APIs.
//!
//! An agent points its SDK's base URL at sluice. sluice forwards each request to the provider,
//! but first *projects* it: tool output and images are kept within fixed budgets, and per
//! session sluice remembers what the model has already seen. docs/architecture.md maps the
//! modules, their import order and the request's stages.
//!
//! The pure core:
//! - [`projection`]: the view, the text exit, images, the delivery state, the plan (no I/O).
//!
//! Around it:
//! - [`dialect`]: the three wire APIs; reads a request into a view, writes the core's decisions.
//! - [`read`]: the read tool sluice offers the model and answers itself (Continue, C1–C5).
//! - [`memo`]: the caches the core consults through its `Memos` trait.
//! - [`config`]: defaults < TOML file < `SLUICE_` environment, validated with dotted key paths.
//! - [`store`]: artifact stores (embedded files; Redis in shared mode) and session state.
//! - [`route`]: dialect + model glob → upstream.
//! - [`upstream`]: per-worker pooled client, header policy, streamed relay.
//! - [`server`]: listeners, dispatch, the request's stages, admin endpoints, shutdown.
//! - [`encoding`]: content codings sluice decodes (compressed request and response bodies).
//! - [`error`]: sluice's own errors and their dialect-shaped bodies.
//! - [`metrics`]: every Prometheus metric.
//! - [`replay`]: `sluice replay`, recorded requests through a throwaway sluice.
//! - [`inspect`]: turn records, savings, the session API's data (docs/inspector.md).
//! - Leaves: [`tenant`] (who calls, as a fingerprint of the credential), [`image`] (checks,
//!   downscaling), [`audio`] (checks), [`json`] (panic-free edits of untrusted JSON), [`tokens`] (token estimates).

pub mod audio;
pub mod config;
pub mod dialect;
pub mod encoding;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod image;
pub mod inspect;
pub mod json;
pub mod memo;
pub mod metrics;
pub mod projection;
pub mod read;
pub mod replay;
pub mod route;
pub mod server;
pub mod store;
pub mod tenant;
pub mod tokens;
pub mod upstream;
