#!/usr/bin/env python3
"""Side-by-side timings of recording, replay and pinpoint (dsmrun --record, --replay,
--pinpoint) against a baseline build: configurations alternate within each repetition and
the medians of the apps' own 'parallel X s' times are printed.

    MAIN_BIN=/path/to/baseline/release BRANCH_BIN=target/release REPS=9 \
        python3 scripts/replay-measure.py [record] [replay] [pinpoint]
"""
import re, subprocess, sys, statistics, os, tempfile
MAIN = os.environ.get("MAIN_BIN")
if not MAIN:
    sys.exit("set MAIN_BIN to the release directory of the baseline build (see the docstring)")
BR = os.environ.get("BRANCH_BIN", "target/release")
REPS = int(os.environ.get("REPS", "7"))
tmp = tempfile.mkdtemp(prefix="replay-measure-")  # the records made for the replays

def run(bindir, n, flags, prog, args):
    cmd = [f"{bindir}/dsmrun", "-n", str(n), "--timeout", "120"] + flags + [f"{bindir}/{prog}"] + args
    p = subprocess.run(cmd, capture_output=True, text=True)
    out = p.stdout + p.stderr
    m = re.search(r"parallel ([0-9.]+) s", out)
    rec = re.search(r"recorded (\d+) lock acquisitions in '[^']*' \((\d+) bytes", out)
    return (float(m.group(1)) if m else None), p.returncode, rec, out

def bench(name, n, prog, args, configs):
    times = {c[0]: [] for c in configs}
    extra = {}
    for r in range(REPS):
        for label, bindir, flags in configs:
            t, rc, rec, out = run(bindir, n, flags, prog, args)
            if t is None:
                extra.setdefault(label + " failures", []).append(rc)
                continue
            times[label].append(t)
            if rec:
                extra["record"] = (int(rec.group(1)), int(rec.group(2)))
    base = statistics.median(times[configs[0][0]]) if times[configs[0][0]] else None
    print(f"\n{name} (N={n}, {REPS} alternating repetitions, median of the app's parallel time)")
    for label, _, _ in configs:
        ts = times[label]
        if not ts:
            print(f"  {label:32s} no successful run")
            continue
        med = statistics.median(ts)
        ratio = f"{med/base:.3f}x" if base else ""
        print(f"  {label:32s} {med*1e3:8.2f} ms  (min {min(ts)*1e3:.2f}, max {max(ts)*1e3:.2f}, n={len(ts)})  {ratio}")
    for k, v in extra.items():
        if k == "record":
            print(f"  record: {v[0]} acquisitions, {v[1]} bytes, {v[1]/max(v[0],1):.1f} bytes per acquisition")
        else:
            print(f"  {k}: exit statuses {v}")

which = sys.argv[1:] or ["record", "replay", "pinpoint"]
apps = [("tsp", ["--random", "16", "--seed", "3", "--no-verify"]),
        ("water", ["--no-verify"])]
if "record" in which:
    for prog, args in apps:
        for n in (2, 4):
            rec = f"{tmp}/{prog}{n}.dsmrec"
            bench(f"recording overhead: {prog} {' '.join(args)}", n, prog, args, [
                ("main", MAIN, []),
                ("branch", BR, []),
                ("branch --record", BR, ["--record", rec]),
            ])
if "replay" in which:
    for prog, args in apps:
        for n in (2, 4):
            rec = f"{tmp}/{prog}{n}-r.dsmrec"
            subprocess.run([f"{BR}/dsmrun", "-n", str(n), "--record", rec, f"{BR}/{prog}"] + args, capture_output=True)
            bench(f"replay slowdown: {prog} {' '.join(args)}", n, prog, args, [
                ("branch", BR, []),
                ("branch --replay", BR, ["--replay", rec]),
            ])
if "pinpoint" in which:
    # Off the pinpoint path: main's --race against this branch's --race (the accessors are
    # #[track_caller] and test one more None); on it: a watched element.
    bench("pinpoint cost: sor --size 1024 --iters 100 --race", 2, "sor", ["--size", "1024", "--iters", "100", "--no-verify"], [
        ("main --race", MAIN, ["--race"]),
        ("branch --race", BR, ["--race"]),
        ("branch --race --pinpoint grid[5000]@3", BR, ["--race", "--pinpoint", "grid[5000]@3"]),
    ])
    bench("pinpoint cost: water --race", 2, "water", ["--no-verify"], [
        ("main --race", MAIN, ["--race"]),
        ("branch --race", BR, ["--race"]),
        ("branch --race --pinpoint forces[7]@2", BR, ["--race", "--pinpoint", "forces[7]@2"]),
    ])
    bench("pinpoint cost: tsp --race", 4, "tsp", ["--random", "16", "--seed", "3", "--no-verify"], [
        ("main --race", MAIN, ["--race", "--race-exit-code", "0"]),
        ("branch --race", BR, ["--race", "--race-exit-code", "0"]),
        ("branch --race --pinpoint bound[0]@3", BR, ["--race", "--race-exit-code", "0", "--pinpoint", "bound[0]@3"]),
    ])
