//! End-to-end: the read tool sluice offers and answers itself (SPEC section 6, C1–C4), through
//! the real binary against a scripted mock model, in all three dialects, streamed and not.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use std::time::Duration;

use common::{client, config_for, metric, tool_output, MockUpstream, Reply, Sluice, D, DIALECTS};
use serde_json::{json, Value};

const ALL: [D; 3] = DIALECTS;

impl D {
    /// A history whose last tool result is long enough to be spilled with a cursor.
    fn request(self, stream: bool, output: &str) -> Value {
        let mut body = match self {
            D::Chat => json!({"model": "gpt-4o", "messages": [
                {"role": "user", "content": "run the build"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "build", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": output}],
                "tools": [{"type": "function", "function": {"name": "build", "parameters": {"type": "object"}}}]}),
            D::Responses => json!({"model": "gpt-4o", "input": [
                {"role": "user", "content": "run the build"},
                {"type": "function_call", "call_id": "call_1", "name": "build", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": output}],
                "tools": [{"type": "function", "name": "build", "parameters": {"type": "object"}}]}),
            D::Anthropic => json!({"model": "claude-x", "max_tokens": 100, "messages": [
                {"role": "user", "content": "run the build"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": "build", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": output}]}],
                "tools": [{"name": "build", "input_schema": {"type": "object"}}]}),
        };
        if stream {
            body["stream"] = json!(true);
        }
        body
    }

    /// The history items the client sends back for what it received (as its SDK would), then
    /// a new user message.
    fn next_turn(self, mut body: Value, received: &[Value], user: &str) -> Value {
        let key = if self == D::Responses {
            "input"
        } else {
            "messages"
        };
        let list = body[key].as_array_mut().unwrap();
        list.extend(received.iter().cloned());
        list.push(json!({"role": "user", "content": user}));
        body
    }

    fn history(self, request: &Value) -> Vec<Value> {
        let key = if self == D::Responses {
            "input"
        } else {
            "messages"
        };
        request[key].as_array().cloned().unwrap_or_default()
    }
}

/// What the client received: its text, the items it sends back, and the tool calls shown.
#[derive(Debug, Default)]
struct Received {
    text: String,
    items: Vec<Value>,
    calls: Vec<String>,
}

async fn send(sluice: &Sluice, d: D, body: &Value) -> (u16, Received) {
    let response = client()
        .post(sluice.url(d.path()))
        .bearer_auth("key-a")
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let streamed = response
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
    let bytes = response.bytes().await.unwrap();
    let received = if streamed {
        from_stream(d, std::str::from_utf8(&bytes).unwrap())
    } else {
        from_json(d, &serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    };
    (status, received)
}

fn from_json(d: D, v: &Value) -> Received {
    let mut r = Received::default();
    match d {
        D::Chat => {
            let m = &v["choices"][0]["message"];
            r.text = m["content"].as_str().unwrap_or_default().to_string();
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                r.calls
                    .push(c["function"]["name"].as_str().unwrap().to_string());
            }
            r.items.push(m.clone());
        }
        D::Responses => {
            for item in v["output"].as_array().into_iter().flatten() {
                for part in item["content"].as_array().into_iter().flatten() {
                    r.text.push_str(part["text"].as_str().unwrap_or_default());
                }
                if item["type"] == "function_call" {
                    r.calls.push(item["name"].as_str().unwrap().to_string());
                }
                r.items.push(item.clone());
            }
        }
        D::Anthropic => {
            for b in v["content"].as_array().into_iter().flatten() {
                r.text.push_str(b["text"].as_str().unwrap_or_default());
                if b["type"] == "tool_use" {
                    r.calls.push(b["name"].as_str().unwrap().to_string());
                }
            }
            r.items
                .push(json!({"role": "assistant", "content": v["content"]}));
        }
    }
    r
}

/// Rebuilds the client's view from a stream, checking it is one well-formed message.
fn from_stream(d: D, text: &str) -> Received {
    let events: Vec<(Option<String>, String)> = text
        .split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|b| {
            let name = b
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .map(str::to_string);
            let data = b
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or("")
                .to_string();
            (name, data)
        })
        .collect();
    let mut r = Received::default();
    match d {
        D::Chat => {
            assert_eq!(
                events.iter().filter(|(_, d)| d == "[DONE]").count(),
                1,
                "{text}"
            );
            assert_eq!(events.last().unwrap().1, "[DONE]");
            let mut calls: Vec<(String, String, String)> = Vec::new();
            let mut ids = std::collections::BTreeSet::new();
            for (_, data) in events.iter().filter(|(_, d)| d != "[DONE]") {
                let v: Value = serde_json::from_str(data).unwrap();
                ids.insert(v["id"].as_str().unwrap().to_string());
                let delta = &v["choices"][0]["delta"];
                r.text
                    .push_str(delta["content"].as_str().unwrap_or_default());
                for c in delta["tool_calls"].as_array().into_iter().flatten() {
                    let i = c["index"].as_u64().unwrap() as usize;
                    assert!(i <= calls.len(), "tool call indices are contiguous: {text}");
                    if i == calls.len() {
                        calls.push(Default::default());
                    }
                    if let Some(id) = c["id"].as_str() {
                        calls[i].0 = id.to_string();
                    }
                    calls[i]
                        .1
                        .push_str(c["function"]["name"].as_str().unwrap_or_default());
                    calls[i]
                        .2
                        .push_str(c["function"]["arguments"].as_str().unwrap_or_default());
                }
            }
            assert_eq!(ids.len(), 1, "one chunk id for the whole stream");
            r.calls = calls.iter().map(|c| c.1.clone()).collect();
            let tool_calls: Vec<Value> = calls
                .iter()
                .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
                .collect();
            let mut m = json!({"role": "assistant", "content": r.text});
            if !tool_calls.is_empty() {
                m["tool_calls"] = Value::Array(tool_calls);
            }
            r.items.push(m);
        }
        D::Responses => {
            let mut seq = Vec::new();
            let mut completed = None;
            for (name, data) in &events {
                let v: Value = serde_json::from_str(data).unwrap();
                assert_eq!(name.as_deref(), v["type"].as_str());
                seq.push(v["sequence_number"].as_u64().unwrap());
                if v["type"] == "response.output_text.delta" {
                    r.text.push_str(v["delta"].as_str().unwrap());
                }
                if v["type"] == "response.completed" {
                    completed = Some(v["response"].clone());
                }
            }
            assert_eq!(
                seq,
                (0..seq.len() as u64).collect::<Vec<_>>(),
                "sequence numbers run on"
            );
            assert_eq!(
                events
                    .iter()
                    .filter(|(n, _)| n.as_deref() == Some("response.created"))
                    .count(),
                1
            );
            let completed = completed.expect("response.completed");
            let from_completed = from_json(d, &completed);
            assert_eq!(
                from_completed.text, r.text,
                "deltas and the final response agree"
            );
            r.items = from_completed.items;
            r.calls = from_completed.calls;
        }
        D::Anthropic => {
            let mut blocks: Vec<Value> = Vec::new();
            let kinds: Vec<String> = events.iter().map(|(n, _)| n.clone().unwrap()).collect();
            assert_eq!(kinds.iter().filter(|k| *k == "message_start").count(), 1);
            assert_eq!(kinds.last().unwrap(), "message_stop");
            let mut partial = String::new();
            for (_, data) in &events {
                let v: Value = serde_json::from_str(data).unwrap();
                match v["type"].as_str().unwrap() {
                    "content_block_start" => {
                        assert_eq!(
                            v["index"].as_u64().unwrap() as usize,
                            blocks.len(),
                            "block indices are contiguous"
                        );
                        blocks.push(v["content_block"].clone());
                        partial.clear();
                    }
                    "content_block_delta" => {
                        assert_eq!(v["index"].as_u64().unwrap() as usize, blocks.len() - 1);
                        let b = blocks.last_mut().unwrap();
                        if let Some(t) = v["delta"]["text"].as_str() {
                            r.text.push_str(t);
                            let mut s = b["text"].as_str().unwrap().to_string();
                            s.push_str(t);
                            b["text"] = json!(s);
                        }
                        if let Some(p) = v["delta"]["partial_json"].as_str() {
                            partial.push_str(p);
                        }
                    }
                    "content_block_stop" => {
                        let b = blocks.last_mut().unwrap();
                        if b["type"] == "tool_use" {
                            b["input"] = serde_json::from_str(&partial).unwrap_or(json!({}));
                            r.calls.push(b["name"].as_str().unwrap().to_string());
                        }
                    }
                    _ => {}
                }
            }
            r.items
                .push(json!({"role": "assistant", "content": blocks}));
        }
    }
    r
}

/// How many pages (notices) a forwarded request shows the model.
fn pages(request: &Value) -> usize {
    request.to_string().matches("sluice: lines ").count()
}

fn config(mock: &MockUpstream, extra_route: &str) -> String {
    config_for(&mock.base_url(), "").replace(
        "models = [\"*\"]\n",
        &format!("models = [\"*\"]\n{extra_route}\n"),
    )
}

async fn commits(sluice: &Sluice, n: f64) {
    for _ in 0..300 {
        let m = sluice.metrics().await;
        if metric(&m, "sluice_commits_total{outcome=\"committed\"}") >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} commits were not written");
}

fn reads_three_then_answers() -> Vec<Reply> {
    let read = |before: Option<&str>| Reply::Read {
        before: before.map(str::to_string),
        also: None,
        answer: "no cursor".into(),
    };
    vec![
        read(Some("Let me read on. ")),
        read(None),
        read(None),
        Reply::Text("The build failed in crate-7.".into()),
    ]
}

/// C1–C3: the model reads three pages, then answers; the client gets one response; the next
/// turn shows the model what it read, byte-identical on every later turn and after a restart.
#[tokio::test]
async fn three_reads_then_an_answer_in_every_dialect_streamed_and_not_c1_c2_c3() {
    let output = tool_output(150_000);
    for d in ALL {
        for stream in [false, true] {
            let mock = MockUpstream::start();
            let dir = tempfile::tempdir().unwrap();
            let data = dir.path().to_str().unwrap().to_string();
            let env = [("SLUICE_STORE__DATA_DIR", data.as_str())];
            let sluice = Sluice::start_with(&config(&mock, ""), &env);
            let first = d.request(stream, &output);
            mock.script(reads_three_then_answers());
            mock.record(true);
            let (status, got) = send(&sluice, d, &first).await;
            let case = format!("{d:?} stream={stream}");
            assert_eq!(status, 200, "{case}");
            // chat's one content string sets the rounds' texts apart (docs/read-tool.md).
            let want = if d == D::Chat {
                "Let me read on. \n\nThe build failed in crate-7."
            } else {
                "Let me read on. The build failed in crate-7."
            };
            assert_eq!(got.text, want, "{case}");
            assert!(
                got.calls.is_empty(),
                "{case}: no read call reaches the client"
            );
            let upstream = mock.requests();
            assert_eq!(
                upstream.len(),
                4,
                "{case}: three read rounds and the answer"
            );
            let bodies: Vec<Value> = upstream.iter().map(|r| r.json()).collect();
            // C1: the tool is offered last, with the same bytes every round.
            let tools: Vec<String> = bodies.iter().map(|b| b["tools"].to_string()).collect();
            assert!(
                tools.windows(2).all(|w| w[0] == w[1]),
                "{case}: tools never change"
            );
            assert!(tools[0].contains("sluice_read"), "{case}");
            assert!(bodies[0]["tools"].as_array().unwrap().len() == 2);
            // C2: each round adds the page read.
            let seen: Vec<usize> = bodies.iter().map(pages).collect();
            assert_eq!(seen, [1, 2, 3, 4], "{case}: one more page each round");
            commits(&sluice, 1.0).await;
            let m = sluice.metrics().await;
            assert_eq!(
                metric(&m, "sluice_read_calls_total{outcome=\"page\"}"),
                3.0,
                "{case}"
            );

            // C3: the next turn shows the model the rounds it had, in place of what the
            // client received.
            let second = d.next_turn(first.clone(), &got.items, "thanks, fix it");
            mock.script([Reply::Text("ok".into())]);
            let (status, _) = send(&sluice, d, &second).await;
            assert_eq!(status, 200, "{case}");
            let spliced = mock.last();
            let history = d.history(&spliced.json());
            assert_eq!(
                pages(&spliced.json()),
                4,
                "{case}: the pages read are back in the history"
            );
            // The client's history, then per read round the call and its result (Responses:
            // the text before the first call is an item of its own), the answer, the new
            // user message.
            let expected_items = match d {
                D::Chat | D::Anthropic => 3 + 3 * 2 + 1 + 1,
                D::Responses => 3 + 1 + 3 * 2 + 1 + 1,
            };
            assert_eq!(history.len(), expected_items, "{case}: {history:#?}");
            mock.script([Reply::Text("ok".into())]);
            send(&sluice, d, &second).await;
            assert_eq!(
                mock.last().body,
                spliced.body,
                "{case}: byte-identical on every turn"
            );
            drop(sluice);
            let sluice = Sluice::start_with(&config(&mock, ""), &env);
            mock.script([Reply::Text("ok".into())]);
            send(&sluice, d, &second).await;
            assert_eq!(
                mock.last().body,
                spliced.body,
                "{case}: and after a restart"
            );
        }
    }
}

/// A9 with the read rounds: a streaming client that hangs up as soon as it has the stream's
/// final event (Codex does) still commits the request, the hidden rounds' link included — the
/// next turn carries them.
#[tokio::test]
async fn a_client_that_hangs_up_after_the_final_event_still_commits_a9_c3() {
    let output = tool_output(150_000);
    for d in ALL {
        let mock = MockUpstream::start();
        let sluice = Sluice::start(&config(&mock, ""));
        let first = d.request(true, &output);
        mock.script(reads_three_then_answers());
        let mut response = client()
            .post(sluice.url(d.path()))
            .bearer_auth("key-a")
            .json(&first)
            .send()
            .await
            .unwrap();
        let last = match d {
            D::Chat => "[DONE]",
            D::Responses => "response.completed",
            D::Anthropic => "message_stop",
        };
        let mut text = String::new();
        while !text.contains(last) {
            let chunk = response.chunk().await.unwrap().expect("the final event");
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        // Wait for the whole final event, then hang up without reading the end of the body.
        while !text.ends_with("\n\n") {
            let chunk = response
                .chunk()
                .await
                .unwrap()
                .expect("the final event's end");
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        drop(response);
        commits(&sluice, 1.0).await;
        let m = sluice.metrics().await;
        assert_eq!(
            metric(&m, "sluice_commits_total{outcome=\"discarded\"}"),
            0.0,
            "{d:?}"
        );
        let got = from_stream(d, &text);
        let second = d.next_turn(first.clone(), &got.items, "thanks, fix it");
        mock.script([Reply::Text("ok".into())]);
        let (status, _) = send(&sluice, d, &second).await;
        assert_eq!(status, 200, "{d:?}");
        assert_eq!(
            pages(&mock.last().json()),
            4,
            "{d:?}: the hidden rounds are spliced back"
        );
    }
}

/// The step limit holds: past `max_read_steps` rounds the model is asked with tool_choice
/// "none", and whatever it says then is the answer.
#[tokio::test]
async fn the_step_limit_forces_an_answer_c2() {
    let output = tool_output(150_000);
    for d in ALL {
        let mock = MockUpstream::start();
        let sluice = Sluice::start(&config(&mock, "max_read_steps = 2"));
        mock.script([
            Reply::Read {
                before: None,
                also: None,
                answer: String::new(),
            },
            Reply::Read {
                before: None,
                also: None,
                answer: String::new(),
            },
            Reply::Text("Answer at the limit.".into()),
        ]);
        mock.record(true);
        let (status, got) = send(&sluice, d, &d.request(false, &output)).await;
        assert_eq!(status, 200);
        assert_eq!(got.text, "Answer at the limit.", "{d:?}");
        let bodies: Vec<Value> = mock.requests().iter().map(|r| r.json()).collect();
        assert_eq!(
            bodies.len(),
            3,
            "{d:?}: two read rounds, then the forced one"
        );
        assert!(bodies[1].get("tool_choice").is_none(), "{d:?}");
        let none = if d == D::Anthropic {
            json!({"type": "none"})
        } else {
            json!("none")
        };
        assert_eq!(bodies[2]["tool_choice"], none, "{d:?}");
    }
}

/// A bad cursor is answered in-band: the model reads an error and goes on.
#[tokio::test]
async fn a_bad_cursor_is_answered_in_band_c2() {
    let output = tool_output(150_000);
    for d in ALL {
        let mock = MockUpstream::start();
        let sluice = Sluice::start(&config(&mock, ""));
        mock.script([
            Reply::Parts(vec![common::Part::Tool(
                "sluice_read".into(),
                json!({"cursor": "not-a-cursor"}),
            )]),
            Reply::Text("Sorry.".into()),
        ]);
        mock.record(true);
        let (status, got) = send(&sluice, d, &d.request(d == D::Anthropic, &output)).await;
        assert_eq!(status, 200, "{d:?}");
        assert_eq!(got.text, "Sorry.", "{d:?}");
        let second = mock.last().json().to_string();
        assert!(
            second.contains("is not valid; copy it exactly"),
            "{d:?}: {second}"
        );
        let m = sluice.metrics().await;
        assert_eq!(
            metric(&m, "sluice_read_calls_total{outcome=\"bad_cursor\"}"),
            1.0
        );
    }
}

/// A failed round returns the upstream's error to the client and consumes nothing: the next
/// request splices nothing in.
#[tokio::test]
async fn a_failed_round_returns_the_error_and_consumes_nothing_c2() {
    let output = tool_output(150_000);
    for d in ALL {
        for stream in [false, true] {
            let mock = MockUpstream::start();
            let sluice = Sluice::start(&config(&mock, ""));
            mock.script([
                Reply::Read { before: None, also: None, answer: String::new() },
                Reply::Status(529, json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}).to_string()),
            ]);
            let first = d.request(stream, &output);
            let response = client()
                .post(sluice.url(d.path()))
                .bearer_auth("key-a")
                .json(&first)
                .send()
                .await
                .unwrap();
            let case = format!("{d:?} stream={stream}");
            if stream {
                assert_eq!(response.status(), 200, "{case}: the stream had begun");
                let text = response.text().await.unwrap();
                assert!(
                    text.contains("overloaded_error") && text.contains("error"),
                    "{case}: {text}"
                );
            } else {
                assert_eq!(response.status(), 529, "{case}");
                assert!(response.text().await.unwrap().contains("busy"));
            }
            let m = sluice.metrics().await;
            assert_eq!(
                metric(&m, "sluice_commits_total{outcome=\"committed\"}"),
                0.0,
                "{case}"
            );
        }
    }
}

/// C4: a read call together with the agent's own call: the client gets the agent's call in a
/// well-formed response; when it sends its tool result, the read call and its answer are
/// spliced back in.
#[tokio::test]
async fn mixed_calls_return_the_agents_call_and_splice_the_read_c4() {
    let output = tool_output(150_000);
    for d in ALL {
        for stream in [false, true] {
            let mock = MockUpstream::start();
            let sluice = Sluice::start(&config(&mock, ""));
            let case = format!("{d:?} stream={stream}");
            mock.script([Reply::Read {
                before: Some("Checking. ".into()),
                also: Some("build".into()),
                answer: String::new(),
            }]);
            let first = d.request(stream, &output);
            let (status, got) = send(&sluice, d, &first).await;
            assert_eq!(status, 200, "{case}");
            assert_eq!(got.calls, ["build"], "{case}: only the agent's call");
            assert_eq!(got.text, "Checking. ", "{case}");
            commits(&sluice, 1.0).await;
            // The agent runs `build` and sends its result.
            let call_id = match d {
                D::Chat => got.items[0]["tool_calls"][0]["id"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                D::Responses => got
                    .items
                    .iter()
                    .find(|i| i["type"] == "function_call")
                    .unwrap()["call_id"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                D::Anthropic => got.items[0]["content"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|b| b["type"] == "tool_use")
                    .unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            };
            let mut second = first.clone();
            let key = if d == D::Responses {
                "input"
            } else {
                "messages"
            };
            let list = second[key].as_array_mut().unwrap();
            list.extend(got.items.iter().cloned());
            list.push(match d {
                D::Chat => json!({"role": "tool", "tool_call_id": call_id, "content": "built"}),
                D::Responses => json!({"type": "function_call_output", "call_id": call_id, "output": "built"}),
                D::Anthropic => json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "built"}]}),
            });
            mock.script([Reply::Text("Fixed.".into())]);
            mock.record(true);
            let (status, got) = send(&sluice, d, &second).await;
            assert_eq!(status, 200, "{case}");
            assert_eq!(got.text, "Fixed.");
            let upstream = mock.last().json();
            assert_eq!(pages(&upstream), 2, "{case}: the page read is back in");
            let text = upstream.to_string();
            assert_eq!(text.matches("\"built\"").count(), 1, "{case}");
            if d == D::Anthropic {
                // Every tool_use is answered in the very next message, read result first.
                let messages = upstream["messages"].as_array().unwrap();
                let last = messages.last().unwrap()["content"].as_array().unwrap();
                assert_eq!(last.len(), 2, "{case}: {last:?}");
                assert!(last[0]["content"]
                    .as_str()
                    .unwrap()
                    .contains("sluice: lines "));
            }
        }
    }
}

/// Requests without a cursor are not touched: no tool is added.
#[tokio::test]
async fn no_cursor_no_tool_c1() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    mock.record(true);
    for d in ALL {
        let body = d.request(false, "short output");
        send(&sluice, d, &body).await;
        assert_eq!(mock.last().json()["tools"], body["tools"], "{d:?}");
    }
}

/// A tool result carrying a screenshot as an MCP result (text), in each dialect.
fn with_screenshot(d: D, png: &[u8]) -> Value {
    let mcp = json!({"content": [{"type": "text", "text": "screenshot taken"},
        {"type": "image", "data": common::b64(png), "mimeType": "image/png"}]})
    .to_string();
    d.request(false, &mcp)
}

/// C5: an image shown once is a placeholder on the next turn that names its artifact; the model
/// reads it again with the read tool and sees it, placed as the dialect takes tool images; later
/// turns show that re-read once, as a placeholder.
#[tokio::test]
async fn an_image_shown_once_can_be_read_again_c5() {
    let png = common::picture(64, 48, image::ImageFormat::Png);
    for d in ALL {
        let mock = MockUpstream::start();
        let sluice = Sluice::start(&config(&mock, ""));
        mock.record(true);
        let first = with_screenshot(d, &png);
        let (status, got) = send(&sluice, d, &first).await;
        assert_eq!(status, 200, "{d:?}");
        let shown = mock.last().json().to_string();
        let at = shown.find("artifact://m").expect("the image's reference") + "artifact://".len();
        let id: String = shown[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        commits(&sluice, 1.0).await;

        // The next turn: the image was shown once; its placeholder says how to see it again.
        let second = d.next_turn(first.clone(), &got.items, "look again");
        mock.script([
            Reply::Parts(vec![common::Part::Tool(
                "sluice_read".into(),
                json!({"url": format!("artifact://{id}")}),
            )]),
            Reply::Text("I see it again.".into()),
        ]);
        let before = mock.requests().len();
        let (status, got2) = send(&sluice, d, &second).await;
        assert_eq!(
            status, 200,
            "{d:?}: the mock enforces the provider's image rules"
        );
        assert_eq!(got2.text, "I see it again.", "{d:?}");
        let rounds: Vec<Value> = mock.requests()[before..].iter().map(|r| r.json()).collect();
        assert_eq!(rounds.len(), 2, "{d:?}");
        let offered = rounds[0].to_string();
        assert!(
            offered.contains(&format!(r#"{{\"url\":\"artifact://{id}\"}}"#)),
            "{d:?}: the placeholder names the artifact and the call: {offered}"
        );
        assert!(
            offered.contains("sluice_read"),
            "{d:?}: the tool is offered"
        );
        let images_in = |v: &Value| {
            let s = v.to_string();
            s.matches(r#""type":"image_url""#).count()
                + s.matches(r#""type":"input_image""#).count()
                + s.matches(r#""type":"image""#).count()
        };
        assert_eq!(images_in(&rounds[0]), 0, "{d:?}: retired in this turn");
        assert_eq!(images_in(&rounds[1]), 1, "{d:?}: shown again by the read");
        let m = sluice.metrics().await;
        assert_eq!(
            metric(&m, "sluice_read_calls_total{outcome=\"image\"}"),
            1.0
        );
        commits(&sluice, 2.0).await;

        // Later turns: the re-read is spliced back as a placeholder (lifetime once).
        let third = d.next_turn(second.clone(), &got2.items, "thanks");
        mock.script([Reply::Text("ok".into())]);
        send(&sluice, d, &third).await;
        let later = mock.last().json();
        assert_eq!(images_in(&later), 0, "{d:?}: shown once");
        assert!(
            later
                .to_string()
                .contains("was shown here; it can be read again"),
            "{d:?}"
        );
    }
}

/// A read for something that is not an image of this tenant is answered in-band.
#[tokio::test]
async fn a_bad_image_url_is_answered_in_band_c5() {
    let output = tool_output(150_000);
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    mock.script([
        Reply::Parts(vec![common::Part::Tool(
            "sluice_read".into(),
            json!({"url": "artifact://mAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}),
        )]),
        Reply::Text("Sorry.".into()),
    ]);
    mock.record(true);
    let (status, got) = send(&sluice, D::Anthropic, &D::Anthropic.request(false, &output)).await;
    assert_eq!(status, 200);
    assert_eq!(got.text, "Sorry.");
    let round = mock.last().json().to_string();
    assert!(
        round.contains("is not the artifact://ID of an image") || round.contains("has expired"),
        "{round}"
    );
}

/// C1: a client tool already named `sluice_read` keeps its name; sluice's tool and the notices
/// use `sluice_read_2`, and calls of it are answered by sluice.
#[tokio::test]
async fn a_taken_name_gets_a_suffix_everywhere_c1() {
    let output = tool_output(150_000);
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    let mut body = D::Chat.request(false, &output);
    body["tools"] = json!([{"type": "function", "function": {"name": "sluice_read", "parameters": {"type": "object"}}}]);
    mock.script([
        Reply::Read {
            before: None,
            also: None,
            answer: String::new(),
        },
        Reply::Text("Done.".into()),
    ]);
    mock.record(true);
    let (status, got) = send(&sluice, D::Chat, &body).await;
    assert_eq!(status, 200);
    assert_eq!(got.text, "Done.");
    let first = mock.requests()[0].json();
    let names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["sluice_read", "sluice_read_2"]);
    assert!(
        first.to_string().contains("call sluice_read_2 with"),
        "the notice names the tool offered"
    );
    assert_eq!(
        mock.requests().len(),
        2,
        "the suffixed tool's call was answered by sluice"
    );
}
