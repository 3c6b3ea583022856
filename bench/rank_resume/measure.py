"""Times Publisher.resume of a 32 MiB part (BF16 rows, 1% changed) against
the same rank's ordinary publish of the next version; then the same resume
with the base fetched from the root (resume without a base, ABI 1.8) and a
rebase alone (a restart between versions), on one machine
(loopback root, plain TCP). Run from the repository root after the release build:
  PYTHONPATH=build/release/python .venv/bin/python bench/rank_resume/measure.py [WORKDIR]
(docs/benchmarks.md, "Resuming a restarted rank")."""
import sys, tempfile, threading, time
import torch
import tern

TOKEN = "bench"
work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
rows, cols = 8192, 4096  # 64 MiB BF16; each of 2 ranks owns 32 MiB
g = torch.Generator().manual_seed(1)
w = torch.randn(rows, cols, generator=g).to(torch.bfloat16)

def step(t, seed):
    g = torch.Generator().manual_seed(seed)
    out = t.clone()
    flat = out.view(-1)
    idx = torch.randperm(flat.numel(), generator=g)[: flat.numel() // 100]
    flat[idx] = (flat[idx].float() + 0.5).to(torch.bfloat16)
    return out

with tern.Agent(root=True, listen="127.0.0.1:0", admin_listen="127.0.0.1:0", admin_token=TOKEN,
                data_dir=f"{work}/root", transport="tcp") as root:
    half = rows // 2
    shards = {0: {"w": (0, half)}, 1: {"w": (half, rows)}}
    def pub(r):
        return tern.Publisher(rank=r, world_size=2, board=root.admin_address, token=TOKEN,
                              layout={"w": w}, shards=shards[r], gather_timeout_s=120)
    def mine(r, t):
        a, b = shards[r]["w"]
        return {"w": t[a:b]}
    def both(version, t, p0, p1):
        th = threading.Thread(target=lambda: p0.publish(version, mine(0, t)))
        th.start()
        t0 = time.monotonic()
        n = p1.publish(version, mine(1, t))
        dt = time.monotonic() - t0
        th.join()
        return n, dt
    p0, p1 = pub(0), pub(1)
    both(1, w, p0, p1)
    w2 = step(w, 2)
    # Rank 0 sends version 2 and waits; rank 1 restarts and resumes.
    th = threading.Thread(target=lambda: p0.publish(2, mine(0, w2)))
    th.start()
    time.sleep(0.5)
    base = {"w": w[half:rows].clone()}  # HEAD's rows, as a member's slot holds them
    p1b = pub(1)
    t0 = time.monotonic()
    n_resume = p1b.resume(2, mine(1, w2), base_version=1, base=base)
    resume_s = time.monotonic() - t0
    th.join()
    w3 = step(w2, 3)
    n_pub, pub_s = both(3, w3, p0, p1b)
    # Version 4: rank 1 restarts again and resumes, its base fetched from the root.
    w4 = step(w3, 4)
    th = threading.Thread(target=lambda: p0.publish(4, mine(0, w4)))
    th.start()
    time.sleep(0.5)
    p1c = pub(1)
    t0 = time.monotonic()
    n_root = p1c.resume(4, mine(1, w4))
    root_s = time.monotonic() - t0
    th.join()
    # Rank 0 restarts between versions: the base alone, then version 5.
    p0b = pub(0)
    t0 = time.monotonic()
    assert p0b.rebase() == 4
    rebase_s = time.monotonic() - t0
    n_pub5, pub5_s = both(5, step(w4, 5), p0b, p1c)
    print(f"resume of a 32 MiB part (v2, 1% changed): {resume_s:.3f} s, part {n_resume} bytes")
    print(f"ordinary publish of the next version (v3, 1% changed): {pub_s:.3f} s, part {n_pub} bytes")
    print(f"ratio resume / publish: {resume_s / pub_s:.2f}")
    print(f"resume with the base fetched from the root (v4): {root_s:.3f} s, part {n_root} bytes")
    print(f"rebase alone (32 MiB from the root, at v4): {rebase_s:.3f} s "
          f"({32 / rebase_s:.0f} MiB/s); the next publish (v5): {pub5_s:.3f} s, part {n_pub5} bytes")
    print(f"ratio resume from the root / publish: {root_s / pub_s:.2f}")
    assert root.status().head == 5
