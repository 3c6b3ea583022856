#!/usr/bin/env python3
"""Plots of measured cross-region fan-out (bench/fanout), from one or more
results.json written by `run.sh --out DIR`.

    bench/fanout/plot.py --out DIR RESULTS.json [RESULTS.json ...]

Writes into DIR (matplotlib; `scripts/install-deps.sh` installs it):
  fanout_time.png     per configuration: the bound, tern's last member, each
                      baseline and the simulator, seconds on a log axis;
  fanout_members.png  the relay (dissemination) shape against the number of
                      members, one panel per testbed (RTT and rate scale):
                      time, and each baseline's time over tern's;
  fanout_wan_bytes.png bytes on each WAN link for one version: tern, (c),
                      (d) and the full checkpoint (a), log axis;
  fanout_sim.png      the simulator against the measurement, with the
                      ±15% band of the validation goal.
Each figure's footer names the runs' commits, machine and commands. Nothing
here measures: it draws what the runs recorded, every missing figure left
out rather than guessed."""
import argparse
import json
import os
import subprocess
import sys

# One colour and marker per series in every figure.
SERIES = [  # (key in a summarized row, label, colour)
    ("bound_s", "bound", "#999999"),
    ("tern_last_s", "tern", "#1f77b4"),
    ("c_last_s", "(c) PULSE via tree", "#9467bd"),
    ("d_warm_s", "(d) store pull, warm", "#ff7f0e"),
    ("d_fetched_s", "(d) store pull", "#d62728"),
    ("a_last_s", "(a) full checkpoint star", "#8c564b"),
    ("sim_s", "tern_sim", "#2ca02c"),
]


def load(paths):
    """[(meta, row)] over every run, in the order given."""
    rows = []
    for p in paths:
        with open(p) as f:
            j = json.load(f)
        for r in j["results"]:
            rows.append((j["meta"], r))
    return rows


def save(plt, fig, rows, out, name):
    """Writes FIG to OUT/NAME with a footer naming each run's machine, commit,
    memcpy and command; returns the path."""
    metas = []
    for m, _ in rows:
        if m not in metas:
            metas.append(m)
    lines = ["%s, commit %s, memcpy %s GB/s/core: %s" % (m["machine"], m["commit"], m.get("memcpy_gb_s_per_core", "?"),
                                                          command(m["command"])) for m in metas]
    fig.text(0.01, 0.005, "\n".join(lines[:6]), fontsize=6, va="bottom", family="monospace")
    fig.tight_layout(rect=(0, 0.03 + 0.018 * min(len(lines), 6), 1, 1))
    path = os.path.join(out, name)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def command(argv):
    """The run's flags as a user gives them to run.sh: without the binaries'
    paths that run.sh passes to fanout.py."""
    words, out, skip = argv.split(), ["run.sh"], False
    for w in words[1:]:
        if skip:
            skip = False
        elif w in ("--tern", "--agent", "--fwd", "--sim", "--relay-blob"):
            skip = True
        else:
            out.append(w)
    return " ".join(out)[:160]


def plot_time(plt, rows, out):
    rows = [(m, r) for m, r in rows if r.get("tern_last_s")]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) * 1.6 + 2))
    h = 0.8 / len(SERIES)
    for k, (key, name, colour) in enumerate(SERIES):
        ys, xs = [], []
        for i, (_, r) in enumerate(rows):
            if r.get(key):
                ys.append(i + (k - len(SERIES) / 2 + 0.5) * h)
                xs.append(r[key])
        if xs:
            ax.barh(ys, xs, height=h, color=colour, label=name)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["name"] for _, r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("seconds from the patch ready to the last member holding (relay) or serving (chain, full); "
                  "median over patch versions", fontsize=8)
    ax.set_title("Cross-region fan-out on the emulated WAN: tern against the baselines")
    ax.grid(axis="x", which="both", alpha=0.3)
    from matplotlib.ticker import FormatStrFormatter  # matplotlib is imported by plot_all only
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return save(plt, fig, rows, out, "fanout_time.png")


def testbed(r):
    return "RTT x%g, WAN rates x%g" % (r.get("rtt_scale", 1), r.get("rate_scale", 1))


def line(ax, pts, style, colour, label):
    """One series of (x, y) points; none: nothing drawn."""
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=colour, label=label)


def members_axis(ax, ns):
    """Log axes over the member counts, each count a tick."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns)
    ax.set_xticklabels([str(n) for n in ns])
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=7)


def plot_members(plt, rows, out):
    relay = [(m, r) for m, r in rows if r["shape"] == "relay" and r.get("tern_last_s")]
    beds = []
    for _, r in relay:
        if testbed(r) not in beds:
            beds.append(testbed(r))
    if not beds:
        return None
    fig, axes = plt.subplots(2, len(beds), figsize=(5.5 * len(beds), 8), squeeze=False)
    for col, bed in enumerate(beds):
        # The last run of a configuration stands for it (runs are given in
        # time order).
        by_n = {}
        for _, r in relay:
            if testbed(r) == bed:
                by_n[r["members"]] = r
        ns = sorted(by_n)
        ax = axes[0][col]
        for key, name, colour in SERIES:
            pts = [(n, by_n[n][key]) for n in ns if by_n[n].get(key)]
            line(ax, pts, "o-", colour, name)
        members_axis(ax, ns)
        ax.set_title("relay-only members, %s" % bed, fontsize=9)
        ax.set_ylabel("seconds to the last member holding")
        ax = axes[1][col]
        for key, name, colour in SERIES[2:6]:
            pts = [(n, by_n[n][key] / by_n[n]["tern_last_s"]) for n in ns if by_n[n].get(key)]
            line(ax, pts, "o-", colour, name + " / tern")
        pts = [(n, by_n[n]["tern_last_s"] / by_n[n]["bound_s"]) for n in ns if by_n[n].get("bound_s")]
        line(ax, pts, "o--", "#1f77b4", "tern / bound")
        ax.axhline(1.3, color="#1f77b4", lw=0.6, ls=":")
        members_axis(ax, ns)
        ax.set_xlabel("members (spread over ca/eu/ap)")
        ax.set_ylabel("times tern (tern: times the bound; dotted: 1.3x)")
    return save(plt, fig, relay, out, "fanout_members.png")


def plot_wan_bytes(plt, rows, out):
    # The configuration with the most baselines' link counters, the last such.
    def n_methods(r):
        return sum(1 for k in ("wan_bytes_patch", "c_wan_bytes", "d_wan_bytes", "a_wan_bytes") if r.get(k))
    cand = [(m, r) for m, r in rows if r.get("wan_bytes_patch")]
    if not cand:
        return None
    best = max(n_methods(r) for _, r in cand)
    m, r = [x for x in cand if n_methods(x[1]) == best][-1]
    methods = [("wan_bytes_patch", "tern (one patch version)", "#1f77b4"),
               ("c_wan_bytes", "(c) PULSE via tree", "#9467bd"),
               ("d_wan_bytes", "(d) store pull (one delta)", "#d62728"),
               ("a_wan_bytes", "(a) full checkpoint star", "#8c564b")]
    links = sorted({k for key, _, _ in methods for k, v in (r.get(key) or {}).items() if v > 20000})
    if not links:
        return None
    fig, ax = plt.subplots(figsize=(10, 5))
    w = 0.8 / len(methods)
    for k, (key, name, colour) in enumerate(methods):
        d = r.get(key) or {}
        xs = [i + (k - len(methods) / 2 + 0.5) * w for i, l in enumerate(links) if d.get(l)]
        ys = [d[l] / 1e6 for l in links if d.get(l)]
        if xs:
            ax.bar(xs, ys, width=w, color=colour, label=name)
    ax.set_xticks(range(len(links)))
    ax.set_xticklabels(links, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("MB on the link (IP bytes both ways, the forwarder's counters)")
    ax.set_title("Bytes on each WAN link, %s (%d members)" % (r["name"], r["members"]))
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return save(plt, fig, [(m, r)], out, "fanout_wan_bytes.png")


def plot_sim(plt, rows, out):
    pts = [(m, r) for m, r in rows if r.get("sim_s") and r.get("tern_last_s")]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(7, 7))
    lo = min(min(r["sim_s"], r["tern_last_s"]) for _, r in pts) * 0.8
    hi = max(max(r["sim_s"], r["tern_last_s"]) for _, r in pts) * 1.25
    ax.plot([lo, hi], [lo, hi], color="#333333", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="#2ca02c", alpha=0.12,
                    label="within 15%")
    for shape, marker in (("chain", "s"), ("relay", "o"), ("full", "^")):
        sel = [r for _, r in pts if r["shape"] == shape]
        if sel:
            ax.scatter([r["tern_last_s"] for r in sel], [r["sim_s"] for r in sel], marker=marker, label=shape)
            for r in sel:
                ax.annotate(r["name"], (r["tern_last_s"], r["sim_s"]), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured: tern's last member (s)")
    ax.set_ylabel("tern_sim (s)")
    inside = sum(1 for _, r in pts if abs(r["sim_s"] / r["tern_last_s"] - 1) <= 0.15)
    ax.set_title("The simulator against the testbed: %d of %d within 15%%" % (inside, len(pts)))
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return save(plt, fig, pts, out, "fanout_sim.png")


def plot_all(paths, out):
    """Draws every figure the runs have data for; returns the files written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        # A virtual environment or pyenv without it: Debian's interpreter,
        # where scripts/install-deps.sh installs python3-matplotlib.
        system = "/usr/bin/python3"
        if os.path.realpath(sys.executable) != os.path.realpath(system) and os.access(system, os.X_OK):
            r = subprocess.run([system, os.path.abspath(__file__), "--out", out] + list(paths),
                               capture_output=True, text=True)
            if r.returncode == 0:
                return r.stdout.split()
            sys.stderr.write(r.stderr)
        print("plot.py: no matplotlib (scripts/install-deps.sh installs python3-matplotlib): no plots",
              file=sys.stderr)
        return []
    rows = load(paths)
    os.makedirs(out, exist_ok=True)
    return [p for p in (plot_time(plt, rows, out), plot_members(plt, rows, out), plot_wan_bytes(plt, rows, out),
                        plot_sim(plt, rows, out)) if p]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for the PNG files")
    ap.add_argument("results", nargs="+", help="results.json files of bench/fanout runs, oldest first")
    a = ap.parse_args()
    for p in a.results:
        if not os.path.isfile(p):
            ap.error("%s: no such file" % p)
    written = plot_all(a.results, a.out)
    for p in written:
        print(p)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
