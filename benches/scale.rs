//! Past one Redis, measured (issue #39, docs/deploy.md "Sizing"): three in-process sluice
//! replicas on a Redis Cluster with artifacts in an S3-compatible bucket, `SESSIONS` Claude-Code-
//! shaped screenshot sessions of `TURNS` turns each (every turn's tool result brings one new
//! 1280×800 PNG and the history keeps the earlier ones), each turn sent to the next replica in
//! turn, as a round-robin load balancer would. Sessions belong to ten tenants and draw their
//! screenshots from a pool, so some repeat within a tenant (content-addressed: stored once).
//!
//! Every turn is also sent, in the same run and interleaved with it, straight to the mock and
//! through three sluices on the embedded store (redb, artifacts on its disk; each session kept
//! on one, as a sidecar is), so the added time of a turn on the cluster + S3 is a ratio to the
//! embedded store's, measured beside it on as many servers.
//!
//! Printed: Redis memory per session (the `sluice:*` keys' `MEMORY USAGE` on every master,
//! after minus before, by kind: state, inspector records, artifacts), the objects in the bucket
//! under the run's prefix against the unique (tenant, screenshot) pairs sent, and the turn's
//! time on each path (median and p99) with the added time's ratio.
//!
//! Needs the Redis Cluster and the bucket of `.ci/run`: `bash tests/redis/cluster.sh` and
//! `AWS_ACCESS_KEY_ID=sluice-test AWS_SECRET_ACCESS_KEY=sluice-test-secret bash
//! tests/s3/seaweedfs.sh`, with the same two variables (and `AWS_REGION=us-east-1`) set for the
//! run. Run: `cargo bench --bench scale` (release; `SESSIONS` (300), `TURNS` (40),
//! `CONCURRENCY` (8), `SCALE_REDIS` (redis://127.0.0.1:7000/0), `SCALE_S3`
//! (http://127.0.0.1:8333)). Its keys expire after an hour (`idle_ttl_seconds`); the bench
//! deletes its objects when it is done.

#![allow(clippy::unwrap_used, clippy::expect_used)] // benchmark code: fail loudly

/// The binary's allocator (src/main.rs).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[path = "../tests/common/mock.rs"]
#[allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod mock;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use futures_util::StreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use sluice::config::blobs::BlobsBackend;
use sluice::config::{Config, StoreBackend};
use sluice::server::Server;

/// Tenants the sessions are spread over (each its own API key).
const TENANTS: usize = 10;
/// Distinct screenshots the sessions draw from.
const POOL: usize = 160;
const REPLICAS: usize = 3;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn env_str(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// A 1280×800 PNG of a plain page (bands of colour, rows of text-like strokes), 30-60 KB; the
/// top rows carry `seed` in binary, so every seed is a different picture.
fn screenshot(seed: u32) -> String {
    let img = image::RgbImage::from_fn(1280, 800, |x, y| {
        if y < 16 {
            let bit = (seed >> (x / 40).min(31)) & 1;
            return image::Rgb(if bit == 1 { [20, 90, 200] } else { [250; 3] });
        }
        let band = (y / 48 + seed) % 5;
        if (x / 7 + y / 18 + seed) % 13 == 0 && (y % 18) > 6 {
            image::Rgb([40, 40, 40])
        } else {
            image::Rgb([236 - band as u8 * 9, 242, 248 - (x / 200) as u8 * 4])
        }
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    base64::engine::general_purpose::STANDARD.encode(out.into_inner())
}

/// Which screenshot session `s` gets at turn `k`.
fn shot_of(s: usize, k: usize) -> usize {
    (s * 7 + k) % POOL
}

/// One turn's tool call and its result (one screenshot), as two messages of the array.
fn exchange(k: usize, shot: &str) -> String {
    format!(
        concat!(
            r#"{{"role":"assistant","content":[{{"type":"text","text":"Taking screenshot {k}."}},"#,
            r#"{{"type":"tool_use","id":"toolu_{k:04}","name":"screenshot","input":{{}}}}]}},"#,
            r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"toolu_{k:04}","content":["#,
            r#"{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{shot}"}}}}]}}]}}"#
        ),
        k = k,
        shot = shot
    )
}

/// The request of a turn whose history holds `exchanges`.
fn body(exchanges: &[String]) -> String {
    let mut out = String::with_capacity(exchanges.iter().map(String::len).sum::<usize>() + 512);
    out.push_str(r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":false,"#);
    out.push_str(r#""system":"You are a browsing agent. Use the screenshot tool.","#);
    out.push_str(r#""tools":[{"name":"screenshot","description":"Screenshot of the page","input_schema":{"type":"object","properties":{}}}],"#);
    out.push_str(r#""messages":[{"role":"user","content":"Check the page after each step."}"#);
    for e in exchanges {
        out.push(',');
        out.push_str(e);
    }
    out.push_str("]}");
    out
}

/// A sluice on `config`, served on `runtime` until `stop` is dropped; its proxy URL.
fn serve(
    runtime: &tokio::runtime::Runtime,
    config: Config,
    stops: &mut Vec<tokio::sync::oneshot::Sender<()>>,
) -> String {
    let server = runtime.block_on(Server::bind(config)).unwrap();
    let url = format!("http://{}/v1/messages", server.proxy_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    runtime.spawn(server.run(async move {
        let _ = stopped.await;
    }));
    stops.push(stop);
    url
}

fn base_config(upstream: &str, data_dir: &std::path::Path) -> Config {
    let mut config = Config {
        listen: "127.0.0.1:0".into(),
        admin_listen: "127.0.0.1:0".into(),
        ..Config::default()
    };
    config.store.data_dir = data_dir.to_path_buf();
    config.store.idle_ttl_seconds = 3600;
    config.inspector.enabled = true;
    for route in &mut config.routes {
        route.upstream = upstream.to_string();
    }
    config
}

/// The masters of the cluster that `url` names a node of, as `redis://host:port/` URLs.
async fn masters(url: &str) -> Vec<String> {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .unwrap();
    nodes
        .lines()
        .filter(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("master")))
        .filter_map(|l| l.split(' ').nth(1))
        .filter_map(|a| a.split('@').next())
        .map(|a| format!("redis://{a}/"))
        .collect()
}

/// Bytes of the `sluice:*` keys on every master, by kind (`s` state, `i` inspector, `a`
/// artifacts), with the number of keys of each.
async fn redis_bytes(masters: &[String]) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    for m in masters {
        let mut conn = redis::Client::open(m.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg("sluice:*")
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .unwrap();
            for key in keys {
                let bytes: Option<u64> = redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(&key)
                    .arg("SAMPLES")
                    .arg(0)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let kind = key.split(':').nth(1).unwrap_or("?").to_string();
                let entry = out.entry(kind).or_insert((0, 0));
                entry.0 += bytes.unwrap_or(0);
                entry.1 += 1;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    out
}

fn bucket(endpoint: &str) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name("sluice")
        .with_region("us-east-1")
        .with_endpoint(endpoint)
        .with_virtual_hosted_style_request(false)
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
        .build()
        .unwrap()
}

/// Median and p99 of `samples`, in milliseconds.
fn spread(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    (at(0.5), at(0.99))
}

/// The three paths a turn is sent on.
#[derive(Clone, Copy)]
enum Path {
    Direct,
    Embedded,
    Shared,
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sessions = env_or("SESSIONS", 300);
    let turns = env_or("TURNS", 40);
    let concurrency = env_or("CONCURRENCY", 8);
    let redis_url = env_str("SCALE_REDIS", "redis://127.0.0.1:7000/0");
    let s3 = env_str("SCALE_S3", "http://127.0.0.1:8333");
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let prefix = format!("scale-{started}/");

    eprintln!("scale: encoding {POOL} 1280x800 PNG screenshots…");
    let pool: Arc<Vec<String>> = Arc::new((0..POOL as u32).map(screenshot).collect());
    let mean_kb = pool.iter().map(String::len).sum::<usize>() / POOL / 1024;

    let upstream = mock::MockUpstream::start();
    upstream.record(false);
    upstream.prompt_cache(false);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-client")
        .enable_all()
        .build()
        .unwrap();
    let dirs: Vec<tempfile::TempDir> = (0..2 * REPLICAS)
        .map(|_| tempfile::tempdir().unwrap())
        .collect();
    let mut stops = Vec::new();
    // As many on the embedded store, each session kept on one (as a sidecar is), so both paths
    // have the same servers and threads.
    let embedded: Vec<String> = dirs[REPLICAS..]
        .iter()
        .map(|dir| {
            serve(
                &runtime,
                base_config(&upstream.base_url(), dir.path()),
                &mut stops,
            )
        })
        .collect();
    let replicas: Vec<String> = (0..REPLICAS)
        .map(|r| {
            let mut config = base_config(&upstream.base_url(), dirs[r].path());
            config.store.backend = StoreBackend::Redis;
            config.store.redis_url = redis_url.clone();
            config.store.redis_cluster = true;
            config.store.blobs.backend = BlobsBackend::S3;
            config.store.blobs.endpoint = s3.clone();
            config.store.blobs.bucket = "sluice".into();
            config.store.blobs.prefix = prefix.clone();
            serve(&runtime, config, &mut stops)
        })
        .collect();
    let direct = format!("{}/v1/messages", upstream.base_url());

    let masters = runtime.block_on(masters(&redis_url));
    let before = runtime.block_on(redis_bytes(&masters));

    eprintln!(
        "scale: {sessions} sessions x {turns} turns over {REPLICAS} replicas ({} masters), {concurrency} at a time, screenshots ~{mean_kb} KB of base64…",
        masters.len()
    );
    let times: Arc<Mutex<[Vec<Duration>; 3]>> = Arc::default();
    let failures = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let run_started = Instant::now();
    runtime.block_on(async {
        let workers = tokio_util::task::TaskTracker::new();
        for _ in 0..concurrency {
            let (pool, times, failures, next) =
                (pool.clone(), times.clone(), failures.clone(), next.clone());
            let (direct, embedded, replicas) = (direct.clone(), embedded.clone(), replicas.clone());
            workers.spawn(async move {
                let client = reqwest::Client::new();
                loop {
                    let s = next.fetch_add(1, Ordering::Relaxed);
                    if s >= sessions {
                        break;
                    }
                    let key = format!("sk-scale-tenant-{}", s % TENANTS);
                    let session = format!("scale-{started}-{s}");
                    let mut exchanges = Vec::with_capacity(turns);
                    for k in 0..turns {
                        let shot = pool.get(shot_of(s, k)).map_or("", String::as_str);
                        exchanges.push(exchange(k, shot));
                        let body = body(&exchanges);
                        let (Some(own), Some(shared)) =
                            (embedded.get(s % REPLICAS), replicas.get((s + k) % REPLICAS))
                        else {
                            break;
                        };
                        for (path, url) in [
                            (Path::Direct, &direct),
                            (Path::Embedded, own),
                            (Path::Shared, shared),
                        ] {
                            let sent = Instant::now();
                            let answer = client
                                .post(url.as_str())
                                .header("x-api-key", &key)
                                .header("anthropic-version", "2023-06-01")
                                .header("content-type", "application/json")
                                .header("x-sluice-session", &session)
                                .body(body.clone())
                                .send()
                                .await;
                            let ok = match answer {
                                Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                                Err(_) => false,
                            };
                            if !ok {
                                failures.fetch_add(1, Ordering::Relaxed);
                            }
                            if let Some(v) = times.lock().unwrap().get_mut(path as usize) {
                                v.push(sent.elapsed());
                            }
                        }
                    }
                }
            });
        }
        workers.close();
        workers.wait().await;
    });
    let elapsed = run_started.elapsed();
    // The inspector's records and the last commits are written after the answer; let them land.
    std::thread::sleep(Duration::from_secs(2));
    let after = runtime.block_on(redis_bytes(&masters));

    let store = bucket(&s3);
    let listed = runtime.block_on(async {
        let prefix = object_store::path::Path::from(prefix.trim_end_matches('/'));
        let objects: Vec<_> = store.list(Some(&prefix)).collect().await;
        objects
            .into_iter()
            .filter_map(Result::ok)
            .collect::<Vec<_>>()
    });
    let object_bytes: u64 = listed.iter().map(|o| o.size).sum();
    let unique: HashSet<(usize, usize)> = (0..sessions)
        .flat_map(|s| (0..turns).map(move |k| (s % TENANTS, shot_of(s, k))))
        .collect();

    println!("\nscale: {sessions} sessions x {turns} screenshot turns, {REPLICAS} replicas on a {}-master Redis Cluster, artifacts in S3 ({:.0} s, {} failed requests)", masters.len(), elapsed.as_secs_f64(), failures.load(Ordering::Relaxed));
    let mut total = 0i64;
    for kind in ["s", "i", "a"] {
        let (b0, k0) = before.get(kind).copied().unwrap_or((0, 0));
        let (b1, k1) = after.get(kind).copied().unwrap_or((0, 0));
        let delta = b1 as i64 - b0 as i64;
        total += delta;
        let name = match kind {
            "s" => "delivery state",
            "i" => "inspector records",
            _ => "artifacts",
        };
        println!(
            "  redis, {name:<18} {:>8.1} KB per session ({} keys added, {:.1} MB in all)",
            delta as f64 / sessions as f64 / 1024.0,
            k1 as i64 - k0 as i64,
            delta as f64 / 1e6
        );
    }
    println!(
        "  redis, all sluice keys      {:>8.1} KB per session",
        total as f64 / sessions as f64 / 1024.0
    );
    println!(
        "  bucket: {} objects, {:.1} MB; unique (tenant, screenshot) pairs sent: {}; equal: {}",
        listed.len(),
        object_bytes as f64 / 1e6,
        unique.len(),
        listed.len() == unique.len()
    );
    let mut times = Arc::try_unwrap(times).unwrap().into_inner().unwrap();
    let [d, e, s] = &mut times;
    let (d50, d99) = spread(d);
    let (e50, e99) = spread(e);
    let (s50, s99) = spread(s);
    println!("  turn time, ms (median / p99): direct {d50:.2} / {d99:.2}; embedded {e50:.2} / {e99:.2}; cluster + S3 {s50:.2} / {s99:.2}");
    println!(
        "  cluster + S3 against embedded: turn time x{:.2} median, x{:.2} p99 ({:+.2} ms, {:+.2} ms)",
        s50 / e50,
        s99 / e99,
        s50 - e50,
        s99 - e99
    );
    // Through sluice the mock parses the projected body, not the agent's: at low concurrency a
    // turn can take less than direct, and this is negative.
    println!(
        "  added over direct, median: embedded {:+.2} ms, cluster + S3 {:+.2} ms",
        e50 - d50,
        s50 - d50
    );

    // Clean up the run's objects.
    runtime.block_on(async {
        for o in &listed {
            let _ = store.delete(&o.location).await;
        }
    });
    drop(stops);
    drop(dirs);
}
