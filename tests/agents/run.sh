#!/usr/bin/env bash
# The real-agent suite (tests/agents.rs): Claude Code, Codex CLI, Gemini CLI, OpenCode, Qwen Code
# and the official Node SDKs,
# pinned in tests/agents/package-lock.json and installed from the npm registry, plus the MCP
# Python SDK for the screenshot server (into the repo's .venv); then runs the ignored tests that
# drive them through sluice against the mock model. Nothing else is fetched.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
if [ ! -x node_modules/.bin/claude ] || [ ! -x node_modules/.bin/codex ] || [ ! -x node_modules/.bin/gemini ] || [ ! -x node_modules/.bin/opencode ] || [ ! -x node_modules/.bin/qwen ] || [ ! -d node_modules/openai ]; then
  # `npm install` from the lock, not `npm ci`: Qwen Code's clipboard package names optional
  # builds for other platforms that were never published, which `npm ci` refuses; the lock
  # still pins every version installed (and is left unchanged).
  npm install --no-audit --no-fund --loglevel=error
fi
cd ../..
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import mcp.server.fastmcp' 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check -r tests/agents/requirements.txt
fi
SLUICE_AGENTS_PYTHON="$PWD/.venv/bin/python" cargo test --locked --test agents -- --ignored
