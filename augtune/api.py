"""augtune's Python API, for notebooks and scripts: the CLI's jobs, returning objects.

    import augtune

    cfg = augtune.config_from("examples/compare_digits.yaml", {"compare.trials": 2})
    exp = augtune.compare(cfg, storage="results", name="digits-nb")
    print(exp.verdict().render("md"))     # the verdict `augtune compare` prints
    exp.table()                            # the verdict's numbers: a pandas DataFrame
    exp.runs(phase="repeat")               # one row per run
    exp.importance(), exp.report()         # {entrant: line}, the report's path
    augtune.load("results/digits-nb")      # the same Experiment, from its folder, later

`import augtune` loads neither torch nor Ray: each function imports what it needs when called. A
search or compare shows one updating progress line (in a notebook too) and sends Ray's own messages to
the experiment's `augtune.log`. Bad input raises `ConfigError` (one line naming the key) before Ray
starts; Ctrl-C (a notebook's interrupt) raises `SearchInterrupted`, whose message says how to continue
(`augtune.resume(path)`); a search whose every trial failed raises `SearchFailed`.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

ConfigLike = Union[str, Path, Mapping, "Config", None]  # noqa: F821 (augtune.config.Config)


def config_from(source: ConfigLike = None, overrides: Union[Mapping, Sequence[str], None] = None, /,
                **sections: Mapping) -> Any:
    """A checked `Config` from a YAML file, a dict (nested sections or dotted keys) or a Config, with
    `overrides` (a {dotted key: value} dict or `key=value` strings, as `--set`) and whole sections as
    keywords (`train={"epochs": 5}`). Unknown keys and bad values raise ConfigError naming the key."""
    from augtune.checks import check_config
    from augtune.config import Config, apply_overrides, from_dict, load_config, set_values, to_dict
    from augtune.plots import PLOTS

    if isinstance(source, Config):
        data = to_dict(source)
    elif isinstance(source, Mapping):
        dotted = {k: v for k, v in source.items() if "." in str(k)}
        data = set_values(to_dict(from_dict({k: v for k, v in source.items() if "." not in str(k)})),
                          dotted)
    else:
        data = to_dict(load_config(source))
    for name, values in sections.items():
        data = set_values(data, {f"{name}.{k}": v for k, v in dict(values).items()})
    if isinstance(overrides, Mapping):
        data = set_values(data, dict(overrides))
    elif overrides:
        data = apply_overrides(data, list(overrides))
    return check_config(from_dict(data), PLOTS)


@dataclass
class Run:
    """One training run (`augtune train`): its folder and its record."""

    path: Path
    record: dict

    @property
    def final(self) -> dict:
        """The final metrics, beside the reference rows' (`record["references"]`)."""
        return dict(self.record.get("final") or {})


class Experiment:
    """A search or compare experiment folder (or URI), read from its records: nothing is unpickled and
    Ray is not needed."""

    def __init__(self, path: Union[str, Path]):
        from augtune.search.storage import argument, is_uri

        text = argument(path)
        self.path = text if is_uri(text) else str(Path(text).expanduser().resolve())

    def __repr__(self) -> str:
        return f"Experiment({self.path!r})"

    @property
    def is_compare(self) -> bool:
        from augtune.search.compare import is_compare

        with self._local() as folder:
            return is_compare(str(folder))

    def _local(self):
        from augtune.search.storage import local_copy

        return local_copy(self.path)  # a local folder as it is; a URI's records copied

    def verdict(self):
        """The verdict of a compare (the object the CLI prints: `.render("md")`)."""
        from augtune.analysis.compare import answer

        self._need_compare()
        with self._local() as folder:
            return answer(folder, write=False).verdict

    def importance(self) -> dict[str, str]:
        """Which hyperparameters mattered: one line per entrant (Optuna's fANOVA over the records)."""
        from augtune.analysis.compare import answer

        self._need_compare()
        with self._local() as folder:
            return answer(folder, write=False).importances

    def report(self) -> Path:
        """Write the compare's HTML report (`report.html` in its folder) and return its path."""
        from augtune.analysis.compare import answer

        self._need_compare()
        return answer(self.path).report

    def records(self, phase: Optional[str] = None) -> list[dict]:
        """Every run's record, as dicts: the search trials' and the repeat runs' (`phase`: "search" or
        "repeat" for one of them)."""
        from augtune.analysis import find_records
        from augtune.records import read_record

        with self._local() as folder:
            out = []
            for path in self._paths(folder, phase, find_records):
                try:
                    out.append(read_record(path))
                except (OSError, ValueError):
                    continue
            return out

    def table(self):
        """The answer as numbers (a pandas DataFrame, long form: one line per row and metric, with
        mean, std and n): a compare's verdict table, with its tests' p-values and marks (what
        `augtune export EXP --format csv` writes); a search's table of its repeat runs (of its
        trials when it repeats nothing), as printed at its end."""
        from augtune.analysis import comparison_table, load_runs
        from augtune.records import REPEAT_DIR, read_search_file

        if self.is_compare:
            return self.verdict().numbers()
        with self._local() as folder:
            search = read_search_file(folder)["config"]["search"]
            repeat = folder / REPEAT_DIR
            runs = load_runs([repeat if repeat.is_dir() else folder])
            return comparison_table(runs, rows="method", cols="dataset",
                                    metrics=(search["metric"],)).data

    def runs(self, phase: Optional[str] = None):
        """One row per run (and the reference rows): the tidy DataFrame the tables are made from
        (`phase`: "search" or "repeat" for one of them)."""
        from augtune.analysis import find_records, load_runs
        from augtune.records import REPEAT_DIR

        with self._local() as folder:
            if phase == "search" and (folder / REPEAT_DIR).is_dir():  # a search's trials, not its repeat
                return load_runs(self._paths(folder, phase, find_records))
            return load_runs(self._paths(folder, phase))  # folders: `experiment` names the entrant

    @staticmethod
    def _paths(folder: Path, phase: Optional[str], find=None) -> list:
        """The record files (`find` given) or folders of `phase` in the experiment `folder`: a search's
        trials and `repeat_best/`; a compare's entrants' folders and `repeat/` (its `search/` holds only
        Tune's files and checkpoints)."""
        from augtune.config import ConfigError
        from augtune.records import COMPARE_FILE, COMPARE_REPEAT, REPEAT_DIR, SEARCH_FILE

        if phase not in (None, "search", "repeat"):
            raise ConfigError(f"phase: {phase!r} is not search or repeat")
        repeat = [p for p in (folder / COMPARE_REPEAT, folder / REPEAT_DIR) if p.is_dir()]
        if (folder / COMPARE_FILE).is_file():
            search = sorted(p for p in folder.iterdir() if (p / SEARCH_FILE).is_file())
        else:
            search = [folder]
        folders = {None: search + repeat, "search": search, "repeat": repeat}[phase]
        if find is None:
            return folders
        files = sorted({f for d in folders for f in find(d)})
        if phase == "search":  # a search's own folder holds its repeat folder too
            files = [f for f in files if not any(r in f.parents for r in repeat)]
        return files

    def _need_compare(self) -> None:
        from augtune.config import ConfigError

        if not self.is_compare:
            raise ConfigError(f"{self.path}: a search, not a compare (its table: .table())")


def load(path: Union[str, Path]) -> Experiment:
    """An experiment already run (a folder or an `s3://` URI)."""
    from augtune.config import ConfigError
    from augtune.records import COMPARE_FILE, SEARCH_FILE
    from augtune.search.storage import exists

    exp = Experiment(path)
    if not (exists(exp.path, COMPARE_FILE) or exists(exp.path, SEARCH_FILE)):
        raise ConfigError(f"{exp.path}: not an augtune experiment (no {SEARCH_FILE} or {COMPARE_FILE})")
    return exp


def train(cfg: ConfigLike, out: Union[str, Path, None] = None, resume: bool = False) -> Run:
    """Train one run in this process (`augtune train`); its folder (default runs/<method>-<data>-<time>)
    and record."""
    import datetime as dt

    from augtune.config import method_label
    from augtune.data import load_dataset
    from augtune.plots import end_of_run_figures
    from augtune.trainables import train_run
    from augtune.trainables.run import check_new_run_folder, check_resume

    cfg = config_from(cfg)
    out = Path(out) if out is not None else \
        Path("runs") / f"{method_label(cfg)}-{cfg.dataset.name}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    if resume:
        check_resume(out, cfg)
    else:
        check_new_run_folder(out)
    record = train_run(cfg, load_dataset(cfg.dataset), out, resume=resume, log=lambda s: print(s, flush=True),
                       on_completed=end_of_run_figures)
    return Run(out, record)


def search(cfg: ConfigLike, *, storage: Optional[str] = None, name: Optional[str] = None,
           address: Optional[str] = None, dashboard: bool = False, verbose: bool = False) -> Experiment:
    """Search `cfg.search`'s space on Ray, then repeat its best (`augtune search`); the experiment."""
    from augtune.plots import PLOTS, end_of_run_figures
    from augtune.search import plan_config, run_search
    from augtune.search.experiment import data_subject, default_name
    from augtune.search.launch import hold_to_loopback
    from augtune.search.plan import resolve_storage

    hold_to_loopback(address)
    cfg = config_from(cfg)
    storage = resolve_storage(storage)
    label = cfg.search.space if isinstance(cfg.search.space, str) else "search"
    plan = plan_config(cfg, storage=storage, name=name or default_name(label, data_subject(cfg), storage),
                       address=address, dashboard=dashboard, figure_kinds=PLOTS)
    run_job(lambda callbacks: run_search(plan, on_completed=end_of_run_figures, callbacks=callbacks),
            plan.experiment, plan.cfg, verbose)
    return Experiment(plan.experiment)


def compare(cfg: ConfigLike, *, storage: Optional[str] = None, name: Optional[str] = None,
            address: Optional[str] = None, dashboard: bool = False, verbose: bool = False) -> Experiment:
    """Every method head to head under one budget (`augtune compare`); the experiment (`.verdict()`)."""
    from augtune.config import ConfigError
    from augtune.data import DataError, load_dataset
    from augtune.plots import PLOTS, end_of_run_figures
    from augtune.search.compare import plan_compare, run_compare
    from augtune.search.experiment import check_name, check_name_free, data_subject, default_name
    from augtune.search.launch import hold_to_loopback
    from augtune.search.plan import resolve_storage

    hold_to_loopback(address)
    cfg = config_from(cfg)
    try:
        data = load_dataset(cfg.dataset)
    except DataError as e:
        raise ConfigError(str(e)) from None
    storage = resolve_storage(storage)
    name = check_name(name) if name else default_name("compare", data_subject(cfg), storage)
    check_name_free(f"{storage.rstrip('/')}/{name}")
    plan = plan_compare(cfg, data.modality, storage=storage, name=name, address=address,
                        dashboard=dashboard, figure_kinds=PLOTS, data=data)
    run_job(lambda callbacks: run_compare(plan, on_completed=end_of_run_figures, callbacks=callbacks),
            plan.experiment, plan.plans[0].cfg, verbose, budget=time_budget_of(plan))
    return Experiment(plan.experiment)


def time_budget_of(plan) -> Optional[tuple[float, float]]:
    """A new compare's `time_budget` in seconds and when it began (its measuring, on time.monotonic's
    clock), or None."""
    from augtune.config import parse_duration

    if not plan.cfg.compare.time_budget or plan.budget_began is None:
        return None
    return parse_duration(plan.cfg.compare.time_budget), plan.budget_began


def resume(path: Union[str, Path], *, address: Optional[str] = None, restart_errored: bool = False,
           trust: bool = False, verbose: bool = False) -> Experiment:
    """Continue an interrupted search or compare (`augtune resume`); a finished one is returned as it is."""
    from augtune.plots import end_of_run_figures
    from augtune.search import load_plan, resume_search
    from augtune.search.compare import is_compare, load_compare, run_compare
    from augtune.search.experiment import is_finished
    from augtune.search.launch import hold_to_loopback

    hold_to_loopback(address)
    exp = load(path)
    if is_finished(exp.path) and not restart_errored:
        return exp
    if is_compare(exp.path):
        plan = load_compare(exp.path, address=address)
        run_job(lambda cb: run_compare(plan, on_completed=end_of_run_figures, callbacks=cb, trust=trust),
                plan.experiment, plan.plans[0].cfg, verbose)
    else:
        plan = load_plan(exp.path, address=address)
        run_job(lambda cb: resume_search(plan, restart_errored=restart_errored, trust=trust,
                                         on_completed=end_of_run_figures, callbacks=cb),
                plan.experiment, plan.cfg, verbose)
    return exp


def run_job(run, experiment: str, cfg, verbose: bool = False,
            budget: Optional[tuple[float, float]] = None) -> None:
    """Run a search-like job (`run(callbacks)`) with one progress line and Ray's own messages in the
    experiment's log; Ctrl-C becomes SearchInterrupted (its message says how to continue). `budget`: a
    new compare's `time_budget` and when it began (`time_budget_of`), which the progress line counts
    down."""
    import os

    from augtune.search.experiment import SearchInterrupted
    from augtune.search.progress import Progress, quiet_ray

    if verbose:
        os.environ["AUGTUNE_VERBOSE"] = "1"
    quiet_ray(log_file(experiment), verbose)
    s = cfg.search
    in_notebook = "ipykernel" in sys.modules  # its output redraws a line on "\r" like a terminal
    progress = Progress(s.metric, s.mode, s.num_samples if s.algorithm == "optuna" else None, title="search",
                        tty=True if in_notebook else None, budget=budget)
    try:
        run([progress])
    except KeyboardInterrupt:
        raise SearchInterrupted(experiment) from None


def log_file(experiment: str) -> Path:
    """Where Ray's own messages of an experiment go (`run_job`): its `augtune.log`; for one kept in cloud
    storage a local file named after it (a log appended line by line is no object to upload)."""
    import tempfile

    from augtune.search.experiment import LOG_FILE
    from augtune.search.storage import is_uri

    if is_uri(experiment):
        return Path(tempfile.gettempdir()) / f"augtune-{experiment.rstrip('/').rsplit('/', 1)[-1]}.log"
    return Path(experiment) / LOG_FILE
