"""The one record format every run leaves behind (`record.json`), read by `augtune.analysis`.

A record holds the resolved config, seed, dataset, method label, package versions and git revision,
the metrics of every epoch, the final metrics, the reference rows (`raw`, `random-init`) and the
run's status (`running`, `completed`, `failed` with the reason, `interrupted`, `stopped` early by a
scheduler). Only JSON: a results folder copied
to a laptop can be tabulated without torch or ray.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import math
import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

FORMAT = "augtune.record/1"

RECORD_FILE = "record.json"
CONFIG_FILE = "config.yaml"
CHECKPOINT_FILE = "checkpoint.pt"
SEARCH_FILE = "augtune_search.yaml"  # in an experiment folder: what `augtune resume` needs
REPEAT_DIR = "repeat_best"  # in a search's folder: the records of the repeat runs of its best
COMPARE_FILE = "augtune_compare.yaml"  # in a compare experiment's folder
COMPARE_SEARCH = "search"  # in a compare experiment's folder: the Tune run of its searches and repeat
COMPARE_REPEAT = "repeat"  # ... and the records of every entrant's best configuration on the shared seeds
ERROR_FILE = "error.txt"  # in a Ray trial's folder: why it failed (written by Tune)
REPORT_FILE = "report.html"  # in a compare experiment's folder: the self-contained report
# a metric scored on the validation split beside the test split (`dataset.evaluate_on: both`): its name
VAL_PREFIX = "val_"
# the metrics that read no label (augtune.eval.label_free), and those of them where lower is better
LABEL_FREE = frozenset({"rankme", "alignment", "uniformity"})
LOWER_IS_BETTER = frozenset({"alignment", "uniformity"})


def mode_of(metric: str) -> str:
    """The direction that improves `metric`: "min" for a lower-is-better one, else "max"."""
    return "min" if metric in LOWER_IS_BETTER else "max"


FRACTION_SUFFIXES = ("_acc", "_nmi", "_ari")  # metrics in [0, 1], shown in % (points)


def searched_schedule(config: Any) -> bool:
    """Whether a config as written (a record's `config`, a search file's) is a trial of a population
    scheduler (PBT, PB2: its values are a schedule, not constants). Of a typed config:
    `augtune.search.schedulers.scheduling(cfg).population`."""
    from augtune.config import SCHEDULES

    search = config.get("search") if isinstance(config, dict) else None
    return isinstance(search, dict) and search.get("scheduler") in SCHEDULES

# A record's fields, in the order the docs list them: (when a record has it, what it holds). The docs hook
# (docs/hooks/tables.py) writes the table from this and stops the build when the fields the code writes
# into a record differ from these.
RECORD_FIELDS: dict[str, tuple[str, str]] = {
    "format": ("every run", "`augtune.record/1`: what a reader checks before anything else"),
    "status": ("every run", "`running`, `completed`, `failed`, `interrupted`, or `stopped` early by a "
                            "scheduler"),
    "error": ("every run", "why it failed (null otherwise)"),
    "method": ("every run", "the label, e.g. `simclr`, `byol+pinda`"),
    "entrant": ("every run", "the row a compare counts it in: the label, unless the compare names the "
                             "entrant otherwise (`simclr+cocor@pbt`)"),
    "dataset": ("every run", "the data set it trained on"),
    "seed": ("every run", "its seed"),
    "rows": ("every run", "the labelled training rows, the held-out rows it was scored on, and the "
                          "unlabelled rows it also trained on (`train`, `test`, `unlabeled`)"),
    "config": ("every run", "the resolved config (a PBT copy's with the `schedule` it trained under)"),
    "versions": ("every run", "the versions of Python and of augtune's main packages that ran it"),
    "git_revision": ("every run", "the commit of the code that ran (`+dirty` with uncommitted changes)"),
    "host": ("every run", "the machine's name"),
    "process": ("every run", "the id of the process that ran it last"),
    "started": ("every run", "when it started (UTC, ISO 8601)"),
    "finished": ("every run", "when it ended (null while it runs)"),
    "epochs": ("every run", "the metrics of every epoch, each with its `epoch` (from 1)"),
    "final": ("every run", "the final metrics: the evaluation and the method's last diagnostics"),
    "references": ("every run", "the `raw` and `random-init` rows"),
    "seconds": ("every run", "wall seconds by part of the run (set-up, training, evaluation, ...), over "
                             "every process that ran it"),
    "cpu_seconds": ("every run", "the same in CPU seconds"),
    "max_rss_mb": ("every run", "the peak memory of the process that ran it, in MB"),
    "resumed_with": ("a resumed run", "each raise of `train.epochs` a resume made: old and new value, "
                                      "and the epoch"),
    "params": ("a search's trial", "its sampled {dotted key: value}; a repeat run's whole parameter set"),
    "variant": ("a search's trial", "the parameters its searcher made it with (a PBT trial's `params` are "
                "its values now); a resume skips the variants its records hold"),
    "phase": ("a search's trial", "`search` or `repeat`"),
    "trial": ("a search's trial", "its folder's name, as Tune names the trial"),
    "checkpoints": ("a search's trial", "where Tune keeps its checkpoints, relative to its folder, when "
                                        "that is elsewhere"),
    "nodes": ("a search's trial", "the Ray node of each of its (re)starts"),
    "candidate": ("a race's repeat run", "the candidate it is a run of (`entrant#rank`)"),
    "round": ("a race's repeat run", "the round of the race that gave it out"),
    "lineage": ("a PBT trial", "the copies it descends from: `epoch`, `trial`, `from`"),
    "exploits": ("a PBT trial", "how many times it copied another trial"),
    "figures": ("a run that drew figures", "the files drawn at its end, relative to its folder"),
    "figure_errors": ("a run that drew figures", "each figure that failed, by kind, with the reason"),
}

# in a Tune trial's parameters: which of several searches sharing one Tune run it belongs to (a compare's
# entrant), and a repeat run of a search's best (its whole parameter set)
ENTRANT = "_entrant"
REPEAT = "_repeat"
# ... and, in a compare's race (`compare.race`), the candidate a repeat run is of (`entrant#rank`) and the
# round that gave it out: its record keeps both as `candidate` and `round`
CANDIDATE = "_candidate"
ROUND = "_round"
RESUME = "_resume"  # a trial a resume made again: where it continues from (augtune.search.resume)


def is_uri(location: object) -> bool:
    """Whether a location is a URI (s3://, gs://, ...) rather than a local path: the one predicate
    (`augtune.storage` re-exports it)."""
    return "://" in str(location)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@functools.lru_cache(maxsize=1)
def _versions() -> tuple:
    """Read once per process: the packages a process runs are those it imported (7 ms a read, at every
    run's start: a PBT exploit restarts its trial's run)."""
    out = {"python": platform.python_version()}
    for dist in ("augtune", "torch", "torchvision", "numpy", "scikit-learn", "ray", "optuna"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    if out["augtune"] is None:  # running from a checkout that is not installed
        from augtune.version import __version__

        out["augtune"] = __version__
    return tuple(out.items())


def versions() -> dict[str, str | None]:
    """Python's version and those of augtune and its main packages, as this process runs them."""
    return dict(_versions())


@functools.lru_cache(maxsize=1)
def git_revision() -> str | None:
    """Commit of the augtune checkout (with `+dirty` for uncommitted changes), or None; asked once per
    process (two git calls, 8 ms), as the code a process runs is the code it imported."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def process_started(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), from Linux's /proc; None elsewhere."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def new_record(config: dict, *, method: str, dataset: str, seed: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "status": "running",
        "error": None,
        "method": method,
        "dataset": dataset,
        "seed": seed,
        "config": config,
        "versions": versions(),
        "git_revision": git_revision(),
        "host": platform.node(),
        "started": now(),
        "finished": None,
        "epochs": [],  # one dict of metrics per finished epoch, with "epoch" (1-based)
        "final": {},  # metrics at the end of the run: the evaluation and the method's last diagnostics
        "references": {},  # {"raw": {...}, "random-init": {...}}
    }


class RunRecord:
    """The life of one run's record: started (or resumed), one entry per epoch, then completed,
    failed or interrupted. Both runners (in-process and Ray) keep their record through this class,
    so the same run leaves the same record whichever way it ran."""

    def __init__(self, data: dict[str, Any]):
        self.data = data

    @classmethod
    def start(cls, config: dict, *, method: str, dataset: str, seed: int) -> "RunRecord":
        return cls(new_record(config, method=method, dataset=dataset, seed=seed))

    @classmethod
    def read(cls, path: Path) -> "RunRecord":
        return cls(read_record(path))

    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def final(self) -> dict:
        return self.data["final"]

    def resumed(self) -> "RunRecord":
        self.data.update(status="running", error=None, finished=None)
        return self

    def epoch(self, history: list[dict], references: dict) -> None:
        self.data["epochs"] = list(history)
        self.data["references"] = dict(references)

    def completed(self, final: dict) -> None:
        self.data.update(status="completed", final=dict(final), finished=now(), error=None)

    def failed(self, error: str, history: list[dict] | None = None) -> None:
        self.data.update(status="failed", error=error, finished=now())
        if history is not None:
            self.data["epochs"] = list(history)

    def interrupted(self, history: list[dict] | None = None) -> None:
        self.data.update(status="interrupted", finished=now())
        if history is not None:
            self.data["epochs"] = list(history)

    def write(self, run_dir: Path) -> None:
        write_record(run_dir, self.data)


class LinkRefused(OSError):
    """A file augtune would write is a symbolic link: refused, so a planted link never redirects a write."""


def is_compare(exp_dir) -> bool:
    """Whether the local folder `exp_dir` holds a compare experiment (its COMPARE_FILE)."""
    return (Path(exp_dir) / COMPARE_FILE).is_file()


def last_reported(record: dict, metric: str) -> float | None:
    """The last finite value of `metric` a run's record holds in its epochs: what Tune ranks a search
    trial by (None when it reported none)."""
    epochs = record.get("epochs")
    values = [e[metric] for e in epochs if isinstance(e, dict) and isinstance(e.get(metric), (int, float))
              and not isinstance(e.get(metric), bool)] if isinstance(epochs, list) else []
    return float(values[-1]) if values and math.isfinite(values[-1]) else None


def phase_folders(exp_dir: Path) -> dict[str, list[Path]]:
    """The folders whose subfolders hold the trial records of the local experiment `exp_dir`, by phase: a
    search's own folder and its `repeat_best/`; a compare's entrants' folders (its `search/` holds only
    Tune's files and checkpoints) and its `repeat/`."""
    exp_dir = Path(exp_dir)
    search = (sorted(p for p in exp_dir.iterdir() if (p / SEARCH_FILE).is_file()) if is_compare(exp_dir)
              else [exp_dir])
    return {"search": search, "repeat": [p for p in (exp_dir / COMPARE_REPEAT, exp_dir / REPEAT_DIR)
                                         if p.is_dir()]}


@contextlib.contextmanager
def atomic_file(path: Path, mode: int = 0o644):
    """A binary file object whose bytes replace `path` whole when the block ends, through a temporary file
    in the same folder renamed over it: a crash never leaves half a file, and a link never redirects the
    write. The temporary is created with O_EXCL | O_NOFOLLOW (a link planted at its name is refused, never
    followed); a final name that is a symbolic link raises LinkRefused (renaming over it would not write
    through it, but the user meant the file it points at, and must say so). An error in the block removes
    the temporary and leaves `path` as it was. Every file augtune writes goes through here
    (tests/test_writes.py checks that no other write remains)."""
    path = Path(path)
    if path.is_symlink():
        raise LinkRefused(f"{path} is a symbolic link; augtune does not write through links (remove it, or "
                          f"write to the file it points at)")
    for attempt in range(100):
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}-{attempt}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
            break
        except FileExistsError:  # a stale or planted file at this name: take the next name
            continue
    else:
        raise FileExistsError(f"{path}: cannot create a temporary file beside it")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    """Replace `path` with `data` (text as UTF-8), whole and never through a link (`atomic_file`)."""
    with atomic_file(path, mode) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file (`write_atomic`)."""
    write_atomic(path, json.dumps(data, indent=1, allow_nan=True) + "\n")


def write_record(run_dir: Path, record: dict) -> None:
    write_json_atomic(Path(run_dir) / RECORD_FILE, record)


# JSON nesting a reader accepts: a record nests about 5 deep (config, section, search space, a list
# of choices); Python's parser recurses per level: a file nested 100,000 deep was a RecursionError.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class JSONFileError(ValueError):
    """A JSON file that cannot be read: `str()` is one line naming the file, `reason` the rest."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def json_depth(text: str) -> int:
    """How deep the brackets of JSON `text` nest outside its strings, counted without recursion."""
    depth = deepest = 0
    for ch in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if ch in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def read_json(path: Path, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON document in file `path`, or a JSONFileError naming the file and what is wrong with
    it: unreadable, not UTF-8, nested deeper than `max_depth`, or not valid JSON (a file cut short,
    as a full disk leaves one, says so)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise JSONFileError(path, f"cannot be read ({e.strerror or type(e).__name__})") from None
    return parse_json(data, path, max_depth)


def parse_json(data: bytes, path: Any, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`read_json` of the bytes `data` of the file `path` names (a local path, or a URI's)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JSONFileError(path, f"not UTF-8 text (byte {e.start}); not a JSON file") from None
    if json_depth(text) > max_depth:
        raise JSONFileError(path, f"nested more than {max_depth} deep; not a file augtune wrote")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        short = e.pos >= len(text.rstrip()) - 1 or e.msg.startswith("Unterminated")
        cut = " (cut short: was the disk full?)" if short else ""
        where = f"line {e.lineno} column {e.colno}"
        raise JSONFileError(path, f"not valid JSON: {e.msg} at {where}{cut}") from None
    except RecursionError:  # the depth is counted first; this is a second line of defence
        raise JSONFileError(path, "nested too deep; not a file augtune wrote") from None


def read_record(path: Path) -> dict:
    """A record, from its file or its run folder; a ValueError naming the file when it is none."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORD_FILE
    data = read_json(path)
    found = data.get("format") if isinstance(data, dict) else type(data).__name__
    if found != FORMAT:
        raise JSONFileError(path, f"not an augtune record (format {found!r}, expected {FORMAT!r})")
    return data


def read_search_file(exp_dir, text: str | None = None) -> dict:
    """An experiment folder's SEARCH_FILE: {"config": ..., "base": ..., "name": ..., "storage": ...}; `text`:
    the file's text, read elsewhere (a URI's, which `exp_dir` names).

    A missing, corrupt or foreign file is a ValueError with one line naming it (never a traceback):
    `augtune status` and `augtune resume` read it before anything else.
    """
    from augtune.config import ConfigError, safe_load

    where = f"{str(exp_dir).rstrip('/')}/{SEARCH_FILE}"
    try:
        if text is None:
            if not (Path(exp_dir) / SEARCH_FILE).is_file():
                raise ValueError(f"{Path(exp_dir)}: not an augtune search folder (no {SEARCH_FILE})")
            text = (Path(exp_dir) / SEARCH_FILE).read_text(encoding="utf-8")
        data = safe_load(text, where)
    except (ConfigError, UnicodeDecodeError, OSError) as e:
        raise ValueError(f"{where}: cannot be read ({str(e).splitlines()[0][:160]})") from None
    search = data.get("config", {}).get("search") if isinstance(data, dict) else None
    if (
        not isinstance(data.get("base") if isinstance(data, dict) else None, dict)
        or not isinstance(search, dict)
        or not {"metric", "mode"} <= set(search)
    ):
        raise ValueError(f"{where}: not an augtune search file (config, search and base sections expected)")
    return data


def knob_schedule(epochs: list[dict], values: dict[str, Any] | None = None, until: int | None = None
                  ) -> list[dict]:
    """A `schedule:` section ([{"epoch": E, "set": {key: value}}], 1-based, piecewise constant) that
    reproduces the knob values recorded per epoch (each epoch's `knobs`): a step where any value
    changes, the first epoch's naming every key. `values`: those in force from epoch `until` + 1 on
    (a PBT trial's own after its last exploit, not yet trained), a last step where they differ."""
    steps: list[dict] = []
    last: dict[str, Any] = {}
    rows = [(int(e["epoch"]), e.get("knobs") or {}) for e in epochs if isinstance(e, dict) and "epoch" in e]
    if values is not None and until is not None:
        rows = [r for r in rows if r[0] <= until] + [(until + 1, dict(values))]
    for epoch, knobs in rows:
        changed = {k: v for k, v in knobs.items() if k not in last or last[k] != v}
        if changed:
            steps.append({"epoch": epoch, "set": changed})
            last.update(changed)
    return steps
