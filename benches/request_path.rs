//! The request path in-process (foundation issue, benchmark 9):
//! - `view`: reading a request into its projection view, projecting and splicing, in steady
//!   state (every projection remembered) and the first time (text exit: decode, page, hash),
//!   against a plain serde_json `RawValue` scan of the same bytes as the baseline;
//! - `round_trip`: one request through an in-process sluice to the mock provider, against the
//!   same request sent to the mock directly.
//!
//! - `first_byte`: time to the first body chunk of a streamed answer that needs no read, for a
//!   request holding a cursor: with the read tool offered (the answer passes through the
//!   rounds' stitcher) against the same request with the tool off (`max_read_steps = 0`, the
//!   plain relay), and direct to the mock.
//!
//! - `context`: the 200 KB agent request through sluice with the context guard off, on with a
//!   window far above it (not engaged: its bytes cannot reach the trigger), and on with a window
//!   it could reach (engaged: counted, below the trigger, nothing retired).
//!
//! - `inspector`: a small and the 200 KB agent request with the inspector off and on.
//!
//! - `decision`: the 200 KB agent request in Anthropic's shape under `[routes.cache]` eager
//!   with no breakpoints of sluice's, and economic with them (the edit decision's cost).
//!
//! Run: `cargo bench --bench request_path`. Figures are ratios to the baselines of the same run.

#![allow(clippy::unwrap_used)] // benchmark code: fail loudly

/// The binary's allocator (src/main.rs), so fresh buffers cost here what they cost in service.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[path = "../tests/common/mock.rs"]
#[allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod mock;

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::json;
use sluice::config::{Config, RouteConfig};
use sluice::dialect::Dialect;
use sluice::memo::Memo;
use sluice::projection::attach::state::SessionState;
use sluice::projection::memos::Memos;
use sluice::projection::{project, splice, Context};
use sluice::server::Server;
use sluice::tenant::Tenant;

/// An agent request of about `target` bytes: a system prompt, a task, then tool turns with
/// build-log-like output, until the size is reached (30 turns for the 200 KB case).
fn agent_chat(turns: usize, output_bytes: usize) -> Bytes {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful coding agent."}),
        json!({"role": "user", "content": "Fix the failing build."}),
    ];
    for t in 0..turns {
        let id = format!("call_{t:04}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\":\"cargo build\"}"}}]}));
        let line = format!("   Compiling crate-{t} v0.1.0 (/work/crate-{t})\n");
        let output: String = line.repeat(output_bytes / line.len() + 1);
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
    }
    Bytes::from(json!({"model": "gpt-4o", "messages": messages}).to_string())
}

fn small_chat() -> Bytes {
    Bytes::from(
        json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "Say hello."}]})
            .to_string(),
    )
}

fn view(c: &mut Criterion) {
    let tenant = Tenant::from_credential(b"bench");
    let route = RouteConfig::default();
    let mut group = c.benchmark_group("view");
    for (name, body) in [
        ("small", small_chat()),
        ("agent_200k_30_turns", agent_chat(30, 6_500)),
        // Every tool output is over the 30,000-unit budget: all of them spill.
        ("history_1mb_all_spilled", agent_chat(20, 50_000)),
    ] {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(
            BenchmarkId::new("raw_value_scan", name),
            &body,
            |b, body| {
                b.iter(|| {
                    let v: Box<serde_json::value::RawValue> =
                        serde_json::from_slice(black_box(body)).unwrap();
                    black_box(v);
                })
            },
        );
        // Steady state: the memo already holds every projection (an agent resending history).
        let memo = Memo::default();
        let warm = |memo: &Memo| {
            let view = Dialect::OpenAiChat.read_view(&body).unwrap();
            let ctx = Context {
                tenant: &tenant,
                policy: route.policy(&route.read_tool),
                memo,
                state: &SessionState::default(),
                now_ms: 0,
            };
            let p = project(&view, &ctx);
            for (k, v) in p.memos {
                memo.insert_page(k, v);
            }
        };
        warm(&memo);
        group.bench_with_input(
            BenchmarkId::new("project_steady", name),
            &body,
            |b, body| {
                b.iter(|| {
                    let view = Dialect::OpenAiChat.read_view(black_box(body)).unwrap();
                    let ctx = Context {
                        tenant: &tenant,
                        policy: route.policy(&route.read_tool),
                        memo: &memo,
                        state: &SessionState::default(),
                        now_ms: 0,
                    };
                    let projection = project(&view, &ctx);
                    drop(view);
                    black_box(splice(body, projection.edits).unwrap());
                })
            },
        );
        // First time: no page remembered; every over-budget result is decoded, paged and
        // hashed. (Which tool results hold images is remembered, as for any history an agent
        // resends: one projection whose pages are not kept.)
        let cold = Memo::default();
        {
            let view = Dialect::OpenAiChat.read_view(&body).unwrap();
            let ctx = Context {
                tenant: &tenant,
                policy: route.policy(&route.read_tool),
                memo: &cold,
                state: &SessionState::default(),
                now_ms: 0,
            };
            black_box(project(&view, &ctx));
        }
        group.bench_with_input(
            BenchmarkId::new("project_first_time", name),
            &body,
            |b, body| {
                b.iter(|| {
                    let memo = &cold;
                    let view = Dialect::OpenAiChat.read_view(black_box(body)).unwrap();
                    let ctx = Context {
                        tenant: &tenant,
                        policy: route.policy(&route.read_tool),
                        memo,
                        state: &SessionState::default(),
                        now_ms: 0,
                    };
                    black_box(project(&view, &ctx));
                })
            },
        );
    }
    group.finish();
}

/// The 200 KB agent request in Anthropic's shape (30 turns of build output, no breakpoints of
/// its own), for the edit decision's cost.
fn agent_anthropic(turns: usize, output_bytes: usize) -> Bytes {
    let mut messages = vec![json!({"role": "user", "content": "Fix the failing build."})];
    for t in 0..turns {
        let id = format!("toolu_{t:04}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "bash", "input": {"cmd": "cargo build"}}]}));
        let line = format!("   Compiling crate-{t} v0.1.0 (/work/crate-{t})\n");
        let output: String = line.repeat(output_bytes / line.len() + 1);
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": output}]}));
    }
    Bytes::from(
        json!({"model": "claude-sonnet-4-5", "max_tokens": 8000,
            "system": "You are a careful coding agent.", "messages": messages})
        .to_string(),
    )
}

/// What the edit decision costs on the 200 KB agent request (docs/cache.md, issue #38):
/// projected and spliced into pieces in steady state with pruning as A4 is written and no
/// breakpoints of sluice's (`eager_off`), and through the decision with sluice's breakpoints
/// (`economic_auto`: here the top-level marker a conversation without one gets).
fn decision(c: &mut Criterion) {
    use sluice::projection::policy::{Breakpoints, EditPolicy};
    let tenant = Tenant::from_credential(b"bench");
    let body = agent_anthropic(30, 6_500);
    let mut eager = RouteConfig::default();
    eager.cache.policy = EditPolicy::Eager;
    eager.cache.breakpoints = Breakpoints::Off;
    let economic = RouteConfig::default();
    let mut group = c.benchmark_group("decision");
    group.throughput(Throughput::Bytes(body.len() as u64));
    for (name, route) in [("eager_off", &eager), ("economic_auto", &economic)] {
        let memo = Memo::default();
        let state = SessionState {
            last_ms: 1,
            ..SessionState::default()
        };
        let run = |memo: &Memo| {
            let view = Dialect::AnthropicMessages
                .read_view(black_box(&body))
                .unwrap();
            let ctx = Context {
                tenant: &tenant,
                policy: route.policy(&route.read_tool),
                memo,
                state: &state,
                now_ms: 2,
            };
            let projection = project(&view, &ctx);
            drop(view);
            // Into pieces, as the body for an `http` upstream is: joining them for `https`
            // copies the 200 KB once whenever any edit is made, the marker's or another's.
            let pieces = sluice::projection::splice_shared(&body, projection.edits).unwrap();
            (pieces, projection.memos)
        };
        for (k, v) in run(&memo).1 {
            memo.insert_page(k, v);
        }
        group.bench_function(BenchmarkId::new(name, "agent_200k_30_turns"), |b| {
            b.iter(|| black_box(run(&memo).0))
        });
    }
    group.finish();
}

/// A two-thread runtime for the client side of the in-process round trips.
fn client_runtime() -> tokio::runtime::Runtime {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// An in-process sluice whose routes all go to `upstream`.
struct Running {
    url: String,
    metrics: std::sync::Arc<sluice::metrics::Metrics>,
    stop: tokio::sync::oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Starts sluice on `runtime`, with `tweak` applied to its config.
    fn start(
        runtime: &tokio::runtime::Runtime,
        upstream: &str,
        tweak: impl FnOnce(&mut Config),
    ) -> Running {
        let mut config = Config {
            listen: "127.0.0.1:0".into(),
            admin_listen: "127.0.0.1:0".into(),
            ..Config::default()
        };
        for route in &mut config.routes {
            route.upstream = upstream.to_string();
        }
        tweak(&mut config);
        let server = runtime.block_on(Server::bind(config)).unwrap();
        let url = format!("http://{}", server.proxy_addr().unwrap());
        let metrics = server.metrics();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = runtime.spawn(server.run(async move {
            let _ = stopped.await;
        }));
        Running {
            url,
            metrics,
            stop,
            serving,
        }
    }

    fn stop(self, runtime: &tokio::runtime::Runtime) {
        let _ = self.stop.send(());
        let _ = runtime.block_on(self.serving);
    }
}

fn round_trip(c: &mut Criterion) {
    let upstream = mock::MockUpstream::start();
    upstream.record(false);
    let runtime = client_runtime();
    let sluice = Running::start(&runtime, &upstream.base_url(), |_| {});
    let client = reqwest::Client::new();
    let mut group = c.benchmark_group("round_trip");
    for (name, body) in [
        ("small", small_chat()),
        ("agent_200k_30_turns", agent_chat(30, 6_500)),
    ] {
        for (target, base) in [
            ("direct", upstream.base_url()),
            ("sluice", sluice.url.clone()),
        ] {
            let url = format!("{base}/v1/chat/completions");
            group.bench_function(BenchmarkId::new(target, name), |b| {
                b.to_async(&runtime).iter(|| async {
                    let resp = client.post(&url).body(body.clone()).send().await.unwrap();
                    black_box(resp.bytes().await.unwrap());
                })
            });
        }
    }
    group.finish();
    sluice.stop(&runtime);
}

/// A streamed chat request whose last tool result is spilled (it holds a cursor).
fn streamed_with_cursor() -> Bytes {
    let output: String = (0..4000)
        .map(|i| format!("test tests::case_{i} ... ok\n"))
        .collect();
    Bytes::from(
        json!({"model": "gpt-4o", "stream": true, "messages": [
            {"role": "user", "content": "run the tests"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": output}]})
        .to_string(),
    )
}

fn first_byte(c: &mut Criterion) {
    let upstream = mock::MockUpstream::start();
    upstream.record(false);
    let runtime = client_runtime();
    let dir = tempfile::tempdir().unwrap();
    let proxies: Vec<(&str, Running)> = [("sluice_read_tool", 4), ("sluice_tool_off", 0)]
        .into_iter()
        .map(|(name, steps)| {
            let sluice = Running::start(&runtime, &upstream.base_url(), |config| {
                config.store.data_dir = dir.path().join(name);
                for route in &mut config.routes {
                    route.max_read_steps = steps;
                }
            });
            (name, sluice)
        })
        .collect();
    let client = reqwest::Client::new();
    let body = streamed_with_cursor();
    let mut group = c.benchmark_group("first_byte");
    let targets = [("direct", upstream.base_url())]
        .into_iter()
        .chain(proxies.iter().map(|(name, p)| (*name, p.url.clone())));
    for (target, base) in targets {
        let url = format!("{base}/v1/chat/completions");
        group.bench_function(BenchmarkId::new(target, "streamed_with_cursor"), |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let (client, url, body) = (client.clone(), url.clone(), body.clone());
                async move {
                    let mut total = std::time::Duration::ZERO;
                    for _ in 0..iters {
                        let start = std::time::Instant::now();
                        let mut resp = client.post(&url).body(body.clone()).send().await.unwrap();
                        black_box(resp.chunk().await.unwrap());
                        total += start.elapsed();
                        // The rest of the stream, untimed.
                        while resp.chunk().await.unwrap().is_some() {}
                    }
                    total
                }
            })
        });
    }
    group.finish();
    for (_, sluice) in proxies {
        sluice.stop(&runtime);
    }
}

/// A noisy (incompressible) PNG of `w`×`h`, like a busy screenshot.
fn noisy_png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        let v =
            (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503)).wrapping_mul(2_246_822_519);
        image::Rgb([(v >> 24) as u8, (v >> 16) as u8, (v >> 8) as u8])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn images(c: &mut Criterion) {
    use base64::Engine;
    let engine = base64::engine::general_purpose::STANDARD;
    let tenant = Tenant::from_credential(b"bench");
    let png = noisy_png(900, 780);
    let data = engine.encode(&png);
    let content = serde_json::value::RawValue::from_string(
        serde_json::Value::String(
            json!({"content": [{"type": "text", "text": "Screenshot taken."},
                               {"type": "image", "data": data, "mimeType": "image/png"}]})
            .to_string(),
        )
        .to_string(),
    )
    .unwrap();
    let mut group = c.benchmark_group("images");
    group.throughput(Throughput::Bytes(png.len() as u64));
    group.bench_function("base64_decode_twice/2mb_screenshot", |b| {
        b.iter(|| {
            black_box(engine.decode(black_box(&data)).unwrap());
            black_box(engine.decode(black_box(&data)).unwrap());
        })
    });
    group.bench_function("extract_and_check/2mb_screenshot", |b| {
        b.iter(|| {
            black_box(sluice::projection::attach::extract::from_result(
                Dialect::AnthropicMessages.shapes(),
                black_box(&*content).into(),
                &tenant,
            ))
        })
    });
    let memo = Memo::default();
    // The result as a view hands it over (its digest hashed once, by the reader).
    let result = sluice::projection::ToolResult {
        item: 0,
        source: "call".into(),
        tool_name: None,
        content: (&*content).into(),
        span: sluice::projection::Span { start: 0, end: 0 },
        digest: xxhash_rust::xxh3::xxh3_128(content.get().as_bytes()),
        slot: None,
    };
    let shapes = Dialect::AnthropicMessages.shapes();
    memo.tool_images(shapes, &result, &tenant);
    group.bench_function("extract_and_check_remembered/2mb_screenshot", |b| {
        b.iter(|| black_box(memo.tool_images(shapes, black_box(&result), &tenant)))
    });
    let photo = {
        let mut out = std::io::Cursor::new(Vec::new());
        image::DynamicImage::ImageRgb8(image::RgbImage::from_fn(4000, 3000, |x, y| {
            image::Rgb([
                (x % 256) as u8,
                (y % 256) as u8,
                ((x / 16 + y / 16) % 256) as u8,
            ])
        }))
        .write_to(&mut out, image::ImageFormat::Jpeg)
        .unwrap();
        sluice::image::check(out.into_inner().into(), Some("image/jpeg")).unwrap()
    };
    group.sample_size(10);
    group.bench_function("downscale/4000x3000_jpeg_to_2000px", |b| {
        b.iter(|| black_box(sluice::image::downscale(&photo, 2000, 5 << 20).unwrap()))
    });
    group.finish();
}

/// The context guard below its trigger (docs/context-guard.md): the same request with the
/// guard off, on and not engaged, on and engaged (counted from its memo, nothing retired).
fn context(c: &mut Criterion) {
    let upstream = mock::MockUpstream::start();
    upstream.record(false);
    let runtime = client_runtime();
    let body = agent_chat(30, 6_500);
    let client = reqwest::Client::new();
    let mut group = c.benchmark_group("context");
    for (name, window) in [("off", 0), ("on_far", 1_000_000), ("on_engaged", 250_000)] {
        let sluice = Running::start(&runtime, &upstream.base_url(), |config| {
            for route in &mut config.routes {
                route.context.window_tokens = window;
            }
        });
        let url = format!("{}/v1/chat/completions", sluice.url);
        group.bench_function(BenchmarkId::new(name, "agent_200k_30_turns"), |b| {
            b.to_async(&runtime).iter(|| async {
                let resp = client.post(&url).body(body.clone()).send().await.unwrap();
                let engaged = resp.headers().get("x-sluice-projection").cloned();
                black_box((engaged, resp.bytes().await.unwrap()));
            })
        });
        sluice.stop(&runtime);
    }
    group.finish();
}

/// Turn records (docs/inspector.md): the same requests through sluice with the inspector off
/// and on. On, each response's end hands a draft to the inspector's thread, which counts,
/// compares and writes it off the request path.
fn inspector(c: &mut Criterion) {
    let upstream = mock::MockUpstream::start();
    upstream.record(false);
    let runtime = client_runtime();
    let client = reqwest::Client::new();
    let data = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("inspector");
    for (name, enabled) in [("off", false), ("on", true)] {
        let sluice = Running::start(&runtime, &upstream.base_url(), |config| {
            config.inspector.enabled = enabled;
            config.store.data_dir = data.path().join(name);
        });
        let url = format!("{}/v1/chat/completions", sluice.url);
        let sent = std::sync::atomic::AtomicU64::new(0);
        for (case, body) in [
            ("small", small_chat()),
            ("agent_200k_30_turns", agent_chat(30, 6_500)),
        ] {
            group.bench_function(BenchmarkId::new(name, case), |b| {
                b.to_async(&runtime).iter(|| async {
                    sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let resp = client
                        .post(&url)
                        .header("x-sluice-session", case)
                        .body(body.clone())
                        .send()
                        .await
                        .unwrap();
                    black_box(resp.bytes().await.unwrap());
                })
            });
        }
        if enabled {
            // Records the inspector could not keep up with (it yields to requests).
            println!(
                "inspector: {} of {} turn records dropped",
                sluice.metrics.inspector_dropped_total.get(),
                sent.load(std::sync::atomic::Ordering::Relaxed)
            );
        }
        sluice.stop(&runtime);
    }
    group.finish();
}

criterion_group!(benches, view, images, round_trip, first_byte, context, inspector, decision);
criterion_main!(benches);
