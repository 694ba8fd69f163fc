#!/usr/bin/env bash
# Every fuzz target (fuzz/, cargo-fuzz with libFuzzer and AddressSanitizer) for SECONDS each,
# starting from the committed corpus (fuzz/corpus/TARGET/). New inputs found go to a scratch
# corpus, not the committed one; a crash leaves its input in fuzz/artifacts/TARGET/ and fails
# the script (add the input to fuzz/corpus/TARGET/ with the fix: tests/tests/fuzz_corpus.rs
# replays it). Installs the nightly toolchain and cargo-fuzz when missing.
# Usage: scripts/fuzz.sh [SECONDS=60] [TARGET...]   (CI: scripts/fuzz.sh 20)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
case "$seconds" in '' | *[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2; exit 2 ;; esac
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir fuzz)
fi
echo "== fuzz: build (${#targets[@]} targets, nightly, AddressSanitizer, debug assertions)"
cargo +nightly fuzz build --fuzz-dir fuzz -O -a
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  echo "== fuzz: $t for ${seconds}s"
  # -rss_limit_mb: an input that makes a parser allocate beyond its bounds fails; -timeout: one
  # that makes it wait (no input may take 10 s). Extra corpora are read, new inputs land in
  # the first (scratch) one.
  if ! cargo +nightly fuzz run --fuzz-dir fuzz -O -a "$t" "$scratch/$t" "fuzz/corpus/$t" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      2> "$scratch/$t.log"; then
    tail -40 "$scratch/$t.log"
    failed+=("$t")
  else
    grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$scratch/$t.log" | tr '\n' ' '
    echo
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no crash"
