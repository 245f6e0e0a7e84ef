"""`augtune ...`: train in-process, search, tabulate, draw figures, list what is registered.

Bad input (config, data, paths) gets one line on stderr naming what is wrong and exit code 2,
before anything is written. A run that fails while training (NaN loss) exits 1 after its record
says why.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """Bad input found before anything was launched or written."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="augtune", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train and evaluate one config in this process")
    t.add_argument("config", nargs="?", help="YAML config (defaults for every key left out)")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key, e.g. --set train.lr=0.01 (repeatable)")
    t.add_argument("--out", type=Path, help="run folder (default: runs/<method>-<dataset>-<time>)")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its checkpoint (CONFIG defaults to its config.yaml)")
    t.set_defaults(func=cmd_train)

    m = sub.add_parser("methods", help="list base methods, augmentation methods and datasets")
    m.set_defaults(func=cmd_methods)

    s = sub.add_parser("search", help="search a config's space with Ray Tune (+ Optuna, ASHA)")
    s.add_argument("config", help="YAML config with a `search` section")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--address", help="join a Ray cluster: auto, or ray://host:port (default: a local Ray)")
    s.add_argument("--storage", help="experiment storage: a folder (default ./results) or a URI (s3://, gs://)")
    s.add_argument("--name", help="experiment name (default: <space>-<dataset>-<time>)")
    s.add_argument("--dashboard", action="store_true", help="start Ray's dashboard (off by default)")
    s.set_defaults(func=cmd_search)

    r = sub.add_parser("resume", help="continue an interrupted search")
    r.add_argument("experiment", help="the search's folder (<storage>/<name>)")
    r.add_argument("--restart-errored", action="store_true", help="restart errored trials from scratch")
    r.add_argument("--address", help="join a Ray cluster instead of starting a local one")
    r.set_defaults(func=cmd_resume)

    st = sub.add_parser("status", help="print a search's trials without starting Ray")
    st.add_argument("experiment")
    st.set_defaults(func=cmd_status)

    pl = sub.add_parser("plot", help="draw a figure of finished runs (see `augtune methods` for the kinds)")
    pl.add_argument("kind", help="which figure, e.g. pinda, umap, cocor, diffaug")
    pl.add_argument("paths", nargs="+", type=Path, metavar="RUN_DIR",
                    help="run folders, Ray trial folders or experiment folders (every run under them)")
    pl.add_argument("--out", type=Path, help="folder for the figures (default: RUN_DIR/figures of the first path)")
    pl.set_defaults(func=cmd_plot)

    from augtune.analysis.export import add_parser as add_export

    add_export(sub)
    return p


def cmd_train(args: argparse.Namespace) -> int:
    from augtune.config import ConfigError, load_config, method_label
    from augtune.data import DataError, load_dataset
    from augtune.records import CHECKPOINT_FILE, CONFIG_FILE, RECORD_FILE
    from augtune.trainables import NonFiniteLoss, train_run

    config_path = args.config
    if args.resume:
        if args.out is None:
            raise UsageError("--resume needs --out, the run folder to continue")
        if not (args.out / CHECKPOINT_FILE).is_file():
            raise UsageError(f"--resume: no checkpoint at {args.out / CHECKPOINT_FILE}")
        config_path = config_path or args.out / CONFIG_FILE
    try:
        cfg = load_config(config_path, args.overrides)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    out = args.out or Path("runs") / f"{method_label(cfg)}-{cfg.dataset.name}-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    if not args.resume and (out / RECORD_FILE).exists():
        raise UsageError(f"--out: {out} already holds a run; pass --resume to continue it or choose another folder")
    try:
        data = load_dataset(cfg.dataset)
    except DataError as e:
        raise UsageError(str(e)) from None
    print(f"{method_label(cfg)} on {cfg.dataset.name}: {len(data.x_train)} train / {len(data.x_test)} test, "
          f"{data.modality} {tuple(data.shape)}, {data.num_classes} classes -> {out}", flush=True)
    try:
        record = train_run(cfg, data, out, resume=args.resume, log=lambda s: print(s, flush=True))
    except ValueError as e:  # a setup the config types cannot rule out (batch larger than the data, ...)
        raise UsageError(str(e)) from None
    except NonFiniteLoss as e:
        print(f"augtune: run failed: {e} (record: {out / RECORD_FILE})", file=sys.stderr)
        return 1
    final = record["final"]
    refs = record["references"]
    if final:
        width = max(len(k) for k in final)
        head = f"{'metric':<{width}}  {'trained':>8}" + "".join(f"  {r:>11}" for r in refs)
        print(head)
        for k, v in final.items():
            print(f"{k:<{width}}  {v:>8.4f}" + "".join(f"  {refs[r].get(k, float('nan')):>11.4f}" for r in refs))
    print(f"record: {out / RECORD_FILE}")
    return 0


def _final_table(exp_dir: str, cfg) -> None:
    from augtune.analysis import AnalysisError, comparison_table, load_runs
    from augtune.search.launch import REPEAT_DIR

    where = Path(exp_dir) / REPEAT_DIR
    where = where if where.is_dir() else Path(exp_dir)
    metric, per = cfg.search.metric, cfg.search.repeat_best.per
    # a row per method, and per value of the key the best were chosen for (pinda.mu: zero, learned)
    rows = "method" if per in (None, "method.base", "method.augment") else f"method,{per}"
    try:
        runs = load_runs([where])
        # the search metric first, then the papers' usual columns that the trials report
        shown = [metric] + [m for m in ("knn_acc", "sr_acc", "linear_acc", "kmeans_nmi")
                            if m != metric and m in runs.columns and runs[m].notna().any()]
        print(comparison_table(runs, rows=rows, cols="dataset", metrics=tuple(shown)).to_markdown())
    except AnalysisError as e:
        print(f"augtune: no table: {e}")


def cmd_search(args: argparse.Namespace) -> int:
    from augtune.config import ConfigError
    from augtune.search import plan_search, run_search

    try:
        plan = plan_search(args.config, args.overrides, storage=args.storage, name=args.name,
                           address=args.address, dashboard=args.dashboard)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    try:
        run_search(plan)
    except ConfigError as e:  # the cluster cannot hold one trial: found after connecting
        raise UsageError(str(e)) from None
    _final_table(plan.experiment, plan.cfg)
    print(f"experiment: {plan.experiment}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from augtune.config import ConfigError
    from augtune.search import load_plan, resume_search

    try:
        plan = load_plan(args.experiment, address=args.address)
        resume_search(plan, restart_errored=args.restart_errored)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    _final_table(plan.experiment, plan.cfg)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from augtune.search.status import format_status

    try:
        print(format_status(Path(args.experiment)))
    except ValueError as e:
        raise UsageError(str(e)) from None
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from augtune.plots import FIGURES_DIR, PLOTS, PlotError, find_runs, plot

    if args.kind not in PLOTS:
        raise UsageError(f"plot: unknown figure {args.kind!r} (known: {', '.join(PLOTS) or 'none yet'})")
    out = args.out or args.paths[0] / FIGURES_DIR
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} is a file; name a folder")
    try:
        files = plot(args.kind, find_runs(args.paths), out)
    except PlotError as e:
        raise UsageError(str(e)) from None
    for f in files:
        print(f"wrote {f}")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from augtune.data import DATASETS
    from augtune.methods import AUGMENTATIONS, BASES

    def doc(obj) -> str:
        """The first line of the object's docstring, else of its module's."""
        text = obj.__doc__ or sys.modules[obj.__module__].__doc__ or ""
        return text.strip().splitlines()[0] if text.strip() else ""

    print("base methods (method.base):")
    for name, cls in BASES.items():
        print(f"  {name:<14} {doc(cls)}")
    print("augmentation methods (method.augment):")
    for name, cls in AUGMENTATIONS.items():
        print(f"  {name:<14} {doc(cls)}")
    if not AUGMENTATIONS:
        print("  (none registered yet)")
    print("datasets (dataset.name):")
    for name, fn in DATASETS.items():
        print(f"  {name:<14} {doc(fn)}")
    from augtune.plots import PLOTS, describe

    print("figures (augtune plot KIND RUN_DIR):")
    for kind in PLOTS:
        print(f"  {kind:<14} {describe(kind)}")
    if not PLOTS:
        print("  (none registered yet)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except UsageError as e:
        print(f"augtune: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `augtune status DIR | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0


if __name__ == "__main__":
    sys.exit(main())
