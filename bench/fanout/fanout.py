#!/usr/bin/env python3
"""bench/fanout: cross-region fan-out of a datagen trace on the emulated WAN
(tools/wan/wan.sh), tern against baselines in the same run, and tern_sim on
the same configurations. Run by bench/fanout/run.sh (needs root).

Regions (one-way delays modelled on public cloud inter-region round trips;
rates scaled to this 2-core machine, whose forwarder carries ~1.9 Gbit/s in
all): the root alone in `us`; members in `ca` (20 ms RTT from us), `eu`
(80 ms) and `ap` (150 ms), each with loss; hosts inside a region 0.5 ms apart,
unshaped. --rtt-scale multiplies every delay, --rate-scale every WAN rate.

Shapes: chain (one serving member per region), relay (N relay-only members
spread over the three regions: publish -> the last member holding the
verified object), full (N serving members). Per configuration
bench/fanout/measure.py runs tern, then baselines (a) full-checkpoint star
over HTTP, (c) a PULSE patch through the same tree (bench/tern_relay_blob)
and (d) store-pull of XOR+zstd deltas, on the same testbed; then
tern_sim gets the same topology and the measured patch size.
"""
import argparse
import glob
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
WAN = os.path.join(ROOT, "tools", "wan", "wan.sh")

MEMBER_REGIONS = ["ca", "eu", "ap"]
# (a, b): one-way ms, Mbit/s, loss %.
LINKS = {("us", "ca"): (10, 400, 0.01), ("us", "eu"): (40, 400, 0.02), ("us", "ap"): (75, 200, 0.05),
         ("ca", "eu"): (45, 200, 0.02), ("ca", "ap"): (80, 200, 0.05), ("eu", "ap"): (110, 100, 0.05)}
LAN_ONE_WAY_MS = 0.5
FORWARDER_GBIT = 1.9  # docs/wan.md: the forwarder's ceiling, unshaped, on this loaded VM


def memcpy_gb_s(mib=128, reps=5):
    """This machine's memcpy on one core (C's memmove through ctypes, the best
    of `reps` over two buffers already touched): the simulator's apply costs
    are multiples of it. The VMs differ about 2x (docs/benchmarks.md,
    Machines), so it is measured per run rather than assumed."""
    import ctypes
    n = mib << 20
    src, dst = bytearray(b"\x01") * n, bytearray(n)
    s, d = (ctypes.c_char * n).from_buffer(src), (ctypes.c_char * n).from_buffer(dst)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        ctypes.memmove(d, s, n)
        best = min(best, time.perf_counter() - t)
    del s, d
    return n / best / 1e9


def members_per_region(shape, n):
    if shape == "chain":
        return {r: 1 for r in MEMBER_REGIONS}
    return {r: n // 3 + (1 if i < n % 3 else 0) for i, r in enumerate(MEMBER_REGIONS)}


def scaled_mbit(mbit, rate_scale):
    """A WAN link's rate under --rate-scale (whole Mbit/s, at least 1)."""
    return max(1, int(round(mbit * rate_scale)))


def wan_config(per_region, rtt_scale, seed, rate_scale=1.0):
    lines = ["mtu 1500", "cc bbr", "seed %d" % seed, "region us hosts=1"]
    lines += ["region %s hosts=%d" % (r, per_region[r]) for r in MEMBER_REGIONS]
    for (a, b), (ms, mbit, loss) in LINKS.items():
        lines.append("link %s %s delay_ms=%g rate_mbit=%d loss_pct=%g" % (
            a, b, ms * rtt_scale, scaled_mbit(mbit, rate_scale), loss))
    lines += ["link %s %s delay_ms=%g" % (r, r, LAN_ONE_WAY_MS) for r in MEMBER_REGIONS if per_region[r] > 1]
    return "\n".join(lines) + "\n"


def bound(shipped, per_region, rtt_scale, rate_scale=1.0):
    """Patch bytes over min(root uplink, each region's ingress, each island's
    downlink) + one-way latency to the farthest island."""
    regions = [r for r in MEMBER_REGIONS if per_region[r]]
    rate_bit = min([scaled_mbit(LINKS[("us", r)][1], rate_scale) * 1e6 for r in regions] + [FORWARDER_GBIT * 1e9])
    far_s = max(LINKS[("us", r)][0] * rtt_scale / 1e3 + (LAN_ONE_WAY_MS / 1e3 if per_region[r] > 1 else 0)
                for r in regions)
    return shipped * 8 / rate_bit + far_s


def sim_scenario(cfg, patch_bytes, changed, params, fmt, patch_format, memcpy):
    per = cfg["per_region"]
    regions = [{"name": "us", "islands": 0, "clusters": 1, "island_downlink_gbit_s": FORWARDER_GBIT,
                "one_way_ms": LAN_ONE_WAY_MS}]
    regions += [{"name": r, "islands": per[r], "clusters": max(per[r], 1), "island_downlink_gbit_s": FORWARDER_GBIT,
                 "one_way_ms": LAN_ONE_WAY_MS} for r in MEMBER_REGIONS]
    links = [{"a": a, "b": b, "rate_gbit_s": scaled_mbit(mbit, cfg.get("rate_scale", 1.0)) / 1e3,
              "one_way_ms": ms * cfg["rtt_scale"], "loss": loss / 100}
             for (a, b), (ms, mbit, loss) in LINKS.items()]
    return {
        "name": "bench/fanout " + cfg["name"],
        "model": {"params": params, "format": "fp8" if fmt.startswith("fp8") else "bf16",
                  "changed_fraction": changed, "patch_format": patch_format, "patch_bytes": patch_bytes},
        "topology": {"root_region": "us", "root_uplink_gbit_s": FORWARDER_GBIT, "regions": regions, "links": links},
        "plan": {"fanout_max": 4, "root_fanout_max": 8, "stripes": 1},
        "transport": {"chunk_bytes": 0, "window_chunks": 16, "push_window_bytes": 2097152, "streams": 8,
                      "congestion": "bbr"},
        # Each agent applies on a pool of this machine's 2 cores, and every
        # member's apply shares those 2 (processor sharing in the simulator).
        "hosts": {"apply_cores": 2.0, "shared_apply_cores": 2.0, "encode_cores": 1,
                  "memcpy_gb_s_per_core": memcpy,
                  "about": "the members that apply share this machine's 2 cores"},
        "versions": 1,
    }


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def datagen(tern, out, params, steps, lr, fmt):
    t0 = time.time()
    r = subprocess.run([tern, "datagen", "--out", out, "--params", params, "--steps", str(steps), "--lr", lr,
                        "--format", fmt, "--threads", "2"], capture_output=True, text=True, check=True)
    changed = [float(x) / 100 for x in re.findall(r"([0-9.]+)% of \S+ values changed", r.stdout + r.stderr)]
    print("datagen %s: %s parameters, %d steps, lr %s: changed per step %s (%.1f s)" % (
        fmt, params, steps, lr, " ".join("%.2f%%" % (c * 100) for c in changed), time.time() - t0), flush=True)
    return changed


def summarize(cfg, res, changed):
    """One row of the table: medians over the patch versions (v >= 2)."""
    rows = [r for r in res["rows"] if "failed" not in r]
    patches = [r for r in rows if not r["keyframe"]]
    kf = next((r for r in rows if r["keyframe"]), None)
    per = cfg["per_region"]
    shipped = median([r["shipped"] for r in patches])
    b = bound(shipped, per, cfg["rtt_scale"], cfg.get("rate_scale", 1.0)) if shipped else None
    last = median([r["last_disk"] for r in patches])
    s = dict(name=cfg["name"], shape=cfg["shape"], members=sum(per.values()), per_region=per,
             rtt_scale=cfg["rtt_scale"], rate_scale=cfg.get("rate_scale", 1.0), format=cfg["format"],
             patch_bytes=shipped,
             changed=median(changed) if changed else None,
             view_bytes=rows[0]["view"] if rows else None, bound_s=b, tern_last_s=last,
             tern_last_status_s=median([r["last_status"] for r in patches]),
             tern_held_s=median([r.get("held_last") for r in patches]),
             applied_in_max_s=median([max(r["applied_in_s"].values()) if r.get("applied_in_s") else None
                                      for r in patches]),
             tern_first_s=median([r["first_disk"] for r in patches]),
             tern_publish_s=median([r["publish_s"] for r in patches]),
             tern_ready_s=median([r.get("ready_s") for r in patches]),
             ratio_to_bound=last / b if last and b else None,
             verified=all(r["verified"] == sum(per.values()) for r in rows) and len(rows) == cfg["versions"],
             keyframe_b_last_s=kf["last_disk"] if kf else None, keyframe_bytes=kf["shipped"] if kf else None,
             critical_path=max(patches, key=lambda r: r["last_disk"] or 0)["critical_path"] if patches else [],
             wan_bytes_patch=patches[-1]["wan_bytes"] if patches else {},
             last_by_region=patches[-1]["last_by_region"] if patches else {},
             machine_busy=median([r["machine_busy"] for r in patches]),
             # Per patch version: the format the root chose, its bytes, the
             # last member serving, the root's predictions and the load.
             per_version=[dict(version=r["version"], patch_format=r.get("patch_format"), shipped=r["shipped"],
                               last_s=r["last_disk"], predicted_s=r.get("predicted_s"), load=r.get("load"),
                               reason=r.get("format_reason"), wan_drops=r.get("wan_drops"),
                               tcp_loss=r.get("tcp_loss"), root_spans=r.get("root_spans"),
                               member_figures=r.get("member_figures")) for r in patches],
             agents_cpu_s=median([sum(r["cpu_s"].values()) for r in patches]),
             root_cpu_s=median([r["cpu_s"].get("root") for r in patches]),
             member_cpu_s_max=median([max(v for k, v in r["cpu_s"].items() if k != "root") for r in patches]),
             apply_cpu_s_max=median([max(r["apply_cpu_s"].values()) if r.get("apply_cpu_s") else None
                                     for r in patches]))
    base = res.get("baselines", {})
    if "a" in base:
        s["a_last_s"] = base["a"]["last"]
        s["a_verified"] = base["a"]["verified"]
        s["a_wan_bytes"] = base["a"]["wan_bytes"]
        s["a_over_tern"] = base["a"]["last"] / last if last else None
    if "d" in base and base["d"]:
        s["d_delta_bytes"] = median([r["delta_bytes"] for r in base["d"]])
        s["d_prep_s"] = median([r["prep_s"] for r in base["d"]])
        s["d_fetched_s"] = median([r["last_fetched"] for r in base["d"]])
        s["d_applied_s"] = median([r["last_applied"] for r in base["d"]])
        s["d_warm_s"] = median([r.get("last_fetched_warm") for r in base["d"]])
        s["d_verified"] = min(r["verified"] for r in base["d"])
        s["d_wan_bytes"] = base["d"][-1]["wan_bytes"]
        s["d_over_tern"] = s["d_fetched_s"] / last if last and s["d_fetched_s"] else None
    if base.get("c"):
        c = [r for r in base["c"] if "failed" not in r]
        s["c_failed"] = next((r["failed"] for r in base["c"] if "failed" in r), None)
        s["c_bytes"] = median([r["bytes"] for r in c])
        s["c_held_s"] = median([r["last_held"] for r in c])
        s["c_applied_s"] = median([r["last_applied"] for r in c])
        # Like for like: relay-only members hold, serving members apply.
        s["c_last_s"] = s["c_held_s"] if cfg["shape"] == "relay" else s["c_applied_s"]
        s["c_verified"] = min([r["verified"] for r in c] or [0])
        s["c_wan_bytes"] = c[-1]["wan_bytes"] if c else {}
        s["c_over_tern"] = s["c_last_s"] / last if last and s["c_last_s"] else None
    return s


def run_sim(a, cfg, s, work):
    if not a.sim or not s["patch_bytes"]:
        return
    # The format the root wrote most (--patch-format auto chooses per version).
    written = [v["patch_format"] for v in s.get("per_version", []) if v.get("patch_format") in (1, 2)]
    patch_format = max(set(written), key=written.count) if written else 2
    sc = sim_scenario(cfg, s["patch_bytes"], s["changed"] or 0.01, a.params_n, cfg["format"], patch_format,
                      a.memcpy_gb_s)
    path = os.path.join(work, "sim-%s.json" % cfg["name"].replace(" ", "_"))
    with open(path, "w") as f:
        json.dump(sc, f, indent=1)
    r = subprocess.run([a.sim, "--scenario", path, "--costs", os.path.join(ROOT, "bench", "sim", "costs.json"),
                        "--no-critical-path"], capture_output=True, text=True)
    if r.returncode != 0:
        s["sim_error"] = r.stderr.strip()[-300:]
        return
    j = json.loads(r.stdout)
    v = j["versions"][0]
    s["sim_s"] = v["last_holding_s"] if cfg["shape"] == "relay" else v["last_serving_s"]
    s["sim_holding_s"] = v["last_holding_s"]
    s["sim_apply_s"] = j["apply_s"]
    s["sim_holding_err"] = v["last_holding_s"] / s["tern_held_s"] - 1 if s.get("tern_held_s") else None
    s["sim_bound_s"] = j["bound"]["s"]
    s["sim_a_s"] = j["baselines"]["a_full_star_http"]["last_holding_s"] * (
        s["view_bytes"] / j["view_bytes"] if s.get("view_bytes") and j.get("view_bytes") else 1)
    s["sim_d_s"] = j["baselines"]["d_store_pull"]["last_holding_s"]
    s["sim_err"] = s["sim_s"] / s["tern_last_s"] - 1 if s["tern_last_s"] else None


def fmt(x, spec="%.3f"):
    return spec % x if x is not None else "-"


def markdown(results, meta):
    out = ["# bench/fanout results", "",
           "commit %s; %s (memcpy %s GB/s on one core); load before/after %s / %s; command: `%s`" % (
               meta["commit"], meta["machine"], meta.get("memcpy_gb_s_per_core", "?"), meta["load_start"],
               meta["load_end"], meta["command"]), "",
           "Times in seconds, medians over the patch versions (v >= 2), from the patch being ready on the root "
           "(tern: its object written and signed, before the root offers it; *ready*: `tern publish` called -> "
           "ready, and in brackets -> returned) or the delta being in the store (d) to the last member holding (relay) or serving (chain, full) "
           "it, read from the members' disks. bound = patch bytes / min(root uplink, each region's "
           "ingress, island downlink) + one-way latency to the farthest island. (a): the last version's full "
           "checkpoint from nginx to every island with curl, all at once. (d): every island curls the "
           "XOR+zstd delta from one nginx store (fetched; then applied = zstd -d + XOR + SHA-256).", "",
           "| config | members (ca/eu/ap) | patch MB (changed) | bound | tern last | x bound | tern first | "
           "ready (returned) | keyframe (b) | (a) last | (a)/tern | (d) MB | (d) fetched | (d) applied | (d)/tern | "
           "agents CPU s | apply CPU s max | machine busy | verified | sim | sim err |",
           "|" + "---|" * 21]
    for s in results:
        per = s["per_region"]
        out.append("| %s | %d (%s) | %s (%s) | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | "
                   "%s | %s | %s | %s | %s |" % (
                       s["name"], s["members"], "/".join(str(per[r]) for r in MEMBER_REGIONS),
                       fmt(s["patch_bytes"] and s["patch_bytes"] / 1e6), fmt(s["changed"] and s["changed"] * 100,
                                                                             "%.2f%%"),
                       fmt(s["bound_s"]), fmt(s["tern_last_s"]), fmt(s["ratio_to_bound"], "%.1fx"),
                       fmt(s["tern_first_s"]),
                       "%s (%s)" % (fmt(s.get("tern_ready_s")), fmt(s["tern_publish_s"])),
                       fmt(s["keyframe_b_last_s"]), fmt(s.get("a_last_s")), fmt(s.get("a_over_tern"), "%.1fx"),
                       fmt(s.get("d_delta_bytes") and s["d_delta_bytes"] / 1e6), fmt(s.get("d_fetched_s")),
                       fmt(s.get("d_applied_s")), fmt(s.get("d_over_tern"), "%.2fx"), fmt(s["agents_cpu_s"], "%.2f"),
                       fmt(s["apply_cpu_s_max"], "%.2f"), fmt(s["machine_busy"] and s["machine_busy"] * 100, "%.0f%%"),
                       "yes" if s["verified"] and s.get("a_verified", s["members"]) == s["members"] and
                       s.get("d_verified", s["members"]) == s["members"] and
                       s.get("c_verified", s["members"]) == s["members"] else "NO",
                       fmt(s.get("sim_s")), fmt(s.get("sim_err") and s["sim_err"] * 100, "%+.0f%%")))
    if any("c_bytes" in s for s in results):
        out += ["", "Baseline (c): each version's PULSE patch (bench/baselines/pulse.h: index gaps + raw values, "
                "zstd -1) through the tree the agent's root planned for the same testbed, by tern_relay_blob "
                "nodes (the agent's relay, chunking, transport and TLS); serving members apply it (PulseApply) "
                "and check the view's digest. Times from the root's Offer; tern's from the patch ready.", "",
                "| config | tern patch MB | (c) MB | (c) / tern bytes | tern last | (c) last holding | "
                "(c) last applied | (c) / tern | verified |", "|" + "---|" * 9]
        for s in results:
            if "c_bytes" not in s:
                continue
            out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                s["name"], fmt(s["patch_bytes"] and s["patch_bytes"] / 1e6),
                fmt(s["c_bytes"] and s["c_bytes"] / 1e6),
                fmt(s["c_bytes"] and s["patch_bytes"] and s["c_bytes"] / s["patch_bytes"], "%.2fx"),
                fmt(s["tern_last_s"]), fmt(s["c_held_s"]), fmt(s["c_applied_s"]), fmt(s["c_over_tern"], "%.2fx"),
                "%d/%d" % (s["c_verified"], s["members"]) + (" (%s)" % s["c_failed"] if s.get("c_failed") else "")))
    out += ["", "tern_sim on the same configurations (bench/sim/costs.json, the measured median patch size; "
            "relay: time to the last member holding, chain/full: serving; held: the last member holding the whole "
            "object, for serving members their commit minus the agent's 'applied in'; within 15%: |err| <= 15%):", "",
            "| config | measured | sim | err | within 15% | measured held | sim held | err | applied in (last, "
            "measured) | sim apply | (a) measured | (a) sim | (d) fetched | (d) warm | (d) sim |", "|" + "---|" * 15]
    for s in results:
        err = s.get("sim_err")
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            s["name"], fmt(s["tern_last_s"]), fmt(s.get("sim_s")), fmt(err and err * 100, "%+.0f%%"),
            "-" if err is None else "yes" if abs(err) <= 0.15 else "no", fmt(s.get("tern_held_s")),
            fmt(s.get("sim_holding_s")), fmt(s.get("sim_holding_err") and s["sim_holding_err"] * 100, "%+.0f%%"),
            fmt(s.get("applied_in_max_s")), fmt(s.get("sim_apply_s")), fmt(s.get("a_last_s")),
            fmt(s.get("sim_a_s")), fmt(s.get("d_fetched_s")), fmt(s.get("d_warm_s")), fmt(s.get("sim_d_s"))))
    if any(s.get("per_version") and s["per_version"][0].get("patch_format") for s in results):
        out += ["", "Patch format per version (docs/agent.md §6a; the root's choice, its patch bytes, publish "
                "-> the last member serving, the root's predictions for formats 1 / 2, the 1-minute load):", ""]
        for s in results:
            out.append("* **%s**: %s" % (s["name"], "; ".join(
                "v%d f%s %s MB %s s (pred %s / %s, load %s)" % (
                    r["version"], r.get("patch_format"), fmt(r["shipped"] and r["shipped"] / 1e6),
                    fmt(r.get("last_s")), fmt((r.get("predicted_s") or {}).get("1")),
                    fmt((r.get("predicted_s") or {}).get("2")), fmt(r.get("load"), "%.1f"))
                for r in s.get("per_version", []))))
    out += ["", "Per configuration: the tree's critical path of the slowest patch version (member: its disk time), "
            "the last member per region, bytes on each WAN link for one patch version (tern) and for (a) and (d) "
            "(IP bytes both ways, the forwarder's counters):", ""]
    for s in results:
        path = " -> ".join("%s %s" % (n, fmt(t)) for n, t in s["critical_path"])
        out.append("* **%s**: root -> %s; last per region %s; WAN bytes tern %s; (a) %s; (d) %s" % (
            s["name"], path, {k: round(v, 3) for k, v in s["last_by_region"].items()},
            {k: v for k, v in sorted(s["wan_bytes_patch"].items()) if v > 20000},
            {k: v for k, v in sorted(s.get("a_wan_bytes", {}).items()) if v > 20000},
            {k: v for k, v in sorted(s.get("d_wan_bytes", {}).items()) if v > 20000}))
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="chain relay full", help="chain, relay and/or full")
    ap.add_argument("--members", default="8 16 32", help="N for the relay shape")
    ap.add_argument("--full-members", default="8", help="N for the full shape (every member applies)")
    ap.add_argument("--rtt-scales", default="1", help="delay multipliers; each runs chain and relay N=16 too")
    ap.add_argument("--rate-scale", type=float, default=1.0,
                    help="multiplies every WAN link's rate (0.1: a bandwidth-bound tree, 200 Mbit/s -> 20)")
    ap.add_argument("--params", default="20M")
    ap.add_argument("--lr", default="2e-7", help="2e-7: ~1%% of BF16 values change per step at 20M")
    ap.add_argument("--versions", type=int, default=4, help="published versions (1: the keyframe)")
    ap.add_argument("--fp8", default="fp8-e4m3-block128", help="an FP8 format for one chain run ('' for none)")
    ap.add_argument("--fp8-lr", default="1e-6")
    ap.add_argument("--baselines", default="a c d",
                    help="a: full checkpoint star over HTTP; c: a PULSE patch through the same tree; "
                         "d: every island pulls an XOR+zstd delta from one store")
    ap.add_argument("--gap-s", type=float, default=2)
    ap.add_argument("--deadline-s", type=float, default=120)
    ap.add_argument("--no-tls", action="store_true")
    ap.add_argument("--agent-args", default="")
    ap.add_argument("--patch-formats", default="",
                    help="run each configuration once per root --patch-format listed (e.g. 'auto 1 2'), "
                         "on the same versions (docs/agent.md §6a)")
    ap.add_argument("--tern", required=True)
    ap.add_argument("--agent", required=True)
    ap.add_argument("--fwd", required=True)
    ap.add_argument("--sim", default="", help="tern_sim (none: no simulation)")
    ap.add_argument("--relay-blob", default="", help="bench/tern_relay_blob (baseline c)")
    ap.add_argument("--out", default="", help="write results.json and results.md here")
    ap.add_argument("--work-root", default="/var/tmp")
    ap.add_argument("--keep", action="store_true", help="keep the work directory, the agents' logs and data included")
    a = ap.parse_args()
    if not a.rate_scale > 0:
        ap.error("--rate-scale must be > 0")
    if "c" in a.baselines.split() and not a.relay_blob:
        print("fanout: no tern_relay_blob (build bench/tern_relay_blob or pass --relay-blob): baseline (c) "
              "skipped", file=sys.stderr)
        a.baselines = " ".join(b for b in a.baselines.split() if b != "c")
    # A TERM unwinds like an INT: the testbed comes down in `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    a.params_n = float(a.params[:-1]) * {"K": 1e3, "M": 1e6, "G": 1e9}[a.params[-1]] \
        if a.params[-1] in "KMG" else float(a.params)
    work = tempfile.mkdtemp(prefix="tern-fanout.", dir=a.work_root)
    os.chmod(work, 0o755)
    prefix = None
    meta = dict(commit=subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                      text=True).stdout.strip() or "?",
                machine="%d cores, %s" % (os.cpu_count(), open("/proc/cpuinfo").read().split("model name")[1]
                                          .split("\n")[0].strip(" :\t")),
                load_start=open("/proc/loadavg").read().split()[0], command=" ".join(sys.argv))
    a.memcpy_gb_s = meta["memcpy_gb_s_per_core"] = round(memcpy_gb_s(), 2)
    env = dict(os.environ, TERN_WAN_FWD=a.fwd)
    results, failed = [], False
    try:
        traces = {"bf16": (os.path.join(work, "trace-bf16"), datagen(a.tern, os.path.join(work, "trace-bf16"),
                                                                      a.params, a.versions - 1, a.lr, "bf16"))}
        configs = []
        scales = [float(x) for x in a.rtt_scales.split()]
        for sc in scales:
            tag = ("" if sc == 1 else " rtt x%g" % sc) + ("" if a.rate_scale == 1 else " rate x%g" % a.rate_scale)
            for shape in a.shapes.split():
                ns = [0] if shape == "chain" else [int(n) for n in (a.full_members if shape == "full" else
                                                                    a.members).split()]
                if sc != 1 and shape == "full":
                    continue
                if sc != 1 and shape != "chain":
                    ns = [16] if 16 in ns or not ns else ns[:1]
                for n in ns:
                    name = "chain" if shape == "chain" else "%s N=%d" % (shape, n)
                    # One run per --patch-formats entry, one after the other,
                    # on the same trace (the same versions).
                    for pf in a.patch_formats.split() or [""]:
                        configs.append(dict(name=name + tag + (" format %s" % pf if pf else ""), shape=shape, n=n,
                                            rtt_scale=sc, rate_scale=a.rate_scale, format="bf16",
                                            patch_format=pf))
        if a.fp8 and "chain" in a.shapes.split():
            traces["fp8"] = (os.path.join(work, "trace-fp8"), datagen(a.tern, os.path.join(work, "trace-fp8"),
                                                                     a.params, a.versions - 1, a.fp8_lr, a.fp8))
            configs.insert(1, dict(name="chain " + a.fp8, shape="chain", n=0, rtt_scale=1, rate_scale=a.rate_scale,
                                   format=a.fp8))
        for i, cfg in enumerate(configs):
            cfg["per_region"] = members_per_region(cfg["shape"], cfg["n"])
            cfg["versions"] = a.versions
            trace, changed = traces["fp8" if cfg["format"] != "bf16" else "bf16"]
            cdir = os.path.join(work, "c%02d" % i)
            os.makedirs(cdir)
            conf = os.path.join(cdir, "wan.conf")
            with open(conf, "w") as f:
                f.write(wan_config(cfg["per_region"], cfg["rtt_scale"], seed=1 + i, rate_scale=cfg["rate_scale"]))
            prefix = subprocess.run([WAN, "up", conf], capture_output=True, text=True, check=True,
                                    env=env).stdout.strip().split()[-1]
            state = "/run/tern-wan/%s" % prefix
            root_ns = open(os.path.join(state, "hosts")).readline().split()[1]
            print("== %s: testbed %s, load %s" % (cfg["name"], prefix, open("/proc/loadavg").read().split()[0]),
                  flush=True)
            argv = ["ip", "netns", "exec", root_ns, sys.executable, os.path.join(HERE, "measure.py"),
                    "--hosts", os.path.join(state, "hosts"), "--config", conf, "--state", state,
                    "--shape", cfg["shape"], "--trace", trace, "--versions", str(a.versions), "--tern", a.tern,
                    "--agent", a.agent, "--work", cdir, "--out", os.path.join(cdir, "result.json"),
                    "--baselines", a.baselines, "--gap-s", str(a.gap_s), "--deadline-s", str(a.deadline_s),
                    "--agent-args", a.agent_args + (" --patch-format %s" % cfg["patch_format"]
                                                    if cfg.get("patch_format") else "")] + \
                (["--no-tls"] if a.no_tls else []) + (["--relay-blob", a.relay_blob] if a.relay_blob else []) + \
                (["--keep"] if a.keep else [])
            rc = subprocess.run(argv).returncode
            subprocess.run([WAN, "down", prefix], capture_output=True, env=env)
            prefix = None
            if not os.path.exists(os.path.join(cdir, "result.json")):
                print("FAIL: %s produced no result (rc %d)" % (cfg["name"], rc), flush=True)
                failed = True
                continue
            failed |= rc != 0
            s = summarize(cfg, json.load(open(os.path.join(cdir, "result.json"))), changed)
            s["load"] = open("/proc/loadavg").read().split()[0]
            run_sim(a, cfg, s, cdir)
            results.append(s)
            print("   %s: patch %s MB, bound %s s, tern last %s s (%s), (a) %s s, (c) %s s, (d) fetched %s s, "
                  "sim %s s" % (
                      cfg["name"], fmt(s["patch_bytes"] and s["patch_bytes"] / 1e6), fmt(s["bound_s"]),
                      fmt(s["tern_last_s"]), fmt(s["ratio_to_bound"], "%.1fx bound"), fmt(s.get("a_last_s")),
                      fmt(s.get("c_last_s")), fmt(s.get("d_fetched_s")), fmt(s.get("sim_s"))), flush=True)
            # Shrink the work dir between configurations (--keep: keep the
            # agents' logs and data for a look afterwards).
            if not a.keep:
                shutil.rmtree(os.path.join(cdir, "agents"), ignore_errors=True)
                shutil.rmtree(os.path.join(cdir, "islands"), ignore_errors=True)
                shutil.rmtree(os.path.join(cdir, "pulse"), ignore_errors=True)
    finally:
        if prefix:
            subprocess.run([WAN, "down", prefix], capture_output=True, env=env)
        meta["load_end"] = open("/proc/loadavg").read().split()[0]
        md = markdown(results, meta)
        print()
        print(md)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "results.json"), "w") as f:
                json.dump(dict(meta=meta, results=results), f, indent=1)
            with open(os.path.join(a.out, "results.md"), "w") as f:
                f.write(md)
            # The figures of this run beside its tables (plot.py; several
            # runs' results.json together: bench/fanout/reproduce.sh).
            if results:
                try:  # a plot that fails costs the plot, not the run's cleanup
                    sys.path.insert(0, HERE)
                    import plot
                    for path in plot.plot_all([os.path.join(a.out, "results.json")], a.out):
                        print("plot: %s" % path)
                except Exception as e:
                    print("plot: failed: %r" % e, file=sys.stderr)
        if a.keep:
            print("kept %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
