"""The real vLLM behind tern-agent and tern-sidecar, end to end (CPU).

Usage: test_agent_e2e.py TERN TERN_AGENT TERN_SIDECAR (the engine venv's
python; `tests/engine/run.sh --e2e ...` runs it). Exit status 0 only if
every check passed.

A tiny Llama made locally; a root and two members (tern-agent processes on
127.0.0.1, plain TCP, root fan-out 1 so that one member relays to the
other), each member in front of its own vLLM server (CPU, the `tern`
weight-transfer backend) driven by `--engine vllm --engine-url`, each
engine behind its own tern-sidecar, which the member's engine driver asks
for the commit point (`--engine-sidecar`):

  * versions 1-4 published with `tern publish` (each a few % of the values
    changed): per version and member, through the sidecar with
    exact_version, the served logprobs match a reference forward pass
    (transformers, FP32) of that version's weights and not the previous
    one's;
  * 32 clients at once across versions 2-4 (streaming and not; body
    min_version / exact_version, X-Tern-Min-Version, none), through both
    sidecars: no response outside its accepted range, the X-Tern-Version
    header equal to the body's stamp, and every response that ran on one
    version agrees with that version's reference;
  * the update to version 5 fails: the test pauses both engines with an
    exact_version 4 request in flight, so the sidecar cannot drain it and
    does not open its commit point; the member leaves the engine alone,
    which stays on version 4, and /status says so ("failed", the reason);
    once the engines resume, the held request is served on 4 and version 5
    loads on a retry;
  * the relay member's engine killed (SIGKILL) in the middle of the update
    to version 7: its member reports it within the adapter's deadlines and
    keeps relaying: versions 7 and 8 reach the other member and its engine;
  * measured ("measure:" lines, docs/benchmarks.md "vLLM behind the agent"):
    the engine-visible pause per sparse update (the members' last_pause_ms),
    the prepare time (the member serves the version -> the engine starts
    loading it) against the transfer time (publish -> served), the client
    latency through the sidecar against the engine directly.
"""
import concurrent.futures
import http.client
import json
import os
import random
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import engine_model as em  # noqa: E402
import test_tern_vllm as tv  # noqa: E402

TEST_SECONDS_MAX = 1200
START_SECONDS_MAX = 600
CLIENTS = 32
CLIENT_TOKENS = 4
OVERHEAD_REQUESTS = 40
# A version changes this share of the values of every tensor (re-drawn with
# the tensor's spread), and lm_head's a tenth: enough that the served
# logprobs tell consecutive versions apart.
CHANGED_FRACTION = 0.03
LM_HEAD_FRACTION = 0.10
# The member must report an engine that died mid-update within the
# adapter's deadlines (a dead process: the connection is refused at once).
KILL_REPORT_SECONDS_MAX = 30

failures = []
check = tv.check
tv.failures = failures


def log(msg):
    print("      " + msg, flush=True)


# --- versions -------------------------------------------------------------------

def next_state(state, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, v in state.items():
        f = v.to(torch.float32)
        frac = LM_HEAD_FRACTION if name == "lm_head.weight" else CHANGED_FRACTION
        mask = torch.rand(f.shape, generator=g) < frac
        fresh = torch.randn(f.shape, generator=g) * f.std() + f.mean()
        out[name] = torch.where(mask, fresh, f).to(v.dtype).contiguous()
    return out


def write_checkpoint(path, state):
    os.makedirs(path, exist_ok=True)
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(em.CONFIG, f, indent=2)


class References:
    """FP32 reference models per version, built on first use."""

    def __init__(self):
        self.states, self.models, self.lps, self.mu = {}, {}, {}, threading.Lock()

    def model(self, version):
        with self.mu:
            if version not in self.models:
                self.models[version] = em.reference_model(
                    {k: v.to(torch.float32) for k, v in self.states[version].items()})
            return self.models[version]

    def agrees(self, version, prompt, tokens, tops):
        """The served tokens and top logprobs of one completion against
        `version`'s reference (tv.agreement's rule, one prompt)."""
        key = (version, tuple(prompt + tokens))
        if key not in self.lps:  # greedy: few distinct completions per version
            self.lps[key] = em.reference_logprobs(self.model(version), prompt + tokens)
        lp = self.lps[key]
        for i, tok in enumerate(tokens):
            row = lp[len(prompt) - 1 + i]
            if float(row.max() - row[tok]) > tv.GAP_TOL:
                return False
            for cand, got in tops[i].items():
                if abs(got - float(row[cand])) > tv.LOGPROB_TOL:
                    return False
        return True


# --- processes --------------------------------------------------------------------

class Proc:
    """A process in its own group whose first stdout line is its address line."""

    def __init__(self, name, cmd, work, env=None, first_line=True):
        self.name = name
        self.log_path = os.path.join(work, name + ".log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE if first_line else self.log,
                                     stderr=self.log, env=dict(os.environ, **(env or {})),
                                     start_new_session=True)
        self.line = ""
        if first_line:
            deadline = time.monotonic() + 60
            out = b""
            fd = self.proc.stdout.fileno()
            while b"\n" not in out and time.monotonic() < deadline:
                if select.select([fd], [], [], 1)[0]:
                    chunk = os.read(fd, 4096)
                    if not chunk:
                        break
                    out += chunk
            self.line = out.split(b"\n")[0].decode(errors="replace")
            if not self.line:
                self.kill()
                raise RuntimeError(f"{name} did not start: {self.tail()}")

    def tail(self, n=3000):
        with open(self.log_path, errors="replace") as f:
            return f.read()[-n:]

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()


def get_json(address, path, timeout=10):
    with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout) as r:
        return json.loads(r.read())


def wait_for(cond, seconds, what):
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            last = cond()
            if last:
                return last
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"waiting {seconds} s for {what}")


def start_vllm(name, root, port, work):
    # VLLM_RPC_BASE_PATH: its ZMQ sockets go with the work directory, not /tmp.
    env = dict(VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="INFO",
               TOKENIZERS_PARALLELISM="false", VLLM_RPC_BASE_PATH=work)
    cmd = [sys.executable, "-c",
           "from vllm.entrypoints.launchers.api_server.entry import main; main()",
           "--model", os.path.join(root, "current"), "--served-model-name", "tern",
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
           "--max-model-len", "64", "--max-num-seqs", "16", "--enforce-eager",
           "--skip-tokenizer-init", "--seed", "0",
           "--gpu-memory-utilization", str(tv.MEMORY_FRACTION),
           "--weight-transfer-config", json.dumps({"backend": "tern"})]
    return Proc(name, cmd, work, env, first_line=False)


def wait_vllm(p, url):
    engine = tv.Engine(url)
    deadline = time.monotonic() + START_SECONDS_MAX
    while time.monotonic() < deadline:
        if p.proc.poll() is not None:
            raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{p.tail()}")
        try:
            if engine.call("GET", "/health", timeout=5)[0] == 200:
                return engine
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{p.name} not up after {START_SECONDS_MAX} s:\n{p.tail()}")


# --- the request lane through a sidecar --------------------------------------------

def lane_request(sidecar, prompt, max_tokens, body_lane=None, headers=None, stream=False,
                 top=1, timeout=120):
    """One completion through the sidecar: a dict with status, start, end,
    header_version, tokens, tops (per step {token: logprob}), error."""
    body = {"model": "tern", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "logprobs": top, "ignore_eos": True, "return_tokens_as_token_ids": True}
    if body_lane is not None:
        body["weight_version"] = body_lane
    if stream:
        body["stream"] = True
    host, port = sidecar.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    out = {"status": None, "start": None, "end": None, "tokens": [], "tops": [], "error": None}
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     dict({"Content-Type": "application/json"}, **(headers or {})))
        r = conn.getresponse()
        out["status"] = r.status
        out["header_version"] = r.getheader("X-Tern-Version")
        out["header_end"] = r.getheader("X-Tern-Version-End")
        raw = r.read()
        if r.status != 200:
            out["error"] = raw[:300].decode(errors="replace")
            return out
        events = ([json.loads(line[6:]) for line in raw.decode().splitlines()
                   if line.startswith("data: {")] if stream else [json.loads(raw)])
        starts, ends = set(), []
        for ev in events:
            if "error" in ev:
                out["error"] = json.dumps(ev)[:300]
            starts.add(ev.get("weight_version_start"))
            ends.append(ev.get("weight_version_end"))
            for choice in ev.get("choices", []):
                lp = choice.get("logprobs") or {}
                out["tokens"] += [int(t.split(":", 1)[1]) for t in lp.get("tokens") or []]
                out["tops"] += [{int(k.split(":", 1)[1]): v for k, v in step.items()}
                                for step in lp.get("top_logprobs") or []]
        out["start"] = starts.pop() if len(starts) == 1 else ("several", sorted(map(str, starts)))
        out["end"] = max((e for e in ends if e is not None), default=None)
        if stream and ends != sorted(ends):
            out["error"] = f"end stamps go down in a stream: {ends}"
    except (OSError, ValueError, http.client.HTTPException) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return out


def accepted(res, lane):
    """None when the response keeps the lane's promise, else why not."""
    if res["status"] == 409:
        return None  # not served here now: refused, which is allowed
    if res["status"] != 200 or res["error"]:
        return f"HTTP {res['status']}: {res['error']}"
    s, e = res["start"], res["end"]
    if not isinstance(s, int) or not isinstance(e, int) or e < s:
        return f"stamps {s}..{e}"
    if res["header_version"] != str(s):
        return f"X-Tern-Version {res['header_version']} but weight_version_start {s}"
    if lane.get("exact") is not None and not s == e == lane["exact"]:
        return f"exact {lane['exact']} served on {s}..{e}"
    if lane.get("min") is not None and s < lane["min"]:
        return f"min {lane['min']} served on {s}..{e}"
    if len(res["tokens"]) != lane["tokens"]:
        return f"{len(res['tokens'])} tokens, asked {lane['tokens']}"
    return None


class Clients:
    """CLIENTS threads sending mixed requests to both sidecars until stopped."""

    def __init__(self, sidecars, newest):
        self.sidecars, self.newest = sidecars, newest  # newest: [published version]
        self.stop = threading.Event()
        self.results, self.mu = [], threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(CLIENTS)]

    def run(self, i):
        rng = random.Random(i)
        while not self.stop.is_set():
            v = self.newest[0]
            kind = rng.choice(["none", "min", "exact", "header_min", "exact_and_header"])
            lane, body_lane, headers = {"tokens": rng.choice((2, CLIENT_TOKENS))}, None, {}
            if kind == "min":
                lane["min"] = max(1, v - rng.randint(0, 1))
                body_lane = {"min_version": lane["min"], "exact_version": None}
            elif kind in ("exact", "exact_and_header"):
                lane["exact"] = max(1, v - rng.randint(0, 1))
                body_lane = {"exact_version": lane["exact"]}
                if kind == "exact_and_header":
                    lane["min"] = lane["exact"]
                    headers["X-Tern-Min-Version"] = str(lane["min"])
            elif kind == "header_min":
                lane["min"] = max(1, v - rng.randint(0, 1))
                headers["X-Tern-Min-Version"] = str(lane["min"])
            prompt = em.PROMPTS[rng.randrange(len(em.PROMPTS))]
            stream = rng.random() < 0.5
            sidecar = self.sidecars[rng.randrange(len(self.sidecars))]
            res = lane_request(sidecar, prompt, lane["tokens"], body_lane, headers, stream)
            res.update(kind=kind, stream=stream, prompt=prompt, lane=lane, sidecar=sidecar)
            with self.mu:
                self.results.append(res)
            if res["status"] == 409:
                time.sleep(0.05)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(180)


# --- the scenario ---------------------------------------------------------------------

class Cluster:
    def __init__(self, work, tern, agent, sidecar):
        self.work, self.tern, self.agent_bin, self.sidecar_bin = work, tern, agent, sidecar
        self.procs = []
        with open(os.path.join(work, "sidecar.token"), "w") as f:
            f.write("e2e-sidecar-token\n")
        self.token_file = os.path.join(work, "sidecar.token")

    def add(self, p):
        self.procs.append(p)
        return p

    def start_agents(self):
        self.root = self.add(Proc("root", [self.agent_bin, "--root", "--listen", "127.0.0.1:0",
                                           "--admin", "127.0.0.1:0", "--data",
                                           os.path.join(self.work, "root"), "--id", "root",
                                           "--no-tls", "--heartbeat-ms", "100",
                                           "--root-fanout", "1", "--threads", "2"], self.work))
        self.root.address = re.search(r"listening on (\S+?)(,|$)", self.root.line).group(1)
        self.root.admin = re.search(r"admin http://(\S+)", self.root.line).group(1)
        self.members = {}
        for name in ("m1", "m2"):
            port, sidecar_port = tv.free_port(), tv.free_port()
            m = self.add(Proc(name, [
                self.agent_bin, "--join", self.root.address, "--listen", "127.0.0.1:0",
                "--admin", "127.0.0.1:0", "--data", os.path.join(self.work, name), "--id", name,
                "--region", "r", "--trust-key", os.path.join(self.work, "root", "public-key.pem"),
                "--no-tls", "--heartbeat-ms", "100", "--threads", "2", "--spare-grace-ms", "200",
                "--engine", "vllm", "--engine-url", f"http://127.0.0.1:{port}",
                "--engine-sidecar", f"127.0.0.1:{sidecar_port}",
                "--engine-sidecar-token-file", self.token_file], self.work))
            m.admin = re.search(r"admin http://(\S+)", m.line).group(1)
            m.dir = os.path.join(self.work, name)
            m.engine_port, m.sidecar_port = port, sidecar_port
            self.members[name] = m
            # The root's fan-out of 1 puts the second member under the first.
            wait_for(lambda: len(get_json(self.root.admin, "/status")["members"]) ==
                     len(self.members), 30, f"{name} joined")

    def start_sidecars(self):
        for name, m in self.members.items():
            m.sidecar = self.add(Proc(name + "-sidecar", [
                self.sidecar_bin, "--engine-url", f"http://127.0.0.1:{m.engine_port}",
                "--agent-admin", m.admin, "--listen", f"127.0.0.1:{m.sidecar_port}",
                "--poll-ms", "50", "--catchup-wait-ms", "3000", "--drain-timeout-ms", "3000",
                "--admin-token-file", self.token_file], self.work))
            m.sidecar.address = f"127.0.0.1:{m.sidecar_port}"

    def publish(self, path, version):
        t0 = time.monotonic()
        r = subprocess.run([self.tern, "publish", "--board", self.root.admin, path,
                            "--version", str(version)], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"publish {version}: {r.stderr}")
        return t0

    def status(self, m):
        return get_json(m.admin, "/status")

    def stop(self):
        for p in reversed(self.procs):
            p.kill(signal.SIGTERM)


def served_check(m, version, refs, what):
    """Through m's sidecar, exact_version: em.PROMPTS served on `version`,
    matching its reference and not the previous version's."""
    served = []
    for prompt in em.PROMPTS:
        res = lane_request(m.sidecar.address, prompt, em.MAX_TOKENS,
                           {"exact_version": version}, top=em.TOP_LOGPROBS)
        if not check(res["status"] == 200 and res["start"] == res["end"] == version,
                     f"{what}: exact_version {version} through {m.name}'s sidecar: HTTP "
                     f"{res['status']}, stamps {res['start']}..{res['end']} {res['error'] or ''}"):
            return
        served.append((prompt, res["tokens"], res["tops"]))
    ok, summary = tv.agreement(served, refs.states[version])
    check(ok, f"{what}: {m.name} serves version {version}'s reference: {summary}")
    if version - 1 in refs.states:
        ok, summary = tv.agreement(served, refs.states[version - 1])
        check(not ok, f"{what}: {m.name} does not serve version {version - 1}'s: {summary}")


def engine_at(c, m, version):
    e = c.status(m)["engine"]
    return e if e["version"] == version and e["state"] == "serving" else None


def run(work, tern, agent, sidecar):
    refs = References()
    m0 = os.path.join(work, "master0")
    em.make_master(m0, seed=1)
    refs.states[1] = tv.bf16_state(m0)
    for v in range(2, 9):
        refs.states[v] = next_state(refs.states[v - 1], 1000 + v)
    ckpt = {}
    for v, s in refs.states.items():
        ckpt[v] = os.path.join(work, "ckpt", f"v{v}")
        write_checkpoint(ckpt[v], s)
    changed = sum(int((refs.states[3][k] != refs.states[2][k]).sum()) for k in refs.states[2])
    total = sum(v.numel() for v in refs.states[2].values())
    log(f"a version changes {changed} of {total} values ({100 * changed / total:.1f}%)")

    c = Cluster(work, tern, agent, sidecar)
    try:
        c.start_agents()
        m1, m2 = c.members["m1"], c.members["m2"]
        members = [m1, m2]
        t_pub = c.publish(ckpt[1], 1)
        for m in members:
            wait_for(lambda: c.status(m)["served_version"] == 1, 60, f"{m.name} serves 1")
        log(f"version 1 served by both members {time.monotonic() - t_pub:.1f} s after publish")
        c.start_sidecars()
        t0 = time.monotonic()
        engines = {m.name: start_vllm(m.name + "-vllm", m.dir, m.engine_port, work) for m in members}
        for p in engines.values():
            c.add(p)
        for m in members:
            m.engine = wait_vllm(engines[m.name], f"http://127.0.0.1:{m.engine_port}")
        log(f"both vLLM servers up in {time.monotonic() - t0:.0f} s")
        for m in members:
            e = wait_for(lambda: engine_at(c, m, 1), 120, f"{m.name}'s engine on version 1")
            check(e["last_full"], f"{m.name}: the agent loaded version 1 whole into its engine")
            wait_for(lambda: get_json(m.sidecar.address, "/server_info")["applied_version"] == 1,
                     30, f"{m.name}'s sidecar on 1")
            served_check(m, 1, refs, "version 1")
        parents = {r["id"]: r["parent"] for r in get_json(c.root.admin, "/status")["members"]}
        relay = m1 if parents.get("m2") == "m1" else m2
        leaf = m2 if relay is m1 else m1
        check(parents.get(leaf.name) == relay.name,
              f"the tree: root -> {relay.name} -> {leaf.name} ({parents})")

        # Versions 2-4 under 32 clients.
        newest = [1]
        prepare, transfer, pauses = [], [], []
        with Clients([m.sidecar.address for m in members], newest) as clients:
            time.sleep(2)
            for v in (2, 3, 4):
                t_pub = c.publish(ckpt[v], v)
                served_at, ready_at = {}, {}
                while len(ready_at) < 2 and time.monotonic() - t_pub < 120:
                    for m in members:
                        s = c.status(m)
                        if m.name not in served_at and s["served_version"] >= v:
                            served_at[m.name] = time.monotonic()
                        if m.name not in ready_at and s["engine"]["version"] >= v:
                            ready_at[m.name] = (time.monotonic(), s["engine"])
                    time.sleep(0.01)
                newest[0] = v
                for m in members:
                    if not check(m.name in ready_at and m.name in served_at,
                                 f"version {v}: {m.name}'s engine loaded it"):
                        continue
                    at, e = ready_at[m.name]
                    check(not e["last_full"] and e["last_pause_ms"] >= 0,
                          f"version {v}: {m.name}'s update was sparse ({e})")
                    pauses.append(e["last_pause_ms"])
                    transfer.append(served_at[m.name] - t_pub)
                    # Served -> the engine names the version, less the pause:
                    # when the engine was ready to commit (10 ms polls).
                    prepare.append(at - served_at[m.name] - e["last_pause_ms"] / 1e3)
                    served_check(m, v, refs, f"version {v} under load")
                time.sleep(3)
        results = clients.results
        bad = [(r, why) for r in results for why in [accepted(r, r["lane"])] if why]
        for r, why in bad[:10]:
            log(f"bad response: {r['kind']} stream={r['stream']} via {r['sidecar']}: {why}")
        ok200 = [r for r in results if r["status"] == 200 and not r["error"]]
        mislabelled = [r for r in ok200 if r["start"] == r["end"]
                       and not refs.agrees(r["start"], r["prompt"], r["tokens"], r["tops"])]
        for r in mislabelled[:10]:
            log(f"mislabelled: {r['kind']} stream={r['stream']} stamped {r['start']}: "
                f"{r['tokens']}")
        by_version = {}
        for r in ok200:
            by_version.setdefault(r["start"], 0)
            by_version[r["start"]] += 1
        exact_ok = {v: sum(1 for r in ok200 if r["lane"].get("exact") == v) for v in (1, 2, 3, 4)}
        check(not bad and not mislabelled and all(exact_ok[v] > 0 for v in (2, 3, 4)),
              f"{CLIENTS} clients across versions 2-4: {len(results)} responses, "
              f"{len(ok200)} served (by start version {dict(sorted(by_version.items()))}; "
              f"exact-version served {exact_ok}), "
              f"{sum(1 for r in results if r['status'] == 409)} refused 409, "
              f"{sum(1 for r in ok200 if r['stream'])} streamed, "
              f"{sum(1 for r in ok200 if r['end'] > r['start'])} crossed a version; "
              f"{len(bad)} outside their range, {len(mislabelled)} mislabelled")
        print(f"measure: engine-visible pause per sparse update (pause -> resume, agent-driven, "
              f"{len(pauses)} updates): median {statistics.median(pauses):.0f} ms, p90 "
              f"{sorted(pauses)[int(0.9 * (len(pauses) - 1) + 0.5)]} ms, max {max(pauses)} ms",
              flush=True)
        print(f"measure: prepare (member serves -> engine ready to commit) median "
              f"{1e3 * statistics.median(prepare):.0f} ms (max {1e3 * max(prepare):.0f}); "
              f"transfer (publish -> member serves) median "
              f"{1e3 * statistics.median(transfer):.0f} ms (max {1e3 * max(transfer):.0f})",
              flush=True)

        # The sidecar's cost per request against the engine directly:
        # alternating, one at a time, on the idle replica.
        m = members[0]
        direct, proxied = [], []
        for i in range(2 * OVERHEAD_REQUESTS):
            url = m.sidecar.address if i % 2 else f"127.0.0.1:{m.engine_port}"
            t = time.perf_counter()
            res = lane_request(url, em.PROMPTS[0], 1)
            (proxied if i % 2 else direct).append(time.perf_counter() - t)
            if res["status"] != 200:
                check(False, f"overhead request via {url}: HTTP {res['status']} {res['error']}")
                break
        else:
            d, p_ = statistics.median(direct), statistics.median(proxied)
            print(f"measure: one-token completion, {OVERHEAD_REQUESTS} each, median: engine "
                  f"directly {1e3 * d:.1f} ms, through the sidecar {1e3 * p_:.1f} ms "
                  f"(+{1e3 * (p_ - d):.1f} ms, x{p_ / d:.2f})", flush=True)

        # Version 5: an update that fails. The test pauses both engines with
        # an exact-version-4 request in flight on each: the sidecar cannot
        # drain it, so it does not open its commit point, and the member
        # does not touch the engine (the only refusal vLLM could give, a
        # tensor of another dtype or shape, the root refuses at publish).
        for m in members:
            m.engine.ok("POST", "/pause?mode=keep")
        frozen = {}

        def frozen_request(m):
            frozen[m.name] = lane_request(m.sidecar.address, em.PROMPTS[1], em.MAX_TOKENS,
                                          {"exact_version": 4}, top=em.TOP_LOGPROBS)
        threads = [threading.Thread(target=frozen_request, args=(m,)) for m in members]
        for t in threads:
            t.start()
        wait_for(lambda: all(get_json(m.sidecar.address, "/server_info")["active_requests"] == 1
                             for m in members), 30, "a request in flight on each sidecar")
        c.publish(ckpt[5], 5)
        for m in members:
            e = wait_for(lambda: (lambda e: e if e["state"] == "failed" else None)(
                c.status(m)["engine"]), 60, f"{m.name} reports the failed update")
            s = c.status(m)
            check(s["served_version"] == 5 and e["version"] == 4
                  and "did not open its commit point" in e["last_error"],
                  f"version 5 failed: {m.name} serves 5, its engine says 4: {e['last_error'][:240]}")
            check(m.engine.version() == "4", f"version 5 failed: {m.name}'s vLLM names 4")
        for m in members:
            m.engine.ok("POST", "/resume")
        for t in threads:
            t.join(120)
        for m in members:
            r = frozen.get(m.name, {})
            ok = (r.get("status") == 200 and r.get("start") == r.get("end") == 4
                  and refs.agrees(4, em.PROMPTS[1], r.get("tokens"), r.get("tops")))
            check(ok, f"the request held through the failed update on {m.name}: HTTP "
                  f"{r.get('status')}, stamps {r.get('start')}..{r.get('end')}, version 4's "
                  f"reference")
            e = wait_for(lambda: engine_at(c, m, 5), 120, f"{m.name}'s engine on 5 after the retry")
            check(e["updates_failed"] > 0, f"{m.name} loaded 5 on a retry ({e})")
            served_check(m, 5, refs, "version 5 after the failed attempt")
        c.publish(ckpt[6], 6)
        for m in members:
            wait_for(lambda: engine_at(c, m, 6), 120, f"{m.name}'s engine on 6")
            served_check(m, 6, refs, "version 6")

        # Version 7: the relay's engine killed in the middle of its update.
        os.killpg(engines[relay.name].proc.pid, signal.SIGSTOP)
        c.publish(ckpt[7], 7)
        wait_for(lambda: c.status(relay)["engine"]["state"] == "updating", 60,
                 f"{relay.name}'s update of 7 under way")
        t_kill = time.monotonic()
        engines[relay.name].kill()
        e = wait_for(lambda: (lambda e: e if e["state"] in ("failed", "unreachable") else None)(
            c.status(relay)["engine"]), KILL_REPORT_SECONDS_MAX, f"{relay.name} reports its engine")
        check(e["version"] == 6 and e["last_error"],
              f"engine killed mid-update: {relay.name} reports it after "
              f"{time.monotonic() - t_kill:.1f} s: state {e['state']}, version {e['version']}, "
              f"{e['last_error'][:160]}")
        wait_for(lambda: engine_at(c, leaf, 7), 120, f"{leaf.name}'s engine on 7")
        served_check(leaf, 7, refs, "version 7, the relay's engine dead")
        c.publish(ckpt[8], 8)
        wait_for(lambda: c.status(relay)["served_version"] == 8, 60, f"{relay.name} serves 8")
        wait_for(lambda: engine_at(c, leaf, 8), 120, f"{leaf.name}'s engine on 8")
        served_check(leaf, 8, refs, "version 8 relayed by the member whose engine died")
        res = lane_request(relay.sidecar.address, em.PROMPTS[0], 2)
        check(res["status"] == 503, f"{relay.name}'s sidecar without its engine: HTTP "
              f"{res['status']} {res['error'] or ''}")
    finally:
        c.stop()
        if failures:
            for p in c.procs:
                print(f"---- {p.name} log (tail) ----\n{p.tail(2500)}", flush=True)


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    tern, agent, sidecar = (os.path.abspath(a) for a in sys.argv[1:])
    import vllm
    print(f"vLLM {vllm.__version__}, torch {torch.__version__}", flush=True)
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(
        TimeoutError(f"over {TEST_SECONDS_MAX} s")))
    signal.alarm(TEST_SECONDS_MAX)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tern_e2e_") as work:
        try:
            run(work, tern, agent, sidecar)
        except Exception as e:
            check(False, f"{type(e).__name__}: {e}")
    signal.alarm(0)
    print(f"      wall time {time.monotonic() - t0:.0f} s", flush=True)
    print("FAILED: " + "; ".join(failures) if failures else
          "OK: the agent keeps both vLLM servers on the published versions, the sidecars "
          "label every response", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
