//! What the core may remember between requests, as a trait: the caches themselves live outside
//! the core (`crate::memo`), and [`Fresh`] remembers nothing (tests, fuzzing, tools that
//! project one request).

use std::sync::Arc;

use super::attach::extract::{self, Extracted};
use super::attach::{self, Item};
use super::exit::Memoized;
use super::shapes::Shapes;
use super::view::{Raw, ToolResult};
use crate::image::{Checked, Refusal};
use crate::tenant::Tenant;

/// The memos projection consults. Every answer must equal what [`Fresh`] computes.
pub trait Memos: Sync {
    /// Seeds the text exit's memo keys (per process, so keys are unguessable).
    fn seed(&self) -> u64;
    /// A tool result's text-exit outcome remembered under `key` (see `exit::project`).
    fn page(&self, key: u128) -> Option<Memoized>;
    /// The images of a tool result (`None`: it holds none).
    fn tool_images(
        &self,
        shapes: &dyn Shapes,
        result: &ToolResult<'_>,
        tenant: &Tenant,
    ) -> Option<Arc<Extracted>>;
    /// What [`Memos::tool_images`] answered for this content before, if it is remembered;
    /// computes nothing.
    fn known_tool_images(
        &self,
        shapes: &dyn Shapes,
        result: &ToolResult<'_>,
        tenant: &Tenant,
    ) -> Option<Option<Arc<Extracted>>>;
    /// A user message's image part, number `k` of its message, checked.
    fn user_image(
        &self,
        shapes: &dyn Shapes,
        part: Raw<'_>,
        k: usize,
        tenant: &Tenant,
    ) -> Option<Arc<Item>>;
    /// Whether `name` matches the glob `pattern` (an invalid glob matches nothing).
    fn glob_matches(&self, pattern: &str, name: &str) -> bool;
    /// The token count remembered under `key` (the context guard's estimate, per fragment).
    fn tokens(&self, key: u128) -> Option<u64>;
    /// Remembers a token count.
    fn keep_tokens(&self, key: u128, tokens: u64);
    /// [`attach::shrink`].
    fn shrink(
        &self,
        image: &Checked,
        max_dimension: u32,
        max_bytes: u64,
    ) -> Result<Checked, Refusal>;
}

/// Memos that remember nothing: every answer computed afresh.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fresh;

impl Memos for Fresh {
    fn seed(&self) -> u64 {
        0
    }

    fn page(&self, _: u128) -> Option<Memoized> {
        None
    }

    fn tool_images(
        &self,
        shapes: &dyn Shapes,
        result: &ToolResult<'_>,
        tenant: &Tenant,
    ) -> Option<Arc<Extracted>> {
        extract::from_result(shapes, result.content, tenant).map(Arc::new)
    }

    fn known_tool_images(
        &self,
        _: &dyn Shapes,
        _: &ToolResult<'_>,
        _: &Tenant,
    ) -> Option<Option<Arc<Extracted>>> {
        None
    }

    fn user_image(
        &self,
        shapes: &dyn Shapes,
        part: Raw<'_>,
        k: usize,
        tenant: &Tenant,
    ) -> Option<Arc<Item>> {
        extract::user_part(shapes, part, k, tenant).map(Arc::new)
    }

    fn glob_matches(&self, pattern: &str, name: &str) -> bool {
        globset::Glob::new(pattern).is_ok_and(|g| g.compile_matcher().is_match(name))
    }

    fn tokens(&self, _: u128) -> Option<u64> {
        None
    }

    fn keep_tokens(&self, _: u128, _: u64) {}

    fn shrink(
        &self,
        image: &Checked,
        max_dimension: u32,
        max_bytes: u64,
    ) -> Result<Checked, Refusal> {
        attach::shrink(image, max_dimension, max_bytes)
    }
}
