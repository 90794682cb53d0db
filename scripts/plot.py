#!/usr/bin/env python3
"""Plots of a dsm benchmark report: reads latest.json, writes PNGs into a directory.

Usage: plot.py REPORT.json OUT_DIR

Writes breakdown.png (the paper's Figure 3: race-detection overhead by component, stacked),
slowdown.png (race-detection slowdown per app and node count), speedup.png (speedup against
the sequential run, oversubscribed node counts shaded) and peers.png (slowdown of each race
detector on SOR, log scale). Prints the name of each file written, one per line, so the
driver knows which ones exist. Exits 3 when matplotlib is missing, so the report can say so.
"""

import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt
except ImportError as e:
    print(f"matplotlib is not installed ({e}); try: python3 -m pip install --user matplotlib",
          file=sys.stderr)
    sys.exit(3)

COMPONENTS = [
    ("recording_pct", "recording accesses"),
    ("protocol_pct", "protocol extras (notices)"),
    ("intervals_pct", "interval comparison"),
    ("bitmaps_pct", "bitmap round"),
]


def breakdown(report, out):
    rows = [r for r in report["breakdown"] if r.get("total_pct") is not None]
    if not rows:
        return None
    labels = [f'{r["app"]}\nN={r["nodes"]}' for r in rows]
    fig, ax = plt.subplots(figsize=(1.6 * len(rows) + 3, 4.5))
    # Components are differences between noisy runs and can come out negative: those are
    # stacked below zero, so the bar's extent above minus below is the measured total
    # (marked with a black tick and its value).
    up = [0.0] * len(rows)
    down = [0.0] * len(rows)
    for key, name in COMPONENTS:
        vals = [r.get(key) or 0.0 for r in rows]
        base = [u if v >= 0 else d for v, u, d in zip(vals, up, down)]
        ax.bar(labels, vals, bottom=base, label=name, width=0.6)
        up = [u + max(v, 0.0) for u, v in zip(up, vals)]
        down = [d + min(v, 0.0) for d, v in zip(down, vals)]
    for i, r in enumerate(rows):
        t = r["total_pct"]
        ax.plot([i - 0.35, i + 0.35], [t, t], color="black", linewidth=2)
        ax.annotate(f"total {t:.0f}%", (i, max(up[i], t)), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("overhead, % of race-off time")
    ax.set_title("Where race detection's time goes (cf. the paper's Figure 3)")
    ax.legend(fontsize=8)
    ax.axhline(0, color="black", linewidth=0.5)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "breakdown.png"), dpi=110)
    plt.close(fig)
    return "breakdown.png"


def slowdown(report, out):
    rows = [r for r in report["apps"] if r.get("race_ratio") is not None]
    if not rows:
        return None
    nodes = sorted({r["nodes"] for r in rows})
    apps = list(dict.fromkeys(r["app"] for r in rows))
    cores = report["machine"]["cores"]
    width = 0.8 / len(nodes)
    fig, ax = plt.subplots(figsize=(1.5 * len(apps) + 3, 4.5))
    for k, n in enumerate(nodes):
        xs, ys, lo, hi = [], [], [], []
        for i, a in enumerate(apps):
            r = next((r for r in rows if r["app"] == a and r["nodes"] == n), None)
            if r is None:
                continue
            xs.append(i + (k - (len(nodes) - 1) / 2) * width)
            ys.append(r["race_ratio"])
            spread = r.get("ratio") or {}
            lo.append(r["race_ratio"] - spread.get("min", r["race_ratio"]))
            hi.append(spread.get("max", r["race_ratio"]) - r["race_ratio"])
        label = f"N = {n}" + (" (oversubscribed)" if n > cores else "")
        ax.bar(xs, ys, width=width, yerr=[lo, hi], capsize=3, label=label)
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.axhline(1.3, color="green", linestyle="--", linewidth=1, label="target 1.3")
    ax.axhline(2.2, color="grey", linestyle=":", linewidth=1, label="paper's mean 2.2")
    ax.set_xticks(range(len(apps)))
    ax.set_xticklabels(apps)
    ax.set_ylabel("time with --race / without")
    ax.set_title("Race-detection slowdown (median, min-max)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "slowdown.png"), dpi=110)
    plt.close(fig)
    return "slowdown.png"


def speedup(report, out):
    rows = [r for r in report["speedup"] if r.get("speedup") is not None]
    if not rows:
        return None
    cores = report["machine"]["cores"]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    top = 1.0
    for app in dict.fromkeys(r["app"] for r in rows):
        pts = sorted((r["nodes"], r["speedup"]) for r in rows if r["app"] == app)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=app)
        top = max(top, max(p[1] for p in pts))
    all_n = sorted({r["nodes"] for r in rows})
    ax.plot(all_n, [min(n, cores) for n in all_n], color="grey", linestyle="--",
            linewidth=1, label="ideal (bounded by cores)")
    if all_n[-1] > cores:
        ax.axvspan(cores + 0.5, all_n[-1] + 0.5, color="grey", alpha=0.15,
                   label=f"oversubscribed (> {cores} cores)")
    ax.set_xticks(all_n)
    ax.set_xlabel("nodes N")
    ax.set_ylabel("sequential time / parallel time")
    ax.set_ylim(0, max(top, cores) * 1.15)
    ax.set_title("Speedup against each app's sequential run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "speedup.png"), dpi=110)
    plt.close(fig)
    return "speedup.png"


def peers(report, out):
    # The baselines (plain C, dsm without --race) are 1 by definition: only detectors.
    rows = [r for r in report["peers"]
            if r["app"].startswith("sor") and r.get("slowdown") is not None
            and not r["tool"].startswith("plain") and "no --race" not in r["tool"]]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 1 + 0.7 * len(rows)))
    names = [r["tool"] for r in rows]
    vals = [r["slowdown"] for r in rows]
    colors = ["tab:green" if r["tool"].startswith("dsm") else "tab:red" for r in rows]
    ax.barh(names, vals, color=colors)
    for i, v in enumerate(vals):
        ax.annotate(f"{v:.2f}x", (v, i), va="center", xytext=(3, 0), textcoords="offset points",
                    fontsize=9)
    ax.set_xscale("log")
    ax.set_xlim(1, max(vals) * 3)  # room for the labels
    ax.set_xlabel("slowdown against the same program without the detector (log)")
    ax.set_title(f'Race detectors on red-black SOR ({report["settings"]["peer_sor"]})')
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "peers.png"), dpi=110)
    plt.close(fig)
    return "peers.png"


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1], encoding="utf-8") as f:
        report = json.load(f)
    out = sys.argv[2]
    for plot in (breakdown, slowdown, speedup, peers):
        name = plot(report, out)
        if name:
            print(name)


if __name__ == "__main__":
    main()
