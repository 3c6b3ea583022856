"""tern's Python module against real agents on loopback (plain TCP):
publish, status, events, the Subscriber's three ways of reading a version,
errors with their codes, and the GIL released during a long call."""
import functools
import os
import re
import threading
import time

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import tern

TOKEN = "python-test-token"


def checkpoint(path, tensors):
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return str(path)


def model(seed, n=1 << 14):
    g = torch.Generator().manual_seed(seed)
    return {
        "layer.0.weight": torch.randn(n // 128, 128, generator=g).to(torch.bfloat16),
        "layer.1.weight": torch.randn(n // 128, 128, generator=g).to(torch.bfloat16),
        "norm.weight": torch.ones(128, dtype=torch.float32),
    }


def step(prev, frac, seed, names=("layer.0.weight",)):
    """A copy of `prev` with `frac` of the named tensors' elements changed."""
    g = torch.Generator().manual_seed(seed)
    out = {k: v.clone() for k, v in prev.items()}
    for name in names:
        flat = out[name].view(-1)
        idx = torch.randperm(flat.numel(), generator=g)[: max(1, int(flat.numel() * frac))]
        flat[idx] = (flat[idx].float() + 0.5).to(flat.dtype)
    return out


@pytest.fixture
def fleet(tmp_path):
    root = tern.Agent(root=True, listen="127.0.0.1:0", admin_listen="127.0.0.1:0",
                      admin_token=TOKEN, data_dir=str(tmp_path / "root"), transport="tcp",
                      publish_dir=str(tmp_path))
    member = tern.Agent(join=root.listen_address, listen="127.0.0.1:0",
                        admin_listen="127.0.0.1:0", admin_token=TOKEN,
                        data_dir=str(tmp_path / "member"), transport="tcp",
                        trusted_keys_pem=[root.public_key_pem()])
    yield root, member
    member.close()
    root.close()


def wait_served(agent, version, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while agent.status().served_version < version:
        assert time.monotonic() < deadline, f"version {version} not served in {timeout_s} s"
        time.sleep(0.05)


def test_version_and_abi():
    assert tern.version()
    major, minor = tern.abi_version()
    assert major == 1 and minor >= 0


def test_bad_options_are_refused_with_their_name(tmp_path):
    with pytest.raises(TypeError, match="unknown agent option 'listn'"):
        tern.Agent(root=True, listn="127.0.0.1:0", data_dir=str(tmp_path))
    with pytest.raises(TypeError, match="stripes must be an int"):
        tern.Agent(root=True, listen="127.0.0.1:0", data_dir=str(tmp_path), stripes="2")
    with pytest.raises(tern.Error) as e:
        tern.Agent(root=True, listen="127.0.0.1:0", transport="tcp")  # no data_dir
    assert e.value.code == tern.Code.INVALID_ARGUMENT
    assert "data_dir" in str(e.value)


@pytest.mark.parametrize("nibbles", [True, False])
def test_patch_nibbles_keeps_packed_codes_at_file_version_2(tmp_path, nibbles):
    """patch_nibbles (ABI 1.5): on, format 2 codes packed 4-bit codes whose
    nibbles moved as nibbles and the patch file says version 3; off, the
    root's patches stay at version 2 (for members that predate version 3)."""
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 256, size=1 << 16, dtype=np.uint8)
    moved = codes.copy()
    at = rng.choice(moved.size, size=moved.size // 200, replace=False)
    moved[at] ^= np.uint8(0x10)  # the high nibble moved by one code: a byte delta of 16
    root = tern.Agent(root=True, listen="127.0.0.1:0", data_dir=str(tmp_path / "root"),
                      transport="tcp", patch_format=2, patch_nibbles=nibbles)
    try:
        root.publish_tensors(1, {"codes": codes})
        root.publish_tensors(2, {"codes": moved})
    finally:
        root.close()
    patch = (tmp_path / "root" / "published" / "patch-1-2").read_bytes()
    assert patch[:8] == b"TERNPTCH"
    assert int.from_bytes(patch[8:10], "little") == (3 if nibbles else 2)


def test_publish_events_and_subscriber_apply(fleet, tmp_path):
    root, member = fleet
    sub = tern.Subscriber(member)
    versions = [model(1)]
    for v in (2, 3):
        versions.append(step(versions[-1], 0.02, v))
    held = None
    for number, weights in enumerate(versions, start=1):
        root.publish(checkpoint(tmp_path / f"v{number}.safetensors", weights), number)
        got = sub.next(timeout_s=60)
        assert got is not None and got.version == number
        assert got.digest.startswith("tern1:") and len(got.digest) == 70
        if number == 1:
            assert got.all_tensors
            held = {k: torch.zeros_like(t) for k, t in weights.items()}
        else:
            assert not got.all_tensors
            assert got.changed_tensors == ("layer.0.weight",)
            # The sparse form against what a consumer held: exactly the changed elements.
            previous = versions[number - 2]
            (name, idx, vals), = list(got.updates(previous))
            want = torch.nonzero(previous[name].view(-1).view(torch.int16)
                                 != weights[name].view(-1).view(torch.int16)).view(-1)
            assert name == "layer.0.weight" and torch.equal(idx, want)
            assert torch.equal(vals.view(torch.int16), weights[name].view(-1)[want].view(torch.int16))
        written = got.apply_to(held)
        assert written > 0
        for k in weights:
            assert torch.equal(held[k].view(torch.uint8) if held[k].dtype == torch.bfloat16 else held[k],
                               weights[k].view(torch.uint8) if weights[k].dtype == torch.bfloat16 else weights[k])
    # The root's own events say what it published, in order.
    published = [e.version for e in root.wait_events(0, 1024, 0) if e.kind == "version_published"]
    assert published == [1, 2, 3]
    assert member.status().served_version == 3
    # The root learns it from the member's next heartbeat, not at once.
    deadline = time.monotonic() + 30
    while root.status().members_at_head != 1:
        assert time.monotonic() < deadline, "the root never counted the member at HEAD"
        time.sleep(0.02)


def test_subscriber_over_the_admin_port_coalesces(fleet, tmp_path):
    root, member = fleet
    w = model(7)
    root.publish(checkpoint(tmp_path / "a1.safetensors", w), 1)
    wait_served(member, 1)
    sub = tern.Subscriber(member.admin_address, token=TOKEN)
    first = sub.next(timeout_s=30)
    assert first.version == 1 and first.all_tensors
    w2 = step(w, 0.01, 8, names=("layer.0.weight",))
    w3 = step(w2, 0.01, 9, names=("layer.1.weight",))
    root.publish(checkpoint(tmp_path / "a2.safetensors", w2), 2)
    root.publish(checkpoint(tmp_path / "a3.safetensors", w3), 3)
    wait_served(member, 3)
    # Two served since the last call: one Version, the newest, with the union.
    got = sub.next(timeout_s=30)
    assert got.version == 3
    assert set(got.changed_tensors) == {"layer.0.weight", "layer.1.weight"}
    held = {k: v.clone() for k, v in w.items()}
    got.apply_to(held)
    assert all(torch.equal(held[k].view(torch.uint8) if held[k].dtype == torch.bfloat16 else held[k],
                           w3[k].view(torch.uint8) if w3[k].dtype == torch.bfloat16 else w3[k])
               for k in w3)
    assert sub.next(timeout_s=0.2) is None


def test_apply_to_checks_everything_before_writing(fleet, tmp_path):
    root, member = fleet
    w = model(3)
    root.publish(checkpoint(tmp_path / "b1.safetensors", w), 1)
    sub = tern.Subscriber(member)
    got = sub.next(timeout_s=60)
    held = {k: torch.zeros_like(t) for k, t in w.items()}
    held["norm.weight"] = torch.zeros(128, dtype=torch.float16)  # wrong dtype
    before = {k: v.clone() for k, v in held.items()}
    with pytest.raises(tern.Error) as e:
        got.apply_to(held)
    assert e.value.code == tern.Code.MISMATCH and "norm.weight" in str(e.value)
    del held["norm.weight"]
    with pytest.raises(tern.Error) as e:
        got.apply_to(held)
    assert e.value.code == tern.Code.NOT_FOUND
    # Nothing was written by either refused call.
    for k in held:
        assert torch.equal(held[k].view(torch.int16) if held[k].dtype == torch.bfloat16 else held[k],
                           before[k].view(torch.int16) if before[k].dtype == torch.bfloat16 else before[k])


def test_apply_to_verifies_the_whole_view_against_the_signed_digest(fleet, tmp_path):
    root, member = fleet
    w1 = model(11)
    root.publish(checkpoint(tmp_path / "d1.safetensors", w1), 1)
    sub = tern.Subscriber(member)
    got = sub.next(timeout_s=60)
    held = {k: v.clone() for k, v in w1.items()}
    # The digest of tensors in memory is the version's (its manifest's).
    assert tern.view_digest(held) == got.digest
    got.verify(held)
    with pytest.raises(tern.Error) as e:
        got.verify({k: v for k, v in held.items() if k != "norm.weight"})
    assert e.value.code == tern.Code.NOT_FOUND and "'norm.weight'" in str(e.value)
    # The caller's copy drifts in a tensor the next version does not touch:
    # the bit-for-bit check of the changed tensors cannot see it, the digest does.
    held["layer.1.weight"].view(-1).view(torch.int16)[17] ^= 1
    w2 = step(w1, 0.01, 12, names=("layer.0.weight",))
    root.publish(checkpoint(tmp_path / "d2.safetensors", w2), 2)
    got = sub.next(timeout_s=60)
    assert got.version == 2 and got.changed_tensors == ("layer.0.weight",)
    before = held["layer.0.weight"].clone()
    with pytest.raises(tern.Error) as e:  # asked for without the whole view: refused first
        got.apply_to({k: v for k, v in held.items() if k != "norm.weight"}, verify_digest=True)
    assert e.value.code == tern.Code.NOT_FOUND and "verify_digest" in str(e.value)
    assert torch.equal(held["layer.0.weight"].view(torch.int16), before.view(torch.int16))
    assert got.apply_to(held, verify_digest=False) > 0  # asked not to: no digest check
    with pytest.raises(tern.Error) as e:
        got.apply_to(held)
    assert e.value.code == tern.Code.MISMATCH and "signed digest" in str(e.value)
    # After a failed check the next version carries every tensor and repairs the copy.
    w3 = step(w2, 0.01, 13, names=("layer.0.weight",))
    root.publish(checkpoint(tmp_path / "d3.safetensors", w3), 3)
    got = sub.next(timeout_s=60)
    assert got.version == 3 and got.all_tensors
    got.apply_to(held)
    assert tern.view_digest(held) == got.digest
    # The dtype is part of a tensor's identity: the same bits as I16 are another view.
    assert tern.view_digest({k: v.view(torch.int16).numpy() if v.dtype == torch.bfloat16 else v.numpy()
                             for k, v in held.items()}) != got.digest  # I16 is another dtype
    with pytest.raises(ValueError, match="view_digest: 'x' must be a contiguous CPU tensor"):
        tern.view_digest({"x": torch.zeros(4, 4).t()})


def test_errors_carry_codes(fleet, tmp_path):
    root, member = fleet
    w = model(5)
    path = checkpoint(tmp_path / "c1.safetensors", w)
    root.publish(path, 2)
    with pytest.raises(tern.Error) as e:
        root.publish(path, 2)  # not beyond HEAD
    assert e.value.code != tern.Code.OK and e.value.code_name
    with pytest.raises(tern.Error) as e:
        tern.Client(root.admin_address, token="wrong").publish(path, 3)
    assert e.value.code == tern.Code.AUTH
    # Through the port with the token: works, and the jobs say so.
    client = tern.Client(root.admin_address, token=TOKEN)
    client.publish(checkpoint(tmp_path / "c2.safetensors", step(w, 0.01, 6)), 3)
    assert client.status().head == 3
    assert "tern_agent" in client.metrics()
    root.close()
    with pytest.raises(ValueError, match="closed"):
        root.status()


def test_client_supersede_withdraws_a_wrong_version(fleet, tmp_path):
    """tern.Client(supersede=True) (ABI 1.3): a version below a wrong HEAD
    opens the next board epoch; the member follows it; a number the log
    holds is refused (docs/agent/operations.md)."""
    root, member = fleet
    w1, w2 = model(7), None
    root.publish(checkpoint(tmp_path / "s1.safetensors", w1), 1)
    w2 = step(w1, 0.01, 8)
    root.publish(checkpoint(tmp_path / "s2.safetensors", w2), 5000)  # the typo
    wait_served(member, 5000)
    right = checkpoint(tmp_path / "s3.safetensors", step(w2, 0.01, 9))
    client = tern.Client(root.admin_address, token=TOKEN, supersede=True)
    with pytest.raises(tern.Error) as e:
        client.publish(right, 1)  # in the log
    assert "in the board's log already" in str(e.value)
    sub = tern.Subscriber(member)
    assert sub.next(10).position == (0, 5000)
    client.publish(right, 2)
    st = client.status()
    assert st.head == 2 and st.head_position == (1, 2) and st.served_position == (1, 2)
    assert root.status().head_position == (1, 2)
    deadline = time.monotonic() + 60
    while member.status().served_position != (1, 2):
        assert time.monotonic() < deadline, "the member did not follow the supersede"
        time.sleep(0.05)
    assert member.status().head_position == (1, 2)
    # Events carry their version's epoch, in-process and over the port.
    published = {e.version: e.epoch for e in root.wait_events() if e.kind == "version_published"}
    assert published == {1: 0, 5000: 0, 2: 1}
    # (The member emits its event after its status names the version.)
    served = []
    while served[-1:] != [(1, 2)]:
        assert time.monotonic() < deadline, served
        served = [e.position for e in member.wait_events() if e.kind == "version_served"]
        time.sleep(0.05)
    assert served[-2:] == [(0, 5000), (1, 2)] and served == sorted(served)
    over_port = [e.position for e in tern.Client(member.admin_address, token=TOKEN).events()["events"]
                 if e.kind == "version_served"]
    assert over_port == served
    # ABI 1.6: the same events as batches over the port, field by field.
    def fields(events):
        return [(e.seq, e.kind, e.position, e.digest, e.slot_dir, e.all_tensors, e.changed_tensors)
                for e in events]
    batch = tern.Client(member.admin_address, token=TOKEN).wait_events()
    assert fields(batch) == fields(member.wait_events())
    assert re.fullmatch(r"[0-9a-f]{16}", batch.run), batch.run  # ABI 1.7: the agent's run
    later = tern.Client(member.admin_address, token=TOKEN).wait_events(batch[-1].seq)
    assert later.run == batch.run
    v = sub.next(10)
    assert v.position == (1, 2) and v.still_served()
    # Positions, not numbers: version 2 of epoch 0 is not what is served.
    stale = tern.Version(sub, 2, v.digest, v.slot_dir, False, v.changed_tensors, epoch=0)
    assert not stale.still_served()
    # Ordinary publishes go on from 2.
    tern.Client(root.admin_address, token=TOKEN).publish(
        checkpoint(tmp_path / "s4.safetensors", step(w2, 0.01, 10)), 3)
    wait_served(member, 3)


def test_publish_releases_the_gil(fleet, tmp_path):
    """Another Python thread runs while a publish diffs a large checkpoint."""
    root, member = fleet
    big = {"w": torch.randn(4096, 4096).to(torch.bfloat16)}  # 32 MiB
    p1 = checkpoint(tmp_path / "g1.safetensors", big)
    big2 = step(big, 0.01, 11, names=("w",))
    p2 = checkpoint(tmp_path / "g2.safetensors", big2)
    root.publish(p1, 1)
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.05)
        start_ticks, t0 = ticks[0], time.monotonic()
        root.publish(p2, 2)
        during, elapsed = ticks[0] - start_ticks, time.monotonic() - t0
    finally:
        stop.set()
        t.join()
    # Held GIL: the spinner gets at most a switch interval's worth (5 ms).
    assert elapsed > 0.02, f"publish took {elapsed:.3f} s: too short to tell"
    assert during > 1000, f"the spinner ran {during} times in {elapsed:.3f} s of publish"


def test_operator_calls(fleet, tmp_path):
    root, member = fleet
    root.publish(checkpoint(tmp_path / "o1.safetensors", model(13)), 1)
    wait_served(member, 1)
    member_id = member.listen_address
    client = tern.Client(root.admin_address, token=TOKEN)
    client.drain_member(member_id)
    drained = [m for m in client.status_json()["members"] if m["id"] == member_id]
    assert drained and drained[0]["draining"] is True
    with pytest.raises(tern.Error) as e:
        root.drain_member("ghost")
    assert e.value.code == tern.Code.NOT_FOUND
    with pytest.raises(tern.Error) as e:
        tern.Client(root.admin_address).set_retention(4, 8)  # no token
    assert e.value.code == tern.Code.AUTH
    root.set_retention(4, 8)
    root.remove_member(member_id, rejoin_after_s=0)
    kinds = [e.kind for e in root.wait_events(0, 1024, 0) if e.member == member_id]
    assert "member_drained" in kinds and "member_removed" in kinds


def test_publish_tensors_from_memory(fleet, tmp_path):
    """No checkpoint file: the root publishes torch tensors in place, the
    member serves them bit for bit; a wrong dtype is refused by name."""
    root, member = fleet
    sub = tern.Subscriber(member)
    w = model(21)
    root.publish_tensors(1, w)
    w2 = step(w, 0.02, 22)
    root.publish_tensors(2, w2)
    wait_served(member, 2)
    got = sub.next(timeout_s=30)
    assert got.version == 2
    for name, t in w2.items():
        served = got.tensor(name)
        assert torch.equal(served.view(torch.uint8) if served.dtype == torch.bfloat16 else served,
                           t.view(torch.uint8) if t.dtype == torch.bfloat16 else t)
    bad = dict(w2)
    bad["norm.weight"] = bad["norm.weight"].to(torch.float16)
    with pytest.raises(tern.Error) as e:
        root.publish_tensors(3, bad)
    assert "norm.weight" in str(e.value)
    with pytest.raises(ValueError, match="contiguous"):
        root.publish_tensors(3, {**w2, "layer.0.weight": w2["layer.0.weight"].t()})
    assert root.status().head == 2


def test_publisher_ranks_publish_their_rows(fleet):
    """Two trainer ranks (threads here; processes in tests/cli/test_rank_parts.py)
    publish the rows they own through the root's admin port: the member
    serves each version bit for bit; a rank that does not send fails the
    version naming it and nothing is published; a wrong token is refused."""
    root, member = fleet
    sub = tern.Subscriber(member)
    w = model(31)
    layout = {n: t for n, t in w.items()}
    rows = {r: {"layer.0.weight": (r * 64, r * 64 + 64), "layer.1.weight": (r * 64, r * 64 + 64)}
            for r in range(2)}
    rows[0]["norm.weight"] = (0, 128)
    pubs = [tern.Publisher(rank=r, world_size=2, board=root.admin_address, token=TOKEN,
                           layout=layout, shards=rows[r], gather_timeout_s=30,
                           segment_elements=4096) for r in range(2)]

    def mine(r, weights):
        out = {}
        for name, (a, b) in rows[r].items():
            t = weights[name]
            out[name] = t[a:b] if t.dim() > 1 else t  # a row slice of a contiguous tensor is contiguous
        return out

    def publish_all(version, weights, ranks=(0, 1)):
        errors, sizes = {}, {}

        def run(r):
            try:
                sizes[r] = pubs[r].publish(version, mine(r, weights))
            except tern.Error as e:
                errors[r] = e
        threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sizes, errors

    for version, weights in ((1, w), (2, step(w, 0.02, 32, names=("layer.0.weight", "layer.1.weight")))):
        sizes, errors = publish_all(version, weights)
        assert not errors, errors
        assert all(s > 0 for s in sizes.values())
        wait_served(member, version)
        got = sub.next(timeout_s=30)
        assert got.version == version
        for name, t in weights.items():
            assert got.tensor(name).contiguous().view(torch.uint8).equal(t.contiguous().view(torch.uint8)), name
        assert pubs[0].version == version and pubs[1].version == version

    # Only rank 0 sends version 3: it fails naming rank 1, the board keeps 2.
    slow = tern.Publisher(rank=0, world_size=2, board=root.admin_address, token=TOKEN,
                          layout=layout, shards=rows[0], gather_timeout_s=0.5)
    with pytest.raises(tern.Error) as e:
        slow.publish(1, mine(0, w))  # a fresh publisher starts at version 0
    assert "rank(s) 1" in str(e.value), str(e.value)
    assert root.status().head == 2
    assert slow.version == 0

    wrong = tern.Publisher(rank=0, world_size=2, board=root.admin_address, token="nope",
                           layout=layout, shards=rows[0])
    with pytest.raises(tern.Error) as e:
        wrong.publish(3, mine(0, w))
    assert e.value.code == tern.Code.AUTH
    with pytest.raises(ValueError, match="owned tensors"):
        pubs[0].publish(3, mine(1, w))


def test_publisher_resume_after_a_rank_restarts(fleet):
    """A rank whose process restarts while the root gathers a version
    resumes it (Publisher.resume, ABI 1.3) from HEAD's bytes of its rows,
    read from the member's served slot: the version commits with the other
    rank's part and the member serves it bit for bit. The root refuses a
    resume it cannot take with MISMATCH, saying what to do, and takes
    nothing: a version it is not gathering, other bytes for a rank whose
    part is there."""
    root, member = fleet
    sub = tern.Subscriber(member)
    w = model(51)
    publisher = functools.partial(_rank_publisher, root, w)

    pubs = [publisher(0), publisher(1)]
    _publish_all(pubs, 1, w)
    wait_served(member, 1)
    served = sub.next(timeout_s=30)
    assert served.version == 1

    # Version 2: rank 0's part is sent and waits; rank 1's process died
    # before sending and comes back with a new publisher.
    w2 = step(w, 0.02, 52, names=("layer.0.weight", "layer.1.weight"))
    t0, out0 = _in_thread(lambda: pubs[0].publish(2, _mine(0, w2)))
    deadline = time.monotonic() + 30
    while not _rank_job(root, 2, 0):
        assert time.monotonic() < deadline, "rank 0's part never reached the root"
        time.sleep(0.02)
    restarted = publisher(1)
    with pytest.raises(tern.Error) as e:  # without resuming, its zero view is not HEAD's
        publisher(1).resume(2, _mine(1, w2), base_version=0, base=None)
    assert e.value.code == tern.Code.MISMATCH, str(e.value)
    # A base that is not HEAD's bytes (here the new version's own): the
    # root knows the terms rank 1's part of version 1 committed and refuses
    # it before it joins; rank 0's part still waits.
    with pytest.raises(tern.Error) as e:
        publisher(1).resume(2, _mine(1, w2), base_version=1, base=_mine(1, w2))
    assert e.value.code == tern.Code.MISMATCH and "is not version 1's bytes" in str(e.value), str(e.value)
    assert t0.is_alive() and _rank_job(root, 2, 0)
    base = {n: served.tensor(n) for n in _ROWS[1]}
    size = restarted.resume(2, _mine(1, w2), base_version=1, base=_mine(1, base))
    assert size > 0 and restarted.version == 2
    t0.join()
    assert "error" not in out0, out0
    wait_served(member, 2)
    got = sub.next(timeout_s=30)
    assert got.version == 2
    for name, t in w2.items():
        assert got.tensor(name).contiguous().view(torch.uint8).equal(t.contiguous().view(torch.uint8)), name

    # Refusals take nothing. A version nobody gathers:
    with pytest.raises(tern.Error) as e:
        publisher(1).resume(3, _mine(1, w2), base_version=2, base=_mine(1, w2))
    assert e.value.code == tern.Code.MISMATCH and "not being gathered" in str(e.value), str(e.value)
    # Other bytes for rank 0, whose part of version 3 is being gathered:
    w3 = step(w2, 0.02, 53, names=("layer.0.weight",))
    t0, out0 = _in_thread(lambda: pubs[0].publish(3, _mine(0, w3)))
    deadline = time.monotonic() + 30
    while not _rank_job(root, 3, 0):
        assert time.monotonic() < deadline, "rank 0's part never reached the root"
        time.sleep(0.02)
    with pytest.raises(tern.Error) as e:
        publisher(0).resume(3, _mine(0, w2), base_version=2, base=_mine(0, w2))
    assert e.value.code == tern.Code.MISMATCH and "wait for the version" in str(e.value), str(e.value)
    assert restarted.publish(3, _mine(1, w3)) > 0  # rank 1 as usual: 3 commits with rank 0's part
    t0.join()
    assert "error" not in out0, out0
    wait_served(member, 3)
    got = sub.next(timeout_s=30)
    assert got.tensor("layer.0.weight").view(torch.int16).equal(w3["layer.0.weight"].view(torch.int16))


_ROWS = {0: {"layer.0.weight": (0, 64), "layer.1.weight": (0, 64), "norm.weight": (0, 128)},
         1: {"layer.0.weight": (64, 128), "layer.1.weight": (64, 128)}}


def _rank_publisher(root, layout, r, gather_timeout_s=30):
    """Rank r of two over `layout`'s tensors, owning _ROWS[r]."""
    return tern.Publisher(rank=r, world_size=2, board=root.admin_address, token=TOKEN,
                          layout=layout, shards=_ROWS[r], gather_timeout_s=gather_timeout_s,
                          segment_elements=4096)


def _mine(r, weights):
    """Rank r's rows of `weights`."""
    return {n: (weights[n][a:b] if weights[n].dim() > 1 else weights[n])
            for n, (a, b) in _ROWS[r].items()}


def _in_thread(call):
    """Runs call() on a thread: (the thread, {"size": its result} or {"error": tern.Error})."""
    out = {}

    def run():
        try:
            out["size"] = call()
        except tern.Error as e:
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, out


def _publish_all(pubs, version, weights):
    """Every rank publishes its rows of `weights` as `version`, each from a
    thread of its own; asserts none failed."""
    threads = [_in_thread(lambda p=p, r=r: p.publish(version, _mine(r, weights)))
               for r, p in enumerate(pubs)]
    for t, out in threads:
        t.join()
        assert "error" not in out, out


def _wait_rank_job(root, version, rank):
    deadline = time.monotonic() + 30
    while not _rank_job(root, version, rank):
        assert time.monotonic() < deadline, f"rank {rank}'s part of {version} never reached the root"
        time.sleep(0.02)


def test_restarted_ranks_fetch_their_base_from_the_root(fleet):
    """ABI 1.8: a rank whose process restarted gets its rows of HEAD from
    the root itself (GET /view/rows), not from a member's slot. Rank 1
    dies while the root gathers version 2 and resumes it with no base
    given; rank 0 dies between versions and rebases before version 3. The
    member serves each version bit for bit. A Publisher that has published
    cannot rebase, and a wrong token takes nothing."""
    root, member = fleet
    sub = tern.Subscriber(member)
    w = model(61)
    pubs = [_rank_publisher(root, w, 0), _rank_publisher(root, w, 1)]
    assert pubs[1].rebase() == 0  # an empty board: the zero view is HEAD's
    _publish_all(pubs, 1, w)

    w2 = step(w, 0.02, 62, names=("layer.0.weight", "layer.1.weight"))
    t0, out0 = _in_thread(lambda: pubs[0].publish(2, _mine(0, w2)))
    _wait_rank_job(root, 2, 0)
    restarted = _rank_publisher(root, w, 1)
    assert restarted.resume(2, _mine(1, w2)) > 0 and restarted.version == 2
    t0.join()
    assert "error" not in out0, out0

    with pytest.raises(tern.Error) as e:
        restarted.rebase()
    assert e.value.code == tern.Code.MISMATCH and "new publisher" in str(e.value), str(e.value)
    wrong = tern.Publisher(rank=0, world_size=2, board=root.admin_address, token="wrong",
                           layout=w, shards=_ROWS[0])
    with pytest.raises(tern.Error) as e:
        wrong.rebase()
    assert e.value.code == tern.Code.AUTH and wrong.version == 0, str(e.value)

    pubs = [_rank_publisher(root, w, 0), restarted]
    assert pubs[0].rebase() == 2 and pubs[0].version == 2
    w3 = step(w2, 0.02, 63, names=("layer.0.weight", "norm.weight"))
    _publish_all(pubs, 3, w3)
    wait_served(member, 3)
    got = sub.next(timeout_s=30)
    while got.version < 3:
        got = sub.next(timeout_s=30)
    for name, t in w3.items():
        assert got.tensor(name).contiguous().view(torch.uint8).equal(t.contiguous().view(torch.uint8)), name


def _rank_job(root, version, rank):
    """GET /publish/rank-part?version=&rank= on the root, or None (404)."""
    import json as _json
    import urllib.error
    import urllib.request
    req = urllib.request.Request(f"http://{root.admin_address}/publish/rank-part?version={version}&rank={rank}",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return _json.loads(r.read())
    except urllib.error.HTTPError:
        return None


def _rss_anon_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def _peak_anon_growth(call):
    """Runs call() while a thread samples this process's anonymous memory
    every millisecond; returns (the peak above where it started, call's
    result). A copy of a tensor's bytes made for the call shows up as that
    many bytes (glibc maps and unmaps blocks that large: they are not
    hidden in a free list), alive at least as long as the diff reads it."""
    base = _rss_anon_bytes()
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_anon_bytes())
            time.sleep(0.001)

    t = threading.Thread(target=sample)
    t.start()
    try:
        out = call()
    finally:
        stop.set()
        t.join()
    return peak[0] - base, out


N_ZERO_COPY = 64 << 20  # bytes of the tensor the two tests below publish


def zero_copy_weights():
    w1 = {"w": torch.randn(4096, 8192).to(torch.bfloat16)}
    return w1, step(w1, 0.01, 41, names=("w",))


def _expect_zero_copy(capsys, member, what, publish):
    """Publishes version 1, then version 2 (1% changed) of the zero-copy
    weights with `publish(version, tensors)`, and checks the process's
    anonymous memory grew by far less than the tensor during the second."""
    w1, w2 = zero_copy_weights()
    publish(1, w1)
    grew, result = _peak_anon_growth(lambda: publish(2, w2))
    wait_served(member, 2)
    part = f" (part {result / 2**20:.2f} MiB)" if isinstance(result, int) else ""
    with capsys.disabled():
        print(f"\nzero copy: a {N_ZERO_COPY >> 20} MiB tensor, 1% changed: anonymous memory grew "
              f"{grew / 2**20:.1f} MiB during {what}{part}")
    assert grew < N_ZERO_COPY // 4, f"{what} grew anonymous memory by {grew} bytes"


def test_publish_tensors_reads_them_in_place(fleet, capsys):
    """Zero copy, measured: Agent.publish_tensors of a 64 MiB tensor (the
    second version, 1% changed) does not copy its bytes: the process's
    anonymous memory grows by far less than the tensor during the call (a
    copy would add 64 MiB; the root's previous view is its served slot, a
    mapped file)."""
    root, member = fleet
    _expect_zero_copy(capsys, member, "Agent.publish_tensors", root.publish_tensors)


def test_publisher_reads_its_rows_in_place(fleet, capsys):
    """The same for a trainer rank (Publisher, one rank): its first part
    allocates the previous view it keeps (64 MiB, once); the second, 1%
    changed, is diffed from the caller's tensor in place and the previous
    view updated where it lies, so memory grows by far less than 64 MiB."""
    root, member = fleet
    pub = tern.Publisher(rank=0, world_size=1, board=root.admin_address, token=TOKEN,
                         layout=zero_copy_weights()[0], shards={"w": (0, 4096)})
    _expect_zero_copy(capsys, member, "Publisher.publish", pub.publish)


def test_subscriber_over_a_port_reads_a_restarted_agent_from_its_first_event():
    """An agent that restarted and numbered past the seq a Subscriber had
    read answers only its newest events with no gap and no restart flag:
    the run id says it is a new process, and the Subscriber reads it from
    its first event and yields the version as all tensors new (what the
    consumer holds may differ anywhere)."""
    import http.server
    import json
    from urllib.parse import parse_qs, urlparse

    state = {"run": "run-a", "served": [(1, ["w"]), (2, ["w"])], "afters": []}

    def event(seq, version, changed):
        return {"seq": seq, "at_s": 1.0, "kind": "version_served", "version": version, "epoch": 0,
                "digest": "tern1:" + "0" * 64, "member": "m", "slot_dir": "/x/views/a",
                "all_tensors": False, "changed_tensors": changed}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            q = parse_qs(urlparse(self.path).query)
            after = int(q["after"][0])
            state["afters"].append(after)
            held = [event(i + 1, v, c) for i, (v, c) in enumerate(state["served"])]
            last = len(held)
            start = 0 if after > last else after
            out = held[start:]
            body = json.dumps({"events": out, "gap": 0, "restarted": False,
                               "next": out[-1]["seq"] if out else min(after, last),
                               "last_seq": last, "run": state["run"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        sub = tern.Subscriber(f"127.0.0.1:{server.server_address[1]}")
        v = sub.next(5)
        assert v.version == 2 and v.all_tensors  # the first version
        # Restarted: versions 1..4 of the new run, seqs 1..4; after seq 2 it
        # would answer 3 and 4 alone.
        state["run"] = "run-b"
        state["served"] = [(1, ["a"]), (2, ["b"]), (3, ["c"]), (4, ["d"])]
        v = sub.next(5)
        assert v.version == 4 and v.all_tensors, (v, state["afters"])
        # Asked after 2, saw run-b, asked again from 0; then drained after 4.
        assert state["afters"] == [0, 2, 2, 0, 4], state["afters"]
        # The same run again: an ordinary next version, only its tensors.
        state["served"].append((5, ["e"]))
        v = sub.next(5)
        assert v.version == 5 and not v.all_tensors and v.changed_tensors == ("e",)
        # Client.wait_events (ABI 1.7) names each batch's run, empty or not,
        # so a poller across calls sees the restart that the seqs hide.
        client = tern.Client(f"127.0.0.1:{server.server_address[1]}")
        batch = client.wait_events(4)
        assert isinstance(batch, tern.Events) and batch.run == "run-b"
        assert [e.version for e in batch] == [5]
        state["run"] = "run-c"
        batch = client.wait_events(5)
        assert batch == [] and batch.run == "run-c"
    finally:
        server.shutdown()
        server.server_close()
    # The agent gone (its port closed): next() waits out its timeout, polling
    # with a backoff, and returns None rather than raising.
    t0 = time.monotonic()
    assert sub.next(1.5) is None
    assert 1.4 <= time.monotonic() - t0 < 5
    assert sub._backoff_s > 0.1  # it backed off
