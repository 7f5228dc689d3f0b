"""A small MCP stdio server for the agent tests (tests/agents.rs): `browser_take_screenshot`
returns a PNG, a different picture on every call, as a browser MCP server would."""

import os
import struct
import time
import zlib

from mcp.server.fastmcp import FastMCP, Image

server = FastMCP("shots")
calls = 0
seed = (os.getpid() * 7919 + time.time_ns()) % 251


def png(n: int) -> bytes:
    """A 32x24 RGB PNG whose colours depend on `n` and this process."""
    width, height = 32, 24
    rows = b"".join(
        b"\x00" + b"".join(bytes(((x * 8 + n * 37) % 256, (y * 10 + seed) % 256, (n * 53 + x * y) % 256)) for x in range(width))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@server.tool()
def browser_take_screenshot(step: int = 0) -> Image:
    """Take a screenshot of the current page. `step` numbers the call (agents that stop a run
    on identical consecutive calls, Qwen Code's loop guard, see each call as new)."""
    global calls
    calls += 1
    return Image(data=png(calls), format="png")


if __name__ == "__main__":
    server.run()
