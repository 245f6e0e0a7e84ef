"""The README's CSV compare, as a new user runs it: `augtune compare examples/compare_vectors.yaml --set
dataset.path=<csv>` under its 20-minute budget, on a real CSV of about 6,000 rows, a few dozen features
and 6 classes that no one here tuned to.

Run:  python benchmarks/readme_csv.py [--unlabelled 0.9] [--budget 20m] [--out DIR]

The CSV: Fashion-MNIST's first 1,000 training images of each of its classes 0-5, projected on their 40
leading principal components (scikit-learn's PCA, fitted on those rows), written with four decimals.
`--unlabelled F` empties the label cell of a seeded fraction F of the rows (mostly unlabelled data).
It prints the compare's own output, then what the budget bought: the wall time, each entrant's search
trials and the epochs each trained (ASHA stops the weak ones early), and the importance lines.
"""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def write_csv(path: Path, unlabelled: float, seed: int = 0) -> tuple[int, int]:
    """The benchmark's CSV (see the module doc); (rows, rows without a label)."""
    from sklearn.decomposition import PCA

    from augtune.config import DatasetConfig
    from augtune.data import load_dataset

    data = load_dataset(DatasetConfig(name="fashion_mnist", as_vectors=True, standardize=False))
    x, y = data.x_train.numpy(), data.y_train.numpy()
    rows = np.concatenate([np.flatnonzero(y == c)[:1000] for c in range(6)])
    z = PCA(n_components=40, random_state=seed).fit_transform(x[rows])
    empty = np.random.default_rng(seed).random(len(rows)) < unlabelled
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"pc{i}" for i in range(40)] + ["label"])
        for features, label, no_label in zip(z, y[rows], empty):
            w.writerow([*(f"{v:.4f}" for v in features), "" if no_label else int(label)])
    return len(rows), int(empty.sum())


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--unlabelled", type=float, default=0.0)
    p.add_argument("--budget", default="20m")
    p.add_argument("--out", type=Path, default=Path("results-readme-csv"))
    p.add_argument("--set", action="append", default=[], help="more --set lines for the compare")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = (args.out / f"fashion6-{int(100 * args.unlabelled)}.csv").resolve()
    n, empty = write_csv(path, args.unlabelled)
    name = f"readme-csv-{int(100 * args.unlabelled)}-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [sys.executable, "-m", "augtune.cli", "compare", str(ROOT / "examples" / "compare_vectors.yaml"),
           "--set", f"dataset.path={path}", "--set", f"compare.time_budget={args.budget}",
           *(x for s in args.set for x in ("--set", s)), "--storage", str(args.out.resolve()), "--name", name]
    start = time.time()
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - start
    print(run.stdout[-12000:])
    if run.returncode != 0:
        print(run.stderr[-4000:], file=sys.stderr)
        raise SystemExit(run.returncode)
    exp = args.out.resolve() / name
    trials: dict = {}  # entrant -> {(trial, status, epochs trained)}: ASHA stops the weak ones early
    for record in exp.glob("*/**/record.json"):
        r = json.loads(record.read_text())
        if r.get("phase") == "search":
            trials.setdefault(r.get("entrant"), set()).add((r.get("trial"), r.get("status"),
                                                            len(r.get("epochs") or [])))
    importance = run.stdout.split("which hyperparameters mattered:")[-1].split("report:")[0].strip()
    result = {"rows": n, "unlabelled": empty, "wall_s": wall, "experiment": str(exp),
              "trials": {k: len(v) for k, v in sorted(trials.items())},
              "epochs_trained": {k: sorted(e for _, _, e in v) for k, v in sorted(trials.items())},
              "completed": {k: sum(s == "completed" for _, s, _ in v) for k, v in sorted(trials.items())},
              "importance": importance.splitlines()}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
