#!/usr/bin/env bash
# Benchmark: C SOR (dsm-capi/c-apps/sor.c) on one host, the same binary without and with
# dsmrun --race, alternating, RUNS runs each; alongside, the same kernel with RANKS POSIX
# threads in one process (c-apps/sor_threads.c), built plain and under ThreadSanitizer
# (gcc -fsanitize=thread with libtsan). Prints every run's parallel time and the medians.
# A benchmark that prints figures, not a test: nothing here passes or fails.
#
#   dsm-capi/bench/c-sor.sh [RANKS [N [ITERS [RUNS]]]]     (default 4 1024 20 7)
#
# Needs the release build: cargo build --release -p dsm-capi -p dsm-launch.
# DSM_TRANSPORT is passed through (dsm's default on one host: one common segment).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$here/../target}
ranks=${1:-4} n=${2:-1024} iters=${3:-20} runs=${4:-7}
dsmrun=$target/release/dsmrun
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
DSM_LIB=$target/release/libdsm.a "$here/dsmcc" -O2 -o "$tmp/sor" "$here/c-apps/sor.c"
cc=${DSMCC_CC:-${CC:-gcc}}
"$cc" -O2 -g -pthread -o "$tmp/threads" "$here/c-apps/sor_threads.c"
"$cc" -O2 -g -pthread -fsanitize=thread -o "$tmp/threads-tsan" "$here/c-apps/sor_threads.c"

# The parallel time of one run (fails loudly if the run did not verify).
time_of() {
    local out
    out=$("$dsmrun" -n "$ranks" "$@" "$tmp/sor" "$n" "$iters" 2>&1) || { echo "$out" >&2; exit 1; }
    grep -q verified: <<<"$out" || { echo "$out" >&2; exit 1; }
    sed -n 's/.*parallel \([0-9.]*\) s.*/\1/p' <<<"$out"
}

# The parallel time of one run of a threaded build.
time_threads() {
    local out
    out=$("$1" "$ranks" "$n" "$iters" 2>&1) || { echo "$out" >&2; exit 1; }
    sed -n 's/.*parallel \([0-9.]*\) s.*/\1/p' <<<"$out"
}

median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

off=() on=() plain=() tsan=()
for ((r = 1; r <= runs; r++)); do
    off+=("$(time_of)")
    on+=("$(time_of --race)")
    plain+=("$(time_threads "$tmp/threads")")
    tsan+=("$(time_threads "$tmp/threads-tsan")")
    echo "run $r: dsm without --race ${off[-1]} s, with --race ${on[-1]} s;" \
        "threads ${plain[-1]} s, threads under TSan ${tsan[-1]} s"
done
m_off=$(printf '%s\n' "${off[@]}" | median)
m_on=$(printf '%s\n' "${on[@]}" | median)
echo "c sor ${n}x${n}, $iters iterations, $ranks ranks, transport ${DSM_TRANSPORT:-auto}, $runs runs each:" \
    "median without --race $m_off s, with --race $m_on s, ratio $(awk -v a="$m_on" -v b="$m_off" 'BEGIN { printf "%.2f", a / b }')x"
m_plain=$(printf '%s\n' "${plain[@]}" | median)
m_tsan=$(printf '%s\n' "${tsan[@]}" | median)
echo "c sor_threads ${n}x${n}, $iters iterations, $ranks threads: median $m_plain s, under TSan $m_tsan s," \
    "ratio $(awk -v a="$m_tsan" -v b="$m_plain" 'BEGIN { printf "%.2f", a / b }')x"
