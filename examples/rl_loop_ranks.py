#!/usr/bin/env python3
"""The RL loop of rl_loop.py with two trainer ranks (docs/embedding.md,
"Python"; docs/agent/board.md §4b).

Two trainer processes train one policy data-parallel under
torch.distributed (gloo, CPU): each samples its own batch of a toy
contextual bandit, the gradients are averaged with all_reduce, and Adam
steps the same FP32 weights on both. After every step each rank publishes
only the rows it owns of every parameter's BF16 serve view — rank r the
r-th half of each tensor's rows — with `tern.Publisher`, through the root
agent's admin port; the root commits the version once both parts are there
and members in two regions (labels on loopback) serve it. Full weights
never leave a rank, and no rank sends another's rows.

Per step it prints the reward, the fraction of BF16 values that changed,
each rank's part bytes and the time from the ranks' publish until every
member serves the version. Exit status 0 when every version reached every
member and a member's served view equals the trainers' view bit for bit at
the end.

    .venv/bin/python examples/rl_loop_ranks.py [--steps 20] [--hidden 1536] [--lr 2e-6] [--workdir DIR]
"""
import argparse
import os
import shutil
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tern

WORLD = 2
TOKEN = "rl-loop-ranks"


class Policy(torch.nn.Module):
    def __init__(self, contexts: int, actions: int, hidden: int):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(contexts, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
            torch.nn.Linear(hidden, actions))

    def forward(self, x):
        return self.body(x)


def serve_view(policy):
    return {name: p.detach().to(torch.bfloat16).contiguous() for name, p in policy.named_parameters()}


def my_rows(shape, rank):
    """Rank r's rows of a tensor: the r-th of WORLD near-equal runs of its first dimension."""
    rows = shape[0] if len(shape) else 1
    return (rows * rank // WORLD, rows * (rank + 1) // WORLD)


def changed_fraction(a, b):
    changed = total = 0
    for name, t in a.items():
        changed += int((t.view(torch.int16) != b[name].view(torch.int16)).sum())
        total += t.numel()
    return changed / total


def trainer(rank, args, board, port, queue):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    torch.manual_seed(0)  # the same initial weights on every rank
    contexts, actions = 32, 16
    target = torch.randn(contexts, actions)
    policy = Policy(contexts, actions, args.hidden)
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
    view = serve_view(policy)
    shards = {name: my_rows(t.shape, rank) for name, t in view.items()}
    pub = tern.Publisher(rank=rank, world_size=WORLD, board=board, token=TOKEN, layout=view,
                         shards=shards, gather_timeout_s=60)

    def publish(version, v):
        mine = {name: v[name][a:b] for name, (a, b) in shards.items()}
        t0 = time.monotonic()
        part = pub.publish(version, mine)
        return t0, part

    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own batches
    t0, part = publish(1, view)
    queue.put((rank, 1, t0, part, 1.0, None))  # from zeros: no step, no reward yet
    for step in range(2, args.steps + 2):
        with torch.no_grad():
            ctx = torch.randn(args.batch, contexts, generator=gen)
            logits = policy(ctx)
            act = torch.multinomial(torch.softmax(logits, dim=1), 1, generator=gen).squeeze(1)
            reward = (act == (ctx @ target).argmax(dim=1)).float()
        logp = torch.distributions.Categorical(logits=policy(ctx)).log_prob(act)
        loss = -((reward - reward.mean()) * logp).mean()
        opt.zero_grad()
        loss.backward()
        for p in policy.parameters():
            dist.all_reduce(p.grad)
            p.grad /= WORLD
        opt.step()
        new_view = serve_view(policy)
        frac = changed_fraction(view, new_view)
        t0, part = publish(step, new_view)
        queue.put((rank, step, t0, part, frac, reward.mean().item()))
        view = new_view
    if rank == 0:
        # By value (NumPy), not as shared memory: this process may be gone
        # before the parent reads it.
        queue.put(("view", {n: t.view(torch.int16).numpy().copy() for n, t in view.items()}))
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps (versions after the first)")
    ap.add_argument("--hidden", type=int, default=1536, help="hidden width (1536: ~2.4M parameters)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-6)
    ap.add_argument("--workdir", help="agents' directories (default: a temporary one, removed)")
    args = ap.parse_args()

    work = args.workdir or tempfile.mkdtemp(prefix="tern-rl-ranks-")
    root = tern.Agent(root=True, listen="127.0.0.1:0", admin_listen="127.0.0.1:0", admin_token=TOKEN,
                      data_dir=f"{work}/root", transport="tcp", region="us")
    key = root.public_key_pem()
    members = [tern.Agent(join=root.listen_address, listen="127.0.0.1:0", data_dir=f"{work}/{name}",
                          transport="tcp", trusted_keys_pem=[key], region=region)
               for name, region in (("us-1", "us"), ("eu-1", "eu"), ("eu-2", "eu"))]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=trainer, args=(r, args, root.admin_address, port, queue))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    ok = True
    try:
        print(f"rl_loop_ranks: {WORLD} trainer ranks (gloo), each publishing its rows; "
              f"{len(members)} members in regions us, eu")
        print(f"{'step':>4} {'reward':>7} {'changed':>8} {'part r0':>9} {'part r1':>9} {'all serve':>10}")
        got = {}
        final = None
        deadline = time.monotonic() + 60 + 30 * args.steps
        for version in range(1, args.steps + 2):
            while sum(1 for k in got if k[1] == version) < WORLD:
                item = queue.get(timeout=max(1.0, deadline - time.monotonic()))
                if item[0] == "view":
                    final = item[1]
                    continue
                got[(item[0], item[1])] = item
            while any(m.status().served_version < version for m in members):
                if time.monotonic() > deadline:
                    raise SystemExit(f"rl_loop_ranks: version {version} did not reach every member")
                time.sleep(0.005)
            served_at = time.monotonic()
            r0, r1 = got[(0, version)], got[(1, version)]
            t0 = min(r0[2], r1[2])
            reward = "-" if r0[5] is None else f"{r0[5]:.3f}"
            print(f"{version:>4} {reward:>7} {r0[4]:>8.2%} {r0[3]:>9,} {r1[3]:>9,} "
                  f"{served_at - t0:>9.3f}s")
        while final is None:
            item = queue.get(timeout=60)
            if item[0] == "view":
                final = item[1]
        for p in procs:
            p.join(timeout=60)
            ok = ok and p.exitcode == 0
        sub = tern.Subscriber(members[-1])
        v = sub.next(timeout_s=30)
        same = v.version == args.steps + 1 and all(
            torch.equal(v.tensor(n).contiguous().view(torch.int16), torch.from_numpy(t))
            for n, t in final.items())
        print(f"rl_loop_ranks: a member's view {'equals' if same else 'DIFFERS FROM'} "
              f"the trainers' bit for bit")
        return 0 if same and ok else 1
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for m in members:
            m.close()
        root.close()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
