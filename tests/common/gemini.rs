//! What the Gemini tests share: a route for `gemini-generate` to the mock, a request sent with
//! the key in Gemini's header, and the parts a whole or streamed answer carried.

use serde_json::Value;

use super::{client, config_for, MockUpstream, Sluice};

pub const GENERATE: &str = "/v1beta/models/gemini-3-pro-preview:generateContent";
pub const STREAM: &str = "/v1beta/models/gemini-3-pro-preview:streamGenerateContent?alt=sse";
pub const KEY: &str = "gemini-test-key";

/// A config with a Gemini route to `mock`; `route` is added to that route's table.
pub fn config(mock: &MockUpstream, route: &str) -> String {
    format!(
        "{}\n[[routes]]\nname = \"gemini\"\ndialects = [\"gemini-generate\"]\nmodels = [\"*\"]\nupstream = \"{}\"\n{route}\n",
        config_for(&mock.base_url(), ""),
        mock.base_url()
    )
}

pub async fn send(sluice: &Sluice, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(sluice.url(path))
        .header("x-goog-api-key", KEY)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// The parts and chunks of an answer's text: a whole response's, or every chunk's of a stream.
pub fn parts_of(text: &str, streamed: bool) -> (Vec<Value>, Vec<Value>) {
    let chunks: Vec<Value> = if streamed {
        text.split("\n\n")
            .filter_map(|event| event.strip_prefix("data: "))
            .map(|data| serde_json::from_str(data).unwrap())
            .collect()
    } else {
        vec![serde_json::from_str(text).unwrap()]
    };
    let parts = chunks
        .iter()
        .flat_map(|c| {
            c["candidates"][0]["content"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    (parts, chunks)
}

/// The parts the client received, in order.
pub async fn received(response: reqwest::Response, streamed: bool) -> (Vec<Value>, Vec<Value>) {
    parts_of(&response.text().await.unwrap(), streamed)
}

pub fn text_of(parts: &[Value]) -> String {
    parts.iter().filter_map(|p| p["text"].as_str()).collect()
}
