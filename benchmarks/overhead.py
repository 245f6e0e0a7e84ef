"""What Ray costs: the same digits training in-process, as a one-worker trial, as a two-worker DDP trial.

Run:  python benchmarks/overhead.py [--epochs 60] [--width 32] [--poll 2.0 0.1]

All three runs train the same config (quickstart's SimCLR on digits) side by side in one
invocation, and the script prints wall times and their ratios to the in-process run:

- in-process: `augtune.trainables.run.train_run` in this process;
- one-worker trial: `augtune search` with a one-point grid, the loop inside the Tune trial; timed
  as the trial's own wall time (Tune's `time_total_s`) and as the whole command (Ray start-up,
  trial scheduling, checkpoint reports included);
- two-worker DDP trial: the same through a Ray Train TorchTrainer with two gloo workers, each
  with half of every global batch (same global batch), once per `--poll` interval: Ray Train's
  controller takes a worker's report only when it polls (`RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`, Ray's
  default 2 s, augtune's 0.1 s), and the worker's next report waits for it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def config(epochs: int, width: int, workers: int) -> dict:
    cfg = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    cfg["train"]["epochs"] = epochs
    cfg["model"]["width"] = width
    cfg["eval"] = {"every": 1, "metrics": ["knn"], "references": False}
    cfg["resources"] = {"num_workers": workers, "cpus_per_worker": 2 / workers}
    cfg["search"] = {"space": {"train.seed": "grid([0])"}, "algorithm": "grid", "num_samples": 1}
    return cfg


def in_process(cfg: dict, out: Path) -> float:
    from augtune.config import from_dict
    from augtune.data import load_dataset
    from augtune.trainables.run import train_run

    c = from_dict(cfg)
    start = time.perf_counter()
    train_run(c, load_dataset(c.dataset), out, log=lambda s: None)
    return time.perf_counter() - start


def as_search(cfg: dict, tmp: Path, name: str, poll: str | None = None) -> tuple[float, float]:
    """(trial wall time, whole command wall time) of a one-trial `augtune search`."""
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ)
    if poll is not None:
        env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = poll
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "augtune.cli", "search", str(path), "--storage",
                          str(tmp / "storage"), "--name", name], cwd=ROOT, capture_output=True, text=True,
                         env=env)
    command = time.perf_counter() - start
    if res.returncode != 0:
        sys.exit(f"search {name} failed:\n{res.stderr[-2000:]}")
    results = list((tmp / "storage" / name).glob("*/result.json"))
    last = [json.loads(line) for line in results[0].read_text().splitlines() if line.strip()][-1]
    return last["time_total_s"], command


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--poll", nargs="+", default=["2.0", "0.1"],
                   help="Ray Train's poll intervals (s) to run the two-worker trial at")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        base = in_process(config(args.epochs, args.width, 1), tmp / "inproc")
        one_trial, one_cmd = as_search(config(args.epochs, args.width, 1), tmp, "one")
        rows += [("one-worker trial", one_trial), ("one-worker search command", one_cmd)]
        for poll in args.poll:
            two_trial, two_cmd = as_search(config(args.epochs, args.width, 2), tmp, f"ddp{poll}", poll)
            rows += [(f"two-worker trial, poll {poll}s", two_trial),
                     (f"two-worker command, poll {poll}s", two_cmd)]
    print(f"digits SimCLR, {args.epochs} epochs, CNN width {args.width}")
    print(f"{'run':<32}{'wall s':>9}{'ratio':>8}")
    print(f"{'in-process':<32}{base:>9.1f}{1:>8.2f}")
    for label, t in rows:
        print(f"{label:<32}{t:>9.1f}{t / base:>8.2f}")


if __name__ == "__main__":
    main()
