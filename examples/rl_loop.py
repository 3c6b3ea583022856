#!/usr/bin/env python3
"""An RL loop that never writes a checkpoint file (docs/embedding.md, "Python").

A small policy (a few million parameters) is trained with PyTorch and Adam
on a toy contextual bandit (REINFORCE). After every optimizer step the
trainer publishes the policy's serve view (its BF16 cast) from memory with
`tern.Agent.publish_tensors`: no file, no copy. Members in two regions
(labels on loopback here; see bench/fanout for the emulated WAN) receive,
verify and serve each version; a rollout worker follows one member with a
`tern.Subscriber` and applies each version in place to its own BF16 copy of
the policy, which samples the next batch of actions.

Per step it prints the reward, the fraction of BF16 values that changed,
the patch bytes and the time from publish until every member serves the
version. Exit status 0 when every version reached every member and the
rollout copy equals the trainer's view bit for bit at the end.

    .venv/bin/python examples/rl_loop.py [--steps 30] [--hidden 1536] [--lr 2e-6] [--workdir DIR]

Single trainer process; examples/rl_loop_ranks.py is the same loop with two
trainer ranks, each publishing its rows (docs/agent/board.md §4b).
"""
import argparse
import shutil
import sys
import tempfile
import time

import torch

import tern


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
    """The served weights: the BF16 cast of every parameter, contiguous."""
    return {name: p.detach().to(torch.bfloat16).contiguous() for name, p in policy.named_parameters()}


def changed_fraction(a, b):
    changed = total = 0
    for name, t in a.items():
        changed += int((t.view(torch.int16) != b[name].view(torch.int16)).sum())
        total += t.numel()
    return changed / total


def wait_all_serve(root, members, version, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while any(m.status().served_version < version for m in members):
        if time.monotonic() > deadline:
            raise SystemExit(f"rl_loop: version {version} did not reach every member in {timeout_s} s")
        time.sleep(0.01)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps (versions)")
    ap.add_argument("--hidden", type=int, default=1536, help="hidden width (1536: ~2.4M parameters)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-6,
                    help="Adam step size: RL post-training runs small (1e-6..1e-5), so few BF16 values change")
    ap.add_argument("--workdir", help="agents' directories (default: a temporary one, removed)")
    args = ap.parse_args()

    torch.manual_seed(0)
    contexts, actions = 32, 16
    target = torch.randn(contexts, actions)  # the hidden best action per context
    trainer = Policy(contexts, actions, args.hidden)
    opt = torch.optim.Adam(trainer.parameters(), lr=args.lr)
    params = sum(p.numel() for p in trainer.parameters())

    work = args.workdir or tempfile.mkdtemp(prefix="tern-rl-loop-")
    root = tern.Agent(root=True, listen="127.0.0.1:0", data_dir=f"{work}/root", transport="tcp",
                      region="us")
    key = root.public_key_pem()
    members = [tern.Agent(join=root.listen_address, listen="127.0.0.1:0", data_dir=f"{work}/{name}",
                          transport="tcp", trusted_keys_pem=[key], region=region)
               for name, region in (("us-1", "us"), ("eu-1", "eu"), ("eu-2", "eu"))]
    rollout_member = members[-1]
    try:
        view = serve_view(trainer)
        root.publish_tensors(1, view)
        wait_all_serve(root, members, 1)
        sub = tern.Subscriber(rollout_member)
        rollout = {name: torch.zeros_like(t) for name, t in view.items()}
        sub.next(timeout_s=30).apply_to(rollout)
        actor = Policy(contexts, actions, args.hidden)
        print(f"rl_loop: {params / 1e6:.2f}M parameters, BF16 view {sum(t.numel() * 2 for t in view.values()) / 1e6:.1f} MB, "
              f"{len(members)} members in regions us, eu")
        print(f"{'step':>4} {'reward':>7} {'changed':>8} {'patch':>10} {'all serve':>10}")
        for step in range(2, args.steps + 2):
            # Rollouts with the weights the member serves (BF16, as an engine would).
            with torch.no_grad():
                for name, p in actor.named_parameters():
                    p.copy_(rollout[name].float())
                ctx = torch.randn(args.batch, contexts)
                dist = torch.distributions.Categorical(logits=actor(ctx))
                act = dist.sample()
                reward = (act == (ctx @ target).argmax(dim=1)).float()
            # One REINFORCE step on the trainer's FP32 weights.
            logp = torch.distributions.Categorical(logits=trainer(ctx)).log_prob(act)
            loss = -((reward - reward.mean()) * logp).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            # Publish the new serve view from memory, then follow it.
            new_view = serve_view(trainer)
            frac = changed_fraction(view, new_view)
            t0 = time.monotonic()
            root.publish_tensors(step, new_view)
            wait_all_serve(root, members, step)
            all_serve_s = time.monotonic() - t0
            got = sub.next(timeout_s=30)
            got.apply_to(rollout)
            versions = {v["version"]: v for v in root.status_json().get("versions", [])}
            patch = versions.get(step, {}).get("patch_bytes", 0)
            print(f"{step:>4} {reward.mean().item():>7.3f} {frac:>8.2%} {patch:>10,} {all_serve_s:>9.3f}s")
            view = new_view
        same = all(torch.equal(rollout[n].view(torch.int16), view[n].view(torch.int16)) for n in view)
        print(f"rl_loop: rollout copy {'equals' if same else 'DIFFERS FROM'} the trainer's view bit for bit")
        return 0 if same else 1
    finally:
        for m in members:
            m.close()
        root.close()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
