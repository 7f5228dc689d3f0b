"""Drive sluice with the official OpenAI and Anthropic Python SDKs (issue: foundation, SPEC P1-P4).

Run by tests/sdk.rs, which starts the mock provider and sluice and passes their addresses. The
mock reads directives from the prompt: `mock:tool=NAME` answers with a tool call, `mock:status=N`
with that status. Every check raises on a mismatch; the script exits non-zero on the first one.
"""

import argparse
import json
import sys

import anthropic
import openai


def expect(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def chat(client):
    r = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    expect(r.choices[0].message.content == "Hello from the mock.", "chat: non-streamed text")

    stream = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    expect(text == "Hello from the mock.", "chat: streamed text")

    with client.chat.completions.stream(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_completion()
    expect(final.choices[0].message.content == "Hello from the mock.", "chat: stream helper final completion")

    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]
    r = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "mock:tool=ls"}], tools=tools
    )
    call = r.choices[0].message.tool_calls[0]
    expect(call.function.name == "ls" and json.loads(call.function.arguments) == {"path": "."}, "chat: tool call")

    history = [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"},
    ]
    with client.chat.completions.stream(model="gpt-4o", messages=history, tools=tools) as stream:
        final = stream.get_final_completion()
    expect(final.choices[0].finish_reason == "stop", "chat: streamed answer after a tool result")

    try:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "mock:status=429"}])
        expect(False, "chat: 429 raises")
    except openai.RateLimitError as e:
        expect(e.status_code == 429, "chat: provider 429 reaches the SDK as RateLimitError")


def chat_errors(base):
    client = openai.OpenAI(base_url=base, api_key="sk-test", max_retries=0)
    try:
        client.chat.completions.create(model="no-such-model", messages=[])
        expect(False, "chat: unrouted model raises")
    except openai.NotFoundError as e:
        expect("sluice" in str(e), "chat: sluice's own 404 parses as NotFoundError")


def responses(client):
    r = client.responses.create(model="gpt-5", input="hi")
    expect(r.output_text == "Hello from the mock.", "responses: non-streamed text")

    events = list(client.responses.create(model="gpt-5", input="hi", stream=True))
    expect(events[-1].type == "response.completed", "responses: streamed events end with response.completed")

    with client.responses.stream(model="gpt-5", input="hi") as stream:
        final = stream.get_final_response()
    expect(final.output_text == "Hello from the mock.", "responses: stream helper final response")

    tools = [{"type": "function", "name": "ls", "parameters": {"type": "object", "properties": {}}}]
    with client.responses.stream(model="gpt-5", input="mock:tool=ls", tools=tools) as stream:
        final = stream.get_final_response()
    call = final.output[0]
    expect(call.type == "function_call" and call.name == "ls", "responses: streamed tool call")

    r = client.responses.create(model="gpt-5", input=[
        {"role": "user", "content": "list"},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
    ])
    expect(r.status == "completed", "responses: answer after a function_call_output")


def messages(client):
    m = client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    expect(m.content[0].text == "Hello from the mock.", "messages: non-streamed text")

    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = stream.get_final_text()
    expect(text == "Hello from the mock.", "messages: stream helper final text")

    stream = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    kinds = [e.type for e in stream]
    expect(kinds[0] == "message_start" and kinds[-1] == "message_stop", "messages: raw stream events")

    tools = [{"name": "ls", "input_schema": {"type": "object", "properties": {}}}]
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=64, tools=tools,
        messages=[{"role": "user", "content": "mock:tool=ls"}],
    ) as stream:
        final = stream.get_final_message()
    block = final.content[0]
    expect(block.type == "tool_use" and block.input == {"path": "."}, "messages: streamed tool use")

    history = [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": "ls", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "a.txt"}]},
    ]
    m = client.messages.create(model="claude-sonnet-4-5", max_tokens=64, tools=tools, messages=history)
    expect(m.stop_reason == "end_turn", "messages: answer after a tool_result")

    n = client.messages.count_tokens(model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}])
    expect(n.input_tokens > 0, "messages: count_tokens")

    try:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=8,
                               messages=[{"role": "user", "content": "mock:status=529"}])
        expect(False, "messages: 529 raises")
    except anthropic.APIStatusError as e:
        expect(e.status_code == 529, "messages: provider 529 reaches the SDK")


def histories(ask, tool, output):
    """One tool call of `tool` answered by `output`, after the user's `ask`, in each dialect's
    history: chat messages, Responses input items, Anthropic messages."""
    chat = [
        {"role": "user", "content": ask},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": tool, "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
    ]
    responses = [
        {"role": "user", "content": ask},
        {"type": "function_call", "call_id": "c1", "name": tool, "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": output},
    ]
    anthropic = [
        {"role": "user", "content": ask},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": tool, "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": output}]},
    ]
    return chat, responses, anthropic


def text_exit(oa, an, output):
    """A long tool output in each dialect's history, streamed and not (SPEC section 3). The
    Rust side checks what reached the provider."""
    history, items, messages = histories("run the tests", "bash", output)
    r = oa.chat.completions.create(model="gpt-4o", messages=history)
    expect(r.choices[0].message.content == "Hello from the mock.", "text exit: chat")
    with oa.chat.completions.stream(model="gpt-4o", messages=history) as stream:
        stream.get_final_completion()
    expect(True, "text exit: chat streamed")
    r = oa.responses.create(model="gpt-5", input=items)
    expect(r.status == "completed", "text exit: responses")
    m = an.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=messages)
    expect(m.content[0].text == "Hello from the mock.", "text exit: messages")
    with an.messages.stream(model="claude-sonnet-4-5", max_tokens=64, messages=messages) as stream:
        expect(stream.get_final_text() == "Hello from the mock.", "text exit: messages streamed")


def delivery(oa, an, image_b64):
    """A tool result with an image (an MCP result stringified into the text), through the
    streaming helpers of both SDKs. Run twice by the Rust side: a `once` image is shown in the
    first successful response only (SPEC A3, A9)."""
    mcp = json.dumps({"content": [{"type": "text", "text": "chart rendered"},
                                  {"type": "image", "data": image_b64, "mimeType": "image/png"}]})
    messages = [
        {"role": "user", "content": "render the chart"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": "render_chart", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": mcp}]},
    ]
    with an.messages.stream(model="claude-sonnet-4-5", max_tokens=64, messages=messages) as stream:
        expect(stream.get_final_message().stop_reason == "end_turn", "delivery: anthropic stream completed")
    history = [
        {"role": "user", "content": "render the chart"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "render_chart", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": mcp},
    ]
    with oa.chat.completions.stream(model="gpt-4o", messages=history) as stream:
        expect(stream.get_final_completion().choices[0].finish_reason == "stop", "delivery: chat stream completed")


def audio(oa, an, wav_b64):
    """A tool result with an MCP audio item, through each SDK's own calls. Run twice by the Rust
    side on a route with "audio": chat is sent the audio once (as input_audio after the tool
    message), the other APIs never (docs/audio.md)."""
    mcp = json.dumps({"content": [{"type": "text", "text": "recorded the call"},
                                  {"type": "audio", "data": wav_b64, "mimeType": "audio/wav"}]})
    history, items, messages = histories("record the call", "record", mcp)
    with oa.chat.completions.stream(model="gpt-4o-audio-preview", messages=history) as stream:
        expect(stream.get_final_completion().choices[0].finish_reason == "stop", "audio: chat stream completed")
    r = oa.responses.create(model="gpt-5", input=items)
    expect(r.output_text == "Hello from the mock.", "audio: responses answered")
    m = an.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=messages)
    expect(m.stop_reason == "end_turn", "audio: anthropic answered")


def read_on(oa, an, output):
    """The model reads three pages through sluice's read tool, then answers (SPEC C1-C3). The
    mock (`mock:read=3`) calls the read tool with the newest cursor until three pages were read.
    Each SDK, streamed (its stream helpers) and not, gets one response: the text before the first
    call and the answer. The next turn sends back what the SDK returned; sluice splices the
    hidden rounds in, so the mock sees three pages read and answers at once."""
    first = "mock:read=3 run the tests"
    want = "Reading on. Read 3 pages."
    # chat has one content string: the rounds' texts are set apart as paragraphs.
    want_chat = "Reading on. \n\nRead 3 pages."
    again = "Read 3 pages."

    chat = [
        {"role": "user", "content": first},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
    ]
    r = oa.chat.completions.create(model="gpt-4o", messages=chat)
    expect(r.choices[0].message.content == want_chat and not r.choices[0].message.tool_calls, "read: chat")
    expect(r.usage.prompt_tokens == 40, "read: chat usage summed over four rounds")
    with oa.chat.completions.stream(model="gpt-4o", messages=chat) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    expect(message.content == want_chat and final.choices[0].finish_reason == "stop", "read: chat stream helper")
    turn = chat + [message.model_dump(exclude_none=True), {"role": "user", "content": "and now?"}]
    r = oa.chat.completions.create(model="gpt-4o", messages=turn)
    expect(r.choices[0].message.content == again, "read: chat next turn sees the pages read")

    items = [
        {"role": "user", "content": first},
        {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": output},
    ]
    r = oa.responses.create(model="gpt-5", input=items)
    expect(r.output_text == want, "read: responses")
    with oa.responses.stream(model="gpt-5", input=items) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_response()
    expect(events[-1] == "response.completed" and final.output_text == want, "read: responses stream helper")
    turn = items + [o.model_dump(exclude_none=True) for o in final.output] + [{"role": "user", "content": "and now?"}]
    r = oa.responses.create(model="gpt-5", input=turn)
    expect(r.output_text == again, "read: responses next turn sees the pages read")

    messages = [
        {"role": "user", "content": first},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": "bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": output}]},
    ]
    m = an.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=messages)
    expect("".join(b.text for b in m.content if b.type == "text") == want, "read: messages")
    with an.messages.stream(model="claude-sonnet-4-5", max_tokens=64, messages=messages) as stream:
        text = stream.get_final_text()
        final = stream.get_final_message()
    expect(text == want and final.stop_reason == "end_turn", "read: messages stream helper")
    expect(final.usage.output_tokens == 20, "read: messages stream usage summed over four rounds")
    turn = messages + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        {"role": "user", "content": "and now?"},
    ]
    m = an.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=turn)
    expect(m.content[0].text == again, "read: messages next turn sees the pages read")


def build_output(i):
    """About 1,200 tokens of build log for step `i` (tests/context.rs writes the same)."""
    return "\n".join(
        f"src/module_{i}/file_{j}.rs:{(i * 7 + j * 13) % 997}:{j % 80}: warning: unused variable `value_{i * 31 + j}` in step {i}"
        for j in range(60)
    )


def context_guard(oa, an, turns, expect_failure):
    """A 200-turn agent session per dialect, streamed and not (context guard, issue #15): with
    the guard every turn completes; without it (`expect_failure`) the provider's context error
    reaches the SDK as BadRequestError once the history passes the window."""

    def chat(history, i, stream, session):
        history.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]})
        history.append({"role": "tool", "tool_call_id": f"call_{i}", "content": build_output(i)})
        tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
        if stream:
            chunks = oa.chat.completions.create(model="gpt-4o", messages=history, tools=tools, max_tokens=1000,
                                                stream=True, extra_headers=session)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            text = oa.chat.completions.create(model="gpt-4o", messages=history, tools=tools, max_tokens=1000,
                                              extra_headers=session).choices[0].message.content
        assert text == "Hello from the mock.", text

    def responses(history, i, stream, session):
        history.append({"type": "function_call", "call_id": f"call_{i}", "name": "bash", "arguments": "{}"})
        history.append({"type": "function_call_output", "call_id": f"call_{i}", "output": build_output(i)})
        if stream:
            events = list(oa.responses.create(model="gpt-5", input=history, max_output_tokens=1000, stream=True,
                                              extra_headers=session))
            assert events[-1].type == "response.completed", events[-1].type
        else:
            r = oa.responses.create(model="gpt-5", input=history, max_output_tokens=1000, extra_headers=session)
            assert r.output_text == "Hello from the mock.", r.output_text

    def messages(history, i, stream, session):
        history.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{i}", "name": "bash", "input": {}}]})
        history.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": build_output(i)}]})
        if stream:
            with an.messages.stream(model="claude-sonnet-4-5", max_tokens=1000, messages=history,
                                    extra_headers=session) as s:
                final = s.get_final_message()
        else:
            final = an.messages.create(model="claude-sonnet-4-5", max_tokens=1000, messages=history,
                                       extra_headers=session)
        assert final.content[0].text == "Hello from the mock.", final.content

    def refused(e):
        if isinstance(e, openai.BadRequestError):
            return e.code == "context_length_exceeded"
        return isinstance(e, anthropic.BadRequestError) and "prompt is too long" in str(e)

    for stream in (False, True):
        for name, turn in (("chat", chat), ("responses", responses), ("messages", messages)):
            session = {"x-sluice-session": f"sdk-context-{name}-{stream}"}
            history = [{"role": "user", "content": "Fix the warnings."}]
            failed = None
            for i in range(turns):
                try:
                    turn(history, i, stream, session)
                except (openai.BadRequestError, anthropic.BadRequestError) as e:
                    assert refused(e), getattr(e, "body", e)
                    failed = i
                    break
            expect((failed is not None) == expect_failure, f"context: {name} stream={stream}: failed at {failed}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--openai-base", required=True)
    parser.add_argument("--anthropic-base", required=True)
    parser.add_argument("--text-exit", help="file holding a long tool output; run only those checks")
    parser.add_argument("--delivery", help="file holding a base64 PNG; run only the delivery checks")
    parser.add_argument("--audio", help="file holding a base64 WAV; run only the audio checks")
    parser.add_argument("--read", help="file holding a long tool output; run only the read-tool checks")
    parser.add_argument("--context-turns", type=int, help="run only the context-guard session, this many turns")
    parser.add_argument("--expect-context-failure", action="store_true",
                        help="the session must fail with the provider's context error (guard off)")
    args = parser.parse_args()
    oa = openai.OpenAI(base_url=args.openai_base, api_key="sk-test", max_retries=0)
    an = anthropic.Anthropic(base_url=args.anthropic_base, api_key="sk-ant-test", max_retries=0)
    if args.context_turns:
        context_guard(oa, an, args.context_turns, args.expect_context_failure)
        print("all SDK checks passed")
        return
    if args.delivery:
        with open(args.delivery, encoding="ascii") as f:
            delivery(oa, an, f.read().strip())
        print("all SDK checks passed")
        return
    if args.audio:
        with open(args.audio, encoding="ascii") as f:
            audio(oa, an, f.read().strip())
        print("all SDK checks passed")
        return
    if args.read:
        with open(args.read, encoding="utf-8", newline="") as f:
            read_on(oa, an, f.read())
        print("all SDK checks passed")
        return
    if args.text_exit:
        with open(args.text_exit, encoding="utf-8", newline="") as f:  # keep CRLF as sent
            text_exit(oa, an, f.read())
        print("all SDK checks passed")
        return
    chat(oa)
    chat_errors(args.openai_base)
    responses(oa)
    messages(an)
    print("all SDK checks passed")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # report, then fail
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
