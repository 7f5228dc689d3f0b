//! The session inspector (docs/inspector.md): a bounded record of each turn — what the agent
//! sent, what the model got, what the provider said it cached — for the session API, the page
//! at `/sluice/ui` and `sluice replay`, with honest savings per turn, per session and per route.
//!
//! The request path only fills a [`turn::Draft`] from what its stages already hold; tokens,
//! chains, costs and the store write happen on the inspector's own thread, behind a bounded
//! queue, so a record never delays a request (a full queue drops the record, counted).

pub mod chain;
pub mod store;
pub mod turn;

use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::config::inspector::{InspectorConfig, PriceConfig, Prices};
use crate::metrics::Metrics;
use chain::Chain;
use store::{Chains, Head, TurnStore};
use turn::{Draft, Prefix, Size};

/// Records waiting for the inspector's thread; past this, new ones are dropped.
const QUEUE: usize = 1024;
/// Parts whose tokens are remembered (a session's history is counted once, not per turn).
const TOKEN_MEMO_ENTRIES: u64 = 200_000;
/// Embedded turn records are made durable at least this often (a crash loses at most the
/// records of the last second; they are observability, not delivery state).
const SYNC_EVERY: Duration = Duration::from_secs(1);
/// A response body kept for its usage when it is no larger than this.
pub const KEEP_RESPONSE_BYTES: usize = 1024 * 1024;

enum Job {
    Turn(Box<Draft>),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The inspector: its store and the queue to its thread.
pub struct Inspector {
    pub config: InspectorConfig,
    pub store: TurnStore,
    ttl: Duration,
    queue: SyncSender<Job>,
    metrics: Arc<Metrics>,
}

impl Inspector {
    /// Starts the inspector's thread; its store operations run on `runtime`.
    pub fn start(
        config: InspectorConfig,
        store: TurnStore,
        ttl: Duration,
        metrics: Arc<Metrics>,
        runtime: tokio::runtime::Handle,
    ) -> std::io::Result<Arc<Inspector>> {
        let (queue, jobs) = sync_channel(QUEUE);
        let inspector = Arc::new(Inspector {
            config,
            store,
            ttl,
            queue,
            metrics,
        });
        let worker = Worker {
            config: inspector.config.clone(),
            store: inspector.store.clone(),
            ttl,
            metrics: inspector.metrics.clone(),
            tokens: moka::sync::Cache::new(TOKEN_MEMO_ENTRIES),
        };
        std::thread::Builder::new()
            .name("sluice-inspector".into())
            .spawn(move || {
                yield_to_requests();
                worker.run(jobs, runtime)
            })?;
        Ok(inspector)
    }

    /// Hands a finished request's draft to the inspector's thread; never waits.
    pub fn record(&self, draft: Box<Draft>) {
        match self.queue.try_send(Job::Turn(draft)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.metrics.inspector_dropped_total.inc();
            }
        }
    }

    /// Waits (up to two seconds) until the records handed over so far are stored, so a page
    /// that asks right after a turn sees it.
    pub async fn settled(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        if self.queue.try_send(Job::Flush(done)).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(2), wait).await;
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// Lowers the calling thread's scheduling priority to nice 10: when the cores are busy, the
/// request threads get about nine tenths of the time, this one a tenth, so records wait for
/// traffic, never the other way round (a full queue drops records, counted). On Linux
/// `setpriority` for the caller changes this thread only.
fn yield_to_requests() {
    if let Err(e) = rustix::process::setpriority_process(None, 10) {
        tracing::debug!(error = %e, "cannot lower the inspector thread's priority");
    }
}

/// The inspector's thread: counts, compares chains, writes.
struct Worker {
    config: InspectorConfig,
    store: TurnStore,
    ttl: Duration,
    metrics: Arc<Metrics>,
    /// Tokens per part, by a hash of tokenizer and part.
    tokens: moka::sync::Cache<u128, u64>,
}

impl Worker {
    /// Records turns as they come. An embedded write is fsync'd at most once a second: the
    /// records of a burst share one, and a quiet second makes the last ones durable.
    fn run(self, jobs: Receiver<Job>, runtime: tokio::runtime::Handle) {
        let mut synced = std::time::Instant::now();
        let mut dirty = false;
        loop {
            let job = match jobs.recv_timeout(SYNC_EVERY) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) => {
                    if dirty && self.store.persist().is_ok() {
                        dirty = false;
                        synced = std::time::Instant::now();
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            match job {
                Job::Turn(draft) => {
                    let durable = synced.elapsed() >= SYNC_EVERY;
                    match runtime.block_on(self.settle(*draft, durable)) {
                        Ok(()) if durable => {
                            dirty = false;
                            synced = std::time::Instant::now();
                        }
                        Ok(()) => dirty = true,
                        Err(e) => {
                            self.metrics.inspector_dropped_total.inc();
                            tracing::warn!(error = %e, "cannot store a turn record");
                        }
                    }
                }
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
        if dirty {
            let _ = self.store.persist();
        }
    }

    /// Finishes a draft into a turn and stores it with the session's new head.
    async fn settle(&self, draft: Draft, durable: bool) -> Result<(), crate::store::StoreError> {
        let ns = draft.tenant.namespace();
        let id = draft.session.0.clone();
        let label = draft.label.clone();
        let previous = self.store.previous(&ns, &id, self.ttl).await?;
        let (mut head, chains) = previous.unwrap_or_default();
        let (turn, now) = self.finish(draft, &chains);
        let seq = head.turns;
        if head.turns == 0 {
            head.first_ms = turn.at_ms;
        }
        head.id = id;
        if !label.is_empty() {
            head.label = label;
        }
        head.turns += 1;
        head.last_ms = turn.at_ms;
        head.dialect.clone_from(&turn.dialect);
        head.route.clone_from(&turn.route);
        head.model.clone_from(&turn.model);
        let chains = match now {
            Some(now) => {
                add(&mut head.totals, &turn);
                self.count(&turn);
                now
            }
            None => {
                head.totals.failed += 1;
                chains
            }
        };
        self.store
            .record(
                &ns,
                &head,
                &chains,
                &turn,
                seq,
                self.config.keep_turns.max(1),
                self.ttl,
                durable,
            )
            .await
    }

    /// The turn, and for a completed one the chains its successor is compared with.
    fn finish(&self, draft: Draft, before: &Chains) -> (turn::Turn, Option<Chains>) {
        let Draft {
            tokenizer,
            dialect,
            mut turn,
            received,
            forwarded,
            results,
            response,
            started,
            ..
        } = draft;
        turn.ms.total = started.elapsed().as_secs_f64() * 1e3;
        let mut count = |part: &str| {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            h.update(tokenizer.as_str().as_bytes());
            h.update(part.as_bytes());
            let key = h.digest128();
            self.tokens
                .get_with(key, || chain::part_tokens(tokenizer, part))
        };
        let sent = chain::chain(dialect, &received, turn.at_ms, &mut count);
        // Forwarded unchanged (P1): the very same bytes, read once.
        let shown = if forwarded.as_ptr() == received.as_ptr() && forwarded.len() == received.len()
        {
            sent.clone()
        } else {
            chain::chain(dialect, &forwarded, turn.at_ms, &mut count)
        };
        let rates = self.config.prices.rates(dialect, &turn.model);
        let (sent_before, shown_before) = (known(&before.received), known(&before.forwarded));
        turn.received = Size {
            bytes: received.len() as u64,
            tokens: sent.tokens(),
        };
        turn.forwarded = Size {
            bytes: forwarded.len() as u64,
            tokens: shown.tokens(),
        };
        turn.prefix = Prefix {
            received_tokens: sent_before.map_or(0, |b| sent.shared(b)),
            forwarded_tokens: shown_before.map_or(0, |b| shown.shared(b)),
        };
        let mut received_cache = before.received_cache.clone();
        let mut forwarded_cache = before.forwarded_cache.clone();
        let warm = forwarded_cache.warm(turn.at_ms);
        turn.bill.received = chain::bill(dialect, &rates, &sent, &mut received_cache);
        turn.bill.forwarded = chain::bill(dialect, &rates, &shown, &mut forwarded_cache);
        turn.cost.received = turn.bill.received.cost(&rates);
        turn.cost.forwarded = turn.bill.forwarded.cost(&rates);
        turn.cache_break = shown_before.and_then(|b| {
            let caching =
                dialect != crate::dialect::Dialect::AnthropicMessages || !shown.marks.is_empty();
            cache_break(
                b,
                &shown,
                sent_before,
                &sent,
                turn.bill.forwarded,
                warm,
                caching,
            )
        });
        turn.results = results
            .iter()
            .take(turn::MAX_LISTED_RESULTS)
            .map(|r| turn::fate(dialect.shapes(), r))
            .collect();
        if turn.usage.is_none() {
            turn.usage = response
                .as_deref()
                .and_then(|b| std::str::from_utf8(b).ok())
                .and_then(|b| crate::dialect::usage::of_json(dialect, b));
        }
        let chains = turn.complete.then_some(Chains {
            received: sent,
            forwarded: shown,
            received_cache,
            forwarded_cache,
        });
        (turn, chains)
    }

    /// The savings counters of a completed turn, per route.
    fn count(&self, turn: &turn::Turn) {
        let m = &self.metrics;
        let route = turn.route.as_str();
        for (side, size, cost) in [
            ("received", turn.received, turn.cost.received),
            ("forwarded", turn.forwarded, turn.cost.forwarded),
        ] {
            m.input_tokens_total
                .with_label_values(&[route, side])
                .inc_by(size.tokens);
            m.input_cost_tokens_total
                .with_label_values(&[route, side])
                .inc_by(cost.max(0.0));
        }
        for (side, bill) in [
            ("received", turn.bill.received),
            ("forwarded", turn.bill.forwarded),
        ] {
            for (kind, n) in [
                ("read", bill.read),
                ("write", bill.write_short + bill.write_long),
                ("uncached", bill.uncached),
            ] {
                m.cache_tokens_total
                    .with_label_values(&[route, side, kind])
                    .inc_by(n);
            }
        }
        if let Some(b) = &turn.cache_break {
            m.cache_breaks_total
                .with_label_values(&[route, b.cause.as_str()])
                .inc();
        }
        if let Some(u) = turn.usage {
            for (kind, n) in [
                ("uncached", u.input),
                ("cached", u.cached),
                ("cache_creation", u.cache_creation),
            ] {
                m.provider_input_tokens_total
                    .with_label_values(&[route, kind])
                    .inc_by(n);
            }
        }
    }
}

/// Where and why the forwarded request `now` found less in the cache than `before` had: the
/// cache was cold, or its history differs from `before`'s inside what `before` held (the
/// agent's own change when what it sent differs there too, else sluice's). `None` when it
/// lost under 1,024 tokens of what it had cached before.
fn cache_break(
    before: &Chain,
    now: &Chain,
    sent_before: Option<&Chain>,
    sent: &Chain,
    bill: crate::projection::cache::Bill,
    warm: bool,
    caching: bool,
) -> Option<turn::Break> {
    let kept = now
        .links
        .iter()
        .zip(&before.links)
        .take_while(|(a, b)| a.0 == b.0)
        .count();
    // What the previous request left cached that this one did not read; a loss under the
    // smallest cacheable prefix is rounding (OpenAI's 128-token steps, the tail after a
    // previous breakpoint).
    let held = before.tokens().min(now.tokens());
    let rewritten = held.saturating_sub(bill.read);
    if !caching {
        return None;
    }
    if rewritten < 1024 {
        return None;
    }
    let cause = if !warm {
        "ttl"
    } else if sent_before.is_some_and(|b| sent.shared(b) < b.tokens()) {
        "client"
    } else {
        "sluice"
    };
    Some(turn::Break {
        cause: cause.into(),
        block: kept as u64,
        rewritten,
    })
}

/// A previous request's chain, when there was one.
fn known(chain: &Chain) -> Option<&Chain> {
    (!chain.links.is_empty()).then_some(chain)
}

/// A completed turn added to its session's totals.
fn add(t: &mut store::Totals, turn: &turn::Turn) {
    t.completed += 1;
    t.received_tokens += turn.received.tokens;
    t.forwarded_tokens += turn.forwarded.tokens;
    t.received_cost += turn.cost.received;
    t.forwarded_cost += turn.cost.forwarded;
    if let Some(u) = turn.usage {
        t.provider_input += u.total_input();
        t.provider_cached += u.cached;
        t.provider_output += u.output;
    }
    t.spilled = t
        .spilled
        .max(turn.results.iter().filter(|r| r.fate == "spilled").count() as u64);
    t.retired = t.retired.max(turn.context.map_or(0, |c| c.retired as u64));
    t.images_embedded += turn.images.iter().filter(|i| i.fate == "embedded").count() as u64;
    t.images_placeholders += turn.images.iter().filter(|i| i.fate != "embedded").count() as u64;
    t.reads += turn.reads.len() as u64;
}

/// What the session API serves for a session: its head and its kept turns, oldest first.
#[derive(Debug, Serialize, Deserialize)]
pub struct SessionRecord {
    pub session: Head,
    pub turns: Vec<turn::Turn>,
}
