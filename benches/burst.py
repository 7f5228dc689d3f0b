#!/usr/bin/env python3
"""Memory under a burst of large requests (issue "runtime"; not in CI): COUNT clients send at
once a chat request of SIZE_MB whose one tool output must be spilled, against a mock provider
that reads the whole body and answers a small JSON. It samples sluice's resident memory every
50 ms and prints: idle RSS before, peak RSS during, each request's status (200, or 503 when
`max_inflight_body_bytes` had no room), and RSS 15 s after the last answer. Then, as a "usual
load" check, 20 s of small requests on 8 connections and the RSS after them.

Usage: benches/burst.py [COUNT=8] [SIZE_MB=60]   (SLUICE_NO_BUILD=1 to skip the release build;
any SLUICE_ / MALLOC_ / MIMALLOC_ variables set are passed on to sluice)
Standard library only; traffic stays on 127.0.0.1.
"""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

COUNT = int(sys.argv[1]) if len(sys.argv) > 1 else 8
SIZE_MB = int(sys.argv[2]) if len(sys.argv) > 2 else 60
MOCK_PORT, PROXY_PORT, ADMIN_PORT = 18401, 18402, 18403
ANSWER = json.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                  "finish_reason": "stop"}]}).encode()


async def mock(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A provider that reads each request whole and answers a small JSON."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length, chunked = 0, False
            for line in head.split(b"\r\n"):
                low = line.lower()
                if low.startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                if low.startswith(b"transfer-encoding:") and b"chunked" in low:
                    chunked = True
            if chunked:
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
                    await reader.readexactly(size + 2)
                    if size == 0:
                        break
            else:
                await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass  # the client left, or the run is over and the server is torn down
    finally:
        writer.close()


def body(n: int) -> bytes:
    line = f"request {n}: a line of build output that goes on for a while 0123456789\n"
    output = line * (SIZE_MB * 1024 * 1024 // len(line))
    return json.dumps({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "Build it."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": output}]}).encode()


async def send(payload: bytes, session: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", PROXY_PORT)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: sluice\r\n"
                     b"content-type: application/json\r\nauthorization: Bearer sk-burst\r\n"
                     b"x-sluice-session: %s\r\ncontent-length: %d\r\n\r\n"
                     % (session.encode(), len(payload)))
        writer.write(payload)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        return int(head.split(b" ")[1])
    except (OSError, asyncio.IncompleteReadError, ValueError):
        return 0
    finally:
        writer.close()


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) / 1024


async def usual(seconds: float) -> int:
    """Small requests on 8 keep-alive connections, one after another each."""
    small = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    done = 0

    async def one(n: int) -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", PROXY_PORT)
        request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: sluice\r\n"
                   b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                   % (len(small), small.encode()))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            lines = [l.lower() for l in head.split(b"\r\n")]
            length = next(int(l.split(b":")[1]) for l in lines if l.startswith(b"content-length:"))
            await reader.readexactly(length)
            done += 1
            if b"connection: close" in lines:  # max_requests_per_connection: open another
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", PROXY_PORT)
        writer.close()

    await asyncio.gather(*(one(n) for n in range(8)))
    return done


async def main() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.environ.get("SLUICE_NO_BUILD"):
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=root, check=True)
    work = tempfile.mkdtemp()
    config = os.path.join(work, "sluice.toml")
    with open(config, "w") as f:
        f.write(f'listen = "127.0.0.1:{PROXY_PORT}"\nadmin_listen = "127.0.0.1:{ADMIN_PORT}"\n'
                f'[store]\ndata_dir = "{work}/data"\n'
                f'[[routes]]\nname = "mock"\ndialects = ["openai-chat"]\n'
                f'upstream = "http://127.0.0.1:{MOCK_PORT}"\n')
    server = await asyncio.start_server(mock, "127.0.0.1", MOCK_PORT, limit=1 << 20)
    binary = os.environ.get("SLUICE_BIN") or os.path.join(root, "target/release/sluice")
    sluice = subprocess.Popen([binary, "serve", "--config",
                               config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await asyncio.sleep(1.0)
        payloads = [body(n) for n in range(COUNT)]
        idle = rss_mib(sluice.pid)
        peak = idle
        sending = asyncio.gather(*(send(p, f"burst-{n}") for n, p in enumerate(payloads)))
        while not sending.done():
            peak = max(peak, rss_mib(sluice.pid))
            await asyncio.sleep(0.05)
        statuses = sending.result()
        peak = max(peak, rss_mib(sluice.pid, "VmHWM"))
        del payloads
        answered = rss_mib(sluice.pid)
        await asyncio.sleep(15)
        after = rss_mib(sluice.pid)
        requests = await usual(20)
        under_load = rss_mib(sluice.pid)
        print(json.dumps({"count": COUNT, "size_mb": SIZE_MB, "idle_rss_mib": round(idle, 1),
                          "peak_rss_mib": round(peak, 1), "statuses": statuses,
                          "rss_at_last_answer_mib": round(answered, 1),
                          "rss_15s_later_mib": round(after, 1),
                          "usual_load_requests": requests,
                          "rss_after_usual_load_mib": round(under_load, 1)}))
    finally:
        sluice.terminate()
        sluice.wait()
        server.close()


if __name__ == "__main__":
    asyncio.run(main())
