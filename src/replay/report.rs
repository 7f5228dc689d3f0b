//! What `sluice replay` prints: per session, one line per turn, then the totals; or the same as
//! JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::inspect::turn::Turn;
use crate::inspect::SessionRecord;

/// The whole report.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub trace: String,
    pub requests: usize,
    /// Requests that did not succeed: (line, status, what sluice said).
    pub failed: Vec<(usize, u16, String)>,
    pub sessions: Vec<SessionReport>,
    pub totals: Sums,
}

#[derive(Debug, Default, Serialize)]
pub struct SessionReport {
    pub id: String,
    pub label: String,
    pub dialect: String,
    pub model: String,
    pub turns: Vec<TurnReport>,
    pub totals: Sums,
}

#[derive(Debug, Default, Serialize)]
pub struct TurnReport {
    pub turn: usize,
    pub status: u16,
    pub received_tokens: u64,
    pub forwarded_tokens: u64,
    /// Tokens a provider's cache can serve: of what was sent, of what was forwarded.
    pub prefix_received: u64,
    pub prefix_forwarded: u64,
    pub cost_received: f64,
    pub cost_forwarded: f64,
    /// Tool results shown as a page.
    pub spilled: usize,
    /// Images by fate (embedded, placeholder, deferred, refused).
    pub images: BTreeMap<String, u64>,
    /// Tool results shown retired by the context guard.
    pub retired: usize,
}

/// Sums over turns.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Sums {
    pub turns: usize,
    pub received_tokens: u64,
    pub forwarded_tokens: u64,
    pub cost_received: f64,
    pub cost_forwarded: f64,
    /// Distinct tool results spilled to an artifact.
    pub spilled: usize,
    /// Image appearances by fate, over all turns.
    pub images: BTreeMap<String, u64>,
    /// The most tool results retired at once.
    pub retired: usize,
}

impl Sums {
    fn add(&mut self, turn: &TurnReport) {
        self.turns += 1;
        self.received_tokens += turn.received_tokens;
        self.forwarded_tokens += turn.forwarded_tokens;
        self.cost_received += turn.cost_received;
        self.cost_forwarded += turn.cost_forwarded;
        for (fate, n) in &turn.images {
            *self.images.entry(fate.clone()).or_default() += n;
        }
        self.retired = self.retired.max(turn.retired);
    }

    fn merge(&mut self, other: &Sums) {
        self.turns += other.turns;
        self.received_tokens += other.received_tokens;
        self.forwarded_tokens += other.forwarded_tokens;
        self.cost_received += other.cost_received;
        self.cost_forwarded += other.cost_forwarded;
        self.spilled += other.spilled;
        for (fate, n) in &other.images {
            *self.images.entry(fate.clone()).or_default() += n;
        }
        self.retired += other.retired;
    }
}

impl TurnReport {
    fn of(n: usize, t: &Turn) -> TurnReport {
        let mut images = BTreeMap::new();
        for image in &t.images {
            *images.entry(image.fate.clone()).or_default() += 1;
        }
        TurnReport {
            turn: n,
            status: t.status,
            received_tokens: t.received.tokens,
            forwarded_tokens: t.forwarded.tokens,
            prefix_received: t.prefix.received_tokens,
            prefix_forwarded: t.prefix.forwarded_tokens,
            cost_received: t.cost.received,
            cost_forwarded: t.cost.forwarded,
            spilled: t.results.iter().filter(|r| r.fate == "spilled").count(),
            images,
            retired: t.context.map_or(0, |c| c.retired),
        }
    }
}

impl Report {
    pub(super) fn new(trace: &Path, requests: usize) -> Report {
        Report {
            trace: trace.display().to_string(),
            requests,
            ..Report::default()
        }
    }

    pub(super) fn failed(&mut self, line: usize, status: u16, said: &str) {
        let said: String = said.chars().take(300).collect();
        self.failed.push((line, status, said));
    }

    pub(super) fn add(&mut self, record: SessionRecord) {
        let head = record.session;
        let mut session = SessionReport {
            id: head.id,
            label: head.label,
            dialect: head.dialect,
            model: head.model,
            ..SessionReport::default()
        };
        let mut artifacts = std::collections::BTreeSet::new();
        for (i, turn) in record.turns.iter().enumerate() {
            let report = TurnReport::of(i + 1, turn);
            session.totals.add(&report);
            session.turns.push(report);
            artifacts.extend(
                turn.results
                    .iter()
                    .filter(|r| r.fate == "spilled")
                    .filter_map(|r| r.artifact.clone()),
            );
        }
        session.totals.spilled = artifacts.len();
        self.totals.merge(&session.totals);
        self.sessions.push(session);
    }
}

fn n(v: u64) -> String {
    let digits = v.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn less(from: f64, to: f64) -> String {
    if from <= 0.0 {
        return "–".into();
    }
    let change = ((to / from - 1.0) * 100.0).round();
    if change == 0.0 {
        "0 %".into()
    } else {
        format!("{change:+} %")
    }
}

fn images(by: &BTreeMap<String, u64>) -> String {
    if by.is_empty() {
        return "none".into();
    }
    by.iter()
        .map(|(fate, count)| format!("{count} {fate}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The report as text.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "sluice replay of {}: {} requests, {} session{}",
        report.trace,
        report.requests,
        report.sessions.len(),
        if report.sessions.len() == 1 { "" } else { "s" }
    );
    for s in &report.sessions {
        let name = if s.label.is_empty() { &s.id } else { &s.label };
        let _ = writeln!(out, "\nsession {name} ({}, {})", s.dialect, s.model);
        let _ = writeln!(
            out,
            "{:>4} {:>6} {:>10} {:>10} {:>7} {:>10} {:>10} {:>10} {:>10} {:>7}  images",
            "turn",
            "status",
            "sent",
            "forwarded",
            "change",
            "cached s",
            "cached f",
            "cost s",
            "cost f",
            "spilled"
        );
        for t in &s.turns {
            let _ = writeln!(
                out,
                "{:>4} {:>6} {:>10} {:>10} {:>7} {:>10} {:>10} {:>10} {:>10} {:>7}  {}{}",
                t.turn,
                t.status,
                n(t.received_tokens),
                n(t.forwarded_tokens),
                less(t.received_tokens as f64, t.forwarded_tokens as f64),
                n(t.prefix_received),
                n(t.prefix_forwarded),
                n(t.cost_received.round() as u64),
                n(t.cost_forwarded.round() as u64),
                t.spilled,
                images(&t.images),
                if t.retired > 0 {
                    format!("; {} retired", t.retired)
                } else {
                    String::new()
                }
            );
        }
        totals(&mut out, "session", &s.totals);
    }
    if report.sessions.len() > 1 {
        out.push('\n');
        totals(&mut out, "all sessions", &report.totals);
    }
    for (line, status, said) in &report.failed {
        let _ = writeln!(out, "line {line}: failed with {status}: {said}");
    }
    let _ = writeln!(
        out,
        "\ntokens: sluice's estimate of input tokens, as the agent sent them (s) and as forwarded (f);\n\
         cached: the prefix a provider's cache can serve from the previous request;\n\
         cost: tokens weighed by the provider's prompt-cache prices, in uncached input tokens"
    );
    out
}

fn totals(out: &mut String, what: &str, t: &Sums) {
    let _ = writeln!(
        out,
        "{what} total over {} turns: input tokens {} → {} ({}); cache-weighted cost {} → {} ({}); \
         {} results spilled; images: {}; {} results retired",
        t.turns,
        n(t.received_tokens),
        n(t.forwarded_tokens),
        less(t.received_tokens as f64, t.forwarded_tokens as f64),
        n(t.cost_received.round() as u64),
        n(t.cost_forwarded.round() as u64),
        less(t.cost_received, t.cost_forwarded),
        t.spilled,
        images(&t.images),
        t.retired
    );
}
