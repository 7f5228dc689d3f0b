#!/usr/bin/env python3
"""Writes the two example traces `sluice replay` runs on (docs/inspector.md, README):

- coding-session.jsonl: a Claude-Code-shaped coding session on the Anthropic Messages API,
  13 requests: files read, greps, edits, test and lint runs whose output runs long.
- browser-session.jsonl: a browser agent on the Anthropic Messages API, 21 requests: a
  1280x720 screenshot from a Playwright-MCP-shaped `browser_take_screenshot` tool on four
  steps of five, an accessibility snapshot on the fifth.

Both mark a prompt-cache breakpoint on the newest block, as Claude Code does. Deterministic:
the same script writes the same bytes. Run: python3 examples/make_traces.py
"""

import base64
import json
import os
import random
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEM = (
    "You are an agent working in a terminal on the user's repository. Use the tools to read, "
    "search, edit and test code. Keep answers short; show the commands you ran. "
) * 12
TOOLS = [
    {"name": "Bash", "description": "Runs a shell command and returns its output. " * 20,
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                      "required": ["command"]}},
    {"name": "Read", "description": "Reads a file with line numbers. " * 20,
     "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}},
                      "required": ["file_path"]}},
    {"name": "Grep", "description": "Searches files with a regular expression. " * 20,
     "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}},
                      "required": ["pattern"]}},
    {"name": "Edit", "description": "Replaces a string in a file. " * 20,
     "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"},
                      "old_string": {"type": "string"}, "new_string": {"type": "string"}}}},
]


def source_file(rng, name, lines):
    out = []
    for i in range(1, lines + 1):
        kind = rng.choice(["fn", "let", "if", "//", "}", "match", "use"])
        ident = f"{rng.choice(['parse', 'spill', 'route', 'image', 'cursor', 'state'])}_{rng.randint(0, 999)}"
        out.append(f"{i:>6}\t{'    ' * rng.randint(0, 3)}{kind} {ident}({rng.randint(0, 99)}); // {name}")
    return "\n".join(out)


def test_run(rng, failures, tests):
    out = ["   Compiling sluice v0.1.0 (/work/sluice)", "    Finished `test` profile [unoptimized + debuginfo] target(s) in 41.20s",
           "     Running unittests src/lib.rs (target/debug/deps/sluice-3f2a1b)", f"running {tests} tests"]
    for i in range(tests):
        module = rng.choice(["projection", "dialect", "store", "read", "server", "image"])
        ok = "FAILED" if i < failures else "ok"
        out.append(f"test {module}::tests::case_{i:05d}_{rng.randint(0, 10**6):06d} ... {ok}")
    for i in range(failures):
        out.append(f"\n---- projection::tests::case_{i:05d} stdout ----")
        out.append(f"thread 'projection::tests::case_{i:05d}' panicked at src/projection/mod.rs:{rng.randint(1, 600)}:9:")
        out.append("assertion `left == right` failed\n  left: 3\n right: 4")
    out.append(f"\ntest result: {'FAILED' if failures else 'ok'}. {tests - failures} passed; {failures} failed; 0 ignored")
    return "\n".join(out)


def grep_output(rng, hits):
    return "\n".join(
        f"src/{rng.choice(['projection', 'server', 'read'])}/{rng.choice(['mod', 'exit', 'guard'])}.rs:{rng.randint(1, 600)}:"
        f"    let spill_{rng.randint(0, 99)} = page_text(&text, &policy);" for _ in range(hits))


def coding_steps(rng):
    yield "Read", {"file_path": "src/projection/exit/mod.rs"}, source_file(rng, "exit/mod.rs", 220)
    yield "Grep", {"pattern": "page_text"}, grep_output(rng, 30)
    yield "Bash", {"command": "cargo test"}, test_run(rng, 3, 700)
    yield "Read", {"file_path": "src/projection/mod.rs"}, source_file(rng, "projection/mod.rs", 260)
    yield "Edit", {"file_path": "src/projection/mod.rs", "old_string": "a", "new_string": "b"}, "The file src/projection/mod.rs has been updated."
    yield "Bash", {"command": "cargo test projection"}, test_run(rng, 1, 200)
    yield "Bash", {"command": "cargo clippy --all-targets"}, "\n".join(
        f"warning: unused variable `x_{i}`\n  --> src/read/mod.rs:{i}:9" for i in range(700))
    yield "Edit", {"file_path": "src/read/mod.rs", "old_string": "x", "new_string": "_x"}, "The file src/read/mod.rs has been updated."
    yield "Bash", {"command": "cargo test"}, test_run(rng, 0, 700)
    yield "Grep", {"pattern": "fn settle"}, grep_output(rng, 12)
    yield "Bash", {"command": "git diff"}, "\n".join(f"+    line {i} of the change" for i in range(80))
    yield "Bash", {"command": "git status"}, "On branch main\nnothing to commit, working tree clean"


def marked(messages):
    """The messages with a cache breakpoint on the newest block only (Claude Code's way)."""
    out = json.loads(json.dumps(messages))
    last = out[-1]
    if isinstance(last["content"], str):
        last["content"] = [{"type": "text", "text": last["content"]}]
    last["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return out


def anthropic_trace(path, session, steps, tools, prompt, model="claude-sonnet-4-5"):
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": prompt}]
    lines = []

    def record():
        body = {"model": model, "max_tokens": 32000, "system": system, "tools": tools,
                "messages": marked(messages), "stream": True}
        lines.append(json.dumps({"path": "/v1/messages", "session": session,
                                 "headers": {"anthropic-version": "2023-06-01"}, "body": body},
                                separators=(",", ":")))

    record()
    for n, (tool, args, content) in enumerate(steps, 1):
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Step {n}: running {tool}."},
            {"type": "tool_use", "id": f"toolu_{n:04d}", "name": tool, "input": args}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{n:04d}", "content": content}]})
        record()
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{path}: {len(lines)} requests, {os.path.getsize(path):,} bytes")


def png(width, height, page):
    """A screenshot-like PNG: a header bar, a sidebar, text-like stripes (flat colours, so a
    1280x720 page stays a few kilobytes)."""
    rows = []
    for y in range(height):
        row = bytearray([0])
        for x in range(width):
            if y < 40:
                rgb = (30, 60 + page * 9 % 120, 120)
            elif x < 120:
                rgb = (235, 235, 240) if (y // 24) % 2 else (225, 225, 232)
            elif (y // 12) % 3 == 0 and 140 < x < 140 + ((y * 37 + page * 53) % 460):
                rgb = (60, 60, 60)
            else:
                rgb = (255, 255, 255)
            row += bytes(rgb)
        rows.append(bytes(row))
    raw = zlib.compress(b"".join(rows), 9)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", raw) + chunk(b"IEND", b""))


def browser_steps(rng):
    pages = ["home", "search results", "product 1", "product 2", "product 3", "cart", "checkout",
             "sign in", "address form", "shipping", "payment form", "review", "confirmation",
             "orders", "order 1", "invoice", "help", "contact", "chat", "done"]
    for i, page in enumerate(pages):
        if i % 5 == 4:
            snapshot = "\n".join(f"- {rng.choice(['link', 'button', 'textbox', 'heading'])} \"{page} item {j}\" [ref=e{i * 100 + j}]"
                                 for j in range(60))
            yield "browser_snapshot", {}, snapshot
        else:
            data = base64.b64encode(png(1280, 720, i)).decode()
            yield "browser_take_screenshot", {}, [
                {"type": "text", "text": f"Took a screenshot of the {page} page."},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]


BROWSER_TOOLS = [
    {"name": "browser_navigate", "description": "Navigates to a URL. " * 10,
     "input_schema": {"type": "object", "properties": {"url": {"type": "string"}}}},
    {"name": "browser_take_screenshot", "description": "Takes a screenshot of the page. " * 10,
     "input_schema": {"type": "object", "properties": {}}},
    {"name": "browser_snapshot", "description": "The page's accessibility snapshot. " * 10,
     "input_schema": {"type": "object", "properties": {}}},
    {"name": "browser_click", "description": "Clicks an element. " * 10,
     "input_schema": {"type": "object", "properties": {"ref": {"type": "string"}}}},
]


def main():
    anthropic_trace(os.path.join(HERE, "coding-session.jsonl"), "coding-demo",
                    list(coding_steps(random.Random(7))), TOOLS,
                    "The projection tests fail after my change; find out why and fix it.")
    anthropic_trace(os.path.join(HERE, "browser-session.jsonl"), "browser-demo",
                    list(browser_steps(random.Random(11))), BROWSER_TOOLS,
                    "Buy the cheapest product on the shop and send me the order number.")


if __name__ == "__main__":
    main()
