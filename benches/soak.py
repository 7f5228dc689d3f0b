#!/usr/bin/env python3
"""Soak (issue "reliability"; not in CI): CONCURRENCY clients each stream chat completions
through sluice, one after another, for DURATION seconds, against a mock provider that streams
each answer slowly (20 events over about 2 s). Every 10 s it prints sluice's resident memory and
open file descriptors, and at the end the streams completed and failed. A flat RSS and fd curve
is the pass mark. Standard library only; traffic stays on 127.0.0.1.

Usage: benches/soak.py [DURATION_SECONDS=600] [CONCURRENCY=1000]   (builds sluice --release)
"""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

DURATION = float(sys.argv[1]) if len(sys.argv) > 1 else 600
CONCURRENCY = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
MOCK_PORT, PROXY_PORT, ADMIN_PORT = 18301, 18302, 18303
EVENTS = 20
PAUSE = 0.1


def chunk(delta: dict, finish=None) -> bytes:
    data = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


async def mock(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A provider that answers every request on the connection with a slow SSE stream."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            for i in range(EVENTS):
                body = chunk({"content": f"word{i} "})
                writer.write(b"%x\r\n%s\r\n" % (len(body), body))
                await writer.drain()
                await asyncio.sleep(PAUSE)
            tail = chunk({}, "stop") + b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def client(n: int, deadline: float, counts: dict) -> None:
    """One agent: stream after stream on a keep-alive connection until the deadline."""
    body = json.dumps({"model": "gpt-4o", "stream": True, "messages": [
        {"role": "user", "content": f"soak {n}"}]}).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: sluice\r\n"
               b"content-type: application/json\r\nauthorization: Bearer sk-soak\r\n"
               b"x-sluice-session: soak-%d\r\ncontent-length: %d\r\n\r\n%s" % (n, len(body), body))
    reader = writer = None
    while time.monotonic() < deadline:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", PROXY_PORT)
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise ConnectionError(head[:40])
            seen = b""
            while True:  # chunked body
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                seen += await reader.readexactly(size + 2)
            counts["ok" if b"[DONE]" in seen else "failed"] += 1
            if b"\r\nconnection: close\r\n" in head.lower():
                # max_requests_per_connection: the next request goes on a new connection.
                writer.close()
                reader = writer = None
        except (OSError, asyncio.IncompleteReadError, ValueError, ConnectionError):
            counts["failed"] += 1
            if writer is not None:
                writer.close()
            reader = writer = None
            await asyncio.sleep(0.5)
    if writer is not None:
        writer.close()


def sample(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


async def main() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.environ.get("SLUICE_NO_BUILD"):  # set it to measure the binary already built
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=root, check=True)
    work = tempfile.mkdtemp()
    config = os.path.join(work, "sluice.toml")
    with open(config, "w") as f:
        f.write(f'listen = "127.0.0.1:{PROXY_PORT}"\nadmin_listen = "127.0.0.1:{ADMIN_PORT}"\n'
                f'[store]\ndata_dir = "{work}/data"\n'
                f'[[routes]]\nname = "mock"\ndialects = ["openai-chat"]\n'
                f'upstream = "http://127.0.0.1:{MOCK_PORT}"\n')
    server = await asyncio.start_server(mock, "127.0.0.1", MOCK_PORT, limit=1 << 20)
    sluice = subprocess.Popen([os.path.join(root, "target/release/sluice"), "serve", "--config", config],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await asyncio.sleep(1.0)
        counts = {"ok": 0, "failed": 0}
        deadline = time.monotonic() + DURATION
        tasks = [asyncio.create_task(client(n, deadline, counts)) for n in range(CONCURRENCY)]
        start = time.monotonic()
        print("seconds,rss_mib,fds,streams_ok,streams_failed", flush=True)
        while time.monotonic() < deadline:
            await asyncio.sleep(10)
            rss, fds = sample(sluice.pid)
            print(f"{time.monotonic() - start:.0f},{rss:.1f},{fds},{counts['ok']},{counts['failed']}",
                  flush=True)
        await asyncio.gather(*tasks)
        print(f"done: {counts['ok']} streams completed, {counts['failed']} failed, "
              f"{CONCURRENCY} concurrent for {DURATION:.0f} s", flush=True)
    finally:
        sluice.terminate()
        sluice.wait()
        server.close()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(main())
