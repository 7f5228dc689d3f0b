//! A page as the model sees it: the page body, a newline, and one notice line (SPEC T5) saying
//! what is shown, where the whole text is, and how to read on. Body and notice together respect
//! the budget (T1). Nothing in it varies with time or a counter (T7).

use super::cursor::{Cursor, CURSOR_LEN};
use super::text::{utf16_len, Budget, Paged, Position};
use crate::projection::artifact::ArtifactId;
use crate::tenant::Tenant;

/// A page rendered for the model, and the cursor of the page after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub next: Option<String>,
}

/// Renders the page of `text` at `from` (artifact `id` of `tenant`) within `budget`, naming
/// `read_tool` as the way to read on.
pub fn render(
    text: &impl Paged,
    id: &ArtifactId,
    tenant: &Tenant,
    from: Position,
    budget: Budget,
    read_tool: &str,
) -> Rendered {
    let total_lines = text.count();
    let total_units = text.total_units();
    // A cursor names its position; one past the text (a forged cursor, or an artifact stored
    // again differently) reads from the end, so the notice stays within the real range.
    let from = match usize::try_from(from.line) {
        Ok(line) if line < total_lines => Position {
            line: from.line,
            unit: from.unit.min(text.line_units(line) as u32),
        },
        _ if total_lines == 0 => Position::default(),
        _ => Position {
            line: (total_lines - 1) as u32,
            unit: 0,
        },
    };
    // Room for the longest notice this text can have: every number at its largest.
    let widest = total_lines.max(total_units).max(1) as u32;
    let worst = notice(
        &Numbers {
            first: widest,
            last: widest,
            of: widest,
            from_unit: Some(widest),
            continues: true,
            units: widest,
            total_units: widest,
        },
        id,
        Some(&"c".repeat(CURSOR_LEN)),
        read_tool,
    );
    let reserve = utf16_len(&worst) + 1;
    let body_budget = Budget {
        lines: budget.lines.saturating_sub(1).max(1),
        units: budget.units.saturating_sub(reserve).max(2),
    };
    let p = text.page(from, body_budget);
    let next = p.more.then(|| {
        Cursor {
            artifact: *id,
            at: p.end,
            end_line: u32::try_from(total_lines).unwrap_or(u32::MAX),
            budget,
        }
        .encode(tenant)
    });
    let numbers = Numbers {
        first: p.start.line + 1,
        last: if p.end.unit > 0 || p.end.line == p.start.line {
            p.end.line + 1
        } else {
            p.end.line
        },
        of: total_lines as u32,
        from_unit: (p.start.unit > 0).then_some(p.start.unit + 1),
        continues: p.end.unit > 0,
        units: p.units as u32,
        total_units: total_units as u32,
    };
    let line = notice(&numbers, id, next.as_deref(), read_tool);
    let mut out = String::with_capacity(p.body.len() + line.len() + 1);
    out.push_str(p.body);
    if !p.body.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&line);
    Rendered { text: out, next }
}

struct Numbers {
    first: u32,
    last: u32,
    of: u32,
    from_unit: Option<u32>,
    continues: bool,
    units: u32,
    total_units: u32,
}

fn notice(n: &Numbers, id: &ArtifactId, cursor: Option<&str>, read_tool: &str) -> String {
    let from = n
        .from_unit
        .map(|u| format!(" (line {} from unit {u})", n.first))
        .unwrap_or_default();
    let continues = if n.continues {
        format!(" (line {} continues)", n.last)
    } else {
        String::new()
    };
    let shown = format!(
        "[sluice: lines {}-{} of {}{from}{continues} shown, {} of {} UTF-16 units",
        n.first, n.last, n.of, n.units, n.total_units
    );
    match cursor {
        Some(c) => format!(
            "{shown}; full text: artifact://{id}; to read on, call {read_tool} with {{\"cursor\":\"{c}\"}}]"
        ),
        None => format!("{shown}; end of artifact://{id}]"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::text::Lines;
    use super::*;
    use crate::projection::artifact::ArtifactKind;
    use proptest::prelude::*;

    fn setup(text: &str) -> (Tenant, ArtifactId) {
        let t = Tenant::from_credential(b"k");
        let id = ArtifactId::for_content(&t, ArtifactKind::Text, text.as_bytes());
        (t, id)
    }

    #[test]
    fn first_page_has_a_notice_with_artifact_and_cursor() {
        let text: String = (1..=5000).map(|i| format!("line {i}\n")).collect();
        let (t, id) = setup(&text);
        let budget = Budget {
            lines: 2000,
            units: 30_000,
        };
        let r = render(
            &Lines::new(&text),
            &id,
            &t,
            Position::default(),
            budget,
            "sluice_read",
        );
        assert!(r.text.starts_with("line 1\nline 2\n"));
        let notice = r.text.lines().last().unwrap();
        assert!(
            notice.starts_with("[sluice: lines 1-1999 of 5000 shown, "),
            "{notice}"
        );
        assert!(notice.contains(&format!("artifact://{id}")));
        let cursor = r.next.clone().unwrap();
        assert!(notice.ends_with(&format!(
            "call sluice_read with {{\"cursor\":\"{cursor}\"}}]"
        )));
        assert_eq!(r.text.lines().count(), 2000);
        assert!(utf16_len(&r.text) <= 30_000);
        let c = Cursor::decode(&cursor, &t).unwrap();
        assert_eq!(
            c.at,
            Position {
                line: 1999,
                unit: 0
            }
        );
    }

    #[test]
    fn a_position_outside_the_text_reads_within_its_range() {
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        let (t, id) = setup(&text);
        let budget = Budget {
            lines: 10,
            units: 1024,
        };
        for line in [100, 101, u32::MAX - 1, u32::MAX] {
            let from = Position { line, unit: 7 };
            let r = render(&Lines::new(&text), &id, &t, from, budget, "r");
            let notice = r.text.lines().last().unwrap();
            assert!(
                notice.starts_with("[sluice: lines 100-100 of 100 "),
                "{line}: {notice}"
            );
        }
        let far = Position {
            line: 4,
            unit: u32::MAX,
        };
        let r = render(&Lines::new(&text), &id, &t, far, budget, "r");
        assert!(r.text.lines().last().unwrap().contains(" of 100 "));
        let empty = render(&Lines::new(""), &id, &t, far, budget, "r");
        assert!(empty.text.contains("[sluice: lines "), "{}", empty.text);
    }

    #[test]
    fn the_last_page_has_no_cursor() {
        let text = "a\nb\n";
        let (t, id) = setup(text);
        let r = render(
            &Lines::new(text),
            &id,
            &t,
            Position { line: 1, unit: 0 },
            Budget {
                lines: 10,
                units: 1024,
            },
            "r",
        );
        assert_eq!(r.next, None);
        assert_eq!(
            r.text,
            format!(
                "b\n[sluice: lines 2-2 of 2 shown, 2 of 4 UTF-16 units; end of artifact://{id}]"
            )
        );
    }

    proptest! {
        /// T1, T4, T5: rendered pages (body and notice) stay within budget, cursors advance,
        /// the last page has none, and the bodies read back to the exact text.
        #[test]
        fn reading_on_covers_the_text_within_budget(
            text in "(\\PC|\\r\\n|\\n\\n|😀|[a-z ]{1,40}){1,400}",
            lines in 2usize..6,
            units in 1024usize..1400,
        ) {
            let (t, id) = setup(&text);
            let l = Lines::new(&text);
            let budget = Budget { lines, units };
            let mut at = Position::default();
            let mut joined = String::new();
            for _ in 0..=text.len() {
                let r = render(&l, &id, &t, at, budget, "sluice_read");
                prop_assert!(utf16_len(&r.text) <= units, "{} > {}", utf16_len(&r.text), units);
                prop_assert!(r.text.lines().count() <= lines);
                let body_end = r.text.rfind("\n[sluice: ").unwrap();
                let body = &r.text[..body_end];
                match &r.next {
                    Some(c) => {
                        let next = Cursor::decode(c, &t).unwrap().at;
                        prop_assert!(next > at);
                        // The body is exactly the text between the two positions.
                        joined.push_str(body);
                        if text_line_ends_at(&l, next) { joined.push('\n'); }
                        at = next;
                    }
                    None => {
                        joined.push_str(body);
                        if text.ends_with('\n') { joined.push('\n'); }
                        prop_assert_eq!(&joined, &text);
                        return Ok(());
                    }
                }
            }
            prop_assert!(false, "never reached the end");
        }
    }

    /// Whether the page that ended at `p` ended with a whole line (whose `\n` the rendering
    /// folded into the notice's newline).
    fn text_line_ends_at(l: &Lines<'_>, p: Position) -> bool {
        p.unit == 0 && p.line > 0 && l.line(p.line as usize - 1).ends_with('\n')
    }
}
