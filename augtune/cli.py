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
from typing import Any, Callable

from augtune.records import LinkRefused

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


class UsageError(Exception):
    """Bad input found before anything was launched or written."""


def _parser() -> argparse.ArgumentParser:
    from augtune.version import __version__

    p = argparse.ArgumentParser(prog="augtune", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"augtune {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="show Ray's and Tune's own messages too")
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
    _ray_job_args(s, "<space>-<data>-<time>")
    s.set_defaults(func=cmd_search)

    r = sub.add_parser("resume", help="continue an interrupted search or compare")
    r.add_argument("experiment", help="the experiment's folder (<storage>/<name>)")
    r.add_argument("--restart-errored", action="store_true", help="restart errored trials from scratch")
    r.add_argument("--address", help="join a Ray cluster instead of starting a local one")
    r.set_defaults(func=cmd_resume)

    c = sub.add_parser("compare", help="every method head to head under one budget: a verdict and a report")
    c.add_argument("config", help="YAML config; its `compare` section sets the entrants, trials and seeds")
    _ray_job_args(c, "compare-<data file's stem or data set>-<time>")
    c.set_defaults(func=cmd_compare)

    im = sub.add_parser(
        "importance", help="which hyperparameters mattered (Optuna's fANOVA, from the records)"
    )
    im.add_argument("experiment", help="a search or compare experiment folder")
    im.set_defaults(func=cmd_importance)

    st = sub.add_parser("status", help="print a search's trials without starting Ray")
    st.add_argument("experiment")
    st.set_defaults(func=cmd_status)

    pl = sub.add_parser("plot", help="draw a figure of finished runs (see `augtune methods` for the kinds)")
    pl.add_argument("kind", help="which figure, e.g. pinda, umap, cocor, diffaug")
    pl.add_argument("paths", nargs="+", type=Path, metavar="RUN_DIR",
                    help="run folders, Ray trial folders or experiment folders (every run under them)")
    pl.add_argument(
        "--out", type=Path, help="folder for the figures (default: RUN_DIR/figures of the first path)"
    )
    pl.set_defaults(func=cmd_plot)

    from augtune.analysis.export import add_parser as add_export

    add_export(sub).set_defaults(func=cmd_export)
    return p


def _ray_job_args(p: argparse.ArgumentParser, default_name: str) -> None:
    """The options every job that runs on Ray takes (search, compare)."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--address", help="join a Ray cluster: auto, or ray://host:port (default: a local Ray)")
    p.add_argument("--storage", help="experiment storage: a folder (default ./results) or a URI (s3://, gs://)")
    p.add_argument("--name", help=f"experiment name (default: {default_name})")
    p.add_argument("--dashboard", action="store_true", help="start Ray's dashboard (off by default)")
    p.add_argument("--plan", action="store_true",
                   help="print what would run and exit, without starting Ray or writing anything")


def cmd_train(args: argparse.Namespace) -> int:
    from augtune.checks import check_config
    from augtune.config import ConfigError, load_config, method_label
    from augtune.data import DataError, load_dataset
    from augtune.data.datasets import describe_rows
    from augtune.plots import PLOTS, end_of_run_figures
    from augtune.records import CONFIG_FILE, RECORD_FILE
    from augtune.trainables import NonFiniteLoss, train_run
    from augtune.trainables.loop import CheckpointError
    from augtune.trainables.run import RunFolderError, check_new_run_folder, check_resume

    config_path = args.config
    if args.resume:
        if args.out is None:
            raise UsageError("--resume needs --out, the run folder to continue")
        if not (args.out / RECORD_FILE).is_file():
            raise UsageError(f"--resume: {args.out} holds no augtune run (no {RECORD_FILE})")
        config_path = config_path or args.out / CONFIG_FILE
    try:
        cfg = check_config(load_config(config_path, args.overrides), PLOTS)
        out = (
            args.out
            or Path("runs") / f"{method_label(cfg)}-{cfg.dataset.name}-{_dt.datetime.now():%Y%m%d-%H%M%S}"
        )
        if args.resume:
            check_resume(out, cfg)
        else:
            check_new_run_folder(out)
        data = load_dataset(cfg.dataset)
    except (ConfigError, RunFolderError, DataError) as e:
        raise UsageError(str(e)) from None
    resume_hint = f"augtune train --resume --out {out}"
    print(f"{method_label(cfg)} on {cfg.dataset.name}: {describe_rows(data)}, "
          f"{data.modality} {tuple(data.shape)}, {data.num_classes} classes -> {out}", flush=True)
    try:
        record = train_run(cfg, data, out, resume=args.resume, log=lambda s: print(s, flush=True),
                           on_completed=end_of_run_figures)
    except CheckpointError as e:
        raise UsageError(f"--resume: {e}") from None
    except ValueError as e:  # a setup the config types cannot rule out (batch larger than the data, ...)
        raise UsageError(str(e)) from None
    except NonFiniteLoss as e:
        print(f"augtune: run failed: {e} (record: {out / RECORD_FILE})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"augtune: interrupted; the record says so. Continue with: {resume_hint}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:
        return _environment_error(e, f"while writing {e.filename or out}", resume_hint)
    from augtune.trainables.run import final_table

    if final_table(record):
        print(final_table(record))
    print(f"record: {out / RECORD_FILE}")
    return 0


def _final_table(exp_dir: str, cfg) -> None:
    from augtune.storage import local_copy

    with local_copy(exp_dir) as local:  # in cloud storage (s3://...): a copy of its records
        _print_final_table(local, cfg)


def _print_final_table(exp_dir: Path, cfg) -> None:
    from augtune.analysis import AnalysisError, comparison_table, load_runs
    from augtune.records import REPEAT_DIR

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


def _run_on_ray(call: Callable[[], Any], experiment: str) -> int:
    """Run a job of the Python API (`augtune.api.run_plan`, `augtune.api.resume`: one progress line,
    Ray's chatter in the experiment's log); every way it can end becomes an exit code and, where it did not
    finish, one line saying why."""
    from augtune.api import log_file
    from augtune.config import ConfigError
    from augtune.search import SearchFailed, SearchInterrupted
    from augtune.search.launch import RayStartFailed

    try:
        call()
    except ConfigError as e:  # the cluster cannot hold one trial, the folder is in use
        raise UsageError(str(e)) from None
    except (SearchInterrupted, KeyboardInterrupt):
        print(f"\naugtune: interrupted; finished trials are kept. Continue with: augtune resume {experiment}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except SearchFailed as e:
        print(f"augtune: error: {e}", file=sys.stderr)
        return 1
    except RayStartFailed as e:  # nothing ran; the folder holds its plan, so resume starts it
        print(f"augtune: error: {e}; Ray's log: {log_file(experiment)}; try again with: augtune resume "
              f"{experiment}", file=sys.stderr)
        return 1
    except Exception as e:  # Tune wraps what failed in its own errors: a full disk is said in one line
        cause = _os_error(e) or _full_disk(experiment)
        if cause is None:
            raise
        return _environment_error(cause, f"({cause.filename or experiment})", f"augtune resume {experiment}")
    return 0


def _full_disk(experiment: str) -> OSError | None:
    """A full disk under a local experiment, as an OSError: Tune can fail on what a full disk did to its own
    files (an empty error file it then cannot unpickle) rather than on the disk itself."""
    import errno
    import shutil

    from augtune.storage import is_uri

    if is_uri(experiment):
        return None
    try:
        free = shutil.disk_usage(
            next(p for p in (Path(experiment), *Path(experiment).parents) if p.exists())
        ).free
    except (OSError, StopIteration):
        return None
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), experiment) if free < 1 << 20 else None


def _os_error(e: BaseException) -> OSError | None:
    """The OSError that `e` is, or that caused it (Tune re-raises its trials' and callbacks' errors)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _environment_error(e: OSError, where: str, resume: str) -> int:
    """One line for a failure of the machine (a full disk, a folder gone): what, where, how to continue.
    Writers that flush once more at exit (TensorBoard's event file) would repeat a full disk as a
    traceback; that one is said already."""
    from augtune.trainables.run import is_disk_full

    what = "no space left on device" if is_disk_full(e) else (e.strerror or type(e).__name__).lower()
    print(f"augtune: error: {what} {where}; when that is fixed, continue with: {resume}", file=sys.stderr)
    if is_disk_full(e):
        default = sys.unraisablehook

        def quiet(unraisable) -> None:
            if not (isinstance(unraisable.exc_value, OSError) and is_disk_full(unraisable.exc_value)):
                default(unraisable)

        sys.unraisablehook = quiet
    return 1


def cmd_search(args: argparse.Namespace) -> int:
    from augtune import api
    from augtune.config import ConfigError, load_config

    try:
        plan = api.make_plan(load_config(args.config, args.overrides), storage=args.storage, name=args.name,
                             address=args.address, dashboard=args.dashboard)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    rows = [f"data: {plan.rows}"] if plan.rows else []
    if args.plan:
        from augtune.search.plan import describe

        print(f"search {plan.experiment} (not started: --plan)")
        print("\n".join([*rows, *describe(plan)]))
        return 0
    if rows:
        print(rows[0], flush=True)
    code = _run_on_ray(lambda: api.run_plan(plan, verbose=args.verbose), plan.experiment)
    if code == 0:
        _final_table(plan.experiment, plan.cfg)
        print(f"experiment: {plan.experiment}")
    return code


def cmd_resume(args: argparse.Namespace) -> int:
    """`augtune.api.resume`, with what the console shows around it: a finished experiment's verdict or
    table without starting Ray, or the run's progress, then its verdict or table."""
    from augtune import api
    from augtune.config import ConfigError
    from augtune.records import is_compare
    from augtune.search import load_plan
    from augtune.search.experiment import is_finished

    try:
        exp = api.resumable(args.experiment)
        compare = is_compare(exp.path)
        plan = None if compare else load_plan(exp.path, address=args.address)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if is_finished(exp.path) and not args.restart_errored:  # nothing to run: no Ray
        print(f"{exp.path} has finished; its {'verdict' if compare else 'table'}, from its records:")
    else:
        code = _run_on_ray(lambda: api.resume(exp.path, address=args.address, verbose=args.verbose,
                                              restart_errored=args.restart_errored),
                           exp.path)
        if code:
            return code
    if compare:
        _compare_verdict(exp.path)
    else:
        _final_table(exp.path, plan.cfg)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from augtune import api
    from augtune.config import ConfigError, load_config
    from augtune.search.compare import describe_compare

    try:
        plan = api.make_plan(load_config(args.config, args.overrides), compare=True, storage=args.storage,
                             name=args.name, address=args.address, dashboard=args.dashboard)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    rows = f"data: {plan.rows}"
    if args.plan:
        print(f"compare {plan.experiment} (not started: --plan)")
        print("\n".join([rows, *describe_compare(plan)]))
        return 0
    print(rows, flush=True)
    c = plan.cfg.compare
    repeat = (f"the best {c.race.finalists} of each raced on {c.race.min_seeds} to {c.race.max_seeds} seeds"
              if c.race.enabled else f"best re-run on {c.seeds} seeds")
    print(f"compare {plan.experiment}: {len(plan.labels)} entrants ({', '.join(plan.labels)}), "
          f"{c.trials} trials each, {repeat}", flush=True)
    if plan.budget:
        print(plan.budget, flush=True)
    code = _run_on_ray(lambda: api.run_plan(plan, verbose=args.verbose), plan.experiment)
    if code == 0:
        _compare_verdict(plan.experiment)
        print(f"experiment: {plan.experiment}")
    return code


def _compare_verdict(exp_dir: str) -> None:
    """The verdict of a compare experiment, its importances and the report's path (from records on disk)."""
    from augtune.analysis.compare import answer

    result = answer(exp_dir)
    print(result.verdict.render("md", plainly=False))  # its plain-words answer comes last, below
    if result.importances:
        print("which hyperparameters mattered:")
        for line in result.importances.values():
            print(f"  {line}")
    else:
        print("which hyperparameters mattered: not measurable (too few search trials per entrant)")
    print(f"\n{result.verdict.plainly()}\n")  # the answer in plain words, last: what a reader takes away
    print(f"report: {result.report}")


def cmd_importance(args: argparse.Namespace) -> int:
    """Hyperparameter importances of a search, or of each entrant of a compare experiment."""
    from augtune.records import is_compare
    from augtune.analysis.importance import format_importances, importances
    from augtune.records import SEARCH_FILE, read_record, read_search_file

    exp = Path(args.experiment)
    folders = sorted(p.parent for p in exp.glob("*/augtune_search.yaml")) if is_compare(exp) else [exp]
    if not folders or not all((f / SEARCH_FILE).is_file() for f in folders):
        raise UsageError(f"{exp}: not an augtune search or compare folder")
    for folder in folders:
        try:
            search = read_search_file(folder)["config"]["search"]
        except ValueError as e:
            raise UsageError(str(e)) from None
        records = []
        for path in sorted(folder.glob("*/record.json")):
            try:
                records.append(read_record(path))
            except (OSError, ValueError):
                continue
        print(format_importances(folder.name, importances(records, search["metric"], search["mode"])))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from augtune.search.status import format_status

    try:
        print(format_status(args.experiment))  # a folder or a URI: not through Path, which folds `s3://`
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


def cmd_export(args: argparse.Namespace) -> int:
    """`augtune export`: the table is made in `augtune.analysis`; its errors are one line here."""
    import contextlib

    from augtune.analysis import AnalysisError
    from augtune.analysis.export import cmd_export as export
    from augtune.storage import StorageError, argument, is_uri, local_copy

    # an experiment in cloud storage (s3://...) is tabulated from a local copy of its records: the
    # analysis reads local folders only; its messages name the URI, not the copy
    shown: dict[str, str] = {}
    try:
        with contextlib.ExitStack() as copies:
            paths = []
            for given in map(argument, args.paths):
                local = copies.enter_context(local_copy(given)) if is_uri(given) else Path(given)
                shown[str(local)] = given
                paths.append(local)
            args.paths = paths
            return export(args)
    except (AnalysisError, StorageError) as e:
        message = str(e)
        for local, given in shown.items():
            message = message.replace(local, given)
        raise UsageError(message) from None


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
    from augtune.config import LOOP_KNOBS

    print("per-epoch knobs (schedule:, search.pbt.mutate), by what reads them:")
    print(f"  {'the loop':<14} {', '.join(LOOP_KNOBS)}")
    for name, cls in [*BASES.items(), *AUGMENTATIONS.items()]:
        if getattr(cls, "knobs", ()):
            print(f"  {name:<14} {', '.join(cls.knobs)}")
    print("datasets (dataset.name):")
    for name, fn in DATASETS.items():
        print(f"  {name:<14} {doc(fn)}")
    from augtune.plots import PLOTS, describe

    from augtune.spaces import SPACES

    print("search spaces (search.space):")
    for name, space in SPACES.items():
        keys = sorted(k for k in space.params if k not in ("method.base", "method.augment"))
        print(f"  {name:<14} {', '.join(keys) if keys else 'conditional (define-by-run)'}")
    print("figures (augtune plot KIND RUN_DIR):")
    for kind in PLOTS:
        print(f"  {kind:<14} {describe(kind)}")
    if not PLOTS:
        print("  (none registered yet)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.func in (cmd_train, cmd_search, cmd_compare, cmd_resume):
        from augtune.search.launch import hold_to_loopback

        hold_to_loopback(getattr(args, "address", None))  # before anything imports Ray
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except UsageError as e:
        print(f"augtune: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LinkRefused as e:  # a link planted where augtune writes (report.html, a record): one line
        print(f"augtune: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `augtune status DIR | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0


if __name__ == "__main__":
    sys.exit(main())
