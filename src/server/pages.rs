//! Pages of stored texts (SPEC T5), for the read tool's rounds and `GET /v1/sluice/read`.
//!
//! A text the artifact cache can hold (up to 8 MiB) is read whole and paged. A larger one (a
//! 60 MB build log) never is: its index (`exit::index`: totals and a mark every 64 KiB) is
//! built once per process from the store in 8 MiB ranges, and each page is cut from a window
//! of about 150 KB read as a range. Scanning more than a window runs on the heavy threads.

use std::sync::Arc;

use bytes::Bytes;

use crate::projection::exit::cursor::Cursor;
use crate::projection::exit::index::{IndexBuilder, TextIndex, Window};
use crate::projection::exit::notice::{self, Rendered};
use crate::projection::exit::text::Lines;
use crate::store::{ArtifactId, StoreError, WHOLE_UP_TO};
use crate::tenant::Tenant;

use super::App;

/// A whole text this long or shorter is paged on the I/O thread; a longer one is scanned on a
/// heavy thread.
const PAGED_IN_PLACE: usize = 256 * 1024;

/// What a cursor read.
pub(super) enum Paged {
    Page(Rendered),
    /// The cursor does not read the stored text (its recorded range, T5).
    NotThisText,
    /// No such artifact (expired, or never stored for this tenant).
    Missing,
}

/// A text artifact as the pager holds it.
enum Text {
    Whole(Bytes),
    Indexed(Arc<TextIndex>),
    /// Stored bytes that are not UTF-8.
    Invalid,
}

impl App {
    /// The page `cursor` reads of `tenant`'s text, naming `read_tool` as the way on.
    pub(super) async fn read_page(
        &self,
        tenant: &Tenant,
        cursor: &Cursor,
        read_tool: &str,
    ) -> Result<Paged, StoreError> {
        let id = cursor.artifact;
        let text = match self.artifacts.cached(tenant, &id) {
            Some(bytes) => Text::Whole(bytes),
            None => match self.artifacts.index(tenant, &id) {
                Some(index) => Text::Indexed(index),
                None => match self.text_of(tenant, &id).await? {
                    Some(text) => text,
                    None => return Ok(Paged::Missing),
                },
            },
        };
        match text {
            Text::Whole(bytes) => Ok(self.page_whole(bytes, tenant, cursor, read_tool).await),
            Text::Indexed(index) => self.page_window(&index, tenant, cursor, read_tool).await,
            Text::Invalid => Ok(Paged::NotThisText),
        }
    }

    /// A text read from the store: whole if it is small enough to cache, else its index, built
    /// from successive ranges (each scanned on a heavy thread) and kept for the next pages.
    async fn text_of(&self, tenant: &Tenant, id: &ArtifactId) -> Result<Option<Text>, StoreError> {
        let chunk = WHOLE_UP_TO as u64;
        let Some((first, size)) = self.artifacts.range(tenant, id, 0..chunk).await? else {
            return Ok(None);
        };
        if size <= chunk {
            self.artifacts.keep(tenant, id, &first);
            return Ok(Some(Text::Whole(first)));
        }
        let mut builder = IndexBuilder::new();
        let mut next = Some(first);
        let mut at = 0u64;
        while let Some(bytes) = next.take() {
            at += bytes.len() as u64;
            let _place = self.heavy.take(tenant).await;
            let mut b = std::mem::take(&mut builder);
            let scanned = super::heavy::run(move || {
                b.push(&bytes);
                b
            });
            // Read the next range while this one is scanned.
            let (scanned, following) = if at < size {
                let (scanned, following) =
                    tokio::join!(scanned, self.artifacts.range(tenant, id, at..at + chunk));
                (scanned, following?)
            } else {
                (scanned.await, None)
            };
            builder = scanned.map_err(|_| StoreError::Task)?;
            match following {
                Some((bytes, now)) if now == size && !bytes.is_empty() => next = Some(bytes),
                // The artifact went away or changed size between two ranges.
                Some(_) => return Ok(Some(Text::Invalid)),
                None if at < size => return Ok(None),
                None => {}
            }
        }
        let Some(index) = builder.finish() else {
            return Ok(Some(Text::Invalid));
        };
        let index = Arc::new(index);
        self.artifacts.keep_index(tenant, id, index.clone());
        Ok(Some(Text::Indexed(index)))
    }

    async fn page_whole(
        &self,
        bytes: Bytes,
        tenant: &Tenant,
        cursor: &Cursor,
        read_tool: &str,
    ) -> Paged {
        let in_place = bytes.len() <= PAGED_IN_PLACE;
        let (tenant_owned, cursor, tool) = (tenant.clone(), *cursor, read_tool.to_string());
        let cut = move || {
            let Ok(text) = std::str::from_utf8(&bytes) else {
                return Paged::NotThisText;
            };
            let lines = Lines::new(text);
            if !cursor.reads(&lines) {
                return Paged::NotThisText;
            }
            Paged::Page(notice::render(
                &lines,
                &cursor.artifact,
                &tenant_owned,
                cursor.at,
                cursor.budget,
                &tool,
            ))
        };
        if in_place {
            return cut();
        }
        let _place = self.heavy.take(tenant).await;
        super::heavy::run(cut).await.unwrap_or(Paged::NotThisText)
    }

    async fn page_window(
        &self,
        index: &TextIndex,
        tenant: &Tenant,
        cursor: &Cursor,
        read_tool: &str,
    ) -> Result<Paged, StoreError> {
        if !cursor.reads_lines(index.lines()) {
            return Ok(Paged::NotThisText);
        }
        let (mark, range) = index.window(cursor.at, cursor.budget);
        let id = cursor.artifact;
        let Some((bytes, size)) = self.artifacts.range(tenant, &id, range).await? else {
            return Ok(Paged::Missing);
        };
        let window = (size == index.bytes())
            .then(|| Window::new(index, mark, &bytes))
            .flatten();
        Ok(match window {
            Some(window) => Paged::Page(notice::render(
                &window,
                &id,
                tenant,
                cursor.at,
                cursor.budget,
                read_tool,
            )),
            None => Paged::NotThisText,
        })
    }
}
