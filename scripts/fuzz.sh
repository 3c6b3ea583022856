#!/usr/bin/env bash
# Fuzzes every target declared with tern_fuzzer() for a bounded time:
#   scripts/fuzz.sh [SECONDS [TARGET...]]      (default: 20 s, every target)
# Builds them with clang, libFuzzer, ASan and UBSan in build/fuzz (target
# `fuzzers`), then runs each on a scratch copy of its saved corpus, so
# tests/fuzz/corpus is never modified. Any crash, leak, timeout (>10 s for one
# input) or memory blow-up (>2 GiB) fails the run; the input that caused it is
# kept under build/fuzz/artifacts/<target>/ and its path printed. Targets run
# TERN_FUZZ_JOBS at a time (default: the number of cores). docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-20}
shift || true
if ! [[ $seconds =~ ^[1-9][0-9]{0,5}$ ]]; then
  echo "fuzz.sh: SECONDS must be a whole number from 1 to 999999, got '$seconds'" >&2
  exit 2
fi
jobs=${TERN_FUZZ_JOBS:-$(nproc)}
build=$PWD/build/fuzz

echo "== fuzz build ($build, clang)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DTERN_FUZZ=ON -DTERN_BUILD_BENCH=OFF -DTERN_CUDA=OFF >/dev/null
cmake --build "$build" -j"$jobs" --target fuzzers

# name<TAB>binary<TAB>corpus, one line per tern_fuzzer() (tests/fuzz/CMakeLists.txt).
mapfile -t targets < "$build/fuzz_targets.txt"
selected=()
for line in "${targets[@]}"; do
  [[ -z $line ]] && continue
  name=${line%%$'\t'*}
  if (($# == 0)) || [[ " $* " == *" $name "* ]]; then selected+=("$line"); fi
done
if ((${#selected[@]} == 0)); then
  echo "fuzz.sh: no target matches '$*'; targets: $(cut -f1 "$build/fuzz_targets.txt" | tr '\n' ' ')" >&2
  exit 2
fi

# TERN_FUZZ_RUN_DIR: where logs and scratch corpora go (default build/fuzz/run,
# emptied first), so a long run can proceed beside a short one.
run_dir=${TERN_FUZZ_RUN_DIR:-$build/run}
rm -rf "$run_dir"
mkdir -p "$run_dir"

# Runs one target; its output goes to $run_dir/<name>.log, its exit status to
# $run_dir/<name>.rc (a status reaped by `wait -n` cannot be asked for again).
fuzz_one() {
  local name=$1 binary=$2 corpus=$3
  local scratch=$run_dir/$name.corpus artifacts=$build/artifacts/$name
  local rc=0
  mkdir -p "$scratch" "$artifacts"
  if [[ ! -d $corpus ]] || ! cp -r "$corpus"/. "$scratch"/; then
    echo "fuzz.sh: cannot copy the corpus $corpus (tern_fuzzer CORPUS must be a directory)" >"$run_dir/$name.log"
    echo 2 >"$run_dir/$name.rc"
    return
  fi
  "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$scratch" \
    >"$run_dir/$name.log" 2>&1 || rc=$?
  echo "$rc" >"$run_dir/$name.rc"
}

echo "== fuzzing ${#selected[@]} targets, ${seconds} s each, $jobs at a time"
start=$SECONDS
for line in "${selected[@]}"; do
  IFS=$'\t' read -r name binary corpus <<<"$line"
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  fuzz_one "$name" "$binary" "$corpus" &
done
wait

failed=()
for line in "${selected[@]}"; do
  IFS=$'\t' read -r name binary corpus <<<"$line"
  log=$run_dir/$name.log
  if [[ $(cat "$run_dir/$name.rc" 2>/dev/null) == 0 ]]; then
    execs=$(sed -n 's/^stat::number_of_executed_units: //p' "$log")
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -n1)
    inputs=$(find "$run_dir/$name.corpus" -type f | wc -l)
    echo "fuzz: $name ok: ${execs:-?} execs, ${cov:-no coverage line}, corpus $(find "$corpus" -type f | wc -l) -> $inputs inputs"
  else
    failed+=("$name")
    echo "fuzz: $name FAILED (exit $(cat "$run_dir/$name.rc" 2>/dev/null)); from $log:"
    # The sanitizer's or libFuzzer's report and its stack, else the log's end.
    first=$(grep -n -m1 -E '==ERROR|runtime error:|ERROR: libFuzzer|deadly signal' "$log" | cut -d: -f1 || true)
    if [[ -n $first ]]; then
      sed -n "${first},$((first + 30))p" "$log" | sed 's/^/  | /'
    else
      tail -n 30 "$log" | sed 's/^/  | /'
    fi
    reproducer=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n1)
    if [[ -n $reproducer ]]; then
      echo "fuzz: $name reproducer: $reproducer"
      echo "fuzz: rerun it with: $binary $reproducer"
    fi
  fi
done
echo "fuzz: ${#selected[@]} targets in $((SECONDS - start)) s"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
