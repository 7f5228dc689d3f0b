#!/usr/bin/env python3
"""A screenshot session's cost to sluice per turn (issue "runtime"; not in CI): a
Claude-Code-shaped Anthropic session where each turn's tool result carries one new 1280x800
JPEG and the history keeps the earlier ones (remembered, so shown as placeholders). After each
turn it reads `sluice_overhead_seconds_sum` from /metrics: the difference is that turn's own
overhead. Prints each turn's figure and the median. Installs Pillow if it is missing; traffic
stays on 127.0.0.1.

Usage: benches/screenshots.py [TURNS=30]   (SLUICE_BIN to pick the binary; build it first with
cargo build --release)
"""
import sys
import asyncio, base64, io, json, os, subprocess, tempfile, time, urllib.request
try:
    from PIL import Image
except ImportError:  # a new machine: PyPI is reachable for installs
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "Pillow"], check=True)
    from PIL import Image
TURNS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
MOCK, PROXY, ADMIN = 18501, 18502, 18503
ANSWER = json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 1}}).encode()

async def mock(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = 0
            for l in head.split(b"\r\n"):
                if l.lower().startswith(b"content-length:"):
                    n = int(l.split(b":")[1])
            await reader.readexactly(n)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass

def shot(i):
    img = Image.frombytes("RGB", (1280, 800), os.urandom(1280 * 800 * 3))
    img = img.resize((320, 200)).resize((1280, 800))  # less noisy: screenshot-like size
    out = io.BytesIO(); img.save(out, "JPEG", quality=92)
    return base64.b64encode(out.getvalue()).decode()

def overhead_sum():
    text = urllib.request.urlopen(f"http://127.0.0.1:{ADMIN}/metrics").read().decode()
    return next(float(l.split()[1]) for l in text.splitlines() if l.startswith("sluice_overhead_seconds_sum"))

async def main():
    shots = [shot(i) for i in range(TURNS)]
    print("jpeg bytes:", len(base64.b64decode(shots[0])))
    work = tempfile.mkdtemp()
    cfg = os.path.join(work, "s.toml")
    open(cfg, "w").write(f'listen = "127.0.0.1:{PROXY}"\nadmin_listen = "127.0.0.1:{ADMIN}"\n[store]\ndata_dir = "{work}/d"\n'
        f'[[routes]]\nname = "a"\ndialects = ["anthropic-messages"]\nupstream = "http://127.0.0.1:{MOCK}"\n')
    server = await asyncio.start_server(mock, "127.0.0.1", MOCK, limit=1 << 20)
    p = subprocess.Popen([os.environ.get("SLUICE_BIN", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "target/release/sluice")), "serve", "--config", cfg],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    await asyncio.sleep(1)
    msgs = [{"role": "user", "content": "Look at the page."}]
    per = []
    loop = asyncio.get_running_loop()
    for k in range(TURNS):
        msgs.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"t{k}", "name": "screenshot", "input": {}}]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{k}", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": shots[k]}}]}]})
        body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": msgs}).encode()
        before = await loop.run_in_executor(None, overhead_sum)
        req = urllib.request.Request(f"http://127.0.0.1:{PROXY}/v1/messages", data=body, headers={
            "content-type": "application/json", "x-api-key": "sk-x", "anthropic-version": "2023-06-01", "x-sluice-session": "shots"})
        r = await loop.run_in_executor(None, lambda: urllib.request.urlopen(req).read())
        await asyncio.sleep(0.2)  # commit
        after = await loop.run_in_executor(None, overhead_sum)
        per.append((after - before) * 1000)
    p.terminate(); server.close()
    s = sorted(per[1:])
    print("per-turn overhead ms:", [round(x, 2) for x in per])
    print("p50 %.2f ms, p90 %.2f ms (turns 2-%d)" % (s[len(s)//2], s[int(len(s)*0.9)], TURNS))
asyncio.run(main())
