"""tern's weight-transfer backend (engines/vllm, `--weight-transfer-config
'{"backend": "tern"}'`) in a real vLLM 0.32 server on CPU.

Usage: test_tern_vllm.py [--updates N] [--adapter ENGINE_VLLM_APPLY]
(the engine venv's python, with tern_vllm installed by
scripts/install-engine-env.sh; `tests/engine/run.sh --backend` runs it).
Exit status 0 only if every check passed.

  * the slot rules without an engine: paths confined, headers bounded,
    fused groups;
  * a tiny Llama served as version 1 from a member-like directory
    (DIR/views/a, DIR/current); versions 2 and 3 written to the other slot
    as the agent does, each with a few changed tensors (a fused q_proj, a
    k_proj alone, gate/up, norms, embeddings, lm_head), loaded through
    vLLM's HTTP routes (pause, start, update, finish, resume): the served
    greedy tokens and top logprobs agree with a reference forward pass
    (transformers, FP32) of that version's weights and NOT the previous
    version's;
  * bad updates (slot outside the root, missing file, wrong shape, unknown
    tensor, wrong base, malformed info) fail with a message naming the
    cause, and the engine still serves the version it had;
  * the engine-visible pause (pause -> resume) and the update call, per
    sparse update, and a full update (changed: null), printed as
    "measure:" lines (docs/benchmarks.md, "vLLM weight update");
  * tied embeddings (tie_word_embeddings, vLLM in this process): a sparse
    and a full update of the embedding reach lm_head too;
  * with --adapter: the agent's VllmAdapter (agent/engine, through the
    engine_vllm_apply program) drives the same engine: sparse updates
    (a fused gate_up), a streamed request in flight when an update starts
    finishing whole, a refused update not retried, the version read back,
    and its own pause measure.
"""
import threading
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import engine_model as em  # noqa: E402

GAP_TOL = 0.15       # as test_vllm.py: vLLM computes in BF16, the reference in FP32
LOGPROB_TOL = 0.15
START_SECONDS_MAX = 600
ROUTE_SECONDS_MAX = 120
TEST_SECONDS_MAX = 1200
# On CPU, the share of the machine's memory vLLM insists is free at start
# (default 0.92: fails on a machine others use); the KV cache itself is
# VLLM_CPU_KVCACHE_SPACE (1 GiB).
MEMORY_FRACTION = 0.3

failures = []


def check(ok, what):
    print(("ok:   " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


# --- the slot rules, without an engine ----------------------------------------

def check_registration():
    """vLLM calls plugins in every process, sometimes twice: idempotent;
    and a foreign backend under our name is an error, not a silent swap."""
    import tern_vllm
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory as f
    tern_vllm.register()
    tern_vllm.register()
    check(f._registry["tern"]().__name__ == "TernWeightTransferEngine",
          "plugin: register() twice leaves the tern backend registered once")
    saved = f._registry.pop("tern")
    try:
        f.register_engine("tern", "vllm.distributed.weight_transfer.ipc_engine",
                          "IPCWeightTransferEngine")
        try:
            tern_vllm.register()
            check(False, "plugin: a foreign backend named tern is accepted")
        except RuntimeError as e:
            check("already registered" in str(e), f"plugin: a foreign backend named tern: {e}")
    finally:
        f._registry["tern"] = saved


def check_slot_rules(work):
    from tern_vllm import slot as s
    root = os.path.join(work, "rules")
    a = os.path.join(root, "views", "a")
    os.makedirs(a)
    t = {"model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 2, dtype=torch.bfloat16),
         "model.layers.0.self_attn.k_proj.weight": torch.zeros(2, 2, dtype=torch.bfloat16),
         "model.layers.0.self_attn.v_proj.weight": torch.zeros(2, 2, dtype=torch.bfloat16),
         "model.layers.0.self_attn.o_proj.weight": torch.zeros(2, 4, dtype=torch.bfloat16),
         "model.norm.weight": torch.ones(2, dtype=torch.bfloat16)}
    save_file(t, os.path.join(a, "model.safetensors"))
    schema = s.read_slot(a)
    check(sorted(schema) == sorted(t), "slot: a single-file slot lists its tensors")
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    keys, names = s.plan_groups(schema, ["model.layers.0.self_attn.k_proj.weight"], packed)
    check(keys == ["model.layers.0.self_attn.qkv_proj"] and sorted(names) == sorted(
        n for n in t if any(p in n for p in ("q_proj", "k_proj", "v_proj"))),
        f"slot: a changed k_proj reloads the whole fused qkv_proj ({names})")
    keys, names = s.plan_groups(schema, ["model.norm.weight"], packed)
    check(keys == ["model.norm"] and names == ["model.norm.weight"], "slot: a norm alone")

    def refused(fn, needle, what):
        try:
            fn()
        except s.SlotError as e:
            return check(needle in str(e), f"slot: {what} refused: {e}")
        return check(False, f"slot: {what} accepted")

    refused(lambda: s.check_update("/etc", 2, None, None, root), "outside the root",
            "a slot outside the root")
    refused(lambda: s.check_update(os.path.join(root, "views", "..", ".."), 2, None, None, root),
            "outside the root", "a slot reached through ..")
    os.symlink("/", os.path.join(root, "views", "escape"))
    refused(lambda: s.check_update(os.path.join(root, "views", "escape"), 2, None, None, root),
            "outside the root", "a slot behind a symlink out of the root")
    refused(lambda: s.check_update("views/a", 2, None, None, root), "absolute", "a relative slot")
    refused(lambda: s.check_update(a, -1, None, None, root), "version", "a negative version")
    refused(lambda: s.check_update(a, True, None, None, root), "version", "a boolean version")
    refused(lambda: s.check_update(a, 2, ["x", "x"], None, root), "twice", "a name twice")
    refused(lambda: s.check_update(a, 2, "model.norm.weight", None, root), "list",
            "changed as a string")
    bad = os.path.join(root, "views", "bad")
    os.makedirs(bad)
    with open(os.path.join(bad, "model.safetensors"), "wb") as f:
        f.write((1 << 40).to_bytes(8, "little") + b"{}")
    refused(lambda: s.read_slot(bad), "does not fit", "a header length past the file")
    with open(os.path.join(bad, "model.safetensors"), "wb") as f:
        h = json.dumps({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 8]}}).encode()
        f.write(len(h).to_bytes(8, "little") + h + b"\0" * 8)
    refused(lambda: s.read_slot(bad), "data_offsets", "offsets shorter than the shape")
    with open(os.path.join(bad, s.INDEX_FILE), "w") as f:
        json.dump({"weight_map": {"w": "../a/model.safetensors"}}, f)
    refused(lambda: s.read_slot(bad), "plain file name", "an index naming a file outside")
    with open(os.path.join(bad, s.INDEX_FILE), "w") as f:
        json.dump({"weight_map": {"w": "model-00002.safetensors"}}, f)
    refused(lambda: s.read_slot(bad), "missing", "an index naming a missing shard")


# --- versions on disk -----------------------------------------------------------

def bf16_state(master_dir):
    return {k: v.to(torch.bfloat16).contiguous()
            for k, v in load_file(os.path.join(master_dir, "model.safetensors")).items()}


def changed_copy(state, names, seed):
    """`state` with `names` drawn afresh (same spread): a change large
    enough that the served logprobs tell the two versions apart."""
    g = torch.Generator().manual_seed(seed)
    out = dict(state)
    for n in names:
        v = state[n].to(torch.float32)
        fresh = torch.randn(v.shape, generator=g) * v.std() + v.mean()
        out[n] = fresh.to(torch.bfloat16).contiguous()
    return out


def write_slot(path, state, config=None):
    """A checkpoint directory as a member's slot holds it, replaced whole."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config or em.CONFIG, f, indent=2)


def point_current(root, slot_name):
    tmp = os.path.join(root, "current.tmp")
    os.symlink(os.path.join("views", slot_name), tmp)
    os.replace(tmp, os.path.join(root, "current"))


# --- the engine over HTTP ---------------------------------------------------------

class Engine:
    def __init__(self, url):
        self.url = url

    def call(self, method, path, body=None, timeout=ROUTE_SECONDS_MAX):
        """(status, parsed JSON or text)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def ok(self, method, path, body=None):
        status, reply = self.call(method, path, body)
        if status != 200:
            raise RuntimeError(f"{method} {path}: {status} {reply}")
        return reply

    def version(self):
        return self.ok("GET", "/weight_info")["weight_version"]

    def generate(self):
        """[(prompt, tokens, [ {token: logprob} per step ])] for em.PROMPTS."""
        reply = self.ok("POST", "/v1/completions", {
            "model": "tern", "prompt": em.PROMPTS, "max_tokens": em.MAX_TOKENS,
            "temperature": 0, "logprobs": em.TOP_LOGPROBS, "ignore_eos": True,
            "return_tokens_as_token_ids": True})
        out = []
        for choice in sorted(reply["choices"], key=lambda c: c["index"]):
            lp = choice["logprobs"]
            tokens = [int(t.split(":", 1)[1]) for t in lp["tokens"]]
            tops = [{int(k.split(":", 1)[1]): v for k, v in step.items()}
                    for step in lp["top_logprobs"]]
            out.append((em.PROMPTS[choice["index"]], tokens, tops))
        return out

    def update(self, info, version):
        """The adapter's sequence, timed: (pause_s, update_s, status, reply);
        self.steps: seconds per route of the last one."""
        self.steps = {}

        def step(name, method, path, body=None, must=True):
            t = time.perf_counter()
            status, reply = self.call(method, path, body)
            self.steps[name] = time.perf_counter() - t
            if must and status != 200:
                raise RuntimeError(f"{method} {path}: {status} {reply}")
            return status, reply

        t0 = time.perf_counter()
        step("pause", "POST", "/pause?mode=keep")
        try:
            step("start", "POST", "/start_weight_update")
            status, reply = step("update", "POST", "/update_weights", {"update_info": info},
                                 must=False)
            if status == 200:
                step("finish", "POST", "/finish_weight_update", {"weight_version": str(version)})
                step("reset_prefix_cache", "POST", "/reset_prefix_cache")
        finally:
            step("resume", "POST", "/resume")
        return time.perf_counter() - t0, self.steps["update"], status, reply


def agreement(served, state):
    """(ok, summary): served tokens and top logprobs against the FP32
    reference of `state` (as test_vllm.py measures)."""
    model = em.reference_model({k: v.to(torch.float32) for k, v in state.items()})
    agree = total = 0
    gap_max = lp_diff_max = 0.0
    for prompt, tokens, tops in served:
        lp = em.reference_logprobs(model, prompt + tokens)
        for i, tok in enumerate(tokens):
            row = lp[len(prompt) - 1 + i]
            gap = float(row.max() - row[tok])
            gap_max = max(gap_max, gap)
            agree += gap <= GAP_TOL
            total += 1
            for cand, got in tops[i].items():
                lp_diff_max = max(lp_diff_max, abs(got - float(row[cand])))
    ok = agree == total and lp_diff_max <= LOGPROB_TOL
    return ok, (f"{agree}/{total} tokens agree (largest reference gap {gap_max:.3f}), "
                f"top-{em.TOP_LOGPROBS} logprobs within {lp_diff_max:.3f}")


def serves(engine, state, previous, what):
    served = engine.generate()
    ok, summary = agreement(served, state)
    check(ok, f"{what}: matches its reference: {summary}")
    if previous is not None:
        ok_prev, summary_prev = agreement(served, previous)
        check(not ok_prev, f"{what}: does not match the previous version's: {summary_prev}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_engine(root, log_path):
    port = free_port()
    # VLLM_RPC_BASE_PATH: vLLM's ZMQ sockets go in the work directory, which
    # the test removes (by default they are left in /tmp, ~20 a run).
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_LOGGING_LEVEL="INFO", TOKENIZERS_PARALLELISM="false",
               VLLM_RPC_BASE_PATH=os.path.dirname(log_path))
    # The module, not the `vllm` script: that one asks for the "vllm"
    # distribution's version, and the CPU build is "vllm-cpu".
    cmd = [sys.executable, "-c", "from vllm.entrypoints.launchers.api_server.entry import main; main()",
           "--model", os.path.join(root, "current"), "--served-model-name", "tern",
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
           "--max-model-len", "64", "--max-num-seqs", "4", "--enforce-eager",
           "--skip-tokenizer-init", "--seed", "0",
           "--gpu-memory-utilization", str(MEMORY_FRACTION),
           "--weight-transfer-config", json.dumps({"backend": "tern"})]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    engine = Engine(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + START_SECONDS_MAX
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path) as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{tail}")
        try:
            if engine.call("GET", "/health", timeout=5)[0] == 200:
                return proc, engine
        except OSError:
            pass
        time.sleep(1)
    stop_engine(proc)
    with open(log_path) as f:
        tail = f.read()[-3000:]
    raise RuntimeError(f"vllm serve not up after {START_SECONDS_MAX} s:\n{tail}")


def stop_engine(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --- the scenario -------------------------------------------------------------------

L0 = "model.layers.0."
L1 = "model.layers.1."
CHANGES = {
    2: [L0 + "self_attn.q_proj.weight", L1 + "mlp.up_proj.weight", "model.norm.weight"],
    3: [L1 + "self_attn.k_proj.weight", "lm_head.weight", L0 + "input_layernorm.weight",
        "model.embed_tokens.weight", L0 + "mlp.down_proj.weight"],
}


def bad_updates(engine, root, state, work):
    """Each must fail with its cause named, leaving version 3 served."""
    views = os.path.join(root, "views")
    served_slot = os.path.join(views, "a")
    c = os.path.join(views, "c")

    def wrong_shape():
        bad = dict(state)
        bad[L0 + "self_attn.o_proj.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
        write_slot(c, bad)

    def missing_tensor():
        write_slot(c, {k: v for k, v in state.items() if k != L0 + "self_attn.o_proj.weight"})

    def missing_file():
        write_slot(c, state)
        os.remove(os.path.join(c, "model.safetensors"))

    outside = os.path.join(work, "outside")
    write_slot(outside, state)
    o_proj = [L0 + "self_attn.o_proj.weight"]
    cases = [
        ("a slot outside the root", None, {"slot": outside, "version": 4, "changed": o_proj},
         "outside the root"),
        ("a missing file", missing_file, {"slot": c, "version": 4, "changed": o_proj},
         "neither model.safetensors"),
        ("a wrong shape", wrong_shape, {"slot": c, "version": 4, "changed": o_proj},
         "the engine serves BF16[256, 256]"),
        ("a tensor missing from the slot", missing_tensor,
         {"slot": c, "version": 4, "changed": o_proj}, "is missing"),
        ("an unknown tensor", None, {"slot": served_slot, "version": 4,
                                     "changed": ["model.layers.9.self_attn.q_proj.weight"]},
         "unknown tensor"),
        ("a wrong base", None, {"slot": served_slot, "version": 4, "changed": o_proj, "base": 2},
         "holds version 3"),
        ("an unknown field", None, {"slot": served_slot, "version": 4, "digest": "x"},
         "unexpected keyword"),
        ("a full update missing a tensor", missing_tensor, {"slot": c, "version": 4,
                                                            "changed": None},
         "does not hold the engine's tensors"),
    ]
    for what, prepare, info, needle in cases:
        if prepare:
            prepare()
        _, _, status, reply = engine.update(info, 4)
        text = json.dumps(reply) if not isinstance(reply, str) else reply
        check(status != 200 and needle in text and "tern: bad update: " in text,
              f"bad update, {what}: HTTP {status}: {text[:300]}")
        check(engine.version() == "3", f"after {what}: the engine still says version 3")
    serves(engine, state, None, "after the bad updates: version 3")


def timed_updates(engine, root, state, n, version):
    """n sparse updates (one fused qkv of one layer each) and one full one;
    returns the last state and version. Slots alternate as the agent's do."""
    pauses, updates, steps = [], [], {}
    slot_names = ("b", "a")
    for i in range(n):
        version += 1
        name = slot_names[i % 2]
        nxt = changed_copy(state, [f"model.layers.{i % 2}.self_attn.q_proj.weight"], 100 + i)
        write_slot(os.path.join(root, "views", name), nxt)
        info = {"slot": os.path.join(root, "views", name), "version": version,
                "changed": [f"model.layers.{i % 2}.self_attn.q_proj.weight"],
                "base": version - 1}
        pause_s, update_s, status, reply = engine.update(info, version)
        if not check(status == 200, f"timed update to {version}: HTTP {status} {reply}"):
            return state, version - 1
        point_current(root, name)
        pauses.append(pause_s)
        updates.append(update_s)
        for k, v in engine.steps.items():
            steps.setdefault(k, []).append(v)
        state = nxt
    serves(engine, state, None, f"after {n} timed sparse updates: version {version}")
    print(f"measure: sparse update (1 fused qkv_proj, 3 tensors, "
          f"{sum(state[f'model.layers.0.self_attn.{p}_proj.weight'].numel() for p in 'qkv') * 2}"
          f" bytes), {n} updates: pause median {1e3 * statistics.median(pauses):.1f} ms "
          f"(min {1e3 * min(pauses):.1f}, max {1e3 * max(pauses):.1f}), update_weights "
          f"median {1e3 * statistics.median(updates):.1f} ms; per route (median ms): "
          + ", ".join(f"{k} {1e3 * statistics.median(v):.1f}" for k, v in steps.items()),
          flush=True)
    version += 1
    name = slot_names[n % 2]
    nxt = changed_copy(state, [L1 + "mlp.gate_proj.weight"], 999)
    write_slot(os.path.join(root, "views", name), nxt)
    pause_s, update_s, status, reply = engine.update(
        {"slot": os.path.join(root, "views", name), "version": version, "changed": None},
        version)
    if check(status == 200, f"full update to {version}: HTTP {status} {reply}"):
        state = nxt
        print(f"measure: full update (changed: null, {len(state)} tensors, "
              f"{sum(v.numel() * 2 for v in state.values())} bytes): pause "
              f"{1e3 * pause_s:.1f} ms, update_weights {1e3 * update_s:.1f} ms", flush=True)
        serves(engine, state, None, f"after a full update: version {version}")
    return state, version


def run_adapter(adapter, root, *args):
    r = subprocess.run([adapter, "--url", ENGINE_URL[0], "--root", root, *args],
                       capture_output=True, text=True, timeout=ROUTE_SECONDS_MAX * 3, check=False)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "error": f"exit {r.returncode}: {r.stdout} {r.stderr}"}


def adapter_updates(engine, adapter, root, state, version, n):
    """The agent's adapter drives the engine: n sparse updates (one fused
    gate_up_proj each), the first with a request in flight."""
    check(run_adapter(adapter, root, "--served") == {"ok": True, "version": version},
          f"adapter: reads back version {version}")
    pauses, updates = [], []
    for i in range(n):
        version += 1
        name = "gate_proj" if i % 2 == 0 else "up_proj"
        changed = [f"model.layers.{i % 2}.mlp.{name}.weight"]
        nxt = changed_copy(state, changed, 500 + i)
        slot = os.path.join(root, "views", "b" if version % 2 == 0 else "a")
        write_slot(slot, nxt)
        in_flight = {"started": threading.Event()}
        if i == 0:
            # A request in flight when the update starts (streamed, so
            # that the update starts after its first token): frozen by the
            # keep pause, then finished. Whether it was still generating
            # when the pause landed depends on this machine's speed (the
            # log gives when it ended); the check is that it finishes
            # whole either way.
            def long_request():
                req = urllib.request.Request(
                    engine.url + "/v1/completions", method="POST",
                    headers={"Content-Type": "application/json"},
                    data=json.dumps({"model": "tern", "prompt": em.PROMPTS[0], "max_tokens": 56,
                                     "temperature": 0, "ignore_eos": True, "stream": True,
                                     "stream_options": {"include_usage": True},
                                     "return_tokens_as_token_ids": True}).encode())
                try:
                    with urllib.request.urlopen(req, timeout=ROUTE_SECONDS_MAX) as r:
                        for line in r:
                            in_flight["started"].set()
                            line = line.decode().strip()
                            if line.startswith("data: {"):
                                usage = json.loads(line[6:]).get("usage")
                                if usage:
                                    in_flight["tokens"] = usage["completion_tokens"]
                        in_flight["status"] = r.status
                except OSError as e:
                    in_flight["status"] = str(e)
                in_flight["end"] = time.monotonic()
                in_flight["started"].set()
            t = threading.Thread(target=long_request)
            t.start()
            in_flight["started"].wait(ROUTE_SECONDS_MAX)
        adapter_start = time.monotonic()
        report = run_adapter(adapter, root, "--slot", slot, "--version", str(version),
                             "--base", str(version - 1), "--changed", ",".join(changed))
        if i == 0:
            t.join(ROUTE_SECONDS_MAX)
            status, tokens = in_flight.get("status"), in_flight.get("tokens", 0)
            check(status == 200 and tokens == 56,
                  f"adapter: a request in flight when the update starts finishes whole "
                  f"(HTTP {status}, {tokens} tokens; it ended "
                  f"{in_flight.get('end', 0) - adapter_start:+.3f} s after the adapter was "
                  f"launched, which took {report.get('pause_ms', 0)} ms of pause)")
        if not check(report.get("ok") and report.get("version") == version
                     and report.get("full") is False,
                     f"adapter: sparse update to {version} ({changed[0]}): {report}"):
            return state, version - 1
        point_current(root, os.path.basename(slot))
        pauses.append(report["pause_ms"])
        updates.append(report["update_ms"])
        prev, state = state, nxt
        if i == 0:
            serves(engine, state, prev, f"adapter: version {version}")
    serves(engine, state, None, f"adapter: after {n} updates, version {version}")
    print(f"measure: adapter (VllmAdapter, pause keep, prefix-cache reset), sparse update of "
          f"one fused gate_up_proj ({2 * 512 * 256 * 2} bytes), {n} updates: pause median "
          f"{statistics.median(pauses):.0f} ms (min {min(pauses)}, max {max(pauses)}), "
          f"update_weights median {statistics.median(updates):.0f} ms", flush=True)
    report = run_adapter(adapter, root, "--slot", os.path.join(root, "views", "a"),
                         "--version", str(version + 1), "--base", str(version), "--changed",
                         "model.layers.7.mlp.gate_proj.weight", "--attempts", "3")
    check(not report.get("ok") and report.get("code") == 1
          and "after 1 attempt" in report.get("error", "")
          and "tern: bad update: unknown tensor" in report.get("error", ""),
          f"adapter: a refused update is reported, not retried: {report.get('error')}")
    check(engine.version() == str(version) and not engine.ok("GET", "/is_paused")["is_paused"],
          f"adapter: after the refusal the engine serves version {version}, not paused")
    serves(engine, state, None, f"adapter: after the refusal, version {version}")
    return state, version


def tied_embeddings(work):
    """tie_word_embeddings: embed_tokens and lm_head share one weight, and
    vLLM's CPU build keeps a packed copy of it for lm_head. An update of
    the embedding (sparse, then full) must reach both. vLLM in this
    process (LLM, the same backend through collective_rpc): one engine at
    a time, the server is stopped by now."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_RPC_BASE_PATH"] = work  # its sockets go with the work directory
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    config = dict(em.CONFIG, tie_word_embeddings=True)
    root = os.path.join(work, "tied")
    m0 = os.path.join(work, "master0")
    v1 = bf16_state(m0)
    v1.pop("lm_head.weight")
    write_slot(os.path.join(root, "views", "a"), v1, config)
    point_current(root, "a")
    llm = LLM(model=os.path.join(root, "current"), skip_tokenizer_init=True, enforce_eager=True,
              dtype="bfloat16", max_model_len=64, max_num_seqs=4, seed=0,
              gpu_memory_utilization=MEMORY_FRACTION, weight_transfer_config={"backend": "tern"})

    def served():
        params = SamplingParams(max_tokens=em.MAX_TOKENS, temperature=0,
                                logprobs=em.TOP_LOGPROBS, detokenize=False, ignore_eos=True)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in em.PROMPTS], params,
                            use_tqdm=False)
        return [(p, list(o.outputs[0].token_ids),
                 [{k: v.logprob for k, v in d.items()} for d in o.outputs[0].logprobs])
                for p, o in zip(em.PROMPTS, outs)]

    def tied(state):
        return dict(state, **{"lm_head.weight": state["model.embed_tokens.weight"]})

    try:
        ok, summary = agreement(served(), tied(v1))
        check(ok, f"tied: version 1: {summary}")
        llm.collective_rpc("init_weight_transfer_engine",
                           kwargs={"init_info": {"root": root, "version": 1}})
        prev = v1
        for version, changed, slot in ((2, ["model.embed_tokens.weight"], "b"), (3, None, "a")):
            state = changed_copy(prev, ["model.embed_tokens.weight"], 40 + version)
            write_slot(os.path.join(root, "views", slot), state, config)
            llm.collective_rpc("start_weight_update")
            llm.collective_rpc("update_weights", kwargs={"update_info": {
                "slot": os.path.join(root, "views", slot), "version": version,
                "changed": changed, "base": version - 1}})
            llm.collective_rpc("finish_weight_update")
            got = served()
            what = f"tied: version {version} ({'sparse' if changed else 'full'} update)"
            ok, summary = agreement(got, tied(state))
            check(ok, f"{what}: matches its reference: {summary}")
            stale = dict(state, **{"lm_head.weight": prev["model.embed_tokens.weight"]})
            ok, summary = agreement(got, stale)
            check(not ok, f"{what}: not the new embedding with the old lm_head: {summary}")
            prev = state
    finally:
        del llm


ENGINE_URL = [""]


def run(work, n_timed, adapter):
    check_registration()
    check_slot_rules(work)
    m0 = os.path.join(work, "master0")
    em.make_master(m0, seed=1)
    root = os.path.join(work, "member")
    v1 = bf16_state(m0)
    write_slot(os.path.join(root, "views", "a"), v1)
    point_current(root, "a")
    log_path = os.path.join(work, "vllm.log")
    start = time.monotonic()
    proc, engine = start_engine(root, log_path)
    ENGINE_URL[0] = engine.url
    print(f"      vLLM up in {time.monotonic() - start:.0f} s", flush=True)
    try:
        status, reply = engine.call("POST", "/update_weights",
                                    {"update_info": {"slot": root, "version": 2}})
        check(status != 200, f"an update before init is refused: HTTP {status}")
        status, reply = engine.call("POST", "/init_weight_transfer_engine",
                                    {"init_info": {"root": "relative/dir"}})
        check(status != 200 and "absolute" in json.dumps(reply),
              f"init with a relative root is refused: HTTP {status} {str(reply)[:200]}")
        engine.ok("POST", "/init_weight_transfer_engine",
                  {"init_info": {"root": root, "version": 1}})
        engine.ok("POST", "/update_weight_version", {"new_version": "1"})
        serves(engine, v1, None, "version 1 (loaded at start)")
        states = {1: v1}
        slot_of = {2: "b", 3: "a"}
        for version in (2, 3):
            states[version] = changed_copy(states[version - 1], CHANGES[version], version)
            slot = os.path.join(root, "views", slot_of[version])
            write_slot(slot, states[version])
            pause_s, update_s, status, reply = engine.update(
                {"slot": slot, "version": version, "changed": CHANGES[version],
                 "base": version - 1}, version)
            check(status == 200, f"update to version {version} ({len(CHANGES[version])} "
                  f"changed tensors): HTTP {status}, pause {1e3 * pause_s:.0f} ms, "
                  f"update_weights {1e3 * update_s:.0f} ms")
            point_current(root, slot_of[version])
            check(engine.version() == str(version), f"the engine says version {version}")
            serves(engine, states[version], states[version - 1], f"version {version}")
        bad_updates(engine, root, states[3], work)
        state, version = timed_updates(engine, root, states[3], n_timed, 3)
        if adapter:
            adapter_updates(engine, adapter, root, state, version, 4)
    finally:
        stop_engine(proc)
        if failures:
            with open(log_path) as f:
                tail = f.read()[-4000:]
            print("---- vllm serve log (tail) ----\n" + tail, flush=True)
    tied_embeddings(work)


def main():
    n_timed, adapter = 6, None
    args = sys.argv[1:]
    while args:
        if len(args) >= 2 and args[0] == "--updates":
            n_timed = int(args[1])
        elif len(args) >= 2 and args[0] == "--adapter":
            adapter = os.path.abspath(args[1])
        else:
            print(__doc__)
            return 2
        args = args[2:]
    import vllm
    print(f"vLLM {vllm.__version__}, torch {torch.__version__}", flush=True)
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(
        TimeoutError(f"over {TEST_SECONDS_MAX} s")))
    signal.alarm(TEST_SECONDS_MAX)
    with tempfile.TemporaryDirectory(prefix="tern_vllm_") as work:
        try:
            run(work, n_timed, adapter)
        except Exception as e:
            check(False, f"{type(e).__name__}: {e}")
    signal.alarm(0)
    print("FAILED: " + "; ".join(failures) if failures else
          "OK: vLLM loads tern's versions from the member's slot, changed tensors only",
          flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
