//! Shared mode (SPEC S1, S2; delivery-state issue): several sluice processes on one Redis serve
//! one session interchangeably. Needs Redis on 127.0.0.1:6379 (`.ci/run` starts it) and
//! `redis-server` on the PATH: run with `cargo test --test shared -- --ignored`. With
//! `SLUICE_TEST_REDIS_CLUSTER` set to a node of a Redis Cluster (`.ci/run` starts one of three
//! masters and three replicas on 127.0.0.1:7000-7005) the same tests run on the cluster
//! (`store.redis_cluster`, issue #39); the one that restarts a Redis of its own uses its own
//! node either way. With `SLUICE_TEST_S3` set to an S3 endpoint (`.ci/run` starts SeaweedFS on
//! 127.0.0.1:8333 with a bucket `sluice`, credentials in the AWS environment) artifacts go to
//! that bucket (`[store.blobs]`) and Redis holds none.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{
    client, config_for, guard_routes, metric, screenshot_turns, tool_output, MockUpstream, Sluice,
};
use serde_json::{json, Value};

/// The Redis the tests share: one node (`SLUICE_TEST_REDIS`, else 127.0.0.1:6379), or a
/// cluster's node when `SLUICE_TEST_REDIS_CLUSTER` names one. Either may be Valkey.
fn redis() -> String {
    cluster().unwrap_or_else(|| {
        std::env::var("SLUICE_TEST_REDIS")
            .ok()
            .filter(|url| !url.is_empty())
            .unwrap_or_else(|| "redis://127.0.0.1:6379/0".into())
    })
}

fn cluster() -> Option<String> {
    std::env::var("SLUICE_TEST_REDIS_CLUSTER")
        .ok()
        .filter(|url| !url.is_empty())
}

/// The S3 endpoint artifacts go to, when the run names one.
fn s3() -> Option<String> {
    std::env::var("SLUICE_TEST_S3")
        .ok()
        .filter(|url| !url.is_empty())
}

/// The `[store]` table for `redis`: on the cluster, with `redis_cluster = true`; with S3
/// blobs when the run names an endpoint.
fn store(redis: &str) -> String {
    let on_cluster = cluster().is_some_and(|c| c == redis);
    let blobs = s3().map_or(String::new(), |endpoint| {
        format!("[store.blobs]\nbackend = \"s3\"\nendpoint = \"{endpoint}\"\nbucket = \"sluice\"\nprefix = \"shared-test/\"\n")
    });
    format!("[store]\nbackend = \"redis\"\nredis_url = \"{redis}\"\nredis_cluster = {on_cluster}\n{blobs}")
}

/// A config whose `[store]` table comes before the routes (TOML tables cannot repeat), with
/// A4's batches as written (`policy = "eager"`).
fn config(mock: &MockUpstream, redis: &str) -> String {
    economic(mock, redis, "cache.policy = \"eager\"")
}

/// The same under the default (economic) policy, with `lines` on every route.
fn economic(mock: &MockUpstream, redis: &str, lines: &str) -> String {
    let base = common::on_every_route(&config_for(&mock.base_url(), &store(redis)), lines);
    format!("{base}\n[routes.images]\nrecent_count = 3\nprune_batch = 2\n")
}

/// Turn `turn` of `session` (see [`screenshot_turns`]), sent to `sluice` as `key`.
async fn send_turn(sluice: &Sluice, key: &str, session: &str, turn: usize) -> reqwest::Response {
    client()
        .post(sluice.url("/v1/messages"))
        .header("x-api-key", key)
        .header("x-sluice-session", session)
        .json(&screenshot_turns(turn))
        .send()
        .await
        .unwrap()
}

/// Turn `turn` sent to the first process when odd, the second when even, once that process has
/// written it (`done` counts each one's commits).
async fn alternate(
    pair: [&Sluice; 2],
    done: &mut [f64; 2],
    key: &str,
    session: &str,
    turn: usize,
) -> reqwest::Response {
    let i = (turn + 1) % 2;
    let resp = send_turn(pair[i], key, session, turn).await;
    done[i] += 1.0;
    committed(pair[i], done[i]).await;
    resp
}

async fn committed(sluice: &Sluice, n: f64) {
    for _ in 0..300 {
        if metric(
            &sluice.metrics().await,
            "sluice_store_seconds_count{backend=\"redis\",op=\"commit\"}",
        ) >= n
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("commit {n} not written");
}

#[tokio::test]
#[ignore = "needs Redis on 127.0.0.1:6379: cargo test --test shared -- --ignored"]
async fn two_processes_serve_alternate_turns_of_one_session() {
    let mock = MockUpstream::start();
    let (a, b) = (
        Sluice::start(&config(&mock, &redis())),
        Sluice::start(&config(&mock, &redis())),
    );
    let key = format!("sk-{}", uuid::Uuid::new_v4());
    let session = uuid::Uuid::new_v4().to_string();
    let mut shown = Vec::new();
    let mut done = [0.0; 2];
    for turn in 1..=8 {
        alternate([&a, &b], &mut done, &key, &session, turn).await;
        shown.push(
            mock.last()
                .json()
                .to_string()
                .matches("\"type\":\"image\"")
                .count(),
        );
    }
    assert_eq!(
        shown,
        [1, 2, 3, 2, 3, 2, 3, 2],
        "the state moved between the processes"
    );
}

/// The session's cache clock (docs/cache.md: `last_ms`, the records hash's `@last`) is shared:
/// prunes put off on a warm cache by one process are all made by the other once it has gone
/// cold.
#[tokio::test]
#[ignore = "needs Redis on 127.0.0.1:6379: cargo test --test shared -- --ignored"]
async fn a_cold_cache_is_seen_by_every_replica() {
    let mock = MockUpstream::start();
    let config = economic(&mock, &redis(), "cache.ttl_seconds = 3");
    let (a, b) = (Sluice::start(&config), Sluice::start(&config));
    let key = format!("sk-{}", uuid::Uuid::new_v4());
    let session = uuid::Uuid::new_v4().to_string();
    let mut done = [0.0; 2];
    let mut deferred = String::new();
    for turn in 1..=6 {
        let resp = alternate([&a, &b], &mut done, &key, &session, turn).await;
        assert_eq!(resp.status(), 200);
        deferred = resp.headers()["x-sluice-projection"]
            .to_str()
            .unwrap()
            .to_string();
    }
    // Tiny screenshots never pay for a rewrite while the cache is warm.
    assert!(
        deferred.contains("embedded=6; ") && deferred.ends_with("deferred_edits=3"),
        "{deferred}"
    );
    tokio::time::sleep(Duration::from_millis(3300)).await;
    let resp = send_turn(&a, &key, &session, 7).await;
    let projection = resp.headers()["x-sluice-projection"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        projection.starts_with("spilled=0; embedded=3; "),
        "{projection}"
    );
    assert!(!projection.contains("deferred_edits"), "{projection}");
}

/// A pause seen by one process (the records hash's `@paused`) turns the breakpoints the other
/// sets for the session to 1-hour ones (docs/cache.md, "How long sluice's breakpoints ask").
#[tokio::test]
#[ignore = "needs Redis on 127.0.0.1:6379: cargo test --test shared -- --ignored"]
async fn a_pause_seen_by_one_replica_lengthens_the_others_breakpoints() {
    let mock = MockUpstream::start();
    mock.cache_ttl(Some(1));
    let config = economic(&mock, &redis(), "cache.ttl_seconds = 1");
    let (a, b) = (Sluice::start(&config), Sluice::start(&config));
    let key = format!("sk-{}", uuid::Uuid::new_v4());
    let session = uuid::Uuid::new_v4().to_string();
    let mut messages = vec![serde_json::json!({"role": "user", "content": "Fix the build."})];
    for (t, sluice) in [&a, &a, &b].into_iter().enumerate() {
        if t == 1 {
            tokio::time::sleep(Duration::from_millis(1400)).await;
        }
        let id = format!("toolu_{t}");
        messages.push(serde_json::json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "bash", "input": {"command": "make"}}]}));
        messages.push(serde_json::json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id,
                "content": (0..200).map(|i| format!("test t{t}_{i} ... ok ({} ms)\n", i * 7 % 13))
                    .collect::<String>()}]}));
        let resp = client()
            .post(sluice.url("/v1/messages"))
            .header("x-api-key", &key)
            .header("x-sluice-session", &session)
            .json(
                &serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 100,
                "messages": messages}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let _ = resp.bytes().await;
        // The commit lands behind the response; the other process reads it from Redis.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ttls: Vec<Option<String>> = mock
        .requests()
        .iter()
        .map(|r| r.json()["cache_control"]["ttl"].as_str().map(str::to_owned))
        .collect();
    let hour = Some("1h".to_string());
    assert_eq!(ttls, [None, hour.clone(), hour]);
}

#[tokio::test]
#[ignore = "needs Redis on 127.0.0.1:6379: cargo test --test shared -- --ignored"]
async fn an_artifact_spilled_through_one_process_is_readable_through_the_other() {
    let mock = MockUpstream::start();
    let (a, b) = (
        Sluice::start(&config(&mock, &redis())),
        Sluice::start(&config(&mock, &redis())),
    );
    // The second body is over a megabyte: planned on the blocking pool, which reads and
    // writes Redis through its worker's runtime.
    // The third is over 8 MiB: paged from ranges of the store's bytes (GETRANGE, or the
    // bucket's ranged GET), never read whole.
    for size in [90_000, 1_200_000, 9_000_000] {
        spilled_on_one_read_on_the_other(&mock, &a, &b, size).await;
    }
}

async fn spilled_on_one_read_on_the_other(
    mock: &MockUpstream,
    a: &Sluice,
    b: &Sluice,
    size: usize,
) {
    let key = format!("sk-{}", uuid::Uuid::new_v4());
    let output = tool_output(size);
    let body = json!({"model": "gpt-4o", "messages": [
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": output}]});
    client()
        .post(a.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let shown = mock.last().json()["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let at = shown.rfind("artifact://").unwrap() + 11;
    let id: String = shown[at..].chars().take(33).collect();
    let whole = client()
        .get(b.url(&format!("/v1/sluice/artifacts/{id}")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(whole.status(), 200);
    assert!(whole.text().await.unwrap() == output);
    // With S3 blobs, the artifact is in the bucket only; else in Redis.
    let redis = sluice::store::redis::RedisStore::connect(
        &self::redis(),
        cluster().is_some(),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let tenant = sluice::tenant::Tenant::from_credential(key.as_bytes());
    let artifact = sluice::store::ArtifactId::parse(&id).unwrap();
    let in_redis = sluice::store::ArtifactStore::get(&redis, &tenant, &artifact)
        .await
        .unwrap();
    assert_eq!(
        in_redis.is_some(),
        s3().is_none(),
        "artifact bytes in Redis"
    );
    let cursor = shown[shown.rfind("{\"cursor\":\"").unwrap() + 11..]
        .split('"')
        .next()
        .unwrap()
        .to_string();
    let page = client()
        .get(b.url(&format!("/v1/sluice/read?cursor={cursor}")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(
        page.status(),
        200,
        "a cursor made by one replica reads on another"
    );
    common::pages_match_the_whole_text(b, &key, &output, &cursor).await;
    let other = client()
        .get(b.url(&format!("/v1/sluice/artifacts/{id}")))
        .bearer_auth("sk-other")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
}

/// A Redis of the test's own on a free port, so it can be stopped and started.
fn own_redis(port: u16) -> Child {
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server on the PATH");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

async fn ready(sluice: &Sluice) -> u16 {
    client()
        .get(sluice.admin_url("/readyz"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
#[ignore = "needs redis-server on the PATH: cargo test --test shared -- --ignored"]
async fn readyz_follows_redis_and_sluice_reconnects_after_a_redis_restart() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut redis = own_redis(port);
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, &format!("redis://127.0.0.1:{port}/0")));
    assert_eq!(ready(&sluice).await, 200);
    redis.kill().unwrap();
    redis.wait().unwrap();
    let mut down = false;
    for _ in 0..50 {
        if ready(&sluice).await == 503 {
            down = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(down, "readyz fails while Redis is unreachable");
    // Requests still go through, without delivery state (nothing is lost to the client).
    let resp = client()
        .post(sluice.url("/v1/messages"))
        .json(&screenshot_turns(1))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut redis = own_redis(port);
    let mut up = false;
    for _ in 0..100 {
        if ready(&sluice).await == 200 {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "reconnected after the restart");
    redis.kill().unwrap();
    let _ = redis.wait();
}

/// C3 across replicas: the model reads a page through one process; the next turn, sent to the
/// other, shows the model the page it read (the hidden round lives in Redis).
#[tokio::test]
#[ignore = "needs Redis on 127.0.0.1:6379: cargo test --test shared -- --ignored"]
async fn hidden_read_rounds_are_spliced_back_by_the_other_process() {
    let mock = MockUpstream::start();
    let (a, b) = (
        Sluice::start(&config(&mock, &redis())),
        Sluice::start(&config(&mock, &redis())),
    );
    let key = format!("sk-{}", uuid::Uuid::new_v4());
    let mut body = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": format!("build {key}")},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": tool_output(90_000)}]});
    mock.script([
        common::Reply::Read {
            before: None,
            also: None,
            answer: String::new(),
        },
        common::Reply::Text("Read it.".into()),
    ]);
    let answer: Value = client()
        .post(a.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let message = answer["choices"][0]["message"].clone();
    assert_eq!(message["content"], "Read it.");
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(message);
    messages.push(json!({"role": "user", "content": "go on"}));
    mock.script([common::Reply::Text("ok".into())]);
    mock.record(true);
    let status = client()
        .post(b.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
    let seen = mock.last().json();
    let history = seen["messages"].as_array().unwrap();
    assert_eq!(
        history.len(),
        3 + 2 + 1 + 1,
        "the read call and its page are back in"
    );
    assert_eq!(
        history[3]["tool_calls"][0]["function"]["name"],
        "sluice_read"
    );
    assert!(history[4]["content"]
        .as_str()
        .unwrap()
        .contains("sluice: lines "));
}

/// A long session on Redis keeps a bounded state: released attachments leave the records for a
/// capped set (newest kept), links get their own capped set, and a released attachment never
/// comes back (A10), whatever a later commit says.
#[tokio::test]
#[ignore = "needs Redis on 127.0.0.1:6379: cargo test --test shared -- --ignored"]
async fn a_long_session_keeps_a_bounded_state_in_redis() {
    use sluice::config::Lifetime;
    use sluice::projection::attach::state::{Delta, Record, Status, MAX_LINKS, MAX_RELEASED};
    use sluice::store::session::{SessionKey, SessionStore};
    let store = sluice::store::redis::RedisStore::connect(
        &redis(),
        cluster().is_some(),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let key = SessionKey(format!("bounded-{}", std::process::id()));
    let record = |status| Record {
        status,
        lifetime: Lifetime::Recent,
    };
    let turns = MAX_RELEASED + 100;
    for t in 0..turns {
        // This turn's screenshot is new; the one of ten turns ago left the history.
        let mut delta = Delta::default();
        delta
            .records
            .insert(format!("s{t}"), record(Status::Viewed));
        if t >= 10 {
            delta
                .records
                .insert(format!("s{}", t - 10), record(Status::Released));
        }
        delta.links.insert(format!("{t:032x}:1:t"));
        store.commit(&key, &delta).await.unwrap();
    }
    let state = store.load(&key).await.unwrap();
    assert_eq!(state.records.len(), 10, "only the live records stay");
    assert_eq!(state.released.len(), MAX_RELEASED);
    assert_eq!(state.links.len(), MAX_LINKS);
    assert_eq!(
        state.status(&format!("s{}", turns - 11)),
        Some(Status::Released)
    );
    assert_eq!(state.status("s0"), None, "the oldest release is forgotten");
    assert!(state.links.contains_key(&format!("{:032x}:1:t", turns - 1)));
    // A late commit of a request that still saw a released one does not bring it back (A10).
    let mut late = Delta::default();
    late.records
        .insert(format!("s{}", turns - 11), record(Status::Viewed));
    store.commit(&key, &late).await.unwrap();
    let state = store.load(&key).await.unwrap();
    assert_eq!(
        state.status(&format!("s{}", turns - 11)),
        Some(Status::Released)
    );
    assert_eq!(state.records.len(), 10);
}

/// The context guard across replicas (docs/context-guard.md): two processes serve alternate
/// turns of one session; a batch retired through one is shown, byte for byte, by the other, and
/// the retired set lives in Redis with the session.
#[tokio::test]
#[ignore = "needs Redis on 127.0.0.1:6379: cargo test --test shared -- --ignored"]
async fn retired_results_are_shared_by_replicas() {
    let mock = MockUpstream::start();
    mock.context_window(Some(12_000));
    // The guard's own edits only: no breakpoint of sluice's (docs/cache.md).
    let guarded = guard_routes(
        &config_for(&mock.base_url(), &store(&redis())),
        "window_tokens = 12000\noutput_tokens = 1000\n[routes.cache]\nbreakpoints = \"off\"\n",
    );
    let (a, b) = (Sluice::start(&guarded), Sluice::start(&guarded));
    let key = format!("sk-{}", uuid::Uuid::new_v4());
    let session = uuid::Uuid::new_v4().to_string();
    let output = |i: usize| {
        (0..60)
            .map(|j| {
                format!(
                    "src/m{i}/f{j}.rs:{}:4: warning: unused variable `v{j}` in step {i}",
                    j * 7
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut messages = vec![json!({"role": "user", "content": "fix"})];
    let (mut previous, mut previous_retired) = (Vec::new(), 0);
    let (mut done_a, mut done_b, mut batches) = (0.0, 0.0, 0);
    for turn in 0..40 {
        messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": format!("t{turn}"), "name": "bash", "input": {}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("t{turn}"), "content": output(turn)}]}));
        let sluice = if turn % 2 == 0 { &a } else { &b };
        let response = client()
            .post(sluice.url("/v1/messages"))
            .header("x-api-key", &key)
            .header("x-sluice-session", &session)
            .json(&json!({"model": "claude-x", "max_tokens": 1000, "messages": messages}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "turn {turn}");
        let header = response.headers()["x-sluice-projection"]
            .to_str()
            .unwrap()
            .to_string();
        let retired: usize = header.rsplit("retired=").next().unwrap().parse().unwrap();
        let forwarded = mock.last().body.to_vec();
        if retired > previous_retired {
            batches += 1;
        } else if !previous.is_empty() {
            let open = previous.len() - 2; // without the closing `]}`
            assert_eq!(
                &forwarded[..open],
                &previous[..open],
                "turn {turn}: prefix-stable across processes"
            );
        }
        assert!(
            retired >= previous_retired,
            "turn {turn}: a retired result stays retired"
        );
        // Only a batch has something to commit: wait for it to land before the next turn.
        if retired > previous_retired {
            if turn % 2 == 0 {
                done_a += 1.0;
                committed(&a, done_a).await;
            } else {
                done_b += 1.0;
                committed(&b, done_b).await;
            }
        }
        (previous, previous_retired) = (forwarded, retired);
    }
    assert!(
        batches >= 2 && previous_retired >= 20,
        "{batches} batches, {previous_retired} retired"
    );
    // Both processes counted their own commits' new retirements: together, each result once.
    let name = "sluice_context_retired_total{route=\"anthropic\"}";
    let total = metric(&a.metrics().await, name) + metric(&b.metrics().await, name);
    assert_eq!(total as usize, previous_retired);
}

/// The inspector on Redis (docs/inspector.md): turns recorded by two replicas land in one
/// session record, listed for its tenant only, with a bounded number of turns.
#[tokio::test]
#[ignore = "needs Redis on 127.0.0.1:6379: cargo test --test shared -- --ignored"]
async fn turn_records_of_one_session_are_shared_by_replicas() {
    let mock = MockUpstream::start();
    let inspected = config(&mock, &redis()).replace(
        "[store]",
        "[inspector]\nenabled = true\nkeep_turns = 4\n\n[store]",
    );
    let (a, b) = (Sluice::start(&inspected), Sluice::start(&inspected));
    let key = format!("sk-{}", uuid::Uuid::new_v4());
    let session = uuid::Uuid::new_v4().to_string();
    for turn in 1..=6 {
        let sluice = if turn % 2 == 1 { &a } else { &b };
        let response = send_turn(sluice, &key, &session, turn).await;
        assert_eq!(response.status().as_u16(), 200);
        response.bytes().await.unwrap();
        // A session's next turn comes after its record was written (the agent reads the
        // answer first); across replicas nothing orders them otherwise.
        common::get_as(sluice, "/v1/sluice/sessions", &key).await;
    }
    for sluice in [&a, &b] {
        let list: Value = common::get_as(sluice, "/v1/sluice/sessions", &key)
            .await
            .json()
            .await
            .unwrap();
        let head = &list["sessions"][0];
        assert_eq!(head["label"], session.as_str(), "{list}");
        assert_eq!(head["turns"], 6, "{list}");
        assert!(
            head["totals"]["images_embedded"].as_u64().unwrap() > 0,
            "{list}"
        );
        let id = head["id"].as_str().unwrap();
        let record: Value = common::get_as(sluice, &format!("/v1/sluice/sessions/{id}"), &key)
            .await
            .json()
            .await
            .unwrap();
        let kept: Vec<u64> = record["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["images"].as_array().unwrap().len() as u64)
            .collect();
        // The last four turns, oldest first: turn N holds N images.
        assert_eq!(kept, [3, 4, 5, 6], "{record}");
        let other: Value = common::get_as(sluice, "/v1/sluice/sessions", "sk-other")
            .await
            .json()
            .await
            .unwrap();
        assert!(!other.to_string().contains(id), "{other}");
    }
}
