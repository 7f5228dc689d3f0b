# Helpers shared by benches/load.sh and benches/streams.sh, sourced after they set MOCK, PROXY,
# SLUICE, ADMIN and `work` (the run's directory, where nginx writes proxy.pid).

TICKS=$(getconf CLK_TCK)
# CPU ticks (user + system) of the given pids.
cpu() { local t=0; for p in "$@"; do set -- $(cut -d' ' -f14,15 "/proc/$p/stat"); t=$((t + $1 + $2)); done; echo "$t"; }
nginx_workers() { pgrep -P "$(cat "$work/proxy.pid")" | tr '\n' ' '; }
url() { case $1 in direct) echo "http://$MOCK";; sluice) echo "http://$SLUICE";; nginx) echo "http://$PROXY";; esac; }
pids() { case $1 in sluice) echo "$SLUICE_PID";; nginx) nginx_workers;; *) echo "";; esac; }
# The host's CPU time stolen by other guests (/proc/stat's steal), and all of it: "steal total".
# A cell run while the host was taking time away is noisy for every target, and says so.
host_ticks() { awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
# Steal between two host_ticks snapshots, as a percentage of the time that passed.
steal_pct() { python3 -c "import sys; a, b = sys.argv[1].split(), sys.argv[2].split(); print(round(100 * (int(b[0]) - int(a[0])) / max(int(b[1]) - int(a[1]), 1), 1))" "$1" "$2"; }
median() { python3 -c "import statistics,sys; print(round(statistics.median(map(float, sys.argv[1:])), 3))" "$@"; }

# Stops the sluice this script started, if any, and refuses to go on if another one answers on
# ADMIN: it would answer instead, and be measured as this one.
stop_sluice() {
  if [ -n "${SLUICE_PID:-}" ]; then kill "$SLUICE_PID"; wait "$SLUICE_PID" 2>/dev/null || true; fi
  if curl -sf "http://$ADMIN/readyz" >/dev/null; then echo "a sluice already answers on $ADMIN" >&2; exit 1; fi
}
# Waits for the sluice started as SLUICE_PID to be ready.
await_sluice() {
  for _ in $(seq 100); do curl -sf "http://$ADMIN/readyz" >/dev/null && break; sleep 0.1; done
  kill -0 "$SLUICE_PID" 2>/dev/null || { echo "sluice did not start" >&2; exit 1; }
}
