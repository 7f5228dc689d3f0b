#!/usr/bin/env bash
# Runs the official-SDK checks (tests/sdk.rs): creates .venv with the pinned SDKs if needed,
# then runs the ignored test that drives them through sluice.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import openai, anthropic, google.genai' 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r tests/sdk/requirements.txt
fi
SLUICE_SDK_PYTHON="$PWD/.venv/bin/python" cargo test --test sdk -- --ignored --nocapture
