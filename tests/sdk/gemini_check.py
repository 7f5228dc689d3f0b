"""Drive sluice with Google's official Python SDK, `google-genai` (issue #40): generate and
stream, a function-calling loop, and a long function response that sluice spills and the model
reads on through sluice's read tool while the SDK sees one answer.

Run by tests/sdk.rs, which starts the mock provider and sluice and passes sluice's address. The
mock reads directives from the prompt (`mock:tool=NAME`, `mock:read=N`). Every check raises on a
mismatch; the script exits non-zero on the first one.
"""

import argparse
import sys

from google import genai
from google.genai import errors, types


def expect(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--long-output", required=True, help="a file holding a long tool output")
    args = parser.parse_args()
    client = genai.Client(api_key="gemini-sdk-key", http_options=types.HttpOptions(base_url=args.base))
    model = "gemini-2.5-flash"

    r = client.models.generate_content(model=model, contents="hi")
    expect(r.text == "Hello from the mock.", "generate: text")
    expect(r.usage_metadata.prompt_token_count > 0, "generate: usage metadata")

    text = "".join(c.text or "" for c in client.models.generate_content_stream(model=model, contents="hi"))
    expect(text == "Hello from the mock.", "stream: text")

    ls = types.FunctionDeclaration(
        name="ls", description="List files.",
        parameters_json_schema={"type": "object", "properties": {"path": {"type": "string"}}},
    )
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[ls])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    history = [types.Content(role="user", parts=[types.Part.from_text(text="mock:tool=ls")])]
    r = client.models.generate_content(model=model, contents=history, config=config)
    call = r.function_calls[0]
    expect(call.name == "ls" and call.args == {"path": "."}, "function calling: a call")
    # The loop goes on with the call and its result (the ask reworded: the mock reads its
    # directives from the whole history).
    history = [types.Content(role="user", parts=[types.Part.from_text(text="list the files")])]
    history.append(r.candidates[0].content)
    history.append(types.Content(role="user", parts=[
        types.Part.from_function_response(name="ls", response={"output": "a.txt\nb.txt"})]))
    r = client.models.generate_content(model=model, contents=history, config=config)
    expect(r.text == "Hello from the mock.", "function calling: the answer after the result")

    # A long function response: sluice spills it, the model reads one page on through the read
    # tool, and the SDK gets one answer, streamed and not, with no read call in it.
    output = open(args.long_output, encoding="utf-8").read()
    for streamed in (False, True):
        history = [
            types.Content(role="user", parts=[types.Part.from_text(text="run the tests mock:read=1")]),
            types.Content(role="model", parts=[types.Part.from_function_call(name="ls", args={})]),
            types.Content(role="user", parts=[
                types.Part.from_function_response(name="ls", response={"output": output})]),
        ]
        if streamed:
            chunks = list(client.models.generate_content_stream(model=model, contents=history, config=config))
            text = "".join(c.text or "" for c in chunks)
            calls = [c for chunk in chunks for c in (chunk.function_calls or [])]
        else:
            r = client.models.generate_content(model=model, contents=history, config=config)
            text, calls = r.text, r.function_calls or []
        expect(text == "Reading on. Read 1 pages.", f"read on (streamed={streamed}): one answer")
        expect(not calls, f"read on (streamed={streamed}): no read call reaches the SDK")

    try:
        client.models.generate_content(model=model, contents=[
            types.Content(role="model", parts=[types.Part.from_text(text="first")])])
        expect(False, "a provider refusal raises")
    except errors.ClientError as e:
        expect(e.code == 400, "a provider's 400 reaches the SDK as ClientError")

    print("all Gemini SDK checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
