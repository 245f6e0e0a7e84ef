"""`augtune export EXP_DIR... --rows method --cols dataset --metric knn_acc,sr_acc --format md`.

Prints the comparison table of the runs under the folders given (or writes it to `--out`). A search
folder stands for its repeat-best runs when it has them; runs whose settings differ are never pooled
into one cell unless `--pool KEY` says so (the seed always is). A table of a search that has not
finished says so in its caption. Records that are not augtune records, and metrics that are not
numbers, are left out with a warning line on stderr; bad input (no records, a broken record, no
finished runs, an unknown metric or column, mixed datasets) is one error line, exit 2.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

FORMATS = ("md", "latex", "csv")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `export` on the `augtune` parser's subparsers."""
    e = subparsers.add_parser("export", help="comparison table (csv, Markdown, LaTeX) of finished runs",
                              description=__doc__.splitlines()[0])
    e.add_argument("paths", nargs="+", type=Path, metavar="EXP_DIR",
                   help="experiment folders, folders of runs, run folders or record.json files")
    e.add_argument("--rows", default="method",
                   help="column(s) that name the rows, e.g. method or method,pinda.mu (default: method)")
    e.add_argument("--cols", default="dataset",
                   help="column that names the columns, e.g. dataset, train.lr, pinda.mu (default: dataset)")
    e.add_argument("--metric", default="knn_acc", metavar="NAME[,NAME...]",
                   help="metric(s) in each cell, comma-separated (default: knn_acc)")
    e.add_argument("--format", choices=FORMATS, default="md", help="md (default), latex or csv")
    e.add_argument("--mode", choices=("auto", "max", "min", "none"), default="auto",
                   help="which mean is best and bold: auto (higher, but lower for losses and times), "
                        "max, min, none")
    e.add_argument("--include-unfinished", action="store_true",
                   help="also tabulate running and failed runs (default: completed runs only)")
    e.add_argument("--pool", action="append", default=[], metavar="KEY",
                   help="a setting whose values may be averaged together in one cell, e.g. train.lr "
                        "(repeatable; default: only seeds are; runs that differ otherwise get rows of their "
                        "own)")
    e.add_argument("--out", type=Path, metavar="FILE", help="write the table here instead of printing it")
    e.add_argument("--force", action="store_true", help="with --out: replace a file that is there already")
    e.add_argument("--schedule", action="store_true",
                   help="instead of a table: a config whose `schedule:` replays the knob values the best "
                        "trial (a PBT search's, by the search's metric) trained under, epoch by epoch; run "
                        "it with `augtune train`")
    e.add_argument("--trial", metavar="ID",
                   help="with --schedule: this trial (its folder name or a part of it only it has) instead "
                        "of the best")
    e.set_defaults(func=cmd_export)
    return e


def cmd_export(args: argparse.Namespace) -> int:
    # AnalysisError: the CLI turns it into its one error line
    from augtune.analysis import AnalysisError, comparison_table, load_runs

    out: Path | None = args.out
    if out is not None:
        if out.is_dir():
            raise AnalysisError(f"--out: {out} is a folder; name the file to write")
        if not out.parent.is_dir():
            raise AnalysisError(f"--out: folder {out.parent} does not exist")
        if out.is_symlink():
            raise AnalysisError(f"--out: {out} is a symbolic link; augtune does not write through links")
        if out.exists() and not getattr(args, "force", False):
            raise AnalysisError(f"--out: {out} exists; add --force to replace it")
    if getattr(args, "schedule", False):
        text = schedule_config(args.paths, getattr(args, "trial", None), args.metric)
        return _write(text, out, "the schedule")
    if getattr(args, "trial", None):
        raise AnalysisError("--trial: names the trial whose schedule --schedule exports; add --schedule")
    from augtune.analysis.compare import answer
    from augtune.records import is_compare

    if len(args.paths) == 1 and is_compare(args.paths[0]):  # a compare experiment: its verdict table
        text = answer(args.paths[0], write=False).verdict.render(args.format)
        return _write(text, out, "the verdict")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            df = load_runs([_runs_of(p) for p in args.paths])
            table = comparison_table(df, rows=args.rows, cols=args.cols, metrics=args.metric,
                                     only_completed=not args.include_unfinished,
                                     mode=None if args.mode == "none" else args.mode, pool=args.pool,
                                     unfinished="; ".join(filter(None, map(unfinished_search, args.paths))))
        finally:
            for w in caught:
                print(f"augtune: warning: {w.message}", file=sys.stderr)
    what = f"{len(table.row_labels)} rows x {len(table.col_labels)} columns"
    return _write(table.render(args.format), out, what)


def schedule_config(paths: list[Path], trial: str | None = None, metric: str = "knn_acc") -> str:
    """The YAML of a config that replays a trial from scratch: the trial's own config (its last values)
    with a `schedule:` of the knob values its epochs trained under (PBA's replay), without the search
    that found it. The trial: `trial` (a part of its folder name only it has), else the best completed
    one by the search's metric and mode (a search folder's; otherwise `metric`, higher is better)."""
    import yaml

    from augtune.analysis.frame import AnalysisError, find_records
    from augtune.config import ConfigError, from_dict, to_dict
    from augtune.records import (REPEAT_DIR, SEARCH_FILE, knob_schedule, read_json, read_search_file,
                                 searched_schedule)

    mode = "max"
    metric = metric.split(",")[0]
    records: list[tuple[Path, dict]] = []
    for path in paths:
        if (Path(path) / SEARCH_FILE).is_file():
            config = read_search_file(Path(path))["config"]
            search = config["search"]
            metric, mode = search["metric"], search["mode"]
            if not searched_schedule(config):
                raise AnalysisError(f"--schedule: {path} was searched with scheduler "
                                    f"{search.get('scheduler')}, so each trial trained under constant "
                                    f"values: there is no schedule to replay (its best configuration is "
                                    f"the table's; a schedule comes from a pbt or pb2 search)")
        for file in find_records(path):
            if REPEAT_DIR in file.parts:
                continue
            try:
                records.append((file.parent, read_json(file)))
            except ValueError:
                continue
    if not records:
        raise AnalysisError(f"--schedule: no run records under {', '.join(map(str, paths))}")
    if trial is not None:
        found = [(p, r) for p, r in records if trial in p.name or trial == r.get("trial")]
        if len(found) != 1:
            names = ", ".join(sorted(p.name for p, _ in found)[:4])
            listed = f" ({names})" if names else ""
            raise AnalysisError(f"--trial: {trial!r} names {len(found)} trials{listed}; give a part of the "
                                "folder name only one trial has")
        folder, record = found[0]
    else:
        done = [(p, r) for p, r in records if r.get("status") == "completed"
                and isinstance((r.get("final") or {}).get(metric), (int, float))]
        if not done:
            raise AnalysisError(f"--schedule: no completed trial with a final {metric}")
        folder, record = (max if mode == "max" else min)(done, key=lambda pr: pr[1]["final"][metric])
    config = {k: v for k, v in (record.get("config") or {}).items() if k not in ("search", "compare")}
    config["schedule"] = knob_schedule(record.get("epochs") or [])
    try:
        config = to_dict(from_dict(config))
    except ConfigError as e:
        raise AnalysisError(f"--schedule: {folder.name}'s config cannot be replayed ({e})") from None
    for key in ("search", "compare"):
        config.pop(key, None)
    lineage = record.get("lineage") or []
    head = (f"# replays {folder.name} ({record.get('method')}, final {metric} "
            f"{(record.get('final') or {}).get(metric)}): {len(config['schedule'])} schedule step(s), "
            f"{len(lineage)} exploit(s) in its lineage\n")
    if config["dataset"].get("evaluate_on") == "val":
        head += ("# scored on the validation split, as the trial was (its final metric is comparable);\n"
                 "# with dataset.evaluate_on: test it trains on the whole training split and is scored on\n"
                 "# the test split\n")
    return head + yaml.safe_dump(config, sort_keys=False)


def _runs_of(path: Path) -> Path:
    """A search folder stands for its repeat-best runs when it has them (as the table at the end of the
    search), never for its trials of different settings pooled with the repeats."""
    from augtune.records import REPEAT_DIR, SEARCH_FILE

    path = Path(path)
    if (path / SEARCH_FILE).is_file() and (path / REPEAT_DIR).is_dir():
        return path / REPEAT_DIR
    return path


_ENDED = ("completed", "failed", "stopped")  # a trial's record once Tune is done with it


def _trials(folder: Path) -> list[dict]:
    """The trial records directly under `folder` (an unreadable one counts as a trial not ended)."""
    from augtune.records import read_json

    out = []
    for path in sorted(folder.glob("*/record.json")):
        try:
            record = read_json(path)
        except ValueError:
            record = None
        out.append(record if isinstance(record, dict) else {})
    return out


def _progress(trials: list[dict], expected: int | None, what: str) -> str:
    ended = sum(t.get("status") in _ENDED for t in trials)
    if expected is not None and ended < expected:
        return f"{ended} of {expected} {what} ended"
    if ended < len(trials):
        return f"{len(trials) - ended} {what} not ended"
    return ""


def _repeats_expected(search: dict, trials: list[dict]) -> int | None:
    """How many repeat runs the search makes: its `top` distinct completed configurations (distinct as the
    search tells them apart, `config.run_signature`) times its seeds; None when `per` makes it unknown."""
    from augtune.config import run_signature

    rb = search["repeat_best"]
    if rb.get("per"):
        return None
    done = {run_signature(t.get("params") or {}, str(t.get("entrant") or t.get("method")))
            for t in trials if t.get("status") == "completed"}
    return min(rb["top"], len(done)) * len(rb.get("seeds") or ())


def unfinished_search(path: Path) -> str:
    """Why the search in folder `path` is not done yet ("" when it is, or when `path` is no search):
    fewer ended trials than it samples (Optuna, random), trials still running or interrupted, or a
    repeat of the best that has not run all its seeds."""
    from augtune.records import REPEAT_DIR, SEARCH_FILE, read_search_file

    path = Path(path)
    if not (path / SEARCH_FILE).is_file():
        return ""
    try:
        search = read_search_file(path)["config"]["search"]
    except ValueError as e:
        warnings.warn(f"cannot tell whether the search finished: {e}", stacklevel=2)
        return ""
    trials = _trials(path)
    expected = search.get("num_samples") if search.get("algorithm") in ("optuna", "random") else None
    parts = [_progress(trials, expected, "trials")]
    if (search.get("repeat_best") or {}).get("top"):
        if not (path / REPEAT_DIR).is_dir():
            parts.append("the best not repeated yet")
        else:
            expected = _repeats_expected(search, trials)
            parts.append(_progress(_trials(path / REPEAT_DIR), expected, "repeat runs"))
    text = ", ".join(p for p in parts if p)
    return f"search {path.name}: {text}" if text else ""


def _write(text: str, out: Path | None, what: str) -> int:
    if out is None:
        sys.stdout.write(text)
        return 0
    from augtune.records import write_atomic

    try:
        write_atomic(out, text)
    except OSError as e:
        from augtune.analysis import AnalysisError

        raise AnalysisError(f"--out: cannot write {out} ({e.strerror or e})") from None
    print(f"wrote {out}: {what}")
    return 0
