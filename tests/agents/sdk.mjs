// The official Node SDKs through sluice (tests/agents.rs): the model reads three pages through
// sluice's read tool, and each SDK, streamed (its stream helpers) and not, gets one response.
// Usage: node sdk.mjs OPENAI_BASE ANTHROPIC_BASE OUTPUT_FILE
import { readFileSync } from "node:fs";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const [openaiBase, anthropicBase, outputFile] = process.argv.slice(2);
const output = readFileSync(outputFile, "utf8");
const oa = new OpenAI({ baseURL: openaiBase, apiKey: "sk-test", maxRetries: 0 });
const an = new Anthropic({ baseURL: anthropicBase, apiKey: "sk-ant-test", maxRetries: 0 });

let passed = 0;
let failed = 0;
function expect(ok, name, got) {
  if (ok) {
    passed += 1;
  } else {
    failed += 1;
    console.log(`FAIL ${name}: ${JSON.stringify(got)}`);
  }
}

const first = "mock:read=3 run the tests";
const want = "Reading on. Read 3 pages.";
// chat has one content string: the rounds' texts are set apart as paragraphs.
const wantChat = "Reading on. \n\nRead 3 pages.";

const chat = [
  { role: "user", content: first },
  { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "bash", arguments: "{}" } }] },
  { role: "tool", tool_call_id: "call_1", content: output },
];
const r = await oa.chat.completions.create({ model: "gpt-4o", messages: chat });
expect(r.choices[0].message.content === wantChat && !r.choices[0].message.tool_calls, "chat", r.choices[0].message);
const chatStream = oa.chat.completions.stream({ model: "gpt-4o", messages: chat });
const chatFinal = await chatStream.finalChatCompletion();
expect(chatFinal.choices[0].message.content === wantChat, "chat stream helper", chatFinal.choices[0].message);

const items = [
  { role: "user", content: first },
  { type: "function_call", call_id: "c1", name: "bash", arguments: "{}" },
  { type: "function_call_output", call_id: "c1", output },
];
const resp = await oa.responses.create({ model: "gpt-5", input: items });
expect(resp.output_text === want, "responses", resp.output_text);
const respStream = oa.responses.stream({ model: "gpt-5", input: items });
const types = [];
for await (const event of respStream) types.push(event.type);
const respFinal = await respStream.finalResponse();
expect(types.at(-1) === "response.completed" && respFinal.output_text === want, "responses stream helper", respFinal.output_text);

const messages = [
  { role: "user", content: first },
  { role: "assistant", content: [{ type: "tool_use", id: "tu1", name: "bash", input: {} }] },
  { role: "user", content: [{ type: "tool_result", tool_use_id: "tu1", content: output }] },
];
const text = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
const msg = await an.messages.create({ model: "claude-x", max_tokens: 100, messages });
expect(text(msg) === want && msg.stop_reason === "end_turn", "messages", msg.content);
const msgStream = an.messages.stream({ model: "claude-x", max_tokens: 100, messages });
const msgFinal = await msgStream.finalMessage();
expect(text(msgFinal) === want && msgFinal.usage.input_tokens === 40, "messages stream helper", msgFinal);

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
