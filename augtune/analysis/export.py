"""`augtune export EXP_DIR... --rows method --cols dataset --metric knn_acc,sr_acc --format md`.

Prints the comparison table of the runs under the folders given (or writes it to `--out`).
Records that are not augtune records are skipped with a warning line on stderr; bad input (no
records, no finished runs, an unknown metric or column, mixed datasets) is one error line, exit 2.
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
                   help="which mean is best and bold: auto (higher, but lower for losses and times), max, min, none")
    e.add_argument("--include-unfinished", action="store_true",
                   help="also tabulate running and failed runs (default: completed runs only)")
    e.add_argument("--out", type=Path, metavar="FILE", help="write the table here instead of printing it")
    e.set_defaults(func=cmd_export)
    return e


def cmd_export(args: argparse.Namespace) -> int:
    from augtune.analysis import AnalysisError, comparison_table, load_runs
    from augtune.cli import UsageError  # lazily: cli imports this module to register the command

    out: Path | None = args.out
    if out is not None:
        if out.is_dir():
            raise UsageError(f"--out: {out} is a folder; name the file to write")
        if not out.parent.is_dir():
            raise UsageError(f"--out: folder {out.parent} does not exist")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            df = load_runs(args.paths)
            table = comparison_table(df, rows=args.rows, cols=args.cols, metrics=args.metric,
                                     only_completed=not args.include_unfinished,
                                     mode=None if args.mode == "none" else args.mode)
        except AnalysisError as e:
            raise UsageError(str(e)) from None
        finally:
            for w in caught:
                print(f"augtune: warning: {w.message}", file=sys.stderr)
    text = table.render(args.format)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
        print(f"wrote {out}: {len(table.row_labels)} rows x {len(table.col_labels)} columns")
    return 0
