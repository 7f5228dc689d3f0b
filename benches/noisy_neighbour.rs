//! Noisy neighbour (runtime issue): a small chat request's latency through an in-process sluice
//! while three other connections keep sending requests whose 6000×4000 JPEG screenshot must be
//! downscaled (`images.downscale = true`, a new picture each time, so no memo helps), against
//! the same small requests with nothing else going on, in the same run. Prints p50, p99 and the
//! worst latency of both, and the heavy requests' count.
//!
//! Run: `cargo bench --bench noisy_neighbour` (release; about a minute).

#![allow(clippy::unwrap_used, clippy::expect_used)] // benchmark code: fail loudly

/// The binary's allocator (src/main.rs), so large buffers are reused here as in service. With
/// the system's, each 13 MB body and decoded picture is a fresh `mmap`; `perf sched` once showed
/// a worker waiting on the address space's lock while another thread mapped its pages.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[path = "../tests/common/mock.rs"]
#[allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod mock;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::json;
use sluice::config::Config;
use sluice::server::Server;

/// Small requests timed in each phase.
const SAMPLES: usize = 300;
/// Distinct heavy pictures (each is downscaled once; after that the memo would answer).
const PICTURES: usize = 40;

/// A noisy 6000×4000 JPEG, different for each `seed`.
fn picture(seed: u32) -> String {
    let img = image::RgbImage::from_fn(6000, 4000, |x, y| {
        let v = (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503) ^ seed.wrapping_mul(97))
            .wrapping_mul(2_246_822_519);
        image::Rgb([(v >> 24) as u8, (v >> 16) as u8, (x / 24) as u8])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Jpeg).unwrap();
    base64::engine::general_purpose::STANDARD.encode(out.into_inner())
}

fn heavy(picture: &str) -> String {
    json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "look"},
        {"role": "assistant", "tool_calls": [{"id": "s", "type": "function", "function": {"name": "take_screenshot", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "s", "content": json!({"content": [
            {"type": "image", "data": picture, "mimeType": "image/jpeg"}]}).to_string()}]})
    .to_string()
}

fn small() -> String {
    json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).to_string()
}

/// p50, p99 and worst of `samples`, in milliseconds.
fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q) as usize).min(samples.len() - 1);
        samples[i].as_secs_f64() * 1e3
    };
    format!(
        "p50 {:.1} ms, p99 {:.1} ms, worst {:.1} ms",
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

async fn smalls(client: &reqwest::Client, url: &str) -> Vec<Duration> {
    let mut out = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let start = Instant::now();
        let resp = client.post(url).body(small()).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
        out.push(start.elapsed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    out
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    eprintln!("noisy_neighbour: encoding {PICTURES} 6000x4000 JPEGs…");
    let bodies: Arc<Vec<String>> = Arc::new(
        (0..PICTURES as u32)
            .map(|seed| heavy(&picture(seed)))
            .collect(),
    );
    let upstream = mock::MockUpstream::start();
    upstream.record(false);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Told apart from sluice's threads and the mock's in `perf sched` and `top -H`.
        .thread_name("bench-client")
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        listen: "127.0.0.1:0".into(),
        admin_listen: "127.0.0.1:0".into(),
        ..Config::default()
    };
    config.store.data_dir = dir.path().to_path_buf();
    for route in &mut config.routes {
        route.upstream = upstream.base_url();
        route.images.downscale = true;
        route.images.max_dimension = 2000;
        route.images.max_image_bytes = 50 * 1024 * 1024;
        route.images.max_total_bytes = 50 * 1024 * 1024;
    }
    let server = runtime.block_on(Server::bind(config)).unwrap();
    let url = format!(
        "http://{}/v1/chat/completions",
        server.proxy_addr().unwrap()
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = runtime.spawn(server.run(async move {
        let _ = stopped.await;
    }));
    runtime.block_on(async {
        let client = reqwest::Client::new();
        // Warm up the connections and the small request's path.
        smalls(&client, &url).await;
        let alone = smalls(&client, &url).await;
        let noisy = Arc::new(AtomicBool::new(true));
        let done = Arc::new(AtomicUsize::new(0));
        let next = Arc::new(AtomicUsize::new(0));
        let neighbours = tokio_util::task::TaskTracker::new();
        for _ in 0..3 {
            // Each neighbour on its own connection pool, as another agent would be.
            let (client, url, bodies) = (reqwest::Client::new(), url.clone(), bodies.clone());
            let (noisy, done, next) = (noisy.clone(), done.clone(), next.clone());
            neighbours.spawn(async move {
                while noisy.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= bodies.len() {
                        break;
                    }
                    let resp = client
                        .post(&url)
                        .body(bodies[n].clone())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(resp.status(), 200);
                    resp.bytes().await.unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let with_noise = smalls(&client, &url).await;
        noisy.store(false, Ordering::Relaxed);
        neighbours.close();
        neighbours.wait().await;
        println!("noisy_neighbour/small_alone: {}", summary(alone));
        println!(
            "noisy_neighbour/small_beside_3_downscales: {} ({} downscaled requests meanwhile)",
            summary(with_noise),
            done.load(Ordering::Relaxed)
        );
    });
    let _ = stop.send(());
    let _ = runtime.block_on(serving);
}
