//! Writing the core's decisions back into a request's parts, through its dialect's [`Shapes`]:
//! a tool result's new content (text, shown images, other parts), a user's image part, the
//! user messages chat needs for media after a turn's tool messages (A7), and the text exit on
//! every other result (T2).

use super::attach::extract::Extracted;
use super::attach::{self, Item, Media, Outcome};
use super::shapes::{ImageRef, NewContent, Shapes};
use super::sounds::{self, Heard};
use super::view::{Edit, Raw, Rope, ToolResult};
use super::{exit, pictures, Context, Prepared, Projection, RequestView};
use crate::json::string as json_string;

/// Writes the decided request back as edits in `out`: each tool result with media through the
/// text exit and then with the media the dialect's way (A7), the other results through the text
/// exit alone (those `retired` names already stand as their lines), user images that changed or
/// are not shown, and chat's user messages after a turn.
pub(super) fn write_back(
    view: &RequestView<'_>,
    ctx: &Context<'_>,
    media: &Prepared,
    (images, audio): (&pictures::Decided, &sounds::Decided),
    retired: &[bool],
    out: &mut Projection,
) {
    let (extracted, users) = (&media.extracted, &media.users);
    let policy = exit::Policy {
        tenant: ctx.tenant,
        budget: ctx.policy.budget(),
        read_tool: ctx.policy.read_tool,
    };
    let mut chat_turns: Vec<(usize, Vec<String>)> = Vec::new();
    for (ri, (e, result)) in extracted.iter().zip(&view.tool_results).enumerate() {
        let Some(e) = e else { continue };
        let outcomes = images.tool.get(ri).map_or(&[][..], Vec::as_slice);
        let heard = audio.heard.get(ri).map_or(&[][..], Vec::as_slice);
        let mut text = e.text.clone();
        let notes = e
            .items
            .iter()
            .zip(outcomes)
            .map(|(i, o)| attach::note(i, o));
        let audio_notes = e.audio.iter().zip(heard).map(|(s, h)| sounds::note(s, h));
        for note in notes.chain(audio_notes).flatten() {
            text.push('\n');
            text.push_str(&note);
        }
        if let Some((page, spill)) = exit::page_text(&text, &policy) {
            text = page;
            out.summary.spilled += 1;
            out.spills.push(spill);
        }
        let (content, chat_parts) =
            render_tool_content(view.shapes, result, e, (outcomes, heard), &text);
        out.edits.push(Edit {
            span: result.span,
            with: content,
        });
        if !chat_parts.is_empty() {
            chat_turns.push((result.item, chat_parts));
        }
    }
    // The other tool results: the text exit alone.
    let is_retired = |i: usize| retired.get(i).copied().unwrap_or(false);
    let has_media = |i: usize| extracted.get(i).is_some_and(Option::is_some);
    let text = exit::project(view, &policy, ctx.memo, &|i| has_media(i) || is_retired(i));
    out.edits.extend(text.edits);
    out.summary.spilled += text.spilled;
    out.spills.extend(text.spills);
    out.memos = text.memos;
    // User images written back when they changed or are not shown.
    for ((item, outcome), image) in users.iter().zip(&images.users).zip(&view.user_images) {
        if let (Some(item), Some(outcome)) = (item, outcome) {
            if let Some(with) = render_user_part(view.shapes, image.part, item, outcome) {
                out.edits.push(Edit {
                    span: image.span,
                    with: with.into(),
                });
            }
        }
    }
    // OpenAI chat: each turn's images in one user message after its tool messages (A7).
    if !chat_turns.is_empty() {
        out.edits
            .extend(view.shapes.after_turns(view.body.as_bytes(), chat_turns));
    }
}

/// A tool result's new content: its text, then its shown images where the dialect allows images
/// in tool results, then its other parts. Where it does not (OpenAI chat), the images come back
/// separately, each after its reference, to go in a user message after the turn; so does the
/// audio sent (`heard`), after the images.
fn render_tool_content(
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
fn render_user_part(
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
