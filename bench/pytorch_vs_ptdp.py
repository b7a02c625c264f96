#!/usr/bin/env python3
"""ptdp's CPU executor against PyTorch on CPU: the same GPT shapes, the same steps, in one run.

For each shape, in alternating rounds (the machine may be shared: every run records the load
average from /proc/loadavg before it starts):
  * `mpirun -np 1 ptdp train …` (t 1, p 1, d 1) against PyTorch with torch.set_num_threads(1);
  * `mpirun -np 2 ptdp train …` (t 1, p 1, d 2) against PyTorch with 2 threads (one process) and
    against PyTorch DDP (gloo on the loopback interface, 2 processes of 1 thread each);
tokens/s of each is the global batch × sequence length over the median step time, first step
excluded, as `ptdp train` reports it. The PyTorch model is the one a PyTorch user writes for this
architecture: pre-LayerNorm GPT blocks (fused QKV, GELU MLP of 4h, biases everywhere), learned
positions, tied embeddings, F.scaled_dot_product_attention(is_causal=True), fp32, AdamW
(β 0.9/0.95, weight decay 0.01) and global-norm clipping at 1.0 — what `ptdp train` runs.

usage: pytorch_vs_ptdp.py [--ptdp build/ptdp] [--rounds 3] [--steps 8] [--shapes tiny,small] [--markdown FILE]
Run with a Python that has torch (e.g. a venv: pip install torch); ptdp is run through mpirun.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = {
    # name: (layers, hidden, heads, seq, vocab, micro_batch, global_batch)
    "tiny": (4, 128, 4, 64, 256, 4, 16),    # scenarios/tiny-gpt-cpu.yaml
    "small": (4, 512, 8, 256, 256, 4, 8),   # the shape of `ptdp_exec_bench step`
}


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_ptdp(ptdp, root, shape, ranks, steps):
    layers, hidden, heads, seq, vocab, micro, batch = shape
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        sets = {"parallel.tensor": 1, "parallel.pipeline": 1, "parallel.data": ranks, "cluster.gpus": ranks,
                "model.num_layers": layers, "model.hidden_size": hidden, "model.num_attention_heads": heads,
                "model.seq_length": seq, "model.vocab_size": vocab, "training.micro_batch": micro,
                "training.global_batch": batch, "parallel.recompute": "none"}
        cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), ptdp, "train", os.path.join(root, "scenarios/tiny-gpt-cpu.yaml"),
               "--steps", str(steps), "--json", out]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            sys.exit(f"ptdp train failed ({p.returncode}):\n{p.stderr}")
        with open(out) as f:
            r = json.load(f)
        return r["tokens_per_s"], r["losses"][0], r["losses"][-1]


def run_torch(shape_name, threads, steps, ddp=1):
    """One PyTorch measurement in a fresh process (no state from an earlier run)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", shape_name, str(threads), str(steps), str(ddp)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if p.returncode != 0:
        sys.exit(f"PyTorch run failed ({p.returncode}):\n{p.stderr}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return r["tokens_per_s"], r["loss_first"], r["loss_last"]


def ddp_worker(rank, world, shape, threads, steps, queue):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    r = torch_train(shape, threads, steps, rank=rank, world=world)
    if rank == 0:
        queue.put(r)
    dist.destroy_process_group()


def torch_train(shape, threads, steps, seed=1, rank=0, world=1):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    layers, hidden, heads, seq, vocab, micro, batch = shape

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.ln2 = nn.LayerNorm(hidden)
            self.fc1 = nn.Linear(hidden, 4 * hidden)
            self.fc2 = nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
            q, k, v = (t.view(b, s, heads, h // heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, s, h))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, hidden)
            self.wpe = nn.Embedding(seq, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.lnf = nn.LayerNorm(hidden)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            logits = self.lnf(x) @ self.wte.weight.t()  # tied embeddings
            return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    model = GPT()
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    # The same learnable corpus structure as ptdp's built-in one is not needed for speed: random
    # tokens of the same shapes.
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (steps, batch, seq + 1), generator=g)
    local = batch // world  # data parallel: each rank its share of the global batch
    accum = local // micro
    times, losses = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(accum):
            chunk = data[step, rank * local + m * micro:rank * local + (m + 1) * micro]
            if world > 1 and m < accum - 1:
                with model.no_sync():  # all-reduce once per step, as ptdp's REDUCE_GRAD
                    loss = model(chunk[:, :-1], chunk[:, 1:]) / accum
                    loss.backward()
            else:
                loss = model(chunk[:, :-1], chunk[:, 1:]) / accum
                loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(total)
    median = statistics.median(times[1:] if len(times) > 1 else times)
    return {"tokens_per_s": batch * seq / median, "loss_first": losses[0], "loss_last": losses[-1]}


def worker(argv):
    name, threads, steps, ddp = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    if ddp == 1:
        r = torch_train(SHAPES[name], threads, steps)
    else:
        import socket
        import torch.multiprocessing as mp
        with socket.socket() as s:  # a free port on the loopback interface
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.spawn(ddp_worker, args=(ddp, SHAPES[name], threads, steps, queue), nprocs=ddp, join=True)
        r = queue.get()
    print(json.dumps(r))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2:])
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ptdp", default=os.path.join(root, "build", "ptdp"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--shapes", default="tiny,small")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--markdown", help="append the result table to this file")
    a = ap.parse_args()
    import torch  # noqa: F401  (fail early without torch)

    rows = []
    for name in a.shapes.split(","):
        shape = SHAPES[name]
        for ranks in (int(r) for r in a.ranks.split(",")):
            # PyTorch on the same cores: one process with `ranks` threads, and (ranks > 1) DDP over
            # gloo with `ranks` processes of one thread each, as ptdp runs.
            variants = [("ptdp", None), ("torch", "threads")] + ([("torch", "ddp")] if ranks > 1 else [])
            tps = {v: [] for v in variants}
            loads = []
            for rnd in range(a.rounds):
                # Alternate the order, so that a load change does not favour one side.
                order = variants if rnd % 2 == 0 else list(reversed(variants))
                for v in order:
                    load = loadavg()
                    if v[0] == "ptdp":
                        x, l0, l1 = run_ptdp(a.ptdp, root, shape, ranks, a.steps)
                    elif v[1] == "threads":
                        x, l0, l1 = run_torch(name, ranks, a.steps)
                    else:
                        x, l0, l1 = run_torch(name, 1, a.steps, ddp=ranks)
                    tps[v].append(x)
                    loads.append(load)
                    label = "ptdp" if v[0] == "ptdp" else ("torch" if v[1] == "threads" else "ddp")
                    print(f"{name:6s} {ranks} round {rnd + 1} {label:5s} {x:10.0f} tokens/s  loss {l0:.3f} → {l1:.3f}  "
                          f"load {load:.2f}", file=sys.stderr, flush=True)
            p = statistics.median(tps[("ptdp", None)])
            for v in variants[1:]:
                t = statistics.median(tps[v])
                what = f"{ranks} thread(s), 1 process" if v[1] == "threads" else f"DDP (gloo), {ranks} processes × 1 thread"
                rows.append((name, shape, ranks, what, p, t, tps[("ptdp", None)], tps[v], min(loads), max(loads)))
    lines = ["| shape (l, h, a, s, V, b, B) | ptdp ranks | PyTorch | ptdp tokens/s | PyTorch tokens/s | ptdp ÷ PyTorch | rounds ptdp | rounds PyTorch | load average |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, shape, ranks, what, p, t, ps, ts, lo, hi in rows:
        lines.append(f"| {name} {shape} | {ranks} | {what} | {p:.0f} | {t:.0f} | **{p / t:.2f}×** | "
                     f"{' / '.join(f'{x:.0f}' for x in ps)} | {' / '.join(f'{x:.0f}' for x in ts)} | {lo:.1f}–{hi:.1f} |")
    table = "\n".join(lines)
    print(table)
    import torch
    print(f"\nPyTorch {torch.__version__}, {a.steps} steps per run (median step time, first excluded), {a.rounds} rounds")
    if a.markdown:
        with open(a.markdown, "a") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
