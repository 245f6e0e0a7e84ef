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
search seeds of each seed's mean: the replay against the trial it replays), that trial's final weights
scored after the search on the test split (mean ± std over the search seeds: against the repeat's test
figure, and free of the winner's curse of choosing the best of the trials on the validation split; none
for a trial ASHA stopped, which a search keeps no checkpoint of) and the CPU seconds its search spent
(its trials' own, pauses and exploits included; Ray's driver not); then each seed's
schedule-against-constant sentence. The replay is on the trial's own splits where the repeat's seeds
vary the initialisation only (Fashion-MNIST); on a test split under 5 000 (digits) `compare.vary`
redraws the split per seed, and the spread includes the split's. About 8 minutes a seed on digits, 15
on `--dataset fashion_mnist --max-train 4000 --epochs 12 --interval 3` (two cores).
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
    """{entrant: (repeat's test k-NN, chosen trial's validation k-NN, its search's CPU seconds, repeat's
    validation k-NN, chosen trial's test k-NN)}, the schedule sentence. The repeat's figures are means
    over its seeds."""
    v = exp.verdict()
    cpu: dict = {}
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
    from augtune.plots import PlotError

    chosen = {}
    for name, (path, reported) in chosen_trials(exp).items():
        try:
            test, val = scored_on_test(path)
        except PlotError as e:  # an ASHA-stopped trial: a search checkpoints at a trial's last epoch only
            print(f"{e}; no test figure for {name}", flush=True)
            chosen[name] = (reported, float("nan"))
            continue
        if abs(val - reported) > 1e-6:  # not the weights, features or k-NN it scored itself with
            print(f"{path}: its newest checkpoint scores {100 * val:.2f} on the validation split, its record "
                  f"{100 * reported:.2f}; no test figure for {name}", flush=True)
            test = float("nan")
        chosen[name] = (reported, test)
    nan = float("nan")
    rows = {row.entrant: (row.cells["knn_acc"].mean, chosen.get(row.entrant, (nan, nan))[0],
                          cpu.get(row.entrant, 0.0),
                          statistics.fmean(replay[row.entrant]) if row.entrant in replay else nan,
                          chosen.get(row.entrant, (nan, nan))[1])
            for row in v.rows}
    said = next((s for s in v.sentences() if s.startswith("Schedule against constant")), "")
    return rows, said


def chosen_trials(exp) -> dict:
    """{entrant: (the record file of the search trial its repeat re-ran, the trial's last validation k-NN)}:
    the first trial whose parameters are the ones the compare's `best_of` chose."""
    from augtune.analysis import find_records
    from augtune.records import SEARCH_FILE, read_record
    from augtune.search.compare import best_of, replayed

    out = {}
    for folder in sorted(p for p in Path(exp.path).iterdir() if (p / SEARCH_FILE).is_file()):
        best = best_of(folder, "knn_acc", "max")
        for path in find_records(folder):
            r = read_record(path)
            if best is not None and r.get("status") in ("completed", "stopped") and replayed(r) == best:
                last = [e["knn_acc"] for e in r["epochs"] if isinstance(e.get("knn_acc"), float)][-1]
                out[r.get("entrant") or r["method"]] = (path, last)
                break
    return out


def scored_on_test(record_file: Path) -> tuple[float, float]:
    """A search trial's final weights scored after the search (k-NN, as the trial scored itself) on the test
    split, which no search or selection read, and on the validation split (the figure the trial reported:
    a check that this is the same network, features and k-NN)."""
    from dataclasses import replace

    from augtune.eval.evaluate import evaluate
    from augtune.plots import load_run

    run = load_run(record_file)
    config = dict(run.record["config"], dataset={**run.record["config"]["dataset"], "evaluate_on": "both"})
    run = replace(run, record={**run.record, "config": config})  # the validation split beside the test split
    cfg, data = run.cfg, run.data
    train = run.features("train")
    scores = [evaluate(train, data.y_train, run.features(split), getattr(data, f"y_{split}"),
                       data.num_classes, cfg.eval, ("knn",), seed=cfg.train.seed)["knn_acc"]
              for split in ("test", "val")]
    return scores[0], scores[1]


def mean_sd(values: list[float]) -> str:
    """`mean ± std` of the values there are (a missing one is NaN), with how many when some are missing."""
    there = [v for v in values if v == v]
    if not there:
        return "–"
    out = f"{statistics.fmean(there):.2f}" + (f" ± {statistics.stdev(there):.2f}" if len(there) > 1 else "")
    return out + ("" if len(there) == len(values) else f" (n = {len(there)})")


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
            "best trial (test)", "search CPU s"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name in names:
        def over_seeds(i: int) -> list[float]:
            return [100 * rows[name][i] for rows in per_seed if name in rows]

        means = over_seeds(0)
        cpu = statistics.fmean(rows[name][2] for rows in per_seed if name in rows)
        cells = " | ".join(f"{m:.2f}" for m in means)
        print(f"| {name} | {cells} | {mean_sd(means)} | {statistics.fmean(over_seeds(1)):.2f} | "
              f"{mean_sd(over_seeds(3))} | {mean_sd(over_seeds(4))} | {cpu:.0f} |")
    print()
    for s in sentences:
        print(s)
    print(f"\nexperiments: {storage}")


if __name__ == "__main__":
    main()
