"""What a trial process pays before it trains: imports, data, model, the first epoch; and which heavy
libraries it has loaded by then. Before and after, side by side in one invocation.

Run:  python benchmarks/trial_imports.py [--config examples/search_digits.yaml] [--before REV] [--repeats 5]

Each measurement is a fresh Python process that does what a Ray trial process does before and during its
first trial, stage by stage, and reads its own CPU time (`time.process_time`) after each stage:

1. `import torch`;
2. Ray's side of a trial (`ray.tune`, `ray.train`, `ray.train.torch`: the function trainable's imports);
3. augtune's trial modules (`augtune.trainables.ray_trainable`, the loop, the data loaders);
4. the data set of the config (as a trial loads it: the node's shared copy when there is one);
5. the `Trainer` (model, method, optimiser);
6. the first of two training epochs (two steps and its per-epoch evaluation, not the end of the run's;
   without the reference rows, which a search computes once per data set and keeps on disk).

After the last stage it lists which of the heavy libraries a trial may not need are loaded (plotting, UMAP,
numba, Optuna, scikit-learn, scipy, pandas, pyarrow, `torch._dynamo`). With `--before REV` the same runs
from that commit, checked out in a temporary git worktree; variants are interleaved and each stage's
median over `--repeats` processes is printed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = [
    ("torch", "import torch"),
    ("ray", "Ray's trial imports (tune, train)"),
    ("augtune", "augtune's trial modules"),
    ("data", "load the data set"),
    ("trainer", "Trainer (model, method, optimiser)"),
    ("epoch", "first epoch (2 steps, per-epoch evaluation)"),
]
HEAVY = ["matplotlib", "umap", "numba", "optuna", "sklearn", "scipy", "pandas", "pyarrow", "torch._dynamo"]

# Runs in the measured process, from the checkout given as argv[1], on the config given as argv[2].
PROBE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
cpu = {}
def stage(name, t=[time.process_time()]):
    now = time.process_time()
    cpu[name] = now - t[0]
    t[0] = now
import torch
torch.set_num_threads(1)
stage("torch")
import ray
from ray import train, tune
import ray.train.torch
stage("ray")
import augtune.trainables.ray_trainable
from augtune.data import load_dataset
from augtune.trainables.loop import Trainer
stage("augtune")
from augtune.config import load_config
cfg = load_config(sys.argv[2], overrides=["train.epochs=2", "train.batch_size=64", "dataset.max_train=128",
                                          "dataset.max_test=64", "eval.references=false"])
data = load_dataset(cfg.dataset)
stage("data")
trainer = Trainer(cfg, data, log=lambda s: None)
stage("trainer")
trainer.fit(None, lambda *a: None, stop_after=1)  # not the last epoch: no end-of-run evaluation
stage("epoch")
heavy = [m for m in json.loads(sys.argv[3]) if m in sys.modules]
print(json.dumps({"cpu": cpu, "heavy": heavy}))
"""


def measure(checkout: Path, config: str) -> dict:
    res = subprocess.run([sys.executable, "-c", PROBE, str(checkout), config, json.dumps(HEAVY)],
                         capture_output=True, text=True, cwd=checkout, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"{checkout}: the probe failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/search_digits.yaml")
    ap.add_argument("--before", help="a commit to compare against (checked out in a temporary worktree)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    config = str((ROOT / args.config).resolve())
    with tempfile.TemporaryDirectory(prefix="augtune-imports-") as tmp:
        variants = {"now": ROOT}
        if args.before:
            subprocess.run(["git", "worktree", "add", "--detach", f"{tmp}/before", args.before], cwd=ROOT,
                           check=True, capture_output=True)
            variants = {f"before ({args.before})": Path(tmp) / "before", **variants}
        try:
            runs: dict[str, list[dict]] = {name: [] for name in variants}
            for _ in range(args.repeats):  # interleaved: the machine's load falls on both alike
                for name, checkout in variants.items():
                    runs[name].append(measure(checkout, config))
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", f"{tmp}/before"], cwd=ROOT,
                               capture_output=True)
    names = list(variants)
    print(f"CPU seconds of a trial process's stages ({args.config}; "
          f"median of {args.repeats} processes each)\n")
    print("| stage | " + " | ".join(names) + " |")
    print("| --- | " + " | ".join("---:" for _ in names) + " |")
    for key, label in STAGES:
        cells = [f"{statistics.median(r['cpu'][key] for r in runs[n]):.2f}" for n in names]
        print(f"| {label} | " + " | ".join(cells) + " |")
    totals = [f"**{statistics.median(sum(r['cpu'].values()) for r in runs[n]):.2f}**" for n in names]
    print("| **total** | " + " | ".join(totals) + " |")
    print()
    for n in names:
        heavy = runs[n][-1]["heavy"]
        print(f"{n}: loaded after the first epoch: {', '.join(heavy) or 'none of ' + ', '.join(HEAVY)}")


if __name__ == "__main__":
    main()
