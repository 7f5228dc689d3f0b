//! Writing the core's decisions back into a request's parts, through its dialect's [`Shapes`]:
//! a tool result's new content (text, shown images, other parts), a user's image part.

use super::attach::extract::Extracted;
use super::attach::{self, Item, Media, Outcome};
use super::shapes::{ImageRef, NewContent, Shapes};
use super::sounds::Heard;
use super::view::{Raw, Rope, ToolResult};
use crate::json::string as json_string;

/// A tool result's new content: its text, then its shown images where the dialect allows images
/// in tool results, then its other parts. Where it does not (OpenAI chat), the images come back
/// separately, each after its reference, to go in a user message after the turn; so does the
/// audio sent (`heard`), after the images.
pub(super) fn render_tool_content(
    shapes: &dyn Shapes,
    result: &ToolResult<'_>,
    e: &Extracted,
    (outcomes, heard): (&[Outcome], &[Heard]),
    text: &str,
) -> (Rope, Vec<String>) {
    let text_json = json_string(text);
    let text_part = |json: &str| shapes.text_part(json, None);
    let mut parts: Vec<Rope> = Vec::new();
    let mut after_turn: Vec<String> = Vec::new();
    for (item, outcome) in e.items.iter().zip(outcomes) {
        let image = match (outcome, &item.media) {
            (Outcome::Embed(em), _) => ImageRef::Data(em),
            (Outcome::KeepRemote, Media::Remote(url)) => ImageRef::Url(url),
            _ => continue,
        };
        let part = shapes.image_part(&image, item.extras.as_deref());
        if shapes.images_in_tool_results() {
            parts.push(part);
        } else {
            after_turn.push(text_part(&json_string(&item.reference())));
            after_turn.push(part.to_text());
        }
    }
    for (sound, heard) in e.audio.iter().zip(heard) {
        if let (Heard::Sent(format), Some(base64)) = (heard, &sound.base64) {
            after_turn.push(text_part(&json_string(&sound.reference())));
            after_turn.push(shapes.audio_part(format, base64));
        }
    }
    let new = NewContent {
        text_json: &text_json,
        text_breakpoint: None,
        media: parts,
        others: e.others.iter().map(|o| Rope::from(o.clone())).collect(),
        last_breakpoint: e.breakpoint.as_deref(),
        as_parts: !e.items.is_empty() && shapes.images_in_tool_results(),
    };
    let content = shapes.tool_content(result.content, new);
    (content, after_turn)
}

/// A user image part as it must be sent, or `None` to leave its bytes untouched (P1).
pub(super) fn render_user_part(
    shapes: &dyn Shapes,
    part: Raw<'_>,
    item: &Item,
    outcome: &Outcome,
) -> Option<String> {
    match outcome {
        Outcome::KeepRemote => None,
        Outcome::Embed(em) if !em.downscaled && !em.relabelled => None,
        // The right label (and the smaller bytes), the part's other fields kept.
        Outcome::Embed(em) => shapes.user_image_part(part, em),
        other => {
            let text = attach::note(item, other).unwrap_or_else(|| item.reference());
            Some(shapes.user_note_part(part, &json_string(&text)))
        }
    }
}
