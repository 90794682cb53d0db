#!/bin/bash
# Checks the report's round-trip model where this machine can: the same job at N = 2 on
# loopback TCP (DSM_TRANSPORT=tcp, one host) and across two network namespaces (veth pairs
# to a bridge, an sshd in each, ranks started by `dsmrun --hostfile` over ssh, TCP between
# them), alternating. The one-way delay of each is half the TCP round trip dsm-bench
# measures there; the model (`dsm-bench-report round-trips`, scripts/src/delay.rs) predicts
# the difference from the namespace run's own counts, and the script prints it beside the
# measured difference of the apps' parallel times (medians of REPS). Needs root, iproute2
# and openssh-server (installed when missing). Removes every namespace, daemon and file it
# made.
#
#   scripts/roundtrip-check.sh [BIN_DIR [REPS]]     # BIN_DIR: target/release by default
set -euo pipefail
bin=$(cd "${1:-target/release}" && pwd)
reps=${2:-5}
tag=rt$$
subnet=10.79.$(($$ % 250))
hosts=2
. "$(dirname "$0")/netns-hosts.sh"
across=(--hostfile "$dir/hosts" --launch-agent "$agent")

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
par() { sed -n 's/.*parallel \([0-9.e-]*\) s.*/\1/p' | head -n1; }
# Two one-way delays per side, medians of three dsm-bench runs: half the TCP round trip of
# its plain socket between the ranks' processes (the wire and the kernel), and a free
# remote lock acquire over its messages (the DSM's own path: comm threads, wake-ups).
delays() {
    python3 -c 'import json, sys
b = json.load(sys.stdin)
print(b["rtt_us"]["median"] / 2, b["lock_acquire_us"]["median"] / b["lock_acquire_messages"])' 2>/dev/null || true
}
bench=("$bin/dsm-bench" --reps 300 --barrier-nodes 2)
for _ in 1 2 3; do DSM_TRANSPORT=tcp "${bench[@]}" 2>/dev/null | delays; done >"$dir/lo-delays"
for _ in 1 2 3; do "${bench[@]}" -- "${across[@]}" --map-by node 2>/dev/null | delays; done >"$dir/ns-delays"
col() { cut -d' ' -f"$1" <"$2" | median; }
lo_d=$(col 1 "$dir/lo-delays"); ns_d=$(col 1 "$dir/ns-delays")
lo_m=$(col 2 "$dir/lo-delays"); ns_m=$(col 2 "$dir/ns-delays")
[ -n "$lo_d" ] && [ -n "$ns_d" ] && [ -n "$lo_m" ] && [ -n "$ns_m" ] ||
    { echo "roundtrip-check: dsm-bench gave no figures" >&2; exit 1; }
echo "one-way delay, half the TCP round trip: loopback $lo_d us, across namespaces $ns_d us"
echo "one-way delay, a free remote lock acquire over its messages: loopback $lo_m us, across namespaces $ns_m us"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-48s %9s %9s %9s %9s %9s %9s %9s  %s\n' app loopback namespaces measured "pred rtt" "/meas" "pred dsm" "/meas" "round trips per rank (namespaces)"

for app in "water --molecules 1000 --steps 2" "water --molecules 1000 --steps 2 --locks block" \
    "water --molecules 216 --steps 5" "sor --size 2048 --iters 50" "tsp --random 19 --seed 3 --locked-bound" \
    "fft --dims 128x128x64"; do
    : >"$dir/lo" && : >"$dir/ns" && : >"$dir/pred" && : >"$dir/pred-dsm" && : >"$dir/delays"
    for rep in $(seq "$reps"); do
        # Alternate which goes first, so drifting load hits both alike.
        for where in $( [ $((rep % 2)) = 1 ] && echo "lo ns" || echo "ns lo"); do
            rm -f "$dir"/stats-*.json
            if [ "$where" = lo ]; then
                DSM_TRANSPORT=tcp DSM_STATS_FILE="$dir/stats-%r.json" "$bin/dsmrun" -n 2 "$bin/"$app 2>/dev/null | par >>"$dir/lo"
            else
                DSM_STATS_FILE="$dir/stats-%r.json" "$bin/dsmrun" "${across[@]}" "$bin/"$app 2>/dev/null | par >>"$dir/ns"
                "$bin/dsm-bench-report" round-trips --delay-us "$ns_d" --base-us "$lo_d" "$dir"/stats-*.json >"$dir/model"
                sed -n 's/^predicted difference.*: \([0-9.-]*\) s$/\1/p' "$dir/model" >>"$dir/pred"
                "$bin/dsm-bench-report" round-trips --delay-us "$ns_m" --base-us "$lo_m" "$dir"/stats-*.json |
                    sed -n 's/^predicted difference.*: \([0-9.-]*\) s$/\1/p' >>"$dir/pred-dsm"
                sed -n 's/^rank [0-9]*: [0-9.]* round trips, \([0-9]*\) delays.*/\1/p' "$dir/model" |
                    sort -g | tail -n1 >>"$dir/delays"
                cp "$dir/model" "$dir/model-last"
            fi
        done
    done
    lo=$(median <"$dir/lo"); ns=$(median <"$dir/ns"); pred=$(median <"$dir/pred"); pdsm=$(median <"$dir/pred-dsm")
    per_rank=$(sed -n 's/^rank \([0-9]*\): \([0-9.]*\) round trips.*/\2/p' "$dir/model-last" | paste -sd/)
    [ -f "$dir/model-first" ] || cp "$dir/model-last" "$dir/model-first"
    echo "$app|$(awk -v lo="$lo" -v ns="$ns" 'BEGIN { print ns - lo }')|$(median <"$dir/delays")" >>"$dir/fit"
    awk -v a="$app" -v lo="$lo" -v ns="$ns" -v p="$pred" -v q="$pdsm" -v r="$per_rank" 'BEGIN {
        m = ns - lo; printf "%-48s %9.4f %9.4f %9.4f %9.4f %9s %9.4f %9s  %s\n", a, lo, ns, m, p,
            (m > 0 ? sprintf("%.2f", p / m) : "-"), q, (m > 0 ? sprintf("%.2f", q / m) : "-"), r }'
done
echo "(seconds; medians of $reps runs; predicted: the namespace runs' counts x (one-way delay across namespaces - on loopback), by the TCP round trip and by the DSM's lock acquire)"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
# The same counts with one delay per message fitted to the first app (the lock-heavy one):
# whether the counts scale the loss right when D is whatever a message costs here.
IFS='|' read -r _ m0 d0 <"$dir/fit"
echo "fitted: one delay = the first app's measured difference / its slowest rank's delays = $(awk -v m="$m0" -v d="$d0" 'BEGIN { printf "%.1f", 1e6 * m / d }') us"
printf '%-48s %9s %9s %9s %9s\n' app delays measured predicted /meas
while IFS='|' read -r a m d; do
    awk -v a="$a" -v m="$m" -v d="$d" -v m0="$m0" -v d0="$d0" 'BEGIN { p = d * m0 / d0
        printf "%-48s %9d %9.4f %9.4f %9s\n", a, d, m, p, (m > 0 ? sprintf("%.2f", p / m) : "-") }'
done <"$dir/fit"
echo "the model of the first app's last namespace run:"
cat "$dir/model-first"
