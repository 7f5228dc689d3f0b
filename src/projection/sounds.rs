//! Audio in tool results (issue #17, docs/audio.md): each item found is stored (when it can
//! be used) and counted; its reference line already stands in the result's text.

use super::attach::extract::Extracted;
use super::{exit, Projection};

/// One audio item's fate in a request: `placeholder` (stored, named, not sent) or `refused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AudioEvent {
    pub outcome: &'static str,
    pub reason: &'static str,
}

/// A tool result's audio: artifacts to store, events, and one placeholder each in the summary.
pub(super) fn take(e: &Extracted, out: &mut Projection) {
    for sound in &e.audio {
        out.summary.placeholders += 1;
        out.audio.push(match &sound.checked {
            Ok(audio) => {
                if let Some(id) = sound.id {
                    out.spills.push(exit::Spill {
                        id,
                        bytes: audio.bytes.clone(),
                    });
                }
                AudioEvent {
                    outcome: "placeholder",
                    reason: "no_audio_input",
                }
            }
            Err(refusal) => AudioEvent {
                outcome: "refused",
                reason: refusal.reason(),
            },
        });
    }
}
