#!/bin/bash
# Across-hosts benchmark: SOR 2048 and TSP on 2 and 4 "hosts" (network namespaces joined
# by veth pairs to a bridge in the root namespace, each running its own sshd, ranks started
# by `dsmrun --hostfile` over real ssh) against the same N on loopback, and job start-up
# time (dsmrun to exit, `dsm-test counter --iters 1`) for N = 2, 8, 32 on loopback.
# Prints the median of REPS runs of each. Needs root, iproute2 and openssh-server
# (installed when missing). Removes every namespace, daemon and file it made.
#
#   scripts/hosts-bench.sh [BIN_DIR [REPS]]     # BIN_DIR: target/release by default
set -euo pipefail
bin=$(cd "${1:-target/release}" && pwd)
reps=${2:-3}
tag=hb$$
subnet=10.78.$(($$ % 250))
hosts=4
. "$(dirname "$0")/netns-hosts.sh"

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# parallel seconds printed by the app's verified line
par() { sed -n 's/.*parallel \([0-9.]*\) s.*/\1/p' | head -n1; }

run_app() { # where N app args...
    local where=$1 n=$2; shift 2
    if [ "$where" = loopback ]; then
        "$bin/dsmrun" -n "$n" "$bin/$@"
    else
        : >"$dir/hosts"
        for k in $(seq 0 $((n - 1))); do echo "$subnet.$((k + 1))" >>"$dir/hosts"; done
        "$bin/dsmrun" --hostfile "$dir/hosts" --launch-agent "$agent" "$bin/$@"
    fi
}

printf '%-28s %-10s %s\n' "run" "where" "median parallel s ($reps runs)"
for n in 2 4; do
    for app in "sor --size 2048 --iters 20" "tsp --random 19 --seed 7"; do
        for where in loopback namespaces; do
            t=$(for _ in $(seq "$reps"); do run_app "$where" "$n" $app 2>/dev/null | par; done | median)
            printf '%-28s %-10s %s\n' "N=$n ${app%% *}" "$where" "$t"
        done
    done
done

printf '\n%-28s %s\n' "start-up (dsm-test counter)" "median wall s to exit ($reps runs)"
for n in 2 8 32; do
    t=$(for _ in $(seq "$reps"); do
        s=$(date +%s.%N)
        "$bin/dsmrun" -n "$n" "$bin/dsm-test" counter --iters 1 >/dev/null 2>&1
        e=$(date +%s.%N)
        awk -v e="$e" -v s="$s" "BEGIN { printf \"%.3f\\n\", e - s }"
    done | median)
    printf '%-28s %s\n' "N=$n loopback" "$t"
done
t=$(for _ in $(seq "$reps"); do
    s=$(date +%s.%N)
    run_app namespaces 4 dsm-test counter --iters 1 >/dev/null 2>&1
    e=$(date +%s.%N)
    awk -v e="$e" -v s="$s" "BEGIN { printf \"%.3f\\n\", e - s }"
done | median)
printf '%-28s %s\n' "N=4 over ssh, 4 namespaces" "$t"
