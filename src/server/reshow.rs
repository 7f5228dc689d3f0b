//! The read tool's `{"url":"artifact://…"}` (C5): a media artifact shown again — an image, or
//! an audio file on a route that sends audio (docs/audio.md) — under the route's gate and what
//! the request's budgets have left.

use bytes::Bytes;

use super::App;
use crate::projection::{AudioEvent, ImageEvent};
use crate::read;
use crate::store::ArtifactId;

/// What is left of a request's image and audio budgets, and the per-file limits.
#[derive(Clone, Copy)]
pub(super) struct MediaRoom {
    pub accepts: bool,
    pub count: usize,
    pub bytes: u64,
    pub max_image_bytes: u64,
    pub max_dimension: u32,
    /// The route sends audio (its modality, and a dialect that takes it).
    pub hears: bool,
    pub audio_count: usize,
    pub audio_bytes: u64,
    pub max_audio_bytes: u64,
}

impl MediaRoom {
    /// The room the route's budgets leave after the media the request already embeds.
    pub fn left(
        route: &crate::config::RouteConfig,
        (accepts, hears): (bool, bool),
        (images, audio): (&[ImageEvent], &[AudioEvent]),
    ) -> MediaRoom {
        let limits = &route.images;
        let embedded = images.iter().filter(|i| i.outcome == "embedded");
        let shown: u64 = embedded.clone().map(|i| i.bytes).sum();
        let sent = audio.iter().filter(|a| a.outcome == "embedded");
        let heard: u64 = sent.clone().map(|a| a.bytes).sum();
        MediaRoom {
            accepts,
            count: limits.max_images.saturating_sub(embedded.count()),
            bytes: limits.max_total_bytes.saturating_sub(shown),
            max_image_bytes: limits.max_image_bytes,
            max_dimension: limits.max_dimension,
            hears,
            audio_count: route.audio.max_audio.saturating_sub(sent.count()),
            audio_bytes: route.audio.max_total_bytes.saturating_sub(heard),
            max_audio_bytes: route.audio.max_audio_bytes,
        }
    }
}

impl App {
    /// [`reshow`] on the heavy pool (the file is checked from its bytes and encoded), as
    /// heavy projection is: the worker goes on relaying meanwhile.
    pub(super) async fn reshow_off_thread(
        &self,
        room: &mut MediaRoom,
        id: ArtifactId,
        bytes: Bytes,
        tenant: &crate::tenant::Tenant,
    ) -> (String, Option<read::Media>, &'static str) {
        let _place = self.heavy.take(tenant).await;
        let mut left = *room;
        let shown = super::heavy::run(move || {
            let shown = reshow(&mut left, id, bytes);
            (left, shown)
        })
        .await;
        match shown {
            Ok((left, shown)) => {
                *room = left;
                shown
            }
            Err(_) => (
                format!("[sluice: artifact://{id} cannot be shown again: it could not be read]"),
                None,
                "image_refused",
            ),
        }
    }
}

/// A media artifact shown again (C5): as an image if it is one, else as audio if it is one,
/// when the route takes it and the request's budgets have room.
pub(super) fn reshow(
    room: &mut MediaRoom,
    id: ArtifactId,
    bytes: Bytes,
) -> (String, Option<read::Media>, &'static str) {
    match crate::image::check(bytes.clone(), None) {
        Ok(checked) => image(room, id, &checked),
        Err(_) => match crate::audio::check(bytes, None) {
            Ok(audio) => hear(room, id, &audio),
            Err(_) => (
                format!("[sluice: artifact://{id} cannot be shown again: it is not an image or audio sluice can show]"),
                None,
                "image_refused",
            ),
        },
    }
}

fn image(
    room: &mut MediaRoom,
    id: ArtifactId,
    checked: &crate::image::Checked,
) -> (String, Option<read::Media>, &'static str) {
    let refuse = |why: &str| {
        (
            format!("[sluice: artifact://{id} cannot be shown again: {why}]"),
            None,
            "image_refused",
        )
    };
    if !room.accepts {
        return refuse("this model does not accept images");
    }
    let base64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &checked.bytes);
    let size = base64.len() as u64;
    if room.count == 0 {
        return refuse("this request already holds as many images as the route allows");
    }
    if size > room.max_image_bytes || size > room.bytes {
        return refuse("it is larger than the image budget left in this request");
    }
    if checked.long_edge() > room.max_dimension {
        return refuse("it is larger than the route's largest image dimension");
    }
    room.count -= 1;
    room.bytes -= size;
    (
        format!(
            "[sluice: image artifact://{id}, {}×{}, shown again]",
            checked.width, checked.height
        ),
        Some(read::Media {
            mime: checked.kind.mime(),
            base64,
            artifact: id,
        }),
        "image",
    )
}

fn hear(
    room: &mut MediaRoom,
    id: ArtifactId,
    audio: &crate::audio::CheckedAudio,
) -> (String, Option<read::Media>, &'static str) {
    let refuse = |why: &str| {
        (
            format!("[sluice: artifact://{id} cannot be played again: {why}]"),
            None,
            "audio_refused",
        )
    };
    if !room.hears {
        return refuse("this model does not accept audio here");
    }
    if audio.kind.input_format().is_none() {
        return refuse(&format!(
            "this API takes WAV or MP3 audio, not {}",
            audio.kind.name()
        ));
    }
    let size = audio.bytes.len() as u64;
    if room.audio_count == 0 {
        return refuse("this request already holds as many audio files as the route allows");
    }
    if size > room.max_audio_bytes || size > room.audio_bytes {
        return refuse("it is larger than the audio budget left in this request");
    }
    room.audio_count -= 1;
    room.audio_bytes -= size;
    (
        format!(
            "[sluice: audio artifact://{id}, {}, played again]",
            audio.kind.name()
        ),
        Some(read::Media {
            mime: audio.kind.mime(),
            base64: base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                &audio.bytes,
            ),
            artifact: id,
        }),
        "audio",
    )
}
