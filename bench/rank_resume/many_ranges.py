"""Times Publisher.rebase of a rank that owns a slice of many tensors, as an
FSDP rank does (one GET /view/rows per owned range at least): N tensors of
64x256 BF16, two ranks owning half the rows of each; version 1 from both
ranks, then three fresh publishers of rank 0 rebase from the root. One
machine, loopback root, plain HTTP (no TLS handshake per request). Run from
the repository root after the release build:
  PYTHONPATH=build/release/python .venv/bin/python bench/rank_resume/many_ranges.py [N]
(docs/benchmarks.md, "Resuming a restarted rank")."""
import sys, tempfile, threading, time
import torch
import tern

TOKEN = "bench"
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
work = tempfile.mkdtemp()
w = {f"layer.{i:04d}.weight": torch.randn(64, 256).to(torch.bfloat16) for i in range(n)}
shards = {0: {k: (0, 32) for k in w}, 1: {k: (32, 64) for k in w}}

with tern.Agent(root=True, listen="127.0.0.1:0", admin_listen="127.0.0.1:0", admin_token=TOKEN,
                data_dir=f"{work}/root", transport="tcp") as root:
    def pub(r):
        return tern.Publisher(rank=r, world_size=2, board=root.admin_address, token=TOKEN,
                              layout=w, shards=shards[r], gather_timeout_s=120)

    def mine(r):
        return {k: w[k][a:b] for k, (a, b) in shards[r].items()}

    p0, p1 = pub(0), pub(1)
    th = threading.Thread(target=lambda: p0.publish(1, mine(0)))
    th.start()
    p1.publish(1, mine(1))
    th.join()
    mib = n * 32 * 256 * 2 / 2**20
    for _ in range(3):
        q = pub(0)
        t0 = time.monotonic()
        assert q.rebase() == 1
        dt = time.monotonic() - t0
        print(f"rebase of {n} ranges ({mib:.1f} MiB): {dt:.3f} s, {dt / n * 1e3:.2f} ms per range")
