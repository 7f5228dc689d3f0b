//! Delivery state (SPEC A2-A5, A9, A10): per session, what the model has been shown of each
//! attachment, and what that means for the next request. Pure: [`plan`] reads a state and a
//! request's candidates; [`settle`] turns what the request embedded into a [`Delta`]; the
//! caller applies the delta only once the response completed (A9).
//!
//! Every status only moves forward (unviewed → viewed → pruned; anything → released), and
//! [`apply`] takes the furthest of the two, so applying deltas in any order, or twice, gives the
//! same state: two concurrent requests of one session never lose each other's changes.
//!
//! The state stays small however long the session runs: a released attachment (its source left
//! the history) is kept only as a 64-bit hash of its identity, the newest [`MAX_RELEASED`] of
//! them; the read tool's links (C3) live in their own map, the newest [`MAX_LINKS`]. The work of
//! a request is linear in its own candidates and the live records, never in the session's age.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::projection::policy::Lifetime;

/// Where an attachment is in its life. Ordered: a status never goes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Status {
    Unviewed,
    /// A response that carried it completed.
    Viewed,
    /// Removed by `recent` pruning (A4); never shown again.
    Pruned,
    /// Its source left the history, or a hard budget let it go (A5, A10); never shown again.
    Released,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub status: Status,
    pub lifetime: Lifetime,
}

/// Released attachments remembered per session (A10). One whose source comes back after more
/// than this many others were released since (a history rewound that far) is treated as new.
pub const MAX_RELEASED: usize = 512;
/// Read-tool links remembered per session (C3): the hidden rounds of the newest this many turns
/// that had any are spliced back in.
pub const MAX_LINKS: usize = 256;
/// Tool results retired by the context guard, remembered per session (docs/context-guard.md):
/// far more than a session's window holds. Past it the oldest retirements are forgotten; such
/// a result, if still in the history, is retired again in the next batch.
pub const MAX_RETIRED: usize = 4096;

/// One session's delivery state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionState {
    /// Attachments whose source is in the history, by identity.
    pub records: BTreeMap<String, Record>,
    /// Attachments released for good, by [`released_key`], with when (a stamp from the caller's
    /// clock; the oldest go first past [`MAX_RELEASED`]).
    #[serde(default)]
    pub released: BTreeMap<u64, u64>,
    /// Read-tool links (their own encoding, see `read::Link`), with when they were made.
    #[serde(default)]
    pub links: BTreeMap<String, u64>,
    /// Tool results the context guard retired, by their key (`projection::guard`), with when.
    #[serde(default)]
    pub retired: BTreeMap<u64, u64>,
    /// When the session's last request that carried images (or a deferred edit) completed:
    /// whether the provider's cache is still warm (`projection::edits`).
    #[serde(default)]
    pub last_ms: u64,
    /// The session came back after idling past the 5-minute TTL (within the hour) while
    /// sluice set its breakpoints: those ask for 1-hour entries from then on
    /// (`projection::edits::Keep`).
    #[serde(default)]
    pub paused: bool,
}

/// The key a released attachment is remembered by.
pub fn released_key(identity: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(identity.as_bytes())
}

impl SessionState {
    /// An attachment's status, released ones included.
    pub fn status(&self, identity: &str) -> Option<Status> {
        match self.records.get(identity) {
            Some(record) => Some(record.status),
            None => self
                .released
                .contains_key(&released_key(identity))
                .then_some(Status::Released),
        }
    }

    /// Moves what an older version stored as records into its own place: released records to
    /// `released`, link records (`read:` keys) to `links`, both stamped `stamp`.
    pub fn normalize(&mut self, stamp: u64) {
        const LEGACY_LINK: &str = "read:";
        let legacy: Vec<String> = self
            .records
            .iter()
            .filter(|(k, r)| r.status == Status::Released || k.starts_with(LEGACY_LINK))
            .map(|(k, _)| k.clone())
            .collect();
        for key in legacy {
            self.records.remove(&key);
            match key.strip_prefix(LEGACY_LINK) {
                Some(link) => {
                    self.links.entry(link.to_string()).or_insert(stamp);
                }
                None => {
                    self.released.entry(released_key(&key)).or_insert(stamp);
                }
            }
        }
        trim(&mut self.released, MAX_RELEASED);
        trim(&mut self.links, MAX_LINKS);
        trim(&mut self.retired, MAX_RETIRED);
    }
}

/// Keeps the newest `max` entries (by stamp, then key).
fn trim<K: Ord + Clone>(map: &mut BTreeMap<K, u64>, max: usize) {
    if map.len() <= max {
        return;
    }
    let mut by_age: Vec<(u64, K)> = map.iter().map(|(k, s)| (*s, k.clone())).collect();
    by_age.sort_unstable();
    for (_, key) in by_age.into_iter().take(map.len() - max) {
        map.remove(&key);
    }
}

/// An attachment of the request, in arrival order (A2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Identity independent of position: source, index in source, content hash.
    pub key: String,
    pub lifetime: Lifetime,
    /// False for images that can never be shown here (refused, or the route takes none).
    pub showable: bool,
}

/// What the state says about one candidate before budgets are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// May be embedded, budgets permitting.
    Eligible,
    /// `once`, already shown: a placeholder.
    Consumed,
    /// Pruned, now or before: a placeholder.
    Pruned,
    /// Released before: a placeholder.
    Released,
    /// Not showable; nothing to track.
    NotShowable,
}

/// Recent pruning parameters (A4).
#[derive(Debug, Clone, Copy)]
pub struct Recent {
    pub count: usize,
    pub batch: usize,
}

/// Decides every candidate: what the state allows, and which viewed `recent` images are pruned
/// by this request (A3, A4). Pruning counts all active images, unviewed included; the excess
/// over `recent.count` is rounded up to a multiple of `recent.batch`, capped at the viewed
/// `recent` images, oldest first. Unviewed images are never pruned.
pub fn plan(state: &SessionState, candidates: &[Candidate], recent: Recent) -> Vec<Decision> {
    let status = |c: &Candidate| state.status(&c.key);
    let mut decisions: Vec<Decision> = candidates
        .iter()
        .map(|c| match (c.showable, status(c), c.lifetime) {
            (false, _, _) => Decision::NotShowable,
            (true, Some(Status::Released), _) => Decision::Released,
            (true, Some(Status::Pruned), _) => Decision::Pruned,
            (true, Some(Status::Viewed), Lifetime::Once) => Decision::Consumed,
            _ => Decision::Eligible,
        })
        .collect();
    let active = decisions
        .iter()
        .filter(|d| **d == Decision::Eligible)
        .count();
    if active > recent.count {
        let viewed_recent: Vec<usize> = candidates
            .iter()
            .enumerate()
            .filter(|(i, c)| {
                decisions[*i] == Decision::Eligible
                    && c.lifetime == Lifetime::Recent
                    && status(c) == Some(Status::Viewed)
            })
            .map(|(i, _)| i)
            .collect();
        let batch = recent.batch.max(1);
        let excess = (active - recent.count).div_ceil(batch) * batch;
        for &i in viewed_recent.iter().take(excess) {
            decisions[i] = Decision::Pruned;
        }
    }
    decisions
}

/// The state changes of one request, to apply only if its response completes (A9).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delta {
    pub records: BTreeMap<String, Record>,
    /// Read-tool links made by this request (C3).
    #[serde(default)]
    pub links: std::collections::BTreeSet<String>,
    /// Tool results the context guard retired in this request.
    #[serde(default)]
    pub retired: std::collections::BTreeSet<u64>,
    /// The request's completion is when the session last forwarded ([`SessionState::last_ms`]).
    #[serde(default)]
    pub touch: bool,
    /// The request came after a pause its session's breakpoints (sluice's) did not outlast
    /// ([`SessionState::paused`]).
    #[serde(default)]
    pub paused: bool,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
            && self.links.is_empty()
            && self.retired.is_empty()
            && !self.touch
            && !self.paused
    }
}

/// What the request did: `embedded[i]` says whether candidate `i` was embedded (after budgets).
/// Embedded candidates become viewed; those pruned by the plan are pruned; an unselected viewed
/// `recent` image is released (A5); attachments of the state whose source is gone from the
/// history are released for good (A10).
pub fn settle(
    state: &SessionState,
    candidates: &[Candidate],
    decisions: &[Decision],
    embedded: &[bool],
) -> Delta {
    let mut delta = Delta::default();
    for ((c, d), &shown) in candidates.iter().zip(decisions).zip(embedded) {
        let before = state.status(&c.key);
        let status = match d {
            Decision::Pruned if before == Some(Status::Pruned) => continue,
            Decision::Pruned => Status::Pruned,
            Decision::Eligible if shown => Status::Viewed,
            Decision::Eligible
                if c.lifetime == Lifetime::Recent && before == Some(Status::Viewed) =>
            {
                Status::Released
            }
            Decision::Eligible => Status::Unviewed,
            Decision::Consumed | Decision::Released | Decision::NotShowable => continue,
        };
        delta.records.insert(
            c.key.clone(),
            Record {
                status,
                lifetime: c.lifetime,
            },
        );
    }
    let present: HashSet<&str> = candidates.iter().map(|c| c.key.as_str()).collect();
    for (key, record) in &state.records {
        if record.status != Status::Released && !present.contains(key.as_str()) {
            delta.records.insert(
                key.clone(),
                Record {
                    status: Status::Released,
                    lifetime: record.lifetime,
                },
            );
        }
    }
    delta
}

/// Merges `delta` into `state`, stamped `stamp`: each record keeps the furthest status, a
/// released one leaves the records for `released` (commutative and idempotent, up to which of
/// the oldest released attachments and links are forgotten past the caps). Returns how many
/// tool results it retired that the state did not hold retired yet.
pub fn apply(state: &mut SessionState, delta: &Delta, stamp: u64) -> u64 {
    if delta.touch {
        state.last_ms = state.last_ms.max(stamp);
    }
    state.paused |= delta.paused;
    for (key, record) in &delta.records {
        let released = released_key(key);
        if record.status == Status::Released {
            state.records.remove(key);
            state.released.entry(released).or_insert(stamp);
            continue;
        }
        if state.released.contains_key(&released) {
            continue;
        }
        state
            .records
            .entry(key.clone())
            .and_modify(|r| {
                if record.status > r.status {
                    r.status = record.status;
                }
            })
            .or_insert(*record);
    }
    for link in &delta.links {
        state.links.entry(link.clone()).or_insert(stamp);
    }
    let mut retired = 0;
    for key in &delta.retired {
        if let std::collections::btree_map::Entry::Vacant(e) = state.retired.entry(*key) {
            e.insert(stamp);
            retired += 1;
        }
    }
    trim(&mut state.released, MAX_RELEASED);
    trim(&mut state.links, MAX_LINKS);
    trim(&mut state.retired, MAX_RETIRED);
    retired
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(key: &str, lifetime: Lifetime) -> Candidate {
        Candidate {
            key: key.into(),
            lifetime,
            showable: true,
        }
    }

    /// Runs one successful request: plan, embed every eligible one up to `max`, settle, apply.
    fn turn(
        state: &mut SessionState,
        cands: &[Candidate],
        recent: Recent,
        max: usize,
    ) -> Vec<String> {
        turn_at(state, cands, recent, max, 0)
    }

    /// [`turn`], committed at `stamp`.
    fn turn_at(
        state: &mut SessionState,
        cands: &[Candidate],
        recent: Recent,
        max: usize,
        stamp: u64,
    ) -> Vec<String> {
        let decisions = plan(state, cands, recent);
        let mut n = 0;
        let embedded: Vec<bool> = decisions
            .iter()
            .map(|d| {
                let take = *d == Decision::Eligible && n < max;
                n += usize::from(take);
                take
            })
            .collect();
        let delta = settle(state, cands, &decisions, &embedded);
        apply(state, &delta, stamp);
        cands
            .iter()
            .zip(&embedded)
            .filter(|(_, e)| **e)
            .map(|(c, _)| c.key.clone())
            .collect()
    }

    #[test]
    fn recent_prunes_in_batches_a4() {
        // SPEC issue: recent_count 3, prune_batch 2, one new screenshot a turn for 8 turns.
        let recent = Recent { count: 3, batch: 2 };
        let mut state = SessionState::default();
        let mut history = Vec::new();
        let mut shown = Vec::new();
        for t in 1..=8 {
            history.push(c(&format!("s{t}"), Lifetime::Recent));
            shown.push(turn(&mut state, &history, recent, 20).len());
        }
        assert_eq!(shown, [1, 2, 3, 2, 3, 2, 3, 2]);
    }

    #[test]
    fn once_is_shown_in_one_successful_response_a3() {
        let recent = Recent { count: 3, batch: 2 };
        let mut state = SessionState::default();
        let history = [c("a", Lifetime::Once)];
        // A failed request: planned and settled, never applied. Nothing consumed (A9).
        let decisions = plan(&state, &history, recent);
        let _unapplied = settle(&state, &history, &decisions, &[true]);
        assert_eq!(plan(&state, &history, recent), [Decision::Eligible]);
        assert_eq!(turn(&mut state, &history, recent, 20), ["a"]);
        assert_eq!(plan(&state, &history, recent), [Decision::Consumed]);
        assert!(turn(&mut state, &history, recent, 20).is_empty());
    }

    #[test]
    fn retain_stays_while_its_source_does_and_a_gone_source_is_released_for_good_a10() {
        let recent = Recent { count: 3, batch: 2 };
        let mut state = SessionState::default();
        let r = c("r", Lifetime::Retain);
        for _ in 0..4 {
            assert_eq!(
                turn(&mut state, std::slice::from_ref(&r), recent, 20),
                ["r"]
            );
        }
        // The source leaves the history: released, and it never comes back.
        turn(&mut state, &[], recent, 20);
        assert_eq!(state.status("r"), Some(Status::Released));
        assert!(
            state.records.is_empty(),
            "a released record leaves the records"
        );
        assert_eq!(
            plan(&state, std::slice::from_ref(&r), recent),
            [Decision::Released]
        );
    }

    #[test]
    fn under_a_hard_budget_viewed_recent_is_released_unviewed_waits_retain_retries_a5() {
        let recent = Recent {
            count: 10,
            batch: 1,
        };
        let mut state = SessionState::default();
        let first = [c("v", Lifetime::Recent)];
        turn(&mut state, &first, recent, 20);
        let all = [
            c("v", Lifetime::Recent),
            c("u", Lifetime::Recent),
            c("k", Lifetime::Retain),
        ];
        turn(&mut state, &all, recent, 0); // no room at all this time
        assert_eq!(state.status("v"), Some(Status::Released));
        assert_eq!(state.records["u"].status, Status::Unviewed);
        assert_eq!(state.records["k"].status, Status::Unviewed);
        assert_eq!(turn(&mut state, &all, recent, 20), ["u", "k"]);
    }

    #[test]
    fn deltas_merge_in_any_order() {
        let mut a = SessionState::default();
        let d1 = Delta {
            records: BTreeMap::from([(
                "x".into(),
                Record {
                    status: Status::Viewed,
                    lifetime: Lifetime::Once,
                },
            )]),
            ..Delta::default()
        };
        let d2 = Delta {
            records: BTreeMap::from([
                (
                    "x".into(),
                    Record {
                        status: Status::Unviewed,
                        lifetime: Lifetime::Once,
                    },
                ),
                (
                    "y".into(),
                    Record {
                        status: Status::Unviewed,
                        lifetime: Lifetime::Once,
                    },
                ),
            ]),
            ..Delta::default()
        };
        let mut b = a.clone();
        apply(&mut a, &d1, 1);
        apply(&mut a, &d2, 2);
        apply(&mut b, &d2, 3);
        apply(&mut b, &d1, 4);
        apply(&mut b, &d1, 5);
        assert_eq!(a, b);
        assert_eq!(a.records["x"].status, Status::Viewed);
    }

    #[test]
    fn a_long_session_keeps_a_bounded_state() {
        // 5,000 turns, a new screenshot each, the client keeping its last 10 turns.
        let recent = Recent { count: 3, batch: 2 };
        let mut state = SessionState::default();
        let mut history: Vec<Candidate> = Vec::new();
        for t in 0..5_000u64 {
            history.push(c(&format!("s{t}"), Lifetime::Recent));
            if history.len() > 10 {
                history.remove(0);
            }
            turn_at(&mut state, &history, recent, 20, t);
        }
        assert!(state.records.len() <= 10, "{}", state.records.len());
        assert_eq!(state.released.len(), MAX_RELEASED);
        // The newest releases are the ones remembered.
        assert_eq!(state.status("s4989"), Some(Status::Released));
        assert_eq!(state.status("s0"), None);
        let mut links = SessionState::default();
        for t in 0..1_000u64 {
            let delta = Delta {
                links: [format!("{t:032x}:1:t")].into(),
                ..Delta::default()
            };
            apply(&mut links, &delta, t);
        }
        assert_eq!(links.links.len(), MAX_LINKS);
        assert!(links.links.contains_key(&format!("{:032x}:1:t", 999)));
    }

    #[test]
    fn a_state_stored_by_an_older_version_is_normalized() {
        let record = |status, lifetime| Record { status, lifetime };
        let mut state = SessionState {
            records: BTreeMap::from([
                ("gone".into(), record(Status::Released, Lifetime::Once)),
                (
                    "read:00ff:2:tabc".into(),
                    record(Status::Released, Lifetime::Retain),
                ),
                ("live".into(), record(Status::Viewed, Lifetime::Once)),
            ]),
            ..SessionState::default()
        };
        state.normalize(7);
        assert_eq!(state.records.keys().collect::<Vec<_>>(), ["live"]);
        assert_eq!(state.status("gone"), Some(Status::Released));
        assert_eq!(state.links.keys().collect::<Vec<_>>(), ["00ff:2:tabc"]);
        // A released record never comes back, whatever arrives later (A10).
        let late = Delta {
            records: BTreeMap::from([("gone".into(), record(Status::Viewed, Lifetime::Once))]),
            ..Delta::default()
        };
        apply(&mut state, &late, 8);
        assert_eq!(state.status("gone"), Some(Status::Released));
    }

    proptest! {
        /// Random sessions with random failures: a failed request never changes state, a
        /// request never embeds more than the budget, a pruned or released image never
        /// returns, and a `once` image is shown in at most one successful response.
        #[test]
        fn random_sessions_keep_the_rules(
            steps in proptest::collection::vec((0u8..4, any::<bool>(), 0usize..4, 0u8..3), 1..40),
            count in 1usize..5,
            batch in 1usize..4,
            max in 0usize..6,
        ) {
            let recent = Recent { count, batch };
            let mut state = SessionState::default();
            let mut history: Vec<Candidate> = Vec::new();
            let mut once_shown: BTreeMap<String, usize> = BTreeMap::new();
            for (i, (lifetime, ok, drop_at, _)) in steps.into_iter().enumerate() {
                let lifetime = [Lifetime::Once, Lifetime::Recent, Lifetime::Retain, Lifetime::Recent][lifetime as usize];
                history.push(c(&format!("i{i}"), lifetime));
                if drop_at < history.len() && i % 5 == 4 {
                    history.remove(drop_at);
                }
                let before = state.clone();
                let decisions = plan(&state, &history, recent);
                let mut n = 0;
                let embedded: Vec<bool> = decisions.iter().map(|d| {
                    let take = *d == Decision::Eligible && n < max;
                    n += usize::from(take);
                    take
                }).collect();
                prop_assert!(embedded.iter().filter(|e| **e).count() <= max);
                for (cand, (d, e)) in history.iter().zip(decisions.iter().zip(&embedded)) {
                    if let Some(status) = before.status(&cand.key) {
                        if matches!(status, Status::Pruned | Status::Released) {
                            prop_assert!(!*e && *d != Decision::Eligible, "a pruned or released image returned");
                        }
                    }
                }
                let delta = settle(&state, &history, &decisions, &embedded);
                if ok {
                    apply(&mut state, &delta, i as u64);
                    for (cand, e) in history.iter().zip(&embedded) {
                        if *e && cand.lifetime == Lifetime::Once {
                            *once_shown.entry(cand.key.clone()).or_default() += 1;
                        }
                    }
                } else {
                    prop_assert_eq!(&state, &before, "a failed request changes nothing");
                }
                prop_assert!(once_shown.values().all(|n| *n <= 1));
            }
        }
    }
}
