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
nodes=()
for i in 0 1 2 3 4 5; do
  port=$((base + i))
  mkdir -p "$dir/$port"
  # A node left from an earlier run: start afresh.
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  rm -f "$dir/$port/nodes.conf"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --cluster-enabled yes \
    --cluster-config-file "$dir/$port/nodes.conf" --cluster-node-timeout 2000 \
    --save "" --appendonly no --dir "$dir/$port" --logfile "$dir/$port/log"
  nodes+=("127.0.0.1:$port")
done
for port in $(seq "$base" $((base + 5))); do
  for _ in $(seq 50); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
done
redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
for _ in $(seq 100); do
  redis-cli -p "$base" cluster info | grep -q 'cluster_state:ok' && break
  sleep 0.1
done
redis-cli -p "$base" cluster info | grep cluster_state
