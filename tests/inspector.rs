//! End-to-end: the session inspector (docs/inspector.md, `[inspector]`, SPEC 9.1) through the
//! real binary, against a mock provider that reports usage from a simulated prompt cache. Each
//! turn of a session is recorded: what the agent sent and what the model got (a spilled result
//! with its artifact, page and notice), the prefix a provider's cache can serve, the
//! cache-weighted cost, and the provider's own usage beside the estimate. The session API is
//! tenant-scoped: another key sees nothing, no key gets 401. A failed request is recorded with
//! its status and left out of the totals.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use common::mock::Reply;
use common::{client, config_for, get_as, metric, MockUpstream, Sluice, D, DIALECTS};
use serde_json::{json, Value};

const KEY: &str = "sk-inspector";
const TURNS: usize = 6;
/// The result of this turn's call is a long build log, spilled to an artifact.
const LONG: usize = 1;

fn inspected(upstream: &str) -> String {
    config_for(upstream, "[inspector]\nenabled = true\nkeep_turns = 50\n")
}

/// What the agent's tool printed on call `i`: a long log on call [`LONG`], else about 1,500
/// tokens of varied lines.
fn output(i: usize) -> String {
    let lines = if i == LONG { 4000 } else { 60 };
    (0..lines)
        .map(|j| {
            format!(
                "step {i}: src/mod_{}/file_{j}.rs: checked {} items in {} ms",
                j % 17,
                i * 31 + j,
                (j * 7) % 101
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The agent's request after `turns` tool calls; Anthropic marks a cache breakpoint on the
/// last block, as Claude Code does.
fn request(d: D, turns: usize, stream: bool) -> Value {
    match d {
        D::Chat => {
            let mut messages = vec![
                json!({"role": "system", "content": "You are a coding agent."}),
                json!({"role": "user", "content": "Build the project."}),
            ];
            for i in 0..turns {
                messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": format!("call_{i}"), "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}));
                messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": output(i)}));
            }
            json!({"model": "gpt-4o", "stream": stream,
                   "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
                   "messages": messages})
        }
        D::Responses => {
            let mut input = vec![json!({"role": "user", "content": "Build the project."})];
            for i in 0..turns {
                input.push(json!({"type": "function_call", "call_id": format!("call_{i}"), "name": "bash", "arguments": "{}"}));
                input.push(json!({"type": "function_call_output", "call_id": format!("call_{i}"), "output": output(i)}));
            }
            json!({"model": "gpt-5", "stream": stream, "instructions": "You are a coding agent.",
                   "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object"}}],
                   "input": input})
        }
        D::Anthropic => {
            let mut messages = vec![json!({"role": "user", "content": "Build the project."})];
            for i in 0..turns {
                messages.push(json!({"role": "assistant", "content": [
                    {"type": "tool_use", "id": format!("toolu_{i}"), "name": "bash", "input": {}}]}));
                let mut result = json!({"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": output(i)});
                if i + 1 == turns {
                    result["cache_control"] = json!({"type": "ephemeral"});
                }
                messages.push(json!({"role": "user", "content": [result]}));
            }
            json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": stream,
                   "system": "You are a coding agent.",
                   "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
                   "messages": messages})
        }
    }
}

async fn send(sluice: &Sluice, d: D, session: &str, body: &Value) -> u16 {
    let response = client()
        .post(sluice.url(d.path()))
        .bearer_auth(KEY)
        .header("x-sluice-session", session)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    response.bytes().await.unwrap();
    status
}

async fn json_of(sluice: &Sluice, path: &str, key: &str) -> (u16, Value) {
    let response = get_as(sluice, path, key).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The listed session labelled `label`.
fn listed<'a>(list: &'a Value, label: &str) -> &'a Value {
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["label"] == label)
        .unwrap_or_else(|| panic!("session {label} not listed in {list}"))
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// One recorded session: every turn and what the API says of it.
async fn session(sluice: &Sluice, d: D, stream: bool) {
    let label = format!("inspect-{d:?}-{stream}");
    for turns in 0..TURNS {
        assert_eq!(
            send(sluice, d, &label, &request(d, turns, stream)).await,
            200
        );
    }
    let (status, list) = json_of(sluice, "/v1/sluice/sessions", KEY).await;
    assert_eq!(status, 200);
    let head = listed(&list, &label);
    assert_eq!(n(&head["turns"]), TURNS as u64);
    assert_eq!(n(&head["totals"]["completed"]), TURNS as u64);
    let id = head["id"].as_str().unwrap();
    let (status, record) = json_of(sluice, &format!("/v1/sluice/sessions/{id}"), KEY).await;
    assert_eq!(status, 200);
    let turns = record["turns"].as_array().unwrap();
    assert_eq!(turns.len(), TURNS);
    let route = if d == D::Anthropic {
        "anthropic"
    } else {
        "openai"
    };
    let mut ratios = Vec::new();
    for (k, turn) in turns.iter().enumerate() {
        let at = format!("{label} turn {k}: {turn}");
        assert_eq!(turn["route"], route, "{at}");
        assert_eq!(turn["status"], 200, "{at}");
        assert_eq!(turn["complete"], true, "{at}");
        assert_eq!(turn["stream"], stream, "{at}");
        let results = turn["results"].as_array().unwrap();
        assert_eq!(results.len(), k, "{at}");
        if k <= LONG {
            assert_eq!(
                turn["received"]["tokens"], turn["forwarded"]["tokens"],
                "{at}"
            );
            continue;
        }
        // The long log: a page and its notice, the whole text in its artifact.
        let long = &results[LONG];
        assert_eq!(long["fate"], "spilled", "{at}");
        assert!(
            long["notice"]
                .as_str()
                .unwrap()
                .contains("full text: artifact://"),
            "{at}"
        );
        let shown = n(&long["shown_lines"]);
        assert!(shown > 0 && shown < 4000, "{at}");
        let artifact = long["artifact"].as_str().unwrap();
        let text = get_as(sluice, &format!("/v1/sluice/artifacts/{artifact}"), KEY)
            .await
            .text()
            .await
            .unwrap();
        assert_eq!(text, output(LONG), "{at}");
        assert!(
            long["shown_bytes"].as_u64() < long["bytes"].as_u64(),
            "{at}"
        );
        assert_eq!(results[0]["fate"], "untouched", "{at}");
        // What the model got is smaller than what the agent sent.
        assert!(
            n(&turn["forwarded"]["tokens"]) * 2 < n(&turn["received"]["tokens"]),
            "{at}"
        );
        // Each forwarded request starts with the one before it: its whole estimate is the
        // prefix a cache can serve, and the provider's own count agrees within 15 %.
        let before = &turns[k - 1];
        if k > LONG + 1 {
            assert_eq!(
                turn["prefix"]["forwarded_tokens"], before["forwarded"]["tokens"],
                "{at}"
            );
            let cached = n(&turn["usage"]["cached"]) as f64;
            let estimate = n(&turn["prefix"]["forwarded_tokens"]) as f64;
            ratios.push(cached / estimate);
            assert!(
                (cached / estimate - 1.0).abs() < 0.15,
                "provider {cached} vs estimate {estimate}: {at}"
            );
            assert!(
                turn["cost"]["forwarded"].as_f64() < turn["cost"]["received"].as_f64(),
                "{at}"
            );
        }
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "{label}: provider-reported cached / estimated prefix from {:.3} to {:.3}",
        ratios[0],
        ratios[ratios.len() - 1]
    );
    let totals = &head["totals"];
    assert!(
        totals["forwarded_cost"].as_f64() < totals["received_cost"].as_f64(),
        "{totals}"
    );
    assert!(n(&totals["provider_cached"]) > 0, "{totals}");
}

#[tokio::test]
async fn every_turn_is_recorded_with_fates_prefixes_costs_and_the_providers_usage() {
    let mock = MockUpstream::start();
    mock.prompt_cache(true);
    let sluice = Sluice::start(&inspected(&mock.base_url()));
    for d in DIALECTS {
        for stream in [false, true] {
            session(&sluice, d, stream).await;
        }
    }
    let metrics = sluice.metrics().await;
    for route in ["openai", "anthropic"] {
        let tokens = |side: &str| {
            metric(
                &metrics,
                &format!("sluice_input_tokens_total{{route=\"{route}\",side=\"{side}\"}}"),
            )
        };
        assert!(
            tokens("forwarded") > 0.0 && tokens("forwarded") < tokens("received"),
            "{route}"
        );
        let cost = |side: &str| {
            metric(
                &metrics,
                &format!("sluice_input_cost_tokens_total{{route=\"{route}\",side=\"{side}\"}}"),
            )
        };
        assert!(cost("forwarded") < cost("received"), "{route}");
        let cached = metric(
            &metrics,
            &format!("sluice_provider_input_tokens_total{{kind=\"cached\",route=\"{route}\"}}"),
        );
        assert!(cached > 0.0, "{route}: {metrics}");
    }
    assert_eq!(metric(&metrics, "sluice_inspector_dropped_total"), 0.0);
}

#[tokio::test]
async fn the_session_api_is_tenant_scoped_and_a_failed_turn_stays_out_of_the_totals() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&inspected(&mock.base_url()));
    let label = "inspect-tenancy";
    assert_eq!(
        send(&sluice, D::Chat, label, &request(D::Chat, 2, false)).await,
        200
    );
    mock.script([Reply::Status(
        500,
        json!({"error": {"message": "overloaded", "type": "server_error"}}).to_string(),
    )]);
    assert_eq!(
        send(&sluice, D::Chat, label, &request(D::Chat, 3, false)).await,
        500
    );
    let (_, list) = json_of(&sluice, "/v1/sluice/sessions", KEY).await;
    let head = listed(&list, label);
    assert_eq!(
        (
            n(&head["turns"]),
            n(&head["totals"]["completed"]),
            n(&head["totals"]["failed"])
        ),
        (2, 1, 1)
    );
    let id = head["id"].as_str().unwrap();
    let (_, record) = json_of(&sluice, &format!("/v1/sluice/sessions/{id}"), KEY).await;
    let failed = &record["turns"][1];
    assert_eq!(
        (failed["status"].as_u64(), failed["complete"].as_bool()),
        (Some(500), Some(false))
    );
    // Another tenant sees no session, and not this one.
    let (status, other) = json_of(&sluice, "/v1/sluice/sessions", "sk-someone-else").await;
    assert_eq!(status, 200);
    assert_eq!(other["sessions"], json!([]));
    let (status, _) = json_of(
        &sluice,
        &format!("/v1/sluice/sessions/{id}"),
        "sk-someone-else",
    )
    .await;
    assert_eq!(status, 404);
    // No credential: 401.
    for path in [
        "/v1/sluice/sessions".to_string(),
        format!("/v1/sluice/sessions/{id}"),
    ] {
        let response = client().get(sluice.url(&path)).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 401, "{path}");
    }
    // Nothing in a record is a secret or a body.
    let text = record.to_string();
    assert!(
        !text.contains(KEY) && !text.contains("checked 31 items"),
        "{text}"
    );
}

#[tokio::test]
async fn with_the_inspector_off_nothing_is_recorded_and_the_api_says_so() {
    let mock = MockUpstream::start();
    let sluice = Sluice::in_front_of(&mock);
    assert_eq!(
        send(&sluice, D::Chat, "off", &request(D::Chat, 2, false)).await,
        200
    );
    let response = get_as(&sluice, "/v1/sluice/sessions", KEY).await;
    assert_eq!(response.status().as_u16(), 404);
    assert!(response.text().await.unwrap().contains("inspector"));
}

/// Images and read rounds in the records (the page's test, tests/ui.rs, shows them too): a
/// spill read on in a hidden round, then a `recent` screenshot and a `once` picture, then a
/// turn where the `once` picture is a placeholder and the hidden round is spliced back.
#[tokio::test]
async fn images_reads_and_hidden_rounds_are_recorded_with_their_artifacts() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&inspected(&mock.base_url()));
    common::inspected_session(&sluice, &mock, KEY, "inspect-images").await;
    let (_, list) = json_of(&sluice, "/v1/sluice/sessions", KEY).await;
    let id = listed(&list, "inspect-images")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, record) = json_of(&sluice, &format!("/v1/sluice/sessions/{id}"), KEY).await;
    let turns = record["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 3);
    let reads = turns[0]["reads"].as_array().unwrap();
    assert_eq!(reads.len(), 1, "{record}");
    assert_eq!(reads[0]["outcome"], "page");
    assert_eq!(reads[0]["artifact"], turns[0]["results"][0]["artifact"]);
    assert!(n(&turns[1]["hidden_rounds"]) > 0, "{record}");
    let fates = |t: &Value| -> Vec<(String, String)> {
        t["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                (
                    i["fate"].as_str().unwrap().into(),
                    i["reason"].as_str().unwrap().into(),
                )
            })
            .collect()
    };
    assert_eq!(
        fates(&turns[1]),
        [
            ("embedded".into(), String::new()),
            ("embedded".into(), String::new())
        ]
    );
    assert_eq!(
        fates(&turns[2])[1],
        ("placeholder".into(), "shown_before".into())
    );
    // Each image names its artifact, served with its media type.
    for image in turns[2]["images"].as_array().unwrap() {
        let artifact = image["artifact"].as_str().unwrap();
        let response = get_as(&sluice, &format!("/v1/sluice/artifacts/{artifact}"), KEY).await;
        assert_eq!(response.headers()["content-type"], "image/png");
        assert!(
            n(&image["width"]) > 0 || image["fate"] == "placeholder",
            "{image}"
        );
    }
    assert_eq!(turns[2]["results"][1]["fate"], "media");
}
