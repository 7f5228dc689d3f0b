#!/usr/bin/env python3
"""One tenant cannot starve the others (issue #42; not in CI). A quiet tenant (its own key,
from 127.0.0.1) sends 20 requests/s, one in four of 200 KB, the rest small, and its latency is
measured in its own process:

  alone          nothing else runs
  noisy          beside a noisy tenant (another key, from 127.0.0.3): SLOW connections trickling
                 bodies, every 2 s a burst of BURST concurrent requests, and SHOTS requests a
                 second each carrying a 1280x800 screenshot in a tool result that sluice must
                 downscale (max_dimension = 1000), each a different picture
  anonymous      beside ANON credential-less slow-body clients from 127.0.0.2, run from
                 processes of 10,000 each (a process's descriptors are its own)

Each run is made without `[limits]` and with it (tenant_concurrency, address_connections), in
one go, so the figures compare within the run. Prints, per run, the quiet tenant's p50/p99/max
and failures, its p99 against its alone run, and what the noisy side got (200s, 429s, other).
The mock answers after 20 ms. Pillow makes the screenshots (installed if missing); traffic
stays on loopback.

Usage: benches/tenants.py [SECONDS=20] [SLOW=2000] [BURST=500] [ANON=20000] [SHOTS=50]
(builds --release)
"""

import asyncio
import base64
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 20
SLOW = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
BURST = int(sys.argv[3]) if len(sys.argv) > 3 else 500
ANON = int(sys.argv[4]) if len(sys.argv) > 4 else 20000
SHOTS = int(sys.argv[5]) if len(sys.argv) > 5 else 50
PER_PROCESS = 10000
MOCK_PORT, PROXY_PORT, ADMIN_PORT = 18411, 18412, 18413
LIMITS = "[limits]\ntenant_concurrency = 64\naddress_connections = 512\n"
MESSAGE = json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
                      "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                      "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}).encode()
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
            await asyncio.sleep(0.02)
            answer = MESSAGE if head.startswith(b"POST /v1/messages") else ANSWER
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(answer), answer))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def mock_process():
    """The provider, in its own process: the noise's event loop cannot slow its answers."""
    async def serve():
        server = await asyncio.start_server(mock, "127.0.0.1", MOCK_PORT, backlog=4096,
                                            limit=1 << 20)
        await server.serve_forever()
    asyncio.run(serve())


def request(key, text):
    body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}).encode()
    auth = b"authorization: Bearer %s\r\n" % key.encode() if key else b""
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: s\r\nconnection: close\r\n%s"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (auth, len(body), body))


async def one(source, payload):
    """The status of one request on its own connection, read to its end."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", PROXY_PORT, local_addr=(source, 0)), 30)
    try:
        writer.write(payload)
        status = await asyncio.wait_for(reader.readline(), 30)
        await asyncio.wait_for(reader.read(), 30)
        return int(status.split()[1]) if len(status.split()) > 1 else 0
    finally:
        writer.close()


async def quiet(deadline, latencies, failures):
    small, large = request("sk-quiet", "hi"), request("sk-quiet", "x" * 200_000)

    async def timed(payload):
        start = time.monotonic()
        try:
            status = await one("127.0.0.1", payload)
        except (OSError, asyncio.TimeoutError, ConnectionError, ValueError):
            status = 0
        if status == 200:
            latencies.append(time.monotonic() - start)
        else:
            failures.append(status)

    tasks, n = [], 0
    while time.monotonic() < deadline:
        tasks.append(asyncio.create_task(timed(large if n % 4 == 3 else small)))
        n += 1
        await asyncio.sleep(0.05)
    await asyncio.gather(*tasks)


def quiet_process(seconds, results):
    latencies, failures = [], []
    asyncio.run(quiet(time.monotonic() + seconds, latencies, failures))
    results.put((latencies, failures))


async def slow(source, key, deadline, stats):
    auth = b"authorization: Bearer %s\r\n" % key.encode() if key else b""
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: s\r\n%scontent-type: application/json\r\n"
            b"content-length: 100000\r\n\r\n{" % auth)
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                "127.0.0.1", PROXY_PORT, local_addr=(source, 0)), 10)
            writer.write(head)
            while time.monotonic() < deadline and not reader.at_eof():
                await asyncio.sleep(2)
                writer.write(b" ")
                await writer.drain()
            writer.close()
        except (OSError, asyncio.TimeoutError, ConnectionError):
            pass
        stats["slow_cut"] += 1
        await asyncio.sleep(0.5)


def screenshot():
    """A 1280x800 JPEG, screenshot-like (smooth blocks, not noise)."""
    try:
        from PIL import Image
    except ImportError:  # a new machine: PyPI is reachable for installs
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "Pillow"], check=True)
        from PIL import Image
    import io
    img = Image.frombytes("RGB", (320, 200), os.urandom(320 * 200 * 3)).resize((1280, 800))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=90)
    return out.getvalue()


def shot_request(jpeg, n):
    """An Anthropic request whose tool result holds `jpeg` with a comment segment numbered `n`
    after its start: a different picture's bytes each time (no memo hit), the same pixels."""
    comment = b"shot %d" % n
    unique = jpeg[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + jpeg[2:]
    body = json.dumps({"model": "claude-x", "max_tokens": 5, "messages": [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                         "data": base64.b64encode(unique).decode()}}]}]}]}).encode()
    return (b"POST /v1/messages HTTP/1.1\r\nhost: s\r\nconnection: close\r\n"
            b"x-api-key: sk-noisy\r\nanthropic-version: 2023-06-01\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


async def shots(deadline, stats, jpeg):
    """SHOTS screenshot requests a second, each on its own, none waited for before the next."""
    async def counted(n):
        try:
            status = await one("127.0.0.3", shot_request(jpeg, n))
        except (OSError, asyncio.TimeoutError, ConnectionError, ValueError):
            status = 0
        key = {200: "shot_200", 429: "shot_429"}.get(status, "shot_other")
        stats[key] = stats.get(key, 0) + 1
    tasks, n = [], 0
    while time.monotonic() < deadline:
        tasks.append(asyncio.create_task(counted(n)))
        n += 1
        await asyncio.sleep(1 / SHOTS)
    await asyncio.gather(*tasks)


def anon_process(count, seconds):
    """`count` credential-less slow clients, in a process of their own."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    want = min(count + 1024, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    deadline = time.monotonic() + seconds
    stats = {"slow_cut": 0}

    async def all_of_them():
        await asyncio.gather(*(slow("127.0.0.2", None, deadline, stats) for _ in range(count)),
                             return_exceptions=True)
    asyncio.run(all_of_them())


async def bursts(deadline, stats):
    payload = request("sk-noisy", "again")
    while time.monotonic() < deadline:
        async def counted():
            try:
                status = await one("127.0.0.3", payload)
            except (OSError, asyncio.TimeoutError, ConnectionError, ValueError):
                status = 0
            key = {200: "200", 429: "429"}.get(status, "other")
            stats[key] = stats.get(key, 0) + 1
        await asyncio.gather(*(counted() for _ in range(BURST)))
        await asyncio.sleep(2)


def scrape():
    import urllib.request
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{ADMIN_PORT}/metrics", timeout=10).read().decode()
    except OSError:
        return ""


def pick(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] if sorted_values else float("nan")


async def run(root, work, name, limits, noise, jpeg):
    config = os.path.join(work, f"{name}.toml")
    with open(config, "w") as f:
        f.write(f'listen = "127.0.0.1:{PROXY_PORT}"\nadmin_listen = "127.0.0.1:{ADMIN_PORT}"\n'
                f'[store]\ndata_dir = "{work}/data-{name}"\n{limits}[[routes]]\nname = "mock"\n'
                f'dialects = ["openai-chat", "anthropic-messages"]\n'
                f'upstream = "http://127.0.0.1:{MOCK_PORT}"\n'
                f'[routes.images]\nmax_dimension = 1000\ndownscale = true\n')
    log = open(os.path.join(work, f"{name}.log"), "w")
    sluice = subprocess.Popen([os.path.join(root, "target/release/sluice"), "serve", "--config", config],
                              stdout=log, stderr=log,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, ORIGINAL_LIMIT))
    try:
        await asyncio.sleep(1.0)
        stats = {"slow_cut": 0}
        deadline = time.monotonic() + SECONDS
        tasks = []
        if noise == "noisy":
            tasks += [asyncio.create_task(slow("127.0.0.3", "sk-noisy", deadline, stats))
                      for _ in range(SLOW)]
            tasks.append(asyncio.create_task(bursts(deadline, stats)))
            tasks.append(asyncio.create_task(shots(deadline, stats, jpeg)))
        elif noise == "anonymous":
            for at in range(0, ANON, PER_PROCESS):
                attackers = multiprocessing.Process(
                    target=anon_process, args=(min(PER_PROCESS, ANON - at), SECONDS), daemon=True)
                attackers.start()
                tasks.append(asyncio.get_running_loop().run_in_executor(None, attackers.join))
        await asyncio.sleep(2 if tasks else 0)  # the noise is under way before the quiet tenant
        results = multiprocessing.Queue()
        probe = multiprocessing.Process(target=quiet_process, args=(SECONDS - 2 if tasks else SECONDS, results))
        probe.start()
        latencies, failures = await asyncio.get_running_loop().run_in_executor(None, results.get, True, 180)
        probe.join()
        await asyncio.gather(*tasks, return_exceptions=True)
        metrics = await asyncio.get_running_loop().run_in_executor(None, scrape)
        stats["downscales"] = sum(float(l.split()[-1]) for l in metrics.splitlines()
                                  if l.startswith("sluice_downscales_total"))
        return sorted(latencies), failures, stats
    finally:
        sluice.terminate()
        sluice.wait()


async def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.environ.get("SLUICE_NO_BUILD"):  # set it to measure the binary already built
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=root, check=True)
    work = tempfile.mkdtemp()
    jpeg = screenshot()
    provider = multiprocessing.Process(target=mock_process, daemon=True)
    provider.start()
    print(f"quiet tenant: 20 requests/s (1 in 4 of 200 KB) for {SECONDS:.0f} s; mock answers in 20 ms")
    print(f"noisy: {SLOW} slow-body connections + bursts of {BURST} every 2 s + {SHOTS} screenshots/s "
          f"({len(jpeg)} B JPEG, downscaled); anonymous: {ANON} slow-body clients; "
          f"limits: {LIMITS.splitlines()[1:]}")
    print("| limits | beside | quiet served | quiet failed | p50 ms | p99 ms | max ms | p99 ÷ alone "
          "| noisy 200 / 429 / other | screenshots 200 / 429 / other |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    try:
        for label, limits in (("none", ""), ("on", LIMITS)):
            alone = None
            for noise in ("alone", "noisy", "anonymous"):
                latencies, failures, stats = await run(root, work, f"{label}-{noise}", limits, noise, jpeg)
                p99 = pick(latencies, 0.99)
                alone = p99 if noise == "alone" else alone
                noisy = (f"{stats.get('200', 0)} / {stats.get('429', 0)} / {stats.get('other', 0)}"
                         if noise == "noisy" else "")
                shot = (f"{stats.get('shot_200', 0)} / {stats.get('shot_429', 0)} / "
                        f"{stats.get('shot_other', 0)} ({stats['downscales']:.0f} downscaled)"
                        if noise == "noisy" else "")
                print(f"| {label} | {noise} | {len(latencies)} | {len(failures)} | "
                      f"{pick(latencies, 0.5) * 1000:.1f} | {p99 * 1000:.1f} | "
                      f"{pick(latencies, 1.0) * 1000:.1f} | {p99 / alone:.2f} | {noisy} | {shot} |",
                      flush=True)
    finally:
        provider.terminate()


ORIGINAL_LIMIT = resource.getrlimit(resource.RLIMIT_NOFILE)

if __name__ == "__main__":
    need = 2 * (SLOW + BURST + SHOTS * 10) + 2048  # the anonymous clients have their own processes
    hard = ORIGINAL_LIMIT[1]
    # The hard limit stays: sluice and the anonymous clients' processes raise theirs to it.
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    asyncio.run(main())
