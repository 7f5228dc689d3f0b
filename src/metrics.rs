//! Every metric sluice exports, defined in one place (SPEC O2). Names carry the `sluice_` prefix
//! and their unit; labels are low-cardinality (dialect, route name, status, outcome).

use prometheus::{
    CounterVec, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::error::GatewayError;

/// The outcomes of `sluice_commits_total`.
pub const COMMIT_OUTCOMES: [&str; 3] = ["committed", "discarded", "failed"];

/// Buckets for time spent inside sluice: from 25 µs to 100 ms.
const OVERHEAD_BUCKETS: &[f64] = &[
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1,
];
/// Buckets for whole requests and upstream waits: LLM calls take from milliseconds to minutes.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// How a relayed response body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOutcome {
    /// The upstream body ended and every byte reached the client.
    Completed,
    /// The client went away before the end.
    Cancelled,
    /// The upstream failed or went silent mid-body.
    UpstreamError,
}

impl StreamOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            StreamOutcome::Completed => "completed",
            StreamOutcome::Cancelled => "cancelled",
            StreamOutcome::UpstreamError => "upstream_error",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    /// Requests by dialect, route and final status (counted when the response head is sent).
    pub requests_total: IntCounterVec,
    /// From the request's arrival to the end of its response body.
    pub request_duration_seconds: HistogramVec,
    /// From sending upstream to the upstream's first body byte.
    pub upstream_duration_seconds: HistogramVec,
    /// Time spent in sluice itself: reading, projecting and forwarding the request, and
    /// preparing the response head; excludes the client upload and the upstream wait.
    pub overhead_seconds: Histogram,
    pub inflight_requests: IntGauge,
    /// Client connections open on the proxy listener (at most `max_connections`).
    pub connections_open: IntGauge,
    /// Client connections closed by sluice after `max_requests_per_connection` requests.
    pub connections_recycled_total: IntCounter,
    /// Idle client connections closed at `max_connections` to make room for a new one.
    pub connections_shed_total: IntCounter,
    /// Relayed `text/event-stream` bodies by how they ended, recorded at the end.
    pub streams_total: IntCounterVec,
    /// sluice's own error responses by kind.
    pub errors_total: IntCounterVec,
    /// Requests refused with 429 because their tenant was over a `[limits]` share, by which.
    pub tenant_rejected_total: IntCounterVec,
    /// Requests in flight per tenant, when `[limits]` sets any share: the busiest tenants by
    /// their namespace's first 12 hex digits, the rest as `other` (`server/busiest.rs`).
    pub tenant_inflight_requests: IntGaugeVec,
    /// Tool results stored as new text artifacts (first spill only; repeats are memo hits).
    pub spills_total: IntCounterVec,
    /// Bytes of text stored by those spills.
    pub spilled_bytes_total: IntCounterVec,
    /// Artifact store operations by op and result.
    pub artifact_store_seconds: HistogramVec,
    /// Images by what happened to them in a request: embedded, deferred, refused, placeholder.
    pub images_total: IntCounterVec,
    /// Base64 bytes of images embedded.
    pub image_bytes_total: IntCounter,
    /// Images embedded after a downscale.
    pub downscales_total: IntCounter,
    /// Delivery-state deltas by fate: committed, discarded (response incomplete), failed.
    pub commits_total: IntCounterVec,
    /// Session store operations by backend and op.
    pub store_seconds: HistogramVec,
    /// Sessions seen within the idle TTL (this process's view).
    pub sessions_active: IntGauge,
    /// Images pruned by `recent` pruning (A4), counted when the pruning is committed.
    pub images_pruned_total: IntCounter,
    /// Read-tool calls sluice answered, by outcome (page, image, image_refused, audio,
    /// audio_refused, bad_cursor, expired, store_error).
    pub read_calls_total: IntCounterVec,
    /// Read rounds sluice answered per request that offered the read tool.
    pub read_rounds: Histogram,
    /// 1 while the store answered its last check (every few seconds and on each /readyz), else 0.
    pub store_up: IntGaugeVec,
    /// Tool results the context guard retired, counted when the retirement is committed (once
    /// per result, however many requests chose it).
    pub context_retired_total: IntCounterVec,
    /// Requests still over their window's room with nothing left to retire (forwarded anyway).
    pub context_overflows_total: IntCounterVec,
    /// The estimated input tokens of requests the guard looked at, as forwarded.
    pub input_tokens_estimated: Histogram,
    /// Estimated input tokens of completed requests by route and side (`received` from the
    /// agent, `forwarded` to the provider); the inspector counts them (docs/inspector.md).
    pub input_tokens_total: IntCounterVec,
    /// The same, weighted by the provider's prompt-cache prices, in uncached input tokens.
    pub input_cost_tokens_total: CounterVec,
    /// Input tokens the provider reported, by route and kind (uncached, cached,
    /// cache_creation).
    pub provider_input_tokens_total: IntCounterVec,
    /// Input tokens of completed requests as the exact cache model bills them, by route, side
    /// (`received`, `forwarded`) and kind (`read`, `write`, `uncached`).
    pub cache_tokens_total: IntCounterVec,
    /// Forwarded requests that found less of their history in the cache than the previous
    /// request left there, by route and cause (`ttl`, `client`, `sluice`).
    pub cache_breaks_total: IntCounterVec,
    /// History edits sluice put off because they would not pay back yet (docs/cache.md).
    pub deferred_edits_total: IntCounterVec,
    /// Turn records dropped: the inspector's queue was full or its store failed.
    pub inspector_dropped_total: IntCounter,
    /// Audio items in tool results by outcome (`placeholder`, `refused`) and reason.
    pub audio_total: IntCounterVec,
    /// Request bodies' bytes by how their view read them: `resumed` (an earlier turn of the
    /// conversation had read them: hashed, not parsed again) or `scanned`.
    pub view_bytes_total: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let requests_total = IntCounterVec::new(
            Opts::new(
                "sluice_requests_total",
                "Requests by dialect, route and status.",
            ),
            &["dialect", "route", "status"],
        )?;
        let request_duration_seconds = HistogramVec::new(
            HistogramOpts::new(
                "sluice_request_duration_seconds",
                "Request arrival to end of response body.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["dialect"],
        )?;
        let upstream_duration_seconds = HistogramVec::new(
            HistogramOpts::new(
                "sluice_upstream_duration_seconds",
                "Upstream request sent to its first body byte.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["dialect", "route"],
        )?;
        let overhead_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_overhead_seconds",
                "Time spent in sluice itself per request (excludes upstream wait).",
            )
            .buckets(OVERHEAD_BUCKETS.to_vec()),
        )?;
        let inflight_requests = IntGauge::new(
            "sluice_inflight_requests",
            "Requests whose response has not ended.",
        )?;
        let streams_total = IntCounterVec::new(
            Opts::new(
                "sluice_streams_total",
                "Relayed event streams by how they ended.",
            ),
            &["dialect", "outcome"],
        )?;
        let errors_total = IntCounterVec::new(
            Opts::new(
                "sluice_errors_total",
                "sluice's own error responses by kind.",
            ),
            &["kind"],
        )?;
        let tenant_rejected_total = IntCounterVec::new(
            Opts::new(
                "sluice_tenant_rejected_total",
                "Requests refused with 429: their tenant was over a [limits] share (concurrency, rate), or connections refused because their source address held address_connections (address).",
            ),
            &["reason"],
        )?;
        let tenant_inflight_requests = IntGaugeVec::new(
            Opts::new(
                "sluice_tenant_inflight_requests",
                "Requests in flight per tenant when [limits] sets a share: the ten busiest tenants by the first 12 hex digits of their storage namespace, the rest as other.",
            ),
            &["tenant"],
        )?;
        let spills_total = IntCounterVec::new(
            Opts::new(
                "sluice_spills_total",
                "Tool results spilled to new text artifacts.",
            ),
            &["dialect", "route"],
        )?;
        let spilled_bytes_total = IntCounterVec::new(
            Opts::new(
                "sluice_spilled_bytes_total",
                "Bytes of tool-result text stored as artifacts.",
            ),
            &["dialect", "route"],
        )?;
        let artifact_store_seconds = HistogramVec::new(
            HistogramOpts::new(
                "sluice_artifact_store_seconds",
                "Artifact store operations by op and result.",
            )
            .buckets(OVERHEAD_BUCKETS.to_vec()),
            &["op", "result"],
        )?;
        let images_total = IntCounterVec::new(
            Opts::new(
                "sluice_images_total",
                "Images per request by outcome (embedded, deferred, refused, placeholder) and reason.",
            ),
            &["outcome", "reason"],
        )?;
        let image_bytes_total = IntCounter::new(
            "sluice_image_bytes_total",
            "Base64 bytes of images embedded in forwarded requests.",
        )?;
        let downscales_total = IntCounter::new(
            "sluice_downscales_total",
            "Images embedded after a downscale.",
        )?;
        let commits_total = IntCounterVec::new(
            Opts::new(
                "sluice_commits_total",
                "Delivery-state deltas: committed, discarded (response incomplete) or failed.",
            ),
            &["outcome"],
        )?;
        let store_seconds = HistogramVec::new(
            HistogramOpts::new("sluice_store_seconds", "Session store operations.")
                .buckets(OVERHEAD_BUCKETS.to_vec()),
            &["backend", "op"],
        )?;
        let sessions_active = IntGauge::new(
            "sluice_sessions_active",
            "Sessions this process saw within the idle TTL.",
        )?;
        let images_pruned_total = IntCounter::new(
            "sluice_images_pruned_total",
            "Images removed by recent pruning (committed).",
        )?;
        let store_up = IntGaugeVec::new(
            Opts::new(
                "sluice_store_up",
                "1 while the artifact and session store answers, else 0.",
            ),
            &["backend"],
        )?;
        // Counters alert rules divide or rate over start at zero rather than appearing with
        // the first event.
        for kind in GatewayError::KINDS {
            errors_total.with_label_values(&[kind]);
        }
        for reason in crate::error::TENANT_LIMITS {
            tenant_rejected_total.with_label_values(&[reason]);
        }
        for outcome in COMMIT_OUTCOMES {
            commits_total.with_label_values(&[outcome]);
        }
        let read_calls_total = IntCounterVec::new(
            Opts::new(
                "sluice_read_calls_total",
                "Read-tool calls answered by sluice, by outcome.",
            ),
            &["outcome"],
        )?;
        let read_rounds = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_read_rounds",
                "Read rounds answered per request that offered the read tool.",
            )
            .buckets(vec![0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0]),
        )?;
        for outcome in [
            "page",
            "image",
            "image_refused",
            "audio",
            "audio_refused",
            "bad_cursor",
            "expired",
            "store_error",
        ] {
            read_calls_total.with_label_values(&[outcome]);
        }
        registry.register(Box::new(read_calls_total.clone()))?;
        registry.register(Box::new(read_rounds.clone()))?;
        registry.register(Box::new(store_up.clone()))?;
        registry.register(Box::new(sessions_active.clone()))?;
        registry.register(Box::new(images_pruned_total.clone()))?;
        registry.register(Box::new(commits_total.clone()))?;
        registry.register(Box::new(store_seconds.clone()))?;
        registry.register(Box::new(images_total.clone()))?;
        registry.register(Box::new(image_bytes_total.clone()))?;
        registry.register(Box::new(downscales_total.clone()))?;
        registry.register(Box::new(spills_total.clone()))?;
        registry.register(Box::new(spilled_bytes_total.clone()))?;
        registry.register(Box::new(artifact_store_seconds.clone()))?;
        registry.register(Box::new(requests_total.clone()))?;
        registry.register(Box::new(request_duration_seconds.clone()))?;
        registry.register(Box::new(upstream_duration_seconds.clone()))?;
        registry.register(Box::new(overhead_seconds.clone()))?;
        registry.register(Box::new(inflight_requests.clone()))?;
        let connections_open = IntGauge::new(
            "sluice_connections_open",
            "Client connections open on the proxy listener.",
        )?;
        registry.register(Box::new(connections_open.clone()))?;
        let connections_recycled_total = IntCounter::new(
            "sluice_connections_recycled_total",
            "Client connections whose last answer said connection: close, after max_requests_per_connection requests.",
        )?;
        registry.register(Box::new(connections_recycled_total.clone()))?;
        let connections_shed_total = IntCounter::new(
            "sluice_connections_shed_total",
            "Idle client connections closed at max_connections to make room for a new one (the one idle the longest first).",
        )?;
        registry.register(Box::new(connections_shed_total.clone()))?;
        registry.register(Box::new(streams_total.clone()))?;
        registry.register(Box::new(errors_total.clone()))?;
        registry.register(Box::new(tenant_rejected_total.clone()))?;
        registry.register(Box::new(tenant_inflight_requests.clone()))?;
        let context_retired_total = IntCounterVec::new(
            Opts::new(
                "sluice_context_retired_total",
                "Tool results retired by the context-window guard, by route.",
            ),
            &["route"],
        )?;
        let context_overflows_total = IntCounterVec::new(
            Opts::new(
                "sluice_context_overflows_total",
                "Requests over their context window with nothing left to retire, by route.",
            ),
            &["route"],
        )?;
        let input_tokens_estimated = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_input_tokens_estimated",
                "Estimated input tokens of requests the context guard looked at, after projection.",
            )
            .buckets(prometheus::exponential_buckets(1000.0, 2.0, 12)?),
        )?;
        registry.register(Box::new(context_retired_total.clone()))?;
        registry.register(Box::new(context_overflows_total.clone()))?;
        registry.register(Box::new(input_tokens_estimated.clone()))?;
        let input_tokens_total = IntCounterVec::new(
            Opts::new(
                "sluice_input_tokens_total",
                "Estimated input tokens of completed requests, as received and as forwarded.",
            ),
            &["route", "side"],
        )?;
        let input_cost_tokens_total = CounterVec::new(
            Opts::new(
                "sluice_input_cost_tokens_total",
                "Cache-weighted input cost of completed requests, in uncached input tokens.",
            ),
            &["route", "side"],
        )?;
        let provider_input_tokens_total = IntCounterVec::new(
            Opts::new(
                "sluice_provider_input_tokens_total",
                "Input tokens the provider reported, by kind (uncached, cached, cache_creation).",
            ),
            &["route", "kind"],
        )?;
        let cache_tokens_total = IntCounterVec::new(
            Opts::new(
                "sluice_cache_tokens_total",
                "Input tokens of completed requests as the provider's prompt cache bills them, by side and kind (read, write, uncached).",
            ),
            &["route", "side", "kind"],
        )?;
        let cache_breaks_total = IntCounterVec::new(
            Opts::new(
                "sluice_cache_breaks_total",
                "Forwarded requests that lost cached history, by cause (ttl, client, sluice).",
            ),
            &["route", "cause"],
        )?;
        let deferred_edits_total = IntCounterVec::new(
            Opts::new(
                "sluice_deferred_edits_total",
                "History edits put off while the provider's cache is warm and the edit would not pay back yet.",
            ),
            &["route"],
        )?;
        registry.register(Box::new(cache_tokens_total.clone()))?;
        registry.register(Box::new(cache_breaks_total.clone()))?;
        registry.register(Box::new(deferred_edits_total.clone()))?;
        let inspector_dropped_total = IntCounter::new(
            "sluice_inspector_dropped_total",
            "Turn records dropped (inspector queue full or store failure).",
        )?;
        registry.register(Box::new(input_tokens_total.clone()))?;
        registry.register(Box::new(input_cost_tokens_total.clone()))?;
        registry.register(Box::new(provider_input_tokens_total.clone()))?;
        registry.register(Box::new(inspector_dropped_total.clone()))?;
        let view_bytes_total = IntCounterVec::new(
            Opts::new(
                "sluice_view_bytes_total",
                "Request body bytes by how their view read them: resumed (read by an earlier turn, hashed only) or scanned.",
            ),
            &["read"],
        )?;
        registry.register(Box::new(view_bytes_total.clone()))?;
        let audio_total = IntCounterVec::new(
            Opts::new(
                "sluice_audio_total",
                "Audio items in tool results by outcome (embedded, deferred, placeholder, refused) and reason.",
            ),
            &["outcome", "reason"],
        )?;
        // The outcomes every audio route has, present from startup (the dashboard's series).
        for (outcome, reason) in [
            ("embedded", ""),
            ("deferred", "budget"),
            ("placeholder", "no_audio_input"),
            ("placeholder", "shown_before"),
        ] {
            audio_total.with_label_values(&[outcome, reason]);
        }
        registry.register(Box::new(audio_total.clone()))?;
        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(Self {
            registry,
            requests_total,
            request_duration_seconds,
            upstream_duration_seconds,
            overhead_seconds,
            inflight_requests,
            connections_open,
            connections_recycled_total,
            connections_shed_total,
            streams_total,
            errors_total,
            tenant_rejected_total,
            tenant_inflight_requests,
            spills_total,
            spilled_bytes_total,
            artifact_store_seconds,
            images_total,
            image_bytes_total,
            downscales_total,
            commits_total,
            store_seconds,
            sessions_active,
            images_pruned_total,
            store_up,
            read_calls_total,
            read_rounds,
            context_retired_total,
            context_overflows_total,
            input_tokens_estimated,
            input_tokens_total,
            input_cost_tokens_total,
            provider_input_tokens_total,
            cache_tokens_total,
            cache_breaks_total,
            deferred_edits_total,
            inspector_dropped_total,
            audio_total,
            view_bytes_total,
        })
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8192);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_named_metrics() {
        let m = Metrics::new().unwrap();
        m.requests_total
            .with_label_values(&["openai-chat", "r", "200"])
            .inc();
        m.streams_total
            .with_label_values(&["openai-chat", StreamOutcome::Cancelled.as_str()])
            .inc();
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text
            .contains(r#"sluice_requests_total{dialect="openai-chat",route="r",status="200"} 1"#));
        assert!(
            text.contains(r#"sluice_streams_total{dialect="openai-chat",outcome="cancelled"} 1"#)
        );
        assert!(text.contains("sluice_inflight_requests 0"));
    }
}
