//! The Gemini API through sluice, end to end against the mock provider in Gemini's shapes (it
//! enforces the API's rules: alternating roles, every `functionCall` answered, media types
//! that match their bytes, no `additionalProperties` in `parameters`): the model in the path,
//! the key moved out of the URL, a long `functionResponse` spilled (T3) and read on through the
//! read tool (C1, C2), whole and streamed, the hidden rounds spliced back (C3), images in and
//! beside a `functionResponse` (A1, A7, M5), errors in Gemini's shape (P4), the inspector's
//! record and usage, and the context guard.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: fail loudly

mod common;

use common::gemini::*;
use common::*;
use serde_json::{json, Value};

/// A Gemini CLI-shaped turn: the user's ask, the model's shell call, its `functionResponse`
/// with the output in `response.output`.
fn request(output: &str, ask: &str) -> Value {
    json!({
        "contents": [
            {"role": "user", "parts": [{"text": ask}]},
            {"role": "model", "parts": [{"functionCall": {"name": "run_shell_command",
                "args": {"command": "cargo test"}, "id": "call-1"},
                "thoughtSignature": "c2lnbmF0dXJl"}]},
            {"role": "user", "parts": [{"functionResponse": {"id": "call-1",
                "name": "run_shell_command", "response": {"output": output}}}]}
        ],
        "systemInstruction": {"parts": [{"text": "You are a coding agent."}]},
        "tools": [{"functionDeclarations": [{"name": "run_shell_command",
            "description": "Runs a shell command.",
            "parametersJsonSchema": {"type": "object", "properties": {"command": {"type": "string"}}}}]}],
        "generationConfig": {"temperature": 0, "maxOutputTokens": 1024}
    })
}

fn reads_two_then_answers() -> Vec<Reply> {
    let read = |before: Option<&str>| Reply::Read {
        before: before.map(str::to_string),
        also: None,
        answer: "no cursor".into(),
    };
    vec![
        read(Some("Let me read on. ")),
        read(None),
        Reply::Text("The build failed in crate-7.".into()),
    ]
}

/// The pages of the spilled output the request shows the model.
fn pages(request: &Value) -> usize {
    request.to_string().matches("sluice: lines ").count()
}

/// T3, C1, C2, C3 in Gemini's shapes, whole and streamed: the long output is spilled, the model
/// reads two pages through `sluice_read` (a `functionDeclarations` entry with a
/// `parametersJsonSchema`), the client gets one answer without the read calls, and its next turn
/// carries the rounds the model had.
#[tokio::test]
async fn a_long_function_response_is_spilled_read_on_and_spliced_back_t3_c1_c2_c3() {
    let output = tool_output(150_000);
    for streamed in [false, true] {
        let case = format!("streamed={streamed}");
        let mock = MockUpstream::start();
        let sluice = Sluice::start(&config(&mock, ""));
        mock.script(reads_two_then_answers());
        let first = request(&output, "Why does the build fail?");
        let path = if streamed { STREAM } else { GENERATE };
        let response = send(&sluice, path, &first).await;
        assert_eq!(response.status(), 200, "{case}");
        let (parts, chunks) = received(response, streamed).await;
        assert_eq!(
            text_of(&parts),
            "Let me read on. The build failed in crate-7.",
            "{case}"
        );
        assert!(
            parts.iter().all(|p| p.get("functionCall").is_none()),
            "{case}: no read call reaches the client: {parts:?}"
        );
        let last = chunks.last().unwrap();
        assert_eq!(last["candidates"][0]["finishReason"], "STOP", "{case}");
        let upstream = mock.requests();
        assert_eq!(upstream.len(), 3, "{case}: two read rounds and the answer");
        for r in &upstream {
            assert!(r.uri.contains(":generateContent") || r.uri.contains(":streamGenerateContent"));
            assert_eq!(r.headers["x-goog-api-key"], KEY, "{case}");
        }
        let bodies: Vec<Value> = upstream.iter().map(|r| r.json()).collect();
        // T3: the first request shows a page of the output, in `response.output`.
        let shown = bodies[0]["contents"][2]["parts"][0]["functionResponse"]["response"]["output"]
            .as_str()
            .unwrap();
        assert!(shown.len() < output.len() / 3, "{case}: spilled");
        assert!(shown.contains("artifact://"), "{case}");
        // C1: the read tool is a function declaration with a JSON schema, the same every round.
        let tools: Vec<String> = bodies.iter().map(|b| b["tools"].to_string()).collect();
        assert!(tools.windows(2).all(|w| w[0] == w[1]), "{case}");
        assert_eq!(
            bodies[0]["tools"][1]["functionDeclarations"][0]["name"],
            "sluice_read"
        );
        assert_eq!(
            bodies[0]["tools"][1]["functionDeclarations"][0]["parametersJsonSchema"]["type"],
            "object"
        );
        // C2: each round adds a page; the model's signed call goes back as it came.
        assert_eq!(bodies.iter().map(pages).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(
            bodies[1]["contents"][1]["parts"][0]["thoughtSignature"],
            "c2lnbmF0dXJl"
        );
        let round = &bodies[1]["contents"][3];
        assert_eq!(round["role"], "model", "{case}: {round}");
        assert!(round["parts"]
            .as_array()
            .unwrap()
            .iter()
            .any(
                |p| p["functionCall"]["name"] == "sluice_read" && p["thoughtSignature"].is_string()
            ));

        // C3: the next turn shows the model its rounds in place of what the client received.
        // As Gemini CLI 0.61 sends a resumed session: the answer's text parts joined into one,
        // its own call's signature dropped, the function response sent twice.
        let mut second = first.clone();
        let contents = second["contents"].as_array_mut().unwrap();
        contents[1]["parts"][0]
            .as_object_mut()
            .unwrap()
            .remove("thoughtSignature");
        let answered = contents[2]["parts"][0].clone();
        contents[2]["parts"].as_array_mut().unwrap().push(answered);
        contents.push(json!({"role": "model", "parts": [{"text": text_of(&parts)}]}));
        contents.push(json!({"role": "user", "parts": [{"text": "thanks, fix it"}]}));
        mock.script([Reply::Text("ok".into())]);
        for _ in 0..100 {
            // The link lands when the response reached the client.
            let m = sluice.metrics().await;
            if metric(&m, "sluice_commits_total{outcome=\"committed\"}") >= 1.0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let response = send(&sluice, path, &second).await;
        assert_eq!(response.status(), 200, "{case}");
        let spliced = mock.last().json();
        // The first page twice (the client sends its result twice), the two read back.
        assert_eq!(pages(&spliced), 4, "{case}: the pages read are back");
        let roles: Vec<&str> = spliced["contents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["role"].as_str().unwrap())
            .collect();
        assert_eq!(
            roles,
            ["user", "model", "user", "model", "user", "model", "user", "model", "user"],
            "{case}: the rounds, alternating as the API wants"
        );
    }
}

/// The key a client puts in the URL (`?key=`) travels in `x-goog-api-key` instead: no URL sluice
/// forwards carries it, and it names the same tenant as the header would.
#[tokio::test]
async fn a_key_in_the_url_moves_into_its_header() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    mock.script([Reply::Text("hi".into())]);
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hello"}]}]});
    let response = client()
        .post(sluice.url(&format!("{STREAM}&key={KEY}")))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (parts, _) = received(response, true).await;
    assert_eq!(text_of(&parts), "hi");
    let got = mock.last();
    assert!(!got.uri.contains("key="), "{}", got.uri);
    assert!(got.uri.ends_with("?alt=sse"), "{}", got.uri);
    assert_eq!(got.headers["x-goog-api-key"], KEY);
    assert!(
        !sluice.logs().join("\n").contains(KEY),
        "the key is never logged"
    );
}

/// P4: sluice's own errors in Gemini's shape, with the status the API would use.
#[tokio::test]
async fn errors_come_in_geminis_shape_p4() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    let response = client()
        .post(sluice.url(GENERATE))
        .header("x-goog-api-key", KEY)
        .body("{\"contents\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let v: Value = response.json().await.unwrap();
    assert_eq!(v["error"]["code"], 400);
    assert_eq!(v["error"]["status"], "INVALID_ARGUMENT");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("sluice:"));
    // A provider's own refusal passes as it came (P3).
    let body = json!({"contents": [{"role": "model", "parts": [{"text": "first"}]}]});
    let response = send(&sluice, GENERATE, &body).await;
    assert_eq!(response.status(), 400);
    let v: Value = response.json().await.unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("alternate between user and model"));
    // No upstream: 502, Gemini-shaped.
    let dead = Sluice::start(&config_for("http://127.0.0.1:9", "").replace(
        "[[routes]]\nname = \"openai\"",
        "[[routes]]\nname = \"gemini\"\ndialects = [\"gemini-generate\"]\nmodels = [\"*\"]\nupstream = \"http://127.0.0.1:9\"\n\n[[routes]]\nname = \"openai\"",
    ));
    let response = send(&dead, GENERATE, &body).await;
    assert_eq!(response.status(), 502);
    let v: Value = response.json().await.unwrap();
    assert_eq!(v["error"]["code"], 502);
    assert_eq!(v["error"]["status"], "INTERNAL");
}

/// `countTokens` is forwarded and shows the model nothing; other Gemini paths pass through
/// (P5), the model list among them.
#[tokio::test]
async fn counting_and_other_paths_pass_through_p5() {
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hello"}]}]});
    let response = send(
        &sluice,
        "/v1beta/models/gemini-2.5-flash:countTokens",
        &body,
    )
    .await;
    assert_eq!(response.status(), 200);
    let v: Value = response.json().await.unwrap();
    assert!(v["totalTokens"].as_u64().is_some());
    let response = client()
        .get(sluice.url("/v1beta/models?pageSize=5"))
        .header("x-goog-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let v: Value = response.json().await.unwrap();
    assert_eq!(v["uri"], "/v1beta/models?pageSize=5");
}

/// A screenshot in a `functionResponse`'s `parts` is checked and kept there (A7); with the
/// route's images off it becomes its placeholder and the bytes never reach the model (A1).
#[tokio::test]
async fn images_in_a_function_response_are_kept_or_gated_a1_a7() {
    let png = picture(64, 48, image::ImageFormat::Png);
    let body = json!({
        "contents": [
            {"role": "user", "parts": [{"text": "take a screenshot"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "screenshot", "args": {}, "id": "s1"}}]},
            {"role": "user", "parts": [{"functionResponse": {"id": "s1", "name": "screenshot",
                "response": {"output": "Took a screenshot."},
                "parts": [{"inlineData": {"mimeType": "image/jpeg", "data": b64(&png)}}]}}]}
        ]
    });
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    mock.script([Reply::Text("I see it.".into())]);
    let response = send(&sluice, GENERATE, &body).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let got = mock.last().json();
    let answered = &got["contents"][2]["parts"][0]["functionResponse"];
    // M2: the bytes decide the type; the mislabelled PNG is sent as what it is.
    assert_eq!(answered["parts"][0]["inlineData"]["mimeType"], "image/png");
    assert_eq!(answered["parts"][0]["inlineData"]["data"], b64(&png));
    assert!(answered["response"]["output"]
        .as_str()
        .unwrap()
        .contains("[image #1: image/png 64×48"));

    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, "input_modalities = [\"text\"]"));
    mock.script([Reply::Text("No picture.".into())]);
    let response = send(&sluice, GENERATE, &body).await;
    assert_eq!(response.status(), 200);
    let got = mock.last();
    assert!(!String::from_utf8_lossy(&got.body).contains(&b64(&png)[..64]));
    let answered = &got.json()["contents"][2]["parts"][0]["functionResponse"];
    assert!(answered.get("parts").is_none(), "{answered}");
    assert!(answered["response"]["output"]
        .as_str()
        .unwrap()
        .contains("no visual content"));
}

/// Gemini CLI sends an MCP tool's screenshot beside its `functionResponse`, in the same `user`
/// content: it is the tool's image (the `*screenshot*` lifetime, `recent`), not a user's
/// (`once`), so the next turn still shows it (M5, A3).
#[tokio::test]
async fn an_image_beside_a_function_response_is_the_tools_m5() {
    let shot = |n: u32| b64(&picture(40 + n, 30, image::ImageFormat::Png));
    let turn = |n: u32| {
        [
            json!({"role": "model", "parts": [{"functionCall": {"name": "browser_take_screenshot",
                "args": {}, "id": format!("s{n}")}}]}),
            json!({"role": "user", "parts": [
                {"functionResponse": {"id": format!("s{n}"), "name": "browser_take_screenshot",
                    "response": {"output": "[Tool 'browser_take_screenshot' provided the following image data]"}}},
                {"inlineData": {"mimeType": "image/png", "data": shot(n)}}]}),
        ]
    };
    let mut contents = vec![json!({"role": "user", "parts": [{"text": "watch the page"}]})];
    contents.extend(turn(1));
    let mock = MockUpstream::start();
    let sluice = Sluice::start(&config(&mock, ""));
    mock.script([Reply::Text("one".into()), Reply::Text("two".into())]);
    let response = send(&sluice, GENERATE, &json!({"contents": contents})).await;
    assert_eq!(response.status(), 200);
    response.text().await.unwrap();
    for _ in 0..100 {
        let m = sluice.metrics().await;
        if metric(&m, "sluice_commits_total{outcome=\"committed\"}") >= 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    contents.push(json!({"role": "model", "parts": [{"text": "one"}]}));
    contents.push(json!({"role": "user", "parts": [{"text": "again"}]}));
    contents.extend(turn(2));
    let response = send(&sluice, GENERATE, &json!({"contents": contents})).await;
    assert_eq!(response.status(), 200);
    let got = String::from_utf8_lossy(&mock.last().body).into_owned();
    assert!(
        got.contains(&shot(1)),
        "the first screenshot is still shown"
    );
    assert!(got.contains(&shot(2)));
    assert!(
        !got.contains("no longer attached"),
        "{}",
        &got[..got.len().min(2000)]
    );
}

/// The inspector records a Gemini session (docs/inspector.md): every streamed turn, the spilled
/// result's fate, the provider's usage read from `usageMetadata` (its cached tokens from
/// `cachedContentTokenCount`), and a cacheable prefix the provider's count confirms.
#[tokio::test]
async fn the_inspector_records_a_gemini_session() {
    let mock = MockUpstream::start();
    let config = format!(
        "{}\n[[routes]]\nname = \"gemini\"\ndialects = [\"gemini-generate\"]\nmodels = [\"*\"]\nupstream = \"{}\"\n",
        config_for(&mock.base_url(), "[inspector]\nenabled = true\n"),
        mock.base_url()
    );
    let sluice = Sluice::start(&config);
    let mut contents = vec![json!({"role": "user", "parts": [{"text": "build it"}]})];
    const TURNS: usize = 5;
    for k in 0..TURNS {
        let output = if k == 1 {
            tool_output(150_000)
        } else {
            format!("step {k} ok\n")
        };
        contents.push(
            json!({"role": "model", "parts": [{"functionCall": {"name": "sh",
            "args": {"k": k}, "id": format!("c{k}")}}]}),
        );
        contents.push(
            json!({"role": "user", "parts": [{"functionResponse": {"name": "sh",
            "id": format!("c{k}"), "response": {"output": output}}}]}),
        );
        mock.script([Reply::Text(format!("done {k}"))]);
        let system = "You are a careful coding agent; read before you write. ".repeat(400);
        let body =
            json!({"systemInstruction": {"parts": [{"text": system}]}, "contents": contents});
        let response = send(&sluice, STREAM, &body).await;
        assert_eq!(response.status(), 200);
        let (parts, _) = received(response, true).await;
        assert_eq!(text_of(&parts), format!("done {k}"));
        contents.push(json!({"role": "model", "parts": [{"text": format!("done {k}")}]}));
        contents.push(json!({"role": "user", "parts": [{"text": format!("go on {k}")}]}));
    }
    let mut record = Value::Null;
    for _ in 0..200 {
        let id = newest_session(&sluice, KEY).await;
        let got: Value = get_as(&sluice, &format!("/v1/sluice/sessions/{id}"), KEY)
            .await
            .json()
            .await
            .unwrap();
        if got["turns"].as_array().is_some_and(|t| t.len() == TURNS) {
            record = got;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let turns = record["turns"].as_array().expect("every turn recorded");
    for (k, turn) in turns.iter().enumerate() {
        let at = format!("turn {k}: {turn}");
        assert_eq!(turn["route"], "gemini", "{at}");
        assert_eq!(turn["dialect"], "gemini-generate", "{at}");
        assert_eq!(turn["stream"], true, "{at}");
        assert_eq!(turn["complete"], true, "{at}");
        assert!(turn["usage"]["input"].as_u64().unwrap() > 0, "{at}");
        if k >= 1 {
            assert_eq!(turn["results"][1]["fate"], "spilled", "{at}");
        }
        if k >= 2 {
            // The provider's implicit cache served the turn before's prefix, as the inspector's
            // exact model bills it (within the estimate's error; the prefix is over Gemini 3's
            // 4,096-token minimum). Turn 1 added the read tool, which is first in cache order:
            // nothing was read then, on either count.
            let cached = turn["usage"]["cached"].as_u64().unwrap() as f64;
            let read = turn["bill"]["forwarded"]["read"].as_u64().unwrap() as f64;
            assert!(cached > 1000.0, "{at}");
            assert!(
                (cached / read - 1.0).abs() < 0.15,
                "{cached} vs {read}: {at}"
            );
        }
    }
}

/// The context guard on a Gemini route (docs/context-guard.md): a session whose history grows
/// past the model's window keeps working, each request under it (the mock refuses one over it
/// with Gemini's own error), the oldest results retired to artifacts; without the guard the
/// same session fails.
#[tokio::test]
async fn the_context_guard_keeps_a_gemini_session_under_its_window() {
    const WINDOW: u64 = 40_000;
    for guarded in [true, false] {
        let mock = MockUpstream::start();
        mock.context_window(Some(WINDOW));
        let route = if guarded {
            format!("[routes.context]\nwindow_tokens = {WINDOW}\noutput_tokens = 1000\n")
        } else {
            String::new()
        };
        let sluice = Sluice::start(&config(&mock, &route));
        let mut contents = vec![json!({"role": "user", "parts": [{"text": "fix it"}]})];
        let mut statuses = Vec::new();
        for k in 0..12 {
            contents.push(
                json!({"role": "model", "parts": [{"functionCall": {"name": "sh",
                "args": {"k": k}, "id": format!("c{k}")}}]}),
            );
            // Within the page budget (1,000 lines, about 25,000 units): never spilled.
            let output: String = (0..1000)
                .map(|i| format!("test case_{k}_{i} ... ok ({} ms)\n", (i * 7 + k) % 97))
                .collect();
            contents.push(
                json!({"role": "user", "parts": [{"functionResponse": {"name": "sh",
                "id": format!("c{k}"), "response": {"output": output}}}]}),
            );
            mock.script([Reply::Text(format!("done {k}"))]);
            let body = json!({"contents": contents, "generationConfig": {"maxOutputTokens": 1000}});
            let response = send(&sluice, GENERATE, &body).await;
            statuses.push(response.status().as_u16());
            let text = response.text().await.unwrap();
            if statuses.last() == Some(&200) {
                let v: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(
                    v["candidates"][0]["content"]["parts"][0]["text"],
                    format!("done {k}")
                );
            } else {
                let v: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["error"]["status"], "INVALID_ARGUMENT", "{text}");
            }
            contents.push(json!({"role": "model", "parts": [{"text": format!("done {k}")}]}));
            contents.push(json!({"role": "user", "parts": [{"text": format!("go on {k}")}]}));
        }
        if guarded {
            assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
            let last = mock.last();
            assert!(
                String::from_utf8_lossy(&last.body).contains("tool output retired"),
                "the oldest results are retired"
            );
        } else {
            assert!(
                statuses.contains(&400),
                "without the guard the window is passed: {statuses:?}"
            );
        }
    }
}
