#!/usr/bin/env bash
# Streams as providers send them (issue #41), direct to a mock provider, through sluice and
# through nginx as a plain proxy (`proxy_buffering off`), all in one run on this machine. The
# mock (benches/streams.rs) answers every request with its dialect's real event sequence: chat
# chunks with include_usage, Responses events, Anthropic events with a tool call, Gemini chunks;
# N events per answer, each its own HTTP chunk.
#  (a) saturation (wrk, CONNS connections): requests/s and the proxy's CPU per event, per
#      dialect and N (EVENTS, default "20 200 1000"), with the events written together
#      (WRITE=together, as the issue first measured) or one write per event (WRITE=each);
#  (b) paced streams (PACED_CONNS streams, one event every PACE_US): each event's delay from the
#      mock's hand-off to the client's read, and the time to first byte; a proxy's added delay
#      is its delay minus direct's;
#  (c) OPEN concurrent paced streams (default 2,000, one event every OPEN_PACE_US) held open for
#      OPEN_SECONDS: the proxy's RSS per open stream (against its idle RSS), CPU per event, the
#      event delay p99.
# Each part runs its targets in turn per cell (direct, sluice, nginx), ROUNDS times interleaved;
# figures are medians over the rounds. Each cell also prints the host's steal time.
# Usage: benches/streams.sh [SECONDS_EACH] (default 5). PARTS picks parts: "saturate paced open".
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-5}
CONNS=${CONNS:-8}
DIALECTS=${DIALECTS:-chat responses anthropic gemini}
EVENTS=${EVENTS:-20 200 1000}
WRITE=${WRITE:-together}
ROUNDS=${ROUNDS:-1}
PARTS=${PARTS:-saturate paced open}
PACED_CONNS=${PACED_CONNS:-50} PACE_US=${PACE_US:-5000} PACED_EVENTS=${PACED_EVENTS:-200}
OPEN=${OPEN:-2000} OPEN_PACE_US=${OPEN_PACE_US:-50000} OPEN_SECONDS=${OPEN_SECONDS:-60} OPEN_EVENTS=${OPEN_EVENTS:-200}

for tool in wrk nginx; do
  command -v $tool >/dev/null || [ -x /usr/sbin/$tool ] || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light >/dev/null; }
done
[ -n "${SLUICE_BIN:-}" ] || cargo build --release --quiet
BENCH=$(cargo build --release --bench streams --message-format=json 2>/dev/null |
  python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"] == "streams"][0])')
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
ulimit -n "$(ulimit -Hn)"

work=$(mktemp -d)
cleanup() {
  [ -n "${MOCK_PID:-}" ] && kill "$MOCK_PID" 2>/dev/null || true
  [ -f "$work/proxy.pid" ] && kill "$(cat "$work/proxy.pid")" 2>/dev/null || true
  [ -n "${SLUICE_PID:-}" ] && kill "$SLUICE_PID" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

MOCK=127.0.0.1:18201 PROXY=127.0.0.1:18202 SLUICE=127.0.0.1:18203 ADMIN=127.0.0.1:18204
"$BENCH" mock "$MOCK" &
MOCK_PID=$!
cat > "$work/proxy.conf" <<NGX
worker_processes auto;
worker_rlimit_nofile 20000;
pid $work/proxy.pid;
error_log $work/proxy.err;
events { worker_connections 16384; }
http {
  access_log off;
  upstream mock { server $MOCK; keepalive 256; }
  server {
    listen $PROXY backlog=4096;
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
NGX
"$NGINX" -c "$work/proxy.conf"
cat > "$work/sluice.toml" <<TOML
listen = "$SLUICE"
admin_listen = "$ADMIN"
[[routes]]
name = "mock"
dialects = ["openai-chat", "openai-responses", "anthropic-messages", "gemini-generate"]
upstream = "http://$MOCK"
TOML
. benches/common.sh
start_sluice() {
  stop_sluice
  SLUICE_LOG=warn "${SLUICE_BIN:-./target/release/sluice}" serve --config "$work/sluice.toml" &
  SLUICE_PID=$!
  await_sluice
}
start_sluice

rss_kb() { local t=0; for p in "$@"; do t=$((t + $(awk '/VmRSS/{print $2}' "/proc/$p/status"))); done; echo "$t"; }
path() { case $1 in
  chat) echo /v1/chat/completions;; responses) echo /v1/responses;; anthropic) echo /v1/messages;;
  gemini) echo "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse";; esac; }
calc() { python3 -c "print($1)"; }
field() { python3 -c "import json,sys; print(json.loads(sys.argv[2])[sys.argv[1]])" "$1" "$2"; }

for d in $DIALECTS; do "$BENCH" body "$(path "$d")" > "$work/$d.json"; done
cat > "$work/post.lua" <<'LUA'
local f = io.open(os.getenv("BODY"), "rb"); local body = f:read("*a"); f:close()
wrk.method = "POST"; wrk.body = body
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
wrk.headers["x-api-key"] = "sk-bench"
wrk.headers["x-goog-api-key"] = "bench"
wrk.headers["anthropic-version"] = "2023-06-01"
wrk.headers["x-mock-events"] = os.getenv("EVENTS_PER")
wrk.headers["x-mock-write"] = os.getenv("WRITE")
LUA
saturate() { # target dialect events -> "requests req/s"
  local target=$1 d=$2 n=$3 out
  out=$(BODY="$work/$d.json" EVENTS_PER=$n WRITE=$WRITE wrk -t 2 -c "$CONNS" -d "${SECONDS_EACH}s" \
    -s "$work/post.lua" "$(url "$target")$(path "$d")")
  if echo "$out" | grep -q 'Non-2xx\|Socket errors'; then echo "warning: $target $d $n: $(echo "$out" | grep 'Non-2xx\|Socket errors')" >&2; fi
  echo "$(echo "$out" | awk '/requests in/{print $1}') $(echo "$out" | awk '/Requests\/sec/{print int($2 + 0.5)}')"
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; $(uname -sr); $(date -u +%F)"
if [[ " $PARTS " == *" saturate "* ]]; then
echo
echo "(a) saturation, wrk $CONNS connections, ${SECONDS_EACH} s per cell, events written $WRITE, $ROUNDS round(s):"
echo
echo "| dialect | events | req/s direct | req/s sluice | req/s nginx | sluice ÷ nginx | CPU µs/event sluice | CPU µs/event nginx | CPU ratio | host steal |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for d in $DIALECTS; do for n in $EVENTS; do
  declare -A rps cpe; for t in direct sluice nginx; do rps[$t]=""; cpe[$t]=""; done
  h0=$(host_ticks)
  for _ in $(seq "$ROUNDS"); do for t in direct sluice nginx; do
    ps=$(pids "$t"); before=$( [ -n "$ps" ] && cpu $ps || echo 0)
    read -r count r < <(saturate "$t" "$d" "$n")
    after=$( [ -n "$ps" ] && cpu $ps || echo 0)
    rps[$t]+=" $r"
    cpe[$t]+=" $(calc "round(($after - $before) / $TICKS * 1e6 / max($count * $n, 1), 3)")"
  done; done
  rs=$(median ${rps[sluice]}) rn=$(median ${rps[nginx]}) cs=$(median ${cpe[sluice]}) cn=$(median ${cpe[nginx]})
  echo "| $d | $n | $(median ${rps[direct]}) | $rs | $rn | $(calc "round($rs / max($rn, 1), 2)") | $cs | $cn | $(calc "round($cs / max($cn, 1e-9), 2)") | $(steal_pct "$h0" "$(host_ticks)") % |"
done; done
fi

if [[ " $PARTS " == *" paced "* ]]; then
echo
echo "(b) paced: $PACED_CONNS streams of $PACED_EVENTS events, one every $PACE_US µs, ${SECONDS_EACH} s per cell, $ROUNDS round(s); µs, medians:"
echo
echo "| dialect | delay p50 direct | delay p50 sluice | delay p50 nginx | delay p99 direct | delay p99 sluice | delay p99 nginx | added p99 sluice | added p99 nginx | TTFB p50 direct | TTFB p50 sluice | TTFB p50 nginx | failures | host steal |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for d in $DIALECTS; do
  declare -A p50 p99 f50 fails; for t in direct sluice nginx; do p50[$t]=""; p99[$t]=""; f50[$t]=""; fails[$t]=0; done
  h0=$(host_ticks)
  for _ in $(seq "$ROUNDS"); do for t in direct sluice nginx; do
    out=$("$BENCH" client "$(url "$t")" "$(path "$d")" "$PACED_CONNS" "$SECONDS_EACH" "$PACED_EVENTS" "$PACE_US")
    p50[$t]+=" $(field delay_p50_us "$out")"; p99[$t]+=" $(field delay_p99_us "$out")"; f50[$t]+=" $(field ttfb_p50_us "$out")"
    fails[$t]=$((fails[$t] + $(field failures "$out")))
  done; done
  dd=$(median ${p99[direct]})
  echo "| $d | $(median ${p50[direct]}) | $(median ${p50[sluice]}) | $(median ${p50[nginx]}) | $dd | $(median ${p99[sluice]}) | $(median ${p99[nginx]}) | $(calc "round($(median ${p99[sluice]}) - $dd)") | $(calc "round($(median ${p99[nginx]}) - $dd)") | $(median ${f50[direct]}) | $(median ${f50[sluice]}) | $(median ${f50[nginx]}) | ${fails[direct]}/${fails[sluice]}/${fails[nginx]} | $(steal_pct "$h0" "$(host_ticks)") % |"
done
fi

if [[ " $PARTS " == *" open "* ]]; then
echo
echo "(c) $OPEN open streams of $OPEN_EVENTS events, one every $OPEN_PACE_US µs, held ${OPEN_SECONDS} s (chat):"
echo
echo "| target | events/s | CPU µs/event | RSS idle | RSS at $OPEN open | RSS per open stream | delay p50 | delay p99 | delay p99.9 | TTFB p99 | failures | host steal |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for t in direct sluice nginx; do
  [ "$t" = sluice ] && start_sluice
  [ "$t" = nginx ] && { kill -HUP "$(cat "$work/proxy.pid")"; sleep 1; }
  ps=$(pids "$t")
  # A few streams first, so what is measured is what the streams add, not the first use.
  "$BENCH" client "$(url "$t")" "$(path chat)" 4 1 20 0 >/dev/null
  idle=$( [ -n "$ps" ] && rss_kb $ps || echo 0)
  before=$( [ -n "$ps" ] && cpu $ps || echo 0) h0=$(host_ticks)
  "$BENCH" client "$(url "$t")" "$(path chat)" "$OPEN" "$OPEN_SECONDS" "$OPEN_EVENTS" "$OPEN_PACE_US" > "$work/open.json" &
  client=$!
  # RSS read when every stream has opened (they start over one answer's length, at most 5 s).
  sleep "$(( OPEN_SECONDS / 2 ))"
  held=$( [ -n "$ps" ] && rss_kb $ps || echo 0)
  wait "$client"
  after=$( [ -n "$ps" ] && cpu $ps || echo 0)
  out=$(cat "$work/open.json")
  ev=$(field events "$out")
  echo "| $t | $(calc "round($ev / $(field seconds "$out"))") | $(calc "round(($after - $before) / $TICKS * 1e6 / max($ev, 1), 3)") | $((idle / 1024)) MiB | $((held / 1024)) MiB | $(calc "round(($held - $idle) / $OPEN, 1)") KiB | $(field delay_p50_us "$out") µs | $(field delay_p99_us "$out") µs | $(field delay_p999_us "$out") µs | $(field ttfb_p99_us "$out") µs | $(field failures "$out") | $(steal_pct "$h0" "$(host_ticks)") % |"
done
fi
