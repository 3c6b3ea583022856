#!/usr/bin/env python3
"""Sweeps of the scale simulator (tern_sim) for docs/scale.md: the validation
table against the WAN testbed's recorded measurements, time per version and
bytes per WAN link for a 1T FP8 MoE and a 235B BF16 dense model over 100 to
5,000 islands in 3-5 regions at 10/25/100 Gb/s between regions, the effect
of fan-out, striping, chunk size, windows and relay failures, break-even
against (a) full checkpoints over HTTP and (d) every island pulling from one
store, and PNG plots with the public anchors on them.

It writes docs/scale/results.json, docs/scale/*.png and the generated part of
docs/scale.md (between the 'generated' markers). Every figure is computed
here from tern_sim's output; nothing is typed in but the inputs and the
measurements the validation compares against (with their dates).

  python3 bench/sim/scale.py --sim build/release/bench/sim/tern_sim [--quick]
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# One-way delays (ms) between the regions: us/eu/ap as in the WAN testbed
# (bench/agent_wan/wan.conf: US-East, EU-West, Tokyo), us-west and sa-east
# approximations of public inter-region latencies.
REGIONS = ["us", "eu", "ap", "usw", "sa"]
ONE_WAY_MS = {
    ("us", "eu"): 40, ("us", "ap"): 75, ("eu", "ap"): 90, ("us", "usw"): 30, ("us", "sa"): 60,
    ("eu", "usw"): 70, ("eu", "sa"): 95, ("ap", "usw"): 55, ("ap", "sa"): 130, ("usw", "sa"): 85,
}

MODELS = {
    # 0.15% of FP8 values per step: the top of the public GLM-4.x-Air FP8
    # figure (0.05-0.15%), inside our own simulation's 0.1-0.3% (DESIGN.md).
    "1T FP8 MoE": {"params": 1e12, "format": "fp8", "changed_fraction": 0.0015, "patch_format": 2},
    # ~1% of BF16 values per step (PULSE: ~99% bit-identical).
    "235B BF16 dense": {"params": 235e9, "format": "bf16", "changed_fraction": 0.01, "patch_format": 2},
}

# Public anchors (DESIGN.md section 6), in seconds or bytes.
ANCHORS_TIME = {
    "checkpoint-engine Kimi-K2 (1 cluster) 16 s": 16.0,
    "Perplexity TransferEngine Kimi-K2 (1 cluster) 1.3 s": 1.3,
    "SGLang P2P Kimi-K2 (RDMA) 7.2 s": 7.2,
}
ANCHOR_VERL = (11.0, 15.0)   # verl delta_sharded, Qwen3-235B, one cluster
ANCHOR_PAUSE = (0.98, 3.84)  # the seed system's activation pause
ANCHORS_PATCH = {
    "seed: GLM-5.2 FP8 11.71 GB": 11.71e9,
    "seed: Kimi K3 MXFP4 24.13 GB": 24.13e9,
    "Fireworks: 20.3 GiB / 1T FP8 step": 20.3 * 2**30,
}

# Validation: the WAN testbed's recorded measurements (docs/benchmarks.md,
# docs/agent.md section 8), held = the last member holds the object, serve =
# publish -> last member serving, as multiples of the driver's bound.
VALIDATION = [
    {"row": "format 1, 0.83-0.96 MB patches, push", "params": 20e6, "patch_bytes": 0.9e6, "changed": 0.049,
     "patch_format": 1, "push": True, "held_s": (0.11, 0.33), "serve_x": (2.9, 4.9),
     "when": "2026-12-02 02:23-02:29 UTC, idle VM (93bb1ea)"},
    {"row": "format 2, 0.60-0.69 MB patches, push", "params": 20e6, "patch_bytes": 0.65e6, "changed": 0.049,
     "patch_format": 2, "push": True, "held_s": (0.11, 0.33), "serve_x": (8.8, 13.2),
     "when": "2026-12-02 02:23-02:29 UTC, idle VM (93bb1ea)"},
    {"row": "50-70 kB patches (--params 2M), push", "params": 2e6, "patch_bytes": 60e3, "changed": 0.049,
     "patch_format": 2, "push": True, "held_s": (0.082, 0.115), "serve_x": (1.6, 2.7),
     "when": "held 2026-12-01 22:34-22:44 UTC (a1b7e5b); serve 2026-12-02 01:27-01:30 UTC, load 8-22 (dfc23d7)"},
    {"row": "50-70 kB patches, push off", "params": 2e6, "patch_bytes": 60e3, "changed": 0.049,
     "patch_format": 2, "push": False, "held_s": (0.225, 0.243), "serve_x": None,
     "when": "2026-12-01 22:34-22:44 UTC (a1b7e5b)"},
    {"row": "40 MB keyframe", "params": 20e6, "patch_bytes": 40.12e6, "changed": 0.049,
     "patch_format": 1, "push": True, "held_s": None, "serve_x": (12, 19),
     "when": "2026-12-01, load 4-8 (docs/agent.md section 8)"},
]
# Transport points (docs/benchmarks.md Transport, 2026-11-30 19:00 UTC, cc06427):
# (RTT ms, rate Mb/s, loss %, cc, measured tern 8 streams Mb/s, iperf3 -P1 Mb/s).
TRANSPORT = [
    (100, 1000, 0.01, "bbr", 858.0, 856.6), (100, 1000, 0.01, "cubic", 499.0, 103.6),
    (50, 100, 0, "bbr", 88.0, 92.9), (200, 500, 0.1, "bbr", 378.0, 348.0),
    (200, 500, 0.1, "cubic", 61.0, 7.7),
]


def git_version():
    try:
        rev = subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], text=True).strip()
        dirty = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--", "bench/sim", "topology",
                                "agent/membership"]).returncode
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%s, %d vCPUs, load %s" % (cpu, os.cpu_count(), " ".join(open("/proc/loadavg").read().split()[:3]))


class Sim:
    def __init__(self, binary, costs):
        self.binary, self.costs, self.runs, self.seconds = binary, costs, 0, 0.0
        self.refusals = []

    def run(self, scenario, path=False):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(scenario, f)
        try:
            t = time.time()
            p = subprocess.run(["nice", self.binary, "--scenario", f.name, "--costs", self.costs]
                               + ([] if path else ["--no-critical-path"]), text=True, capture_output=True)
            self.seconds += time.time() - t
            self.runs += 1
            if p.returncode != 0:
                # The planner may refuse a fleet (kResourceExhausted): a result too.
                self.refusals.append((scenario["name"], p.stderr.strip()))
                return None
            return json.loads(p.stdout)
        finally:
            os.unlink(f.name)


def scale_scenario(model, islands, regions, gbit, fanout=4, stripes=1, chunk=0, window=16, relay_cores=0,
                   failures=0.0, versions=1, patch_bytes=0, build="batch", root_gbit=100, island_gbit=100):
    names = REGIONS[:regions]
    per = [islands // regions + (1 if i < islands % regions else 0) for i in range(regions)]
    m = dict(MODELS[model])
    if patch_bytes:
        m["patch_bytes"] = patch_bytes
    links = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ms = ONE_WAY_MS.get((a, b)) or ONE_WAY_MS[(b, a)]
            links.append({"a": a, "b": b, "rate_gbit_s": gbit, "one_way_ms": ms, "loss": 0.0001})
    return {
        "name": "%s, %d islands, %d regions, %g Gb/s" % (model, islands, regions, gbit),
        "model": m,
        "topology": {
            "root_region": "us", "root_uplink_gbit_s": root_gbit,
            "regions": [{"name": n, "islands": k, "clusters": max(1, (k + 31) // 32),
                         "island_downlink_gbit_s": island_gbit, "one_way_ms": 0.5} for n, k in zip(names, per)],
            "links": links,
        },
        "plan": {"fanout_max": fanout, "root_fanout_max": 8, "stripes": stripes, "build": build},
        "transport": {"chunk_bytes": chunk, "window_chunks": window, "push_window_bytes": 2 << 20,
                      "streams": 8, "congestion": "bbr"},
        "hosts": {"apply_cores": 16, "encode_cores": 32, "relay_cores": relay_cores},
        "versions": versions, "version_interval_s": 60,
        "failures": {"relay_failures_per_hour": failures, "detect_s": 3.0, "repair_s": 600, "seed": 1},
    }


def testbed_scenario(v):
    with open(os.path.join(HERE, "scenarios", "testbed.json")) as f:
        s = json.load(f)
    s["model"].update({"params": v["params"], "patch_bytes": v["patch_bytes"], "changed_fraction": v["changed"],
                       "patch_format": v["patch_format"]})
    s["transport"]["push_window_bytes"] = (2 << 20) if v["push"] else 0
    return s


def link_scenario(rtt_ms, mbit, loss_pct, cc):
    return {
        "name": "one link", "model": {"params": 1e9, "format": "bf16", "patch_bytes": 2e9},
        "topology": {"root_region": "a", "root_uplink_gbit_s": 100,
                     "regions": [{"name": "a", "islands": 0, "island_downlink_gbit_s": 100},
                                 {"name": "b", "islands": 1, "island_downlink_gbit_s": 100, "one_way_ms": 0}],
                     "links": [{"a": "a", "b": "b", "rate_gbit_s": mbit / 1000, "one_way_ms": rtt_ms / 2,
                                "loss": loss_pct / 100}]},
        "transport": {"chunk_bytes": 1 << 20, "window_chunks": 4096, "push_window_bytes": 1 << 40,
                      "streams": 8, "congestion": cc},
    }


def fmt_s(x):
    return "%.3g" % x if x < 100 else "%.0f" % x


def gb(x):
    return "%.2f" % (x / 1e9)


def rng(t):
    return "%g-%g" % t if t else "—"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sim", default=os.path.join(ROOT, "build/release/bench/sim/tern_sim"))
    ap.add_argument("--costs", default=os.path.join(HERE, "costs.json"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "docs/scale"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs/scale.md"))
    ap.add_argument("--quick", action="store_true", help="fewer points (a smoke run)")
    a = ap.parse_args()
    sim = Sim(a.sim, a.costs)
    os.makedirs(a.out_dir, exist_ok=True)
    results = {"code": git_version(), "machine": machine(), "command": " ".join(["python3"] + sys.argv)}
    md = []
    header = ("Machine: %s. Code: `%s`. Command: `python3 bench/sim/scale.py%s` (%s)."
              % (results["machine"], results["code"], " --quick" if a.quick else "",
                 time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))

    # ---- Validation ------------------------------------------------------
    val = []
    md.append("### Validation against the WAN testbed\n\n" + header + "\n")
    md.append("| configuration | patch | model: last holds (s) | measured: last holds (s) | model: serve / bound "
              "| measured: serve / bound | measured when |")
    md.append("|---|---|---|---|---|---|---|")
    for v in VALIDATION:
        r = sim.run(testbed_scenario(v))
        ver = r["versions"][0]
        ratio = ver["last_serving_s"] / r["bound"]["s"]
        val.append({"row": v["row"], "held_s": ver["last_holding_s"], "serve_s": ver["last_serving_s"],
                    "bound_s": r["bound"]["s"], "serve_over_bound": ratio, "measured": v})
        md.append("| %s | %.2f MB | %.3f | %s | %.1f× | %s | %s |" % (
            v["row"], v["patch_bytes"] / 1e6, ver["last_holding_s"], rng(v["held_s"]), ratio,
            (rng(v["serve_x"]) + "×") if v["serve_x"] else "—", v["when"]))
    md.append("")
    md.append("| link (transport table) | cc | model Mb/s | measured tern 8 streams Mb/s | measured iperf3 -P1 Mb/s |")
    md.append("|---|---|---|---|---|")
    for rtt, mbit, loss, cc, tern8, p1 in TRANSPORT:
        r = sim.run(link_scenario(rtt, mbit, loss, cc))
        t = r["versions"][0]["last_holding_s"] - rtt / 2000
        rate = 2e9 * 8 / t / 1e6
        val.append({"link": [rtt, mbit, loss, cc], "model_mbit": rate, "tern8_mbit": tern8, "iperf1_mbit": p1})
        md.append("| %d ms, %d Mb/s, %g%% | %s | %.0f | %.0f | %.1f |" % (rtt, mbit, loss, cc, rate, tern8, p1))
    # The one chain measured: RelayTest.ChainOverTcp (root -> a -> b on
    # 127.0.0.1, one process, 32 MiB in 1 MiB chunks, windows of 8), b done
    # 25-38 ms after a (docs/benchmarks-journal.md, "Transfer agent on one
    # machine", 2026-12-01). Loopback rate: `tern xfer get` of 256 MiB in
    # 0.23 s (docs/benchmarks.md Transport, 2026-12-01) = 9.3 Gb/s.
    chain = {
        "name": "loopback chain", "model": {"params": 16e6, "format": "bf16", "patch_bytes": 32 << 20},
        "topology": {"root_region": "lo", "root_uplink_gbit_s": 9.3,
                     "regions": [{"name": "lo", "islands": 2, "clusters": 2, "island_downlink_gbit_s": 9.3,
                                  "one_way_ms": 0.02}]},
        "plan": {"fanout_max": 1, "root_fanout_max": 1},
        "transport": {"chunk_bytes": 1 << 20, "window_chunks": 8, "push_window_bytes": 0, "streams": 1},
        # The root and two relays in one process on the 2-core VM.
        "hosts": {"relay_cores": 2 / 3},
    }
    r = sim.run(chain, path=True)
    hops = r["versions"][0]["critical_path"]
    gap_ms = (hops[2]["last_chunk_s"] - hops[1]["last_chunk_s"]) * 1e3
    val.append({"chain": "RelayTest.ChainOverTcp", "model_gap_ms": gap_ms, "measured_gap_ms": [25, 38],
                "model_first_done_ms": hops[1]["last_chunk_s"] * 1e3})
    md.append("")
    md.append("| chain (the only one measured) | model: b done after a (ms) | measured (ms) | measured when |")
    md.append("|---|---|---|---|")
    md.append("| root → a → b, 32 MiB in 1 MiB chunks, windows of 8, tcp on 127.0.0.1, one process "
              "(RelayTest.ChainOverTcp) | %.1f | 25–38 | 2026-12-01 (benchmarks-journal.md, Transfer agent on "
              "one machine) |" % gap_ms)
    results["validation"] = val
    md.append("")

    # ---- Scale grid -----------------------------------------------------
    islands_list = [100, 1000] if a.quick else [100, 1000, 5000]
    regions_list = [3, 5]
    rates = [10, 25, 100]
    grid = []
    md.append("### Time per version and bytes per WAN link\n\n" + header + "\n")
    md.append("Plans: `batch` (topology::MakePlan), fan-out 4, root fan-out 8, one stripe, the root's chunks "
              "(agent::DefaultChunkBytes: 4 MiB for these patches), 16-chunk windows per parent link (RelayOptions), push 2 MiB, 8 BBR streams, 0.01% loss on WAN links, root uplink and island "
              "downlinks 100 Gb/s, 32 islands per cluster, apply on 16 CPU cores per island (format 2).\n")
    md.append("| model | islands | regions | Gb/s | patch GB | first holds (s) | last holds (s) | bound (s) "
              "| last / bound | depth | last holds, 256-chunk windows (s) | last serves (s) | (d) store pull (s) "
              "| (a) full HTTP star (s) | WAN GB per link (root → each region) |")
    md.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in MODELS:
        for n in islands_list:
            for reg in regions_list:
                for g in rates:
                    r = sim.run(scale_scenario(model, n, reg, g))
                    ver = r["versions"][0]
                    row = {"model": model, "islands": n, "regions": reg, "gbit": g, "patch_bytes": r["patch_bytes"],
                           "view_bytes": r["view_bytes"], "first_holding_s": ver["first_holding_s"],
                           "last_holding_s": ver["last_holding_s"], "last_serving_s": ver["last_serving_s"],
                           "bound_s": r["bound"]["s"], "depth": r["plan"]["depth_max"],
                           "store_pull_s": r["baselines"]["d_store_pull"]["last_holding_s"],
                           "full_star_s": r["baselines"]["a_full_star_http"]["last_holding_s"],
                           "wan_bytes": ver["wan_bytes"], "apply_s": r["apply_s"],
                           "planner_estimate_s": r["planner_estimate_s"]}
                    # The same fleet with windows past the bandwidth-delay product.
                    w = sim.run(scale_scenario(model, n, reg, g, window=256))
                    row["last_holding_w256_s"] = w["versions"][0]["last_holding_s"]
                    grid.append(row)
                    wan = sorted(set(round(x / 1e9, 2) for x in ver["wan_bytes"].values()))
                    md.append("| %s | %d | %d | %d | %s | %s | %s | %s | %.1f× | %d | %s | %s | %s | %s | %s |" % (
                        model, n, reg, g, gb(r["patch_bytes"]), fmt_s(ver["first_holding_s"]),
                        fmt_s(ver["last_holding_s"]), fmt_s(r["bound"]["s"]),
                        ver["last_holding_s"] / r["bound"]["s"], r["plan"]["depth_max"],
                        fmt_s(row["last_holding_w256_s"]),
                        fmt_s(ver["last_serving_s"]), fmt_s(row["store_pull_s"]), fmt_s(row["full_star_s"]),
                        ", ".join("%g" % w for w in wan) + " × %d links" % len(ver["wan_bytes"])))
    results["grid"] = grid
    md.append("")

    # ---- Knobs: fan-out, stripes, chunk, window, plan build --------------
    knobs = []
    base = dict(model="1T FP8 MoE", islands=1000, regions=5, gbit=25)
    md.append("### Fan-out, striping, chunk size, windows\n\n" + header + "\n")
    md.append("1T FP8 MoE, 1,000 islands, 5 regions, 25 Gb/s between regions, otherwise as above. Relay "
              "cores: a relay's sends capped at cores / (1.6 CPU s per forwarded GB) over its children; "
              "elsewhere not capped.\n")
    md.append("| knob | value | last holds (s) | last / bound | depth | WAN GB into the regions (sum) |")
    md.append("|---|---|---|---|---|---|")
    variants = [("fan-out", "fanout", [2, 4, 8, 16])]
    variants += [("stripes (batch plan)", "stripes", [1, 2, 4])]
    variants += [("chunk MiB", "chunk", [1 << 20, 4 << 20, 16 << 20, 64 << 20])]
    variants += [("window chunks", "window", [4, 16, 64, 256, 1024])]
    variants += [("relay cores (256-chunk windows)", "relay_cores", [1, 2, 4, 16])]
    for label, key, values in variants:
        for val_ in values:
            kw = dict(base)
            kw[key] = val_
            if key == "relay_cores":
                kw["window"] = 256
            r = sim.run(scale_scenario(**kw))
            ver = r["versions"][0]
            shown = val_ / (1 << 20) if key == "chunk" else val_
            knobs.append({"knob": key, "value": val_, "last_holding_s": ver["last_holding_s"],
                          "bound_s": r["bound"]["s"], "depth": r["plan"]["depth_max"],
                          "wan_bytes": sum(ver["wan_bytes"].values())})
            md.append("| %s | %g | %s | %.1f× | %d | %s |" % (label, shown, fmt_s(ver["last_holding_s"]),
                                                             ver["last_holding_s"] / r["bound"]["s"],
                                                             r["plan"]["depth_max"], gb(sum(ver["wan_bytes"].values()))))
    for stripes in [1, 2, 4]:
        kw = dict(base, stripes=stripes, build="joins")
        r = sim.run(scale_scenario(**kw))
        if r is None:
            knobs.append({"knob": "stripes_joins", "value": stripes, "refused": sim.refusals[-1][1]})
            md.append("| stripes (joins: the root's Membership) | %d | refused by the planner: %s | | | |" % (
                stripes, sim.refusals[-1][1].replace("|", "/")))
            continue
        ver = r["versions"][0]
        knobs.append({"knob": "stripes_joins", "value": stripes, "last_holding_s": ver["last_holding_s"],
                      "bound_s": r["bound"]["s"], "depth": r["plan"]["depth_max"],
                      "wan_bytes": sum(ver["wan_bytes"].values())})
        md.append("| stripes (joins: the root's Membership) | %d | %s | %.1f× | %d | %s |" % (
            stripes, fmt_s(ver["last_holding_s"]), ver["last_holding_s"] / r["bound"]["s"], r["plan"]["depth_max"],
            gb(sum(ver["wan_bytes"].values()))))
    results["knobs"] = knobs
    md.append("")

    # ---- Failures ----------------------------------------------------------
    fails = []
    md.append("### Relay failures\n\n" + header + "\n")
    md.append("One version a minute for an hour (60 versions), failures a Poisson process per island, "
              "detection 3 s (`--dead-after-ms` for a silent relay), a failed island back after 10 min; "
              "the orphans resume from their verified chunks at the parent RemoveMember gives them.\n")
    md.append("| model | islands | Gb/s | failures / island / hour | versions hit | failed islands | "
              "last holds: median (s) | p99 (s) | max (s) |")
    md.append("|---|---|---|---|---|---|---|---|---|")
    fail_islands = [1000] if a.quick else [1000, 5000]
    for n in fail_islands:
        for rate in [0.0, 0.01, 0.1]:
            r = sim.run(scale_scenario("1T FP8 MoE", n, 5, 25, failures=rate, versions=60))
            held = sorted(v["last_holding_s"] for v in r["versions"])
            hit = sum(1 for v in r["versions"] if v["failed"])
            nf = sum(v["failed"] for v in r["versions"])
            p = lambda q: held[min(len(held) - 1, int(q * len(held)))]
            fails.append({"islands": n, "rate": rate, "held": held, "versions_hit": hit, "failed": nf})
            md.append("| 1T FP8 MoE | %d | 25 | %g | %d / 60 | %d | %s | %s | %s |" % (
                n, rate, hit, nf, fmt_s(p(0.5)), fmt_s(p(0.99)), fmt_s(held[-1])))
    md.append("")
    md.append("The worst single failure: the first relay on the critical path (a region's head) fails 1 s "
              "into a version; the rest of its region waits for detection and re-attachment.\n")
    md.append("| model | islands | Gb/s | failed relay | detect (s) | last holds, no failure (s) | with it (s) | cost (s) |")
    md.append("|---|---|---|---|---|---|---|---|")
    for n in fail_islands:
        sc = scale_scenario("1T FP8 MoE", n, 5, 25)
        clean = sim.run(sc, path=True)
        head = clean["versions"][0]["critical_path"][1]["id"]
        for detect in [0.2, 3.0]:
            sc["failures"]["at"] = [{"t_s": 1.0, "island": head}]
            sc["failures"]["detect_s"] = detect
            hit = sim.run(sc)
            t0, t1 = clean["versions"][0]["last_holding_s"], hit["versions"][0]["last_holding_s"]
            fails.append({"islands": n, "head": head, "detect_s": detect, "clean_s": t0, "failed_s": t1})
            md.append("| 1T FP8 MoE | %d | 25 | %s | %g | %s | %s | %s |" % (n, head, detect, fmt_s(t0), fmt_s(t1),
                                                                       fmt_s(t1 - t0)))
    results["failures"] = fails
    md.append("")

    # ---- Break-even against (d) and (a) ---------------------------------
    be = []
    md.append("### Break-even against the baselines\n\n" + header + "\n")
    md.append("(d): every island pulls each patch from one store in the root's region with 100 Gb/s of egress "
              "and the agent's 8 streams, no relays. (a): every island downloads the full checkpoint over one "
              "HTTP stream from the root. Islands spread evenly over 5 regions.\n")
    md.append("| model | Gb/s | tree (s) at 100 islands | islands where (d) = tree | (d) / tree at 1,000 "
              "| (a) / tree at 1,000 | versions of patches per full checkpoint (bytes) |")
    md.append("|---|---|---|---|---|---|---|")
    small = [5, 10, 15, 20, 30, 40, 60, 80, 100, 150, 200, 300, 500, 1000]
    for model in MODELS:
        for g in rates:
            pts = []
            for n in small:
                r = sim.run(scale_scenario(model, n, 5, g))
                pts.append((n, r["versions"][0]["last_holding_s"], r["baselines"]["d_store_pull"]["last_holding_s"],
                            r["baselines"]["a_full_star_http"]["last_holding_s"], r["patch_bytes"], r["view_bytes"]))
            cross = None
            for (n0, t0, d0, *_), (n1, t1, d1, *_) in zip(pts, pts[1:]):
                if d0 <= t0 and d1 > t1:
                    f = (t0 - d0) / ((d1 - d0) - (t1 - t0))
                    cross = n0 + f * (n1 - n0)
                    break
            if cross is None and pts[0][2] > pts[0][1]:
                cross = "< %d" % pts[0][0]
            last = pts[-1]
            be.append({"model": model, "gbit": g, "points": pts, "cross": cross})
            md.append("| %s | %d | %s | %s | %.1f× | %.0f× | %.0f |" % (
                model, g, fmt_s([p for p in pts if p[0] == 100][0][1]),
                cross if isinstance(cross, str) else ("%.0f" % cross if cross else "> %d" % small[-1]),
                last[2] / last[1], last[3] / last[1], last[5] / last[4]))
    results["break_even"] = be
    md.append("")

    # ---- Anchors: patch sizes -------------------------------------------
    anch = []
    md.append("### The public patch sizes through the same fleet\n\n" + header + "\n")
    md.append("1,000 islands in 5 regions; patch bytes given instead of computed.\n")
    md.append("| patch | GB | Gb/s | last holds (s) | with 256-chunk windows (s) | bound (s) | (d) store pull (s) |")
    md.append("|---|---|---|---|---|---|---|")
    for label, b in list(ANCHORS_PATCH.items()):
        for g in rates:
            r = sim.run(scale_scenario("1T FP8 MoE", 1000, 5, g, patch_bytes=b))
            ver = r["versions"][0]
            w = sim.run(scale_scenario("1T FP8 MoE", 1000, 5, g, patch_bytes=b, window=256))["versions"][0]
            anch.append({"label": label, "bytes": b, "gbit": g, "last_holding_s": ver["last_holding_s"],
                         "w256_s": w["last_holding_s"],
                         "bound_s": r["bound"]["s"], "store_pull_s": r["baselines"]["d_store_pull"]["last_holding_s"]})
            md.append("| %s | %s | %d | %s | %s | %s | %s |" % (label, gb(b), g, fmt_s(ver["last_holding_s"]),
                                                              fmt_s(w["last_holding_s"]),
                                                          fmt_s(r["bound"]["s"]),
                                                          fmt_s(anch[-1]["store_pull_s"])))
    results["anchors"] = anch
    md.append("")
    md.append("%d simulator runs, %.0f s in all." % (sim.runs, sim.seconds))

    with open(os.path.join(a.out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    plots(results, a.out_dir)
    write_doc(a.doc, "\n".join(md))
    print("\n".join(md))


def plots(res, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("scale.py: no matplotlib (apt-get install python3-matplotlib): tables only", file=sys.stderr)
        return
    foot = "tern_sim %s; %s" % (res["code"], res["machine"])

    def anchors(ax, model):
        if model.startswith("1T"):
            for (label, t), c in zip(ANCHORS_TIME.items(), ["tab:red", "tab:purple", "tab:brown"]):
                ax.axhline(t, color=c, lw=0.8, ls=":")
                ax.text(ax.get_xlim()[0], t, " " + label, color=c, fontsize=6, va="bottom")
        else:
            ax.axhspan(*ANCHOR_VERL, color="tab:red", alpha=0.12)
            ax.text(ax.get_xlim()[0], ANCHOR_VERL[1], " verl delta_sharded Qwen3-235B (1 cluster) 11-15 s",
                    color="tab:red", fontsize=6, va="bottom")
        ax.axhspan(*ANCHOR_PAUSE, color="tab:gray", alpha=0.15)
        ax.text(ax.get_xlim()[0], ANCHOR_PAUSE[0], " seed system: activation pause 0.98-3.84 s", color="dimgray",
                fontsize=6, va="top")

    for model in MODELS:
        fig, ax = plt.subplots(figsize=(7, 5.2))
        rows = [g for g in res["grid"] if g["model"] == model and g["regions"] == 5]
        for gbit, c in zip([10, 25, 100], ["tab:blue", "tab:orange", "tab:green"]):
            pts = sorted((r["islands"], r) for r in rows if r["gbit"] == gbit)
            xs = [p[0] for p in pts]
            ax.plot(xs, [p[1]["last_holding_s"] for p in pts], "o-", color=c, label="tree, %d Gb/s" % gbit)
            ax.plot(xs, [p[1]["last_holding_w256_s"] for p in pts], "s-.", ms=3, color=c,
                    label="tree, 256-chunk windows, %d Gb/s" % gbit)
            ax.plot(xs, [p[1]["bound_s"] for p in pts], "--", color=c, lw=0.8, label="bound, %d Gb/s" % gbit)
            ax.plot(xs, [p[1]["store_pull_s"] for p in pts], ":", color=c, lw=1.2, label="(d) store pull, %d Gb/s" % gbit)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("islands (5 regions)")
        ax.set_ylabel("publish → last island holds the patch (s)")
        p = rows[0]["patch_bytes"] / 1e9 if rows else 0
        ax.set_title("%s: %.2f GB patch per version" % (model, p), fontsize=10)
        anchors(ax, model)
        ax.legend(fontsize=6, ncol=3, loc="upper left", bbox_to_anchor=(0, -0.15))
        ax.set_ylim(bottom=0.1)
        fig.text(0.01, 0.005, foot, fontsize=5)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "time_%s.png" % ("1t_fp8" if model.startswith("1T") else "235b_bf16")), dpi=130)
        plt.close(fig)

    fig, axs = plt.subplots(1, 4, figsize=(12, 3.2))
    for ax, key, label in zip(axs, ["fanout", "stripes", "chunk", "window"],
                              ["fan-out", "stripes (batch plan)", "chunk MiB", "window (chunks)"]):
        pts = [k for k in res["knobs"] if k["knob"] == key]
        xs = [k["value"] / (1 << 20) if key == "chunk" else k["value"] for k in pts]
        ax.plot(xs, [k["last_holding_s"] for k in pts], "o-", label="tree")
        ax.plot(xs, [k["bound_s"] for k in pts], "--", lw=0.8, label="bound")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(label)
        ax.set_ylim(bottom=0)
        if key == "stripes":
            js = [k for k in res["knobs"] if k["knob"] == "stripes_joins" and "refused" not in k]
            ax.plot([k["value"] for k in js], [k["last_holding_s"] for k in js], "s:", label="joins")
        ax.legend(fontsize=6)
    axs[0].set_ylabel("last island holds (s)")
    fig.suptitle("1T FP8 MoE, 1,000 islands, 5 regions, 25 Gb/s", fontsize=9)
    fig.text(0.01, 0.005, foot, fontsize=5)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "knobs.png"), dpi=130)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for f in [x for x in res["failures"] if "held" in x]:
        ax.plot(range(1, len(f["held"]) + 1), f["held"], label="%d islands, %g/h" % (f["islands"], f["rate"]))
    ax.set_xlabel("versions, sorted by time")
    ax.set_ylabel("last island holds (s)")
    ax.set_title("Relay failures over an hour (60 versions), 1T FP8, 25 Gb/s", fontsize=9)
    ax.legend(fontsize=6)
    fig.text(0.01, 0.005, foot, fontsize=5)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "failures.png"), dpi=130)
    plt.close(fig)

    fig, axs = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, model in zip(axs, MODELS):
        for b in [x for x in res["break_even"] if x["model"] == model]:
            xs = [p[0] for p in b["points"]]
            l, = ax.plot(xs, [p[1] for p in b["points"]], "o-", ms=3, label="tree %d Gb/s" % b["gbit"])
            ax.plot(xs, [p[2] for p in b["points"]], ":", color=l.get_color(), label="(d) %d Gb/s" % b["gbit"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("islands (5 regions)")
        ax.set_ylabel("last island holds (s)")
        ax.set_title(model, fontsize=9)
        anchors(ax, model)
        ax.legend(fontsize=6, loc="lower right")
    fig.text(0.01, 0.005, foot, fontsize=5)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "break_even.png"), dpi=130)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for gbit, c in zip([10, 25, 100], ["tab:blue", "tab:orange", "tab:green"]):
        pts = sorted((a["bytes"], a) for a in res["anchors"] if a["gbit"] == gbit)
        pts += sorted((g["patch_bytes"], {"last_holding_s": g["last_holding_s"], "w256_s": g["last_holding_w256_s"],
                                          "bound_s": g["bound_s"]})
                      for g in res["grid"] if g["islands"] == 1000 and g["regions"] == 5 and g["gbit"] == gbit)
        pts.sort(key=lambda p: p[0])
        xs = [p[0] / 1e9 for p in pts]
        ax.plot(xs, [p[1]["last_holding_s"] for p in pts], "o-", color=c, label="16-chunk windows, %d Gb/s" % gbit)
        ax.plot(xs, [p[1]["w256_s"] for p in pts], "s-.", ms=3, color=c, label="256-chunk windows, %d Gb/s" % gbit)
        ax.plot(xs, [p[1]["bound_s"] for p in pts], "--", lw=0.8, color=c, label="bound, %d Gb/s" % gbit)
    ax.set_yscale("log")
    ax.set_xlabel("patch per version (GB)")
    ax.set_ylabel("last of 1,000 islands holds it (s)")
    lo, hi = ax.get_ylim()
    for label, b in ANCHORS_PATCH.items():
        ax.axvline(b / 1e9, color="gray", lw=0.6, ls=":")
        ax.text(b / 1e9, hi, label, rotation=90, fontsize=6, va="top", ha="right")
    for g in res["grid"]:
        if g["islands"] == 1000 and g["regions"] == 5 and g["gbit"] == 25:
            ax.axvline(g["patch_bytes"] / 1e9, color="tab:green", lw=0.6, ls=":")
            ax.text(g["patch_bytes"] / 1e9, hi, "tern: " + g["model"], rotation=90, fontsize=6, va="top",
                    ha="left", color="tab:green")
    ax.axhspan(*ANCHOR_PAUSE, color="tab:gray", alpha=0.15)
    ax.legend(fontsize=5, ncol=3, loc="lower right")
    ax.set_title("Patch sizes: tern's computed ones and the public anchors, 5 regions", fontsize=9)
    fig.text(0.01, 0.005, foot, fontsize=5)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "anchors.png"), dpi=130)
    plt.close(fig)


def write_doc(path, text):
    begin, end = "<!-- generated by bench/sim/scale.py: begin -->", "<!-- generated by bench/sim/scale.py: end -->"
    doc = open(path).read() if os.path.exists(path) else "%s\n%s\n" % (begin, end)
    if begin not in doc:
        doc += "\n%s\n%s\n" % (begin, end)
    head, rest = doc.split(begin, 1)
    tail = rest.split(end, 1)[1] if end in rest else ""
    with open(path, "w") as f:
        f.write(head + begin + "\n" + text + "\n" + end + tail)


if __name__ == "__main__":
    main()
