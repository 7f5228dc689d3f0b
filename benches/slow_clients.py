#!/usr/bin/env python3
"""Slow-body attack (issue "reliability"; not in CI): ATTACKERS connections each send a request
head announcing a body and then trickle it (one byte every few seconds, reconnecting when cut),
for DURATION seconds; meanwhile a normal client sends a small chat request every half second.
Prints the normal requests' latency (p50, p99, max) and failures during the attack, sluice's open
fds and connections, and whether it ever logged `accept failed`. Standard library only; traffic
stays on 127.0.0.1.

Usage: benches/slow_clients.py [ATTACKERS=20000] [DURATION_SECONDS=60]   (builds --release)
"""

import asyncio
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time

ATTACKERS = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
DURATION = float(sys.argv[2]) if len(sys.argv) > 2 else 60
MOCK_PORT, PROXY_PORT, ADMIN_PORT = 18401, 18402, 18403
ANSWER = json.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                  "finish_reason": "stop"}]}).encode()


async def mock(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(l.split(b":")[1]) for l in head.split(b"\r\n")
                           if l.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def attacker(deadline, stats):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: s\r\ncontent-type: application/json\r\n"
            b"content-length: 100000\r\n\r\n{")
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", PROXY_PORT), 10)
            stats["connected"] += 1
            writer.write(head)
            while time.monotonic() < deadline:
                await asyncio.sleep(4)
                writer.write(b" ")
                await writer.drain()
                if reader.at_eof():
                    break
            writer.close()
        except (OSError, asyncio.TimeoutError, ConnectionError):
            stats["refused"] += 1
            await asyncio.sleep(1)


async def normal(deadline, latencies, stats):
    body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: s\r\nconnection: close\r\n"
               b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    while time.monotonic() < deadline:
        start = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", PROXY_PORT), 60)
            writer.write(request)
            status = await asyncio.wait_for(reader.readline(), 60)
            writer.close()
            if b" 200 " in status:
                latencies.append(time.monotonic() - start)
            else:
                stats["normal_failed"] += 1
        except (OSError, asyncio.TimeoutError, ConnectionError):
            stats["normal_failed"] += 1
        await asyncio.sleep(0.5)


def normal_process(duration, results):
    latencies, stats = [], {"normal_failed": 0}
    asyncio.run(normal(time.monotonic() + duration, latencies, stats))
    results.put((latencies, stats["normal_failed"]))


def fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


async def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.environ.get("SLUICE_NO_BUILD"):  # set it to measure the binary already built
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=root, check=True)
    work = tempfile.mkdtemp()
    config = os.path.join(work, "sluice.toml")
    with open(config, "w") as f:
        f.write(f'listen = "127.0.0.1:{PROXY_PORT}"\nadmin_listen = "127.0.0.1:{ADMIN_PORT}"\n'
                f'[store]\ndata_dir = "{work}/data"\n[[routes]]\nname = "mock"\n'
                f'dialects = ["openai-chat"]\nupstream = "http://127.0.0.1:{MOCK_PORT}"\n')
    log = open(os.path.join(work, "sluice.log"), "w+")
    server = await asyncio.start_server(mock, "127.0.0.1", MOCK_PORT)
    # sluice keeps the machine's own descriptor limit; only the attacker raised its own.
    limit = ORIGINAL_LIMIT
    sluice = subprocess.Popen([os.path.join(root, "target/release/sluice"), "serve", "--config", config],
                              stdout=log, stderr=log,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))
    try:
        await asyncio.sleep(1.0)
        stats = {"connected": 0, "refused": 0, "normal_failed": 0}
        latencies = []
        deadline = time.monotonic() + DURATION
        tasks = [asyncio.create_task(attacker(deadline, stats)) for _ in range(ATTACKERS)]
        # The normal client runs in its own process, so the attackers' event loop cannot slow it.
        results = multiprocessing.Queue()
        probe = multiprocessing.Process(target=normal_process, args=(DURATION, results))
        probe.start()
        peak = 0
        while time.monotonic() < deadline:
            await asyncio.sleep(5)
            peak = max(peak, fds(sluice.pid))
        await asyncio.gather(*tasks, return_exceptions=True)
        latencies, stats["normal_failed"] = results.get(timeout=120)
        probe.join()
        latencies.sort()
        pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else float("nan")
        log.seek(0)
        accept_failed = sum("accept failed" in line for line in log)
        print(f"{ATTACKERS} slow-body clients for {DURATION:.0f} s: attacker connections made "
              f"{stats['connected']}, refused/timed out {stats['refused']}")
        print(f"normal requests: {len(latencies)} served, {stats['normal_failed']} failed; latency "
              f"p50 {pick(0.5) * 1000:.0f} ms, p99 {pick(0.99) * 1000:.0f} ms, max {pick(1.0) * 1000:.0f} ms")
        print(f"sluice: peak open fds {peak}, 'accept failed' logged {accept_failed} times")
    finally:
        sluice.terminate()
        sluice.wait()
        server.close()


ORIGINAL_LIMIT = resource.getrlimit(resource.RLIMIT_NOFILE)

if __name__ == "__main__":
    soft, hard = ORIGINAL_LIMIT
    try:  # root may raise its own hard limit: the attacker needs more descriptors than sluice
        resource.setrlimit(resource.RLIMIT_NOFILE, (2 * ATTACKERS + 1024, 2 * ATTACKERS + 1024))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(main())
