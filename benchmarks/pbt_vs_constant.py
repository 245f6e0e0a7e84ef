"""Do schedules help at this scale? PBT against TPE+ASHA, each method searched both ways in one compare.

Run:  python benchmarks/pbt_vs_constant.py [--dataset digits] [--seeds 0 1 2] [--trials 8] [--epochs 24]

Each search seed runs one `augtune compare` with `compare.scheduler: [asha, pbt]` over PiNDA and CoCor
(their own spaces; PBT mutates every per-epoch knob of each, every `--interval` epochs, quantile 0.25):
the same trials and epochs per entrant, so PBT's population and TPE's trials have the same most epochs
(ASHA stops some early, so the constant search spends less). Each entrant's best is re-run on 3 new
seeds (the PBT entrant's best trial's schedule replayed from scratch, PBA's replay), and the verdict tests
the schedule against the constant. The whole compare is repeated per search seed (`search.seed` and
`train.seed` move together), which gives the spread of the whole search.

It prints, per entrant: the repeat's k-NN accuracy on the test split (mean over its 3 seeds) per search
seed, the mean ± std over the search seeds, the best search trial's validation k-NN (for the PBT
entrant: the trial whose schedule was replayed), the repeat's own validation k-NN (mean ± std over the
search seeds of each seed's mean: the replay against the trial it replays, on the same split) and the
CPU seconds its search spent (its trials' own, pauses and exploits included; Ray's driver not); then
each seed's schedule-against-constant sentence.
About 8 minutes a seed on digits (two busy cores).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def config(dataset: str, seed: int, trials: int, epochs: int, interval: int, max_train) -> dict:
    data = {"name": dataset, "as_vectors": True}
    if max_train:
        data["max_train"] = max_train
    return {
        "dataset": data,
        "pinda": {"generator": "mlp"},
        "train": {"epochs": epochs, "batch_size": 128, "seed": 100 * seed},
        "eval": {"metrics": ["knn", "linear"]},
        "search": {"seed": seed, "pbt": {"interval": interval, "quantile": 0.25}},
        # the repeat as a race that cannot eliminate (3 seeds, one finalist): the fixed design's runs,
        # trained without the validation split and scored on it too, so the replay's validation k-NN is
        # like for like with the PBT trial's
        "compare": {"methods": ["pinda", "cocor"], "scheduler": ["asha", "pbt"], "trials": trials,
                    "metrics": ["knn_acc"], "race": {"enabled": True, "finalists": 1, "min_seeds": 3,
                                                     "max_seeds": 3}},
    }


def summary(exp) -> tuple[dict, str]:
    """{entrant: (repeat mean, best search trial's validation k-NN, its search's CPU seconds, the repeat's
    validation k-NN)}, the schedule sentence."""
    v = exp.verdict()
    cpu: dict = {}
    best: dict = {}
    replay: dict = {}
    for r in exp.records():
        name = r.get("entrant") or r.get("method")
        if r.get("phase") != "search":
            value = (r.get("final") or {}).get("val_knn_acc")
            if isinstance(value, float):
                replay.setdefault(name, []).append(value)
            continue
        parts = r.get("cpu_seconds") or {}  # by part: train, eval, references, checkpoint, ...
        cpu[name] = cpu.get(name, 0.0) + sum(float(v) for v in parts.values())
        if r.get("status") in ("completed", "stopped"):
            last = [e["knn_acc"] for e in r.get("epochs", []) if isinstance(e.get("knn_acc"), float)]
            if last:
                best[name] = max(best.get(name, 0.0), last[-1])
    rows = {row.entrant: (row.cells["knn_acc"].mean, best.get(row.entrant, float("nan")),
                          cpu.get(row.entrant, 0.0),
                          statistics.fmean(replay[row.entrant]) if row.entrant in replay else float("nan"))
            for row in v.rows}
    said = next((s for s in v.sentences() if s.startswith("Schedule against constant")), "")
    return rows, said


def mean_sd(values: list[float]) -> str:
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 \
        else f"{values[0]:.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="digits")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--epochs", type=int, default=24)
    p.add_argument("--interval", type=int, default=4)
    p.add_argument("--max-train", type=int, default=None, help="a subsample of the training split")
    p.add_argument("--storage", default=None, help="where the compares go (a temporary folder by default)")
    args = p.parse_args()

    import augtune

    storage = args.storage or tempfile.mkdtemp(prefix="augtune-pbt-vs-constant-")
    per_seed, sentences = [], []
    for seed in args.seeds:
        cfg = config(args.dataset, seed, args.trials, args.epochs, args.interval, args.max_train)
        done = Path(storage) / f"{args.dataset}_seed{seed}"
        # one already there (--storage): read again (a part-run one: `augtune resume` it first)
        exp = augtune.load(done) if done.exists() else augtune.compare(cfg, storage=storage, name=done.name)
        rows, said = summary(exp)
        per_seed.append(rows)
        sentences.append(f"search seed {seed}: {said}")
        print(f"search seed {seed}: " + "; ".join(f"{k} {100 * v[0]:.2f}" for k, v in rows.items()),
              flush=True)

    names = list(per_seed[0])
    print(f"\n{args.dataset}, {args.trials} trials x {args.epochs} epochs per entrant, PBT every "
          f"{args.interval} epochs; k-NN accuracy (%) of each entrant's best re-run on 3 seeds (test split)")
    head = ["entrant", *(f"seed {s}" for s in args.seeds), "mean ± std", "best trial (val)", "replay (val)",
            "search CPU s"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name in names:
        means = [100 * rows[name][0] for rows in per_seed if name in rows]
        val = statistics.fmean(100 * rows[name][1] for rows in per_seed if name in rows)
        again = [100 * rows[name][3] for rows in per_seed if name in rows]
        cpu = statistics.fmean(rows[name][2] for rows in per_seed if name in rows)
        cells = " | ".join(f"{m:.2f}" for m in means)
        print(f"| {name} | {cells} | {mean_sd(means)} | {val:.2f} | {mean_sd(again)} | {cpu:.0f} |")
    print()
    for s in sentences:
        print(s)
    print(f"\nexperiments: {storage}")


if __name__ == "__main__":
    main()
