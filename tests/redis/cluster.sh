#!/usr/bin/env bash
# A Redis Cluster on loopback for the shared-mode tests (issue #39): three masters and three
# replicas on 127.0.0.1:7000-7005 (ports from $1, default 7000), no persistence, data under a
# temp dir. Does nothing when a cluster already answers there. Needs redis-server and
# redis-cli (Debian's redis-server package, or Valkey's binaries under the same names).
set -euo pipefail
base=${1:-7000}
dir=${CLUSTER_DIR:-/tmp/sluice-redis-cluster}
if redis-cli -p "$base" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then
  echo "redis cluster already up on $base"
  exit 0
fi
mkdir -p "$dir"
# Why a start failed, printed before giving up: each node's log tail.
logs() {
  for port in $(seq "$base" $((base + 5))); do
    echo "--- $dir/$port/log" >&2
    tail -5 "$dir/$port/log" >&2 2>/dev/null || true
  done
}
nodes=()
for i in 0 1 2 3 4 5; do
  port=$((base + i))
  # A node left from an earlier run: stop it, and wait until its port is free.
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 || break; sleep 0.1; done
  # Start from an empty folder: a replica keeps the RDB of its last full sync on disk even
  # without `save`, and a node that loads one is "not empty" to `--cluster create`.
  rm -rf "${dir:?}/$port"
  mkdir -p "$dir/$port"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --cluster-enabled yes \
    --cluster-config-file "$dir/$port/nodes.conf" --cluster-node-timeout 2000 \
    --save "" --appendonly no --dir "$dir/$port" --logfile "$dir/$port/log"
  nodes+=("127.0.0.1:$port")
done
for port in $(seq "$base" $((base + 5))); do
  up=""
  for _ in $(seq 100); do
    if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then up=1; break; fi
    sleep 0.1
  done
  [ -n "$up" ] || { echo "redis node on $port did not start" >&2; logs; exit 1; }
done
if ! out=$(redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes 2>&1); then
  echo "$out" | tail -20 >&2
  logs
  exit 1
fi
for _ in $(seq 100); do
  redis-cli -p "$base" cluster info | grep -q 'cluster_state:ok' && break
  sleep 0.1
done
redis-cli -p "$base" cluster info | grep 'cluster_state:ok' || { logs; exit 1; }
