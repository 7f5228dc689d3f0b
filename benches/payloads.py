"""Writes the load run's request bodies into the folder given: a small chat request and a
~200 KB agent request with 30 tool turns (build-log-like output), each streamed and not."""

import json
import pathlib
import sys


def agent(turns=30, output_bytes=6_500):
    messages = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Fix the failing build."},
    ]
    for t in range(turns):
        call = f"call_{t:04}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call, "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\":\"cargo build\"}"}}]})
        line = f"   Compiling crate-{t} v0.1.0 (/work/crate-{t})\n"
        messages.append({"role": "tool", "tool_call_id": call, "content": line * (output_bytes // len(line) + 1)})
    return {"model": "gpt-4o", "messages": messages}


def main():
    out = pathlib.Path(sys.argv[1])
    small = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Say hello."}]}
    for name, body in [("small", small), ("agent", agent())]:
        (out / f"{name}.json").write_text(json.dumps(body))
        (out / f"{name}-stream.json").write_text(json.dumps({**body, "stream": True}))


main()
