#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60) on top of the committed corpus, then
# minimises the corpus and prints each target's executions. Needs cargo-fuzz
# (`cargo install cargo-fuzz`); uses the nightly toolchain when there is one, else stable with
# RUSTC_BOOTSTRAP=1 (cargo-fuzz passes -Z flags). Crashes land in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  fuzz=(cargo +nightly fuzz)
else
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
fi
read -r -a targets <<< "${TARGETS:-request resumed_view provider_stream image cursor config encoding}"
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  log="$(mktemp)"
  "${fuzz[@]}" run --sanitizer none "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 2>"$log" || {
    tail -n 40 "$log"; echo "FUZZ $target: crash (see fuzz/artifacts/$target)"; exit 1; }
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  echo "FUZZ $target: $runs executions in ${seconds}s, no crash"
  rm -f "$log"
done
# Keep the committed corpus small: only inputs that add coverage.
for target in "${targets[@]}"; do
  "${fuzz[@]}" cmin --sanitizer none "$target" "corpus/$target" >/dev/null 2>&1 || true
done
