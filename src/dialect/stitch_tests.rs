//! Unit tests of the stitcher: rounds become one well-formed stream per dialect, indices and
//! ids stay consistent, and a stream that needs no read passes byte for byte.

use super::*;
use serde_json::json;

fn events(text: &str) -> Vec<(Option<String>, Value)> {
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|b| {
            let name = b
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .map(str::to_string);
            let data = b.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            (name, serde_json::from_str(data).unwrap_or(Value::Null))
        })
        .collect()
}

fn sse(events: &[(&str, Value)]) -> String {
    events
        .iter()
        .map(|(n, d)| format!("event: {n}\ndata: {d}\n\n"))
        .collect()
}

#[test]
fn anthropic_rounds_become_one_message_with_consistent_indices() {
    let mut s = Stitcher::new(Dialect::AnthropicMessages, "sluice_read");
    let round1 = sse(&[
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "m1", "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Reading."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1", "name": "sluice_read", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"cursor\":"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"c\"}"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]);
    // Fed in awkward pieces: events split across chunks.
    let mut client = Vec::new();
    for piece in round1.as_bytes().chunks(7) {
        client.extend(s.feed(piece));
    }
    assert!(s.round_complete());
    let first = s.output();
    assert_eq!(first.calls[0].arguments["cursor"], "c");
    s.next_round();
    let round2 = sse(&[
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "m2", "usage": {"input_tokens": 20, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " Done."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]);
    client.extend(s.feed(round2.as_bytes()));
    let second = s.output();
    client.extend(s.finish(&[first, second]));
    let got = events(std::str::from_utf8(&client).unwrap());
    let kinds: Vec<&str> = got
        .iter()
        .map(|(_, d)| d["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let indices: Vec<u64> = got
        .iter()
        .filter_map(|(_, d)| d["index"].as_u64())
        .collect();
    assert_eq!(indices, [0, 0, 0, 1, 1, 1]);
    let delta = &got[7].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["input_tokens"], 30);
    assert_eq!(delta["usage"]["output_tokens"], 12);
}

#[test]
fn responses_rounds_keep_the_first_response_id_to_the_end() {
    let mut s = Stitcher::new(Dialect::OpenAiResponses, "sluice_read");
    let round = |id: &str, item: Value| {
        sse(&[
            (
                "response.created",
                json!({"type": "response.created", "sequence_number": 0, "response": {"id": id}}),
            ),
            (
                "response.in_progress",
                json!({"type": "response.in_progress", "sequence_number": 1, "response": {"id": id}}),
            ),
            (
                "response.output_item.added",
                json!({"type": "response.output_item.added", "sequence_number": 2, "output_index": 0, "item": item}),
            ),
            (
                "response.output_item.done",
                json!({"type": "response.output_item.done", "sequence_number": 3, "output_index": 0, "item": item}),
            ),
            (
                "response.completed",
                json!({"type": "response.completed", "sequence_number": 4, "response": {"id": id, "output": [item], "usage": {"input_tokens": 1}}}),
            ),
        ])
    };
    let call = json!({"type": "function_call", "id": "fc1", "call_id": "c1", "name": "sluice_read", "arguments": "{\"cursor\":\"c\"}"});
    let mut client = s.feed(round("resp_1", call).as_bytes());
    let first = s.output();
    s.next_round();
    let text = json!({"type": "message", "id": "m2", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]});
    client.extend(s.feed(round("resp_2", text).as_bytes()));
    let second = s.output();
    client.extend(s.finish(&[first, second]));
    let got = events(std::str::from_utf8(&client).unwrap());
    let ids: Vec<&Value> = got
        .iter()
        .filter_map(|(_, d)| d.get("response"))
        .map(|r| &r["id"])
        .collect();
    assert_eq!(ids, [&json!("resp_1"), &json!("resp_1"), &json!("resp_1")]);
    let seq: Vec<u64> = got
        .iter()
        .filter_map(|(_, d)| d["sequence_number"].as_u64())
        .collect();
    assert!(seq.windows(2).all(|w| w[1] == w[0] + 1), "{seq:?}");
}

#[test]
fn a_stream_that_needs_no_read_passes_byte_for_byte() {
    let streams = [
        (
            Dialect::AnthropicMessages,
            sse(&[
                ("message_start", json!({"type": "message_start", "message": {"id": "m1", "usage": {"input_tokens": 10, "output_tokens": 1}}})),
                ("ping", json!({"type": "ping"})),
                ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
                ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "café 1.50"}})),
                ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
                ("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}})),
                ("message_stop", json!({"type": "message_stop"})),
            ]),
        ),
        (
            Dialect::OpenAiResponses,
            sse(&[
                ("response.created", json!({"type": "response.created", "sequence_number": 0, "response": {"id": "r"}})),
                ("response.output_text.delta", json!({"type": "response.output_text.delta", "sequence_number": 1, "output_index": 0, "delta": "hi"})),
                ("response.completed", json!({"type": "response.completed", "sequence_number": 2, "response": {"id": "r", "output": [], "usage": {"input_tokens": 1}}})),
            ]),
        ),
        (
            Dialect::OpenAiChat,
            "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\\u00e9\"},\"finish_reason\":null}]}\n\ndata: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n".to_string(),
        ),
    ];
    for (dialect, upstream) in streams {
        let mut s = Stitcher::new(dialect, "sluice_read");
        let mut client = s.feed(upstream.as_bytes());
        let out = s.output();
        client.extend(s.finish(&[out]));
        assert_eq!(String::from_utf8(client).unwrap(), upstream, "{dialect:?}");
    }
}

#[test]
fn chat_read_calls_are_held_and_agent_calls_renumbered() {
    let mut s = Stitcher::new(Dialect::OpenAiChat, "sluice_read");
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "x", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut up = String::new();
    up += &chunk(json!({"role": "assistant", "content": "Hi"}), Value::Null);
    up += &chunk(
        json!({"tool_calls": [{"index": 0, "id": "r", "type": "function", "function": {"name": "sluice_read", "arguments": ""}}]}),
        Value::Null,
    );
    up += &chunk(
        json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"cursor\":\"c\"}"}}]}),
        Value::Null,
    );
    up += &chunk(
        json!({"tool_calls": [{"index": 1, "id": "b", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}),
        Value::Null,
    );
    up += &chunk(json!({}), json!("tool_calls"));
    up += "data: [DONE]\n\n";
    let mut client = s.feed(up.as_bytes());
    assert!(s.round_complete());
    let out = s.output();
    assert_eq!(out.calls.len(), 2);
    assert_eq!(out.calls[0].arguments["cursor"], "c");
    client.extend(s.finish(&[out]));
    let text = String::from_utf8(client).unwrap();
    assert!(!text.contains("sluice_read"), "{text}");
    let chunks: Vec<Value> = text
        .split("\n\n")
        .filter_map(|b| b.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(calls[0]["function"]["name"], "bash");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    assert!(text.ends_with("data: [DONE]\n\n"));
}
