"""augtune's Python API, for notebooks and scripts: the CLI's jobs, returning objects.

    import augtune

    cfg = augtune.config_from("examples/compare_digits.yaml", {"compare.trials": 2})
    exp = augtune.compare(cfg, storage="results", name="digits-nb")
    print(exp.verdict().render("md"))     # the verdict `augtune compare` prints
    exp.table()                            # the verdict's numbers: a pandas DataFrame
    exp.runs(phase="repeat")               # one row per run
    exp.importance(), exp.report()         # a DataFrame (entrant, key, importance), the report's path
    best = exp.best()                      # the best entrant's configuration, score and trained encoder
    x, y = best.features("test")           # numpy features and labels, for a classifier of your own
    exp.trials(), exp.figure("search")     # one row per trial; a matplotlib Figure
    augtune.load("results/digits-nb")      # the same Experiment, from its folder, later

In a notebook an `Experiment`, a `Run` and a `Best` show their answer (`_repr_markdown_`, `_repr_html_`):
the best entrant and its score, the trials; a run's final scores.

`import augtune` loads neither torch nor Ray: each function imports what it needs when called. A
search or compare shows one updating progress line (in a notebook too) and sends Ray's own messages to
the experiment's `augtune.log`. Bad input raises `ConfigError` (one line naming the key) before Ray
starts; Ctrl-C (a notebook's interrupt) raises `SearchInterrupted`, whose message says how to continue
(`augtune.resume(path)`); a search whose every trial failed raises `SearchFailed`.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

ConfigLike = Union[str, Path, Mapping, "Config", None]  # noqa: F821 (augtune.config.Config)


def config_from(source: ConfigLike = None, overrides: Union[Mapping, Sequence[str], None] = None,
                **sections: Mapping) -> Any:
    """A checked `Config` from a YAML file, a dict (nested sections or dotted keys) or a Config, with
    `overrides` (a {dotted key: value} dict or `key=value` strings, as `--set`; positional or keyword) and
    whole sections as keywords (`train={"epochs": 5}`; no section is named `source` or `overrides`).
    Unknown keys and bad values raise ConfigError naming the key."""
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
    """One training run (`augtune train`): its folder and its record; its trained network and features
    from its checkpoint when asked."""

    path: Path
    record: dict
    _loaded: Any = field(default=None, repr=False, compare=False)  # augtune.plots.Run, on first use

    @property
    def final(self) -> dict:
        """The final metrics, beside the reference rows' (`record["references"]`)."""
        return dict(self.record.get("final") or {})

    def encoder(self):
        """The trained network that evaluation scored (`eval.encoder`: input normalisation and backbone),
        loaded from the run's checkpoint with `weights_only=True`: a torch module in eval mode, on the GPU
        when there is one, taking the data set's inputs as floats (images scaled to [0, 1])."""
        return self._run().encoder

    def features(self, split: str = "test"):
        """(features (N, F) float32, labels (N,)) of the run's data split (`train`, `test` or `val`) under
        its trained encoder, as numpy arrays: what its k-NN and probes scored."""
        run = self._run()
        x = run.features(split).numpy()
        return x, getattr(run.data, f"y_{split}").cpu().numpy()

    def figure(self, kind: str, which: Optional[str] = None, path: Union[str, Path, None] = None):
        """Figure `kind` of this run (`augtune plot KIND RUN`) as a matplotlib Figure (`which`, `path`: as
        `augtune.plots.figure`)."""
        from augtune.plots import figure

        return figure(kind, [self._run()], which, path)

    def _run(self):
        from augtune.config import ConfigError
        from augtune.plots import load_run
        from augtune.records import is_uri

        if self._loaded is None:
            if is_uri(self.path):
                raise ConfigError(f"{self.path}: a run kept in cloud storage; copy its folder (with its "
                                  "checkpoint) here and use augtune.plots.load_run")
            self._loaded = load_run(Path(self.path))
        return self._loaded

    def _repr_markdown_(self) -> str:
        r = self.record
        epochs = len(r.get("epochs") or [])
        scores = " · ".join(f"{k} {_shown(k, v)}{_unit(k)}" for k, v in _scores(r).items())
        return _markdown([f"**augtune run** `{Path(str(self.path)).name}`: {r.get('method')} on "
                          f"{r.get('dataset')}, seed {r.get('seed')}, {r.get('status')} after {epochs} "
                          f"epoch{'s' * (epochs != 1)}", scores or "no final scores"])

    def _repr_html_(self) -> str:
        return _html(self._repr_markdown_())


@dataclass
class Best:
    """The best configuration of an experiment (`Experiment.best`): its entrant, parameters and score,
    and the runs that measured it, whose first (`run`, its first seed's) gives the trained network."""

    entrant: str
    metric: str
    score: float  # the mean of `metric` over the runs (a compare's: its verdict's number)
    std: float  # their standard deviation (0 over one run)
    n: int  # the runs the mean is over
    split: str  # the split `score` is on: test (a repeat's runs), val (search trials on a validation split)
    params: dict  # the searched {dotted key: value} that make it
    seeds: dict  # {seed: value of `metric`} of each run
    config: Any = field(repr=False)  # its first run's resolved Config: `augtune.train(best.config)`
    runs: tuple = field(default=(), repr=False)  # a `Run` per seed, by seed

    @property
    def run(self) -> Run:
        """Its first seed's run."""
        from augtune.config import ConfigError

        if not self.runs:
            raise ConfigError("an experiment in cloud storage: its runs' checkpoints stay there; copy the "
                              "experiment here (augtune.load of the folder) for its trained network")
        return self.runs[0]

    def encoder(self):
        """The trained network of its first run (`Run.encoder`)."""
        return self.run.encoder()

    def features(self, split: str = "test"):
        """(features, labels) of a split under the first run's encoder (`Run.features`)."""
        return self.run.features(split)

    def _repr_markdown_(self) -> str:
        params = ", ".join(f"{k} = {_shown('', v)}" for k, v in self.params.items())
        return _markdown([f"**{self.entrant}**: {_score(self)}",
                          params[:400] or "its defaults (nothing searched)"])

    def _repr_html_(self) -> str:
        return _html(self._repr_markdown_())


class Experiment:
    """A search or compare experiment folder (or URI), read from its records: nothing is unpickled and
    Ray is not needed."""

    def __init__(self, path: Union[str, Path]):
        from augtune.storage import argument, is_uri

        text = argument(path)
        self.path = text if is_uri(text) else str(Path(text).expanduser().resolve())

    def __repr__(self) -> str:
        return f"Experiment({self.path!r})"

    @property
    def is_compare(self) -> bool:
        from augtune.records import is_compare

        with self._local() as folder:
            return is_compare(str(folder))

    def _local(self):
        from augtune.storage import local_copy

        return local_copy(self.path)  # a local folder as it is; a URI's records copied

    def verdict(self):
        """The verdict of a compare (the object the CLI prints: `.render("md")`)."""
        from augtune.analysis.compare import answer

        self._need_compare()
        with self._local() as folder:
            return answer(folder, write=False).verdict

    def importance(self):
        """Which hyperparameters mattered (Optuna's fANOVA over the search trials' records, PED-ANOVA
        where fANOVA cannot run; `augtune importance`): a pandas DataFrame with columns `entrant`, `key`,
        `importance` (floats, an entrant's summing to 1) and `method`, most important first; an entrant
        with too few trials has no row, and `attrs["skipped"]` says why."""
        from augtune.analysis import find_records
        from augtune.analysis.importance import importance_frame
        from augtune.records import read_record

        with self._local() as folder:
            metric, mode = self._goal(folder)
            searches: dict[str, list[dict]] = {}
            for path in self._paths(folder, "search", find_records):
                record = _read(path, read_record)
                if record is not None:
                    searches.setdefault(_entrant(record), []).append(record)
            return importance_frame(searches, metric, mode)

    def trials(self, metric: Optional[str] = None):
        """One row per trial, search trials then repeat runs (Optuna's `trials_dataframe`): a pandas
        DataFrame with columns `trial`, `entrant`, `phase`, `state`, `seed`, each searched key by its dotted
        name, `metric`'s value (default: the one searched; a search trial's last reported, on the
        validation split where the search had one; a repeat run's on the test split), `epochs` and
        `seconds` (numbers in numeric columns)."""
        from augtune.analysis import find_records
        from augtune.analysis.frame import trials_frame
        from augtune.records import read_record

        with self._local() as folder:
            metric = metric or self._goal(folder)[0]
            records = [(path.parent.name, record) for path in self._paths(folder, None, find_records)
                       if (record := _read(path, read_record)) is not None]
            return trials_frame(records, metric)

    def best(self, entrant: Optional[str] = None, metric: Optional[str] = None) -> Best:
        """The best configuration (a `Best`): of a compare, the entrant with the highest mean of `metric`
        over its repeat runs (the verdict's rows; `metric`: default the compare's first; `entrant`: that
        one's instead); of a search, the configuration its repeat ran with the best mean (its best trial
        when it repeated nothing). Its `.encoder()` and `.features(split)` come from its first seed's run."""
        with self._local() as folder:
            return self._choose(folder, entrant, metric)[0]

    def figure(self, kind: str, entrant: Optional[str] = None, which: Optional[str] = None,
               path: Union[str, Path, None] = None):
        """A figure of the experiment as a matplotlib Figure (`augtune plot`'s kinds; `path`: written there
        too): `search` and `schedule` from an entrant's search trials, the others (`umap`, `pinda`, ...)
        from its best configuration's runs and their checkpoints. `entrant`: default the best one (a
        search's: its own); `which`: part of the figure's name when the kind draws several (`"parallel"`
        of `search`'s history, parallel coordinates and importances), default the first."""
        from augtune.analysis import find_records
        from augtune.records import is_compare
        from augtune.config import ConfigError
        from augtune.plots import PlotError, figure, load_run

        with self._local() as folder:
            if kind not in ("search", "schedule"):
                runs = self._choose(folder, entrant, None)[0].runs
                if not runs:
                    raise PlotError(f"{self.path}: in cloud storage, its runs' checkpoints stay there; "
                                    "copy the experiment here to draw its trained networks' figures")
                return figure(kind, [run._run() for run in runs], which, path)
            runs = [load_run(p) for p in self._paths(folder, "search", find_records)]
            if entrant is None and is_compare(folder):
                try:
                    entrant = self._choose(folder, None, None)[0].entrant
                except ConfigError:  # no repeat run has finished: every entrant's
                    pass
            if entrant is not None:
                runs = [r for r in runs if _entrant(r.record) == entrant]
            if not runs:
                raise PlotError(f"{self.path}: no search trial of {entrant}")
            return figure(kind, runs, which, path)

    def _choose(self, folder: Path, entrant: Optional[str], metric: Optional[str]):
        """(the `Best` of the experiment in `folder`, the verdict of `metric` that chose it; None for a
        search)."""
        from augtune.analysis import find_records
        from augtune.config import ConfigError
        from augtune.records import is_compare, is_uri, mode_of, read_record

        goal, mode = self._goal(folder)
        metric = metric or goal
        if metric != goal:
            mode = mode_of(metric)
        repeat = [(p, r) for p in self._paths(folder, "repeat", find_records)
                  if (r := _read(p, read_record)) is not None]
        search = [(p, r) for p in self._paths(folder, "search", find_records)
                  if (r := _read(p, read_record)) is not None]
        if entrant is not None:
            known = sorted({_entrant(r) for _, r in repeat + search})
            if entrant not in known:
                raise ConfigError(f"entrant: {entrant!r} is not one of {', '.join(known) or 'none'}")
        v = None
        if is_compare(folder):
            groups, v = _compare_groups(folder, repeat, metric, entrant)
        else:
            groups = _search_groups(repeat or search, metric)
        groups = {key: runs for key, runs in groups.items() if entrant in (None, _entrant(runs[0][1]))}
        if not groups:
            raise ConfigError(f"{self.path}: no finished run with a value of {metric}"
                              + (f" for {entrant}" if entrant else ""))
        sign = -1.0 if mode == "min" else 1.0
        runs = max(groups.values(), key=lambda runs: sign * _mean(runs, metric))
        keys = {k for _, r in search if _entrant(r) == _entrant(runs[0][1]) for k in r.get("params") or {}}
        return _best(runs, metric, keys, local=not is_uri(self.path)), v

    def _goal(self, folder: Path) -> tuple[str, str]:
        """The metric the experiment searched and its mode (a compare's first metric: maximised, or
        minimised where lower is better)."""
        from augtune.analysis.compare import compare_settings
        from augtune.records import is_compare, mode_of, read_search_file

        if is_compare(folder):
            first = tuple(compare_settings(folder).get("compare", {}).get("metrics") or ("knn_acc",))[0]
            return first, mode_of(first)
        search = read_search_file(folder)["config"]["search"]
        return search["metric"], search["mode"]

    def _repr_markdown_(self) -> str:
        from augtune.analysis import find_records
        from augtune.records import is_compare

        with self._local() as folder:
            compare = is_compare(folder)
            counts = {phase: len(self._paths(folder, phase, find_records)) for phase in ("search", "repeat")}
            try:
                best, v = self._choose(folder, None, None)
            except (ValueError, OSError) as e:  # nothing finished yet, a foreign folder
                best, v, why = None, None, str(e).splitlines()[0]
        kind = "compare" if compare else "search"
        head = (f"**augtune {kind}** `{self.path.rstrip('/').rsplit('/', 1)[-1]}`: {counts['search']} "
                f"search trials, {counts['repeat']} repeat runs")
        if best is None:
            return _markdown([head, f"no answer yet ({why})"])
        if v is None:
            return _markdown([head, f"best: {_score(best)}",
                              ", ".join(f"{k} = {_shown('', x)}" for k, x in best.params.items())[:400]])
        winner = v.winner(best.metric)
        named = ("the verdict names it best" if winner is not None and winner.entrant == best.entrant
                 else "the verdict names no entrant best (`.verdict()` says why)")
        return _markdown([head, f"highest mean: **{best.entrant}**, {_score(best)}; {named}"])

    def _repr_html_(self) -> str:
        return _html(self._repr_markdown_())

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
        """The record files (`find` given) or folders of `phase` (None: both) in the experiment `folder`
        (`records.phase_folders`)."""
        from augtune.config import ConfigError
        from augtune.records import phase_folders

        if phase not in (None, "search", "repeat"):
            raise ConfigError(f"phase: {phase!r} is not search or repeat")
        by_phase = phase_folders(folder)
        folders = by_phase[phase] if phase else by_phase["search"] + by_phase["repeat"]
        if find is None:
            return folders
        files = sorted({f for d in folders for f in find(d)})
        if phase == "search":  # a search's own folder holds its repeat folder too
            files = [f for f in files if not any(r in f.parents for r in by_phase["repeat"])]
        return files

    def _need_compare(self) -> None:
        from augtune.config import ConfigError

        if not self.is_compare:
            raise ConfigError(f"{self.path}: a search, not a compare (its table: .table())")


def _read(path: Path, read) -> Optional[dict]:
    """A record (`read`: `records.read_record`), or None for a file that cannot be read as one."""
    try:
        return read(path)
    except (OSError, ValueError):
        return None


def _entrant(record: dict) -> str:
    return str(record.get("entrant") or record.get("method"))


def _value(record: dict, metric: str) -> Optional[float]:
    """A completed run's final value of `metric` (what the verdict reads), None without a finite one."""
    import math

    value = (record.get("final") or {}).get(metric) if record.get("status") == "completed" else None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _mean(runs: list, metric: str) -> float:
    values = [_value(r, metric) for _, r in runs]
    return sum(values) / len(values)


def _compare_groups(folder: Path, repeat: list, metric: str, entrant: Optional[str] = None):
    """({candidate: its repeat runs with a value}, the verdict of `metric`) of a compare: each entrant's
    candidate that the verdict's row shows (the race's longest); an entrant flagged as not trained is left
    out unless it is the one asked for (`entrant`)."""
    from augtune.analysis.compare import compare_settings, race_of
    from augtune.analysis.race import candidate_of
    from augtune.analysis.verdict import verdict

    c = compare_settings(folder)
    records = [r for _, r in repeat]
    v = verdict(records, (metric,), alpha=float(c.get("compare", {}).get("alpha", 0.05)),
                race=race_of(c, records), margin=c.get("compare", {}).get("margin"))
    shown = {row.candidate for row in v.rows if not row.flag or row.entrant == entrant}
    groups: dict[str, list] = {}
    for path, record in repeat:
        if candidate_of(record) in shown and _value(record, metric) is not None:
            groups.setdefault(candidate_of(record), []).append((path, record))
    return groups, v


def _search_groups(records: list, metric: str) -> dict[str, list]:
    """{configuration: its runs with a value} of a search's repeat runs (the seed aside), or of its trials
    (one run each) when it repeated nothing."""
    import json

    groups: dict[str, list] = {}
    for path, record in records:
        if _value(record, metric) is None:
            continue
        params = {k: v for k, v in (record.get("params") or {}).items() if k != "train.seed"}
        key = json.dumps([_entrant(record), params], sort_keys=True, default=str) \
            if record.get("phase") == "repeat" else str(path)
        groups.setdefault(key, []).append((path, record))
    return groups


def _best(runs: list, metric: str, searched: set, local: bool) -> Best:
    """The `Best` of one configuration's runs ((record path, record), any order); `searched`: the keys its
    entrant's search trials were given (its params are those; all but the seed when none is known)."""
    import statistics

    from augtune.config import from_dict
    from augtune.records import VAL_PREFIX

    runs = sorted(runs, key=lambda t: (t[1]["seed"] if isinstance(t[1].get("seed"), int) else 0, str(t[0])))
    first = runs[0][1]
    values = [_value(r, metric) for _, r in runs]
    on = ((first.get("config") or {}).get("dataset") or {}).get("evaluate_on")
    params = {k: v for k, v in (first.get("params") or {}).items()
              if (k in searched if searched else k != "train.seed")}
    return Best(_entrant(first), metric, statistics.fmean(values),
                statistics.stdev(values) if len(values) > 1 else 0.0, len(values),
                "val" if metric.startswith(VAL_PREFIX) or on == "val" else "test", params,
                {r.get("seed"): x for (_, r), x in zip(runs, values)}, from_dict(first["config"]),
                tuple(Run(p.parent, r) for p, r in runs) if local else ())


def _shown(metric: str, value: Any) -> str:
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if not math.isfinite(value):
        return "–"
    from augtune.records import FRACTION_SUFFIXES

    return f"{100 * value:.2f}" if metric.endswith(FRACTION_SUFFIXES) else f"{value:.4g}"


def _unit(metric: str) -> str:
    from augtune.records import FRACTION_SUFFIXES

    return " %" if metric.endswith(FRACTION_SUFFIXES) else ""


def _score(best: Best) -> str:
    m = best.metric
    return (f"{m} {_shown(m, best.score)} ± {_shown(m, best.std)}{_unit(m)} (n = {best.n}, "
            f"{best.split} split)")


def _scores(record: dict) -> dict:
    """A record's final scores of its `eval.metrics` (`knn`: knn_acc; `kmeans`: kmeans_acc, ...; their
    `val_` twins), not the method's diagnostics."""
    from augtune.records import VAL_PREFIX

    groups = tuple(((record.get("config") or {}).get("eval") or {}).get("metrics") or ())

    def scored(key: str) -> bool:
        name = key.removeprefix(VAL_PREFIX)
        return any(name == g or name.startswith(f"{g}_") for g in groups)

    return {k: v for k, v in (record.get("final") or {}).items() if scored(k)}


def _markdown(lines: list[str]) -> str:
    return "\n\n".join(lines)


def _html(markdown: str) -> str:
    """The few marks `_markdown` writes (**bold**, `code`, paragraphs) as HTML."""
    import html
    import re

    text = html.escape(markdown)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"`(.+?)`", r"<code>\1</code>", text)
    return "".join(f"<p>{line}</p>" for line in text.split("\n\n"))


def load(path: Union[str, Path]) -> Experiment:
    """An experiment already run (a folder or an `s3://` URI)."""
    from augtune.config import ConfigError
    from augtune.records import COMPARE_FILE, SEARCH_FILE
    from augtune.storage import exists

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
    from augtune.trainables.run import check_new_run_folder, check_resume, final_table

    cfg = config_from(cfg)
    out = Path(out) if out is not None else \
        Path("runs") / f"{method_label(cfg)}-{cfg.dataset.name}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    if resume:
        check_resume(out, cfg)
    else:
        check_new_run_folder(out)
    record = train_run(cfg, load_dataset(cfg.dataset), out, resume=resume, log=lambda s: print(s, flush=True),
                       on_completed=end_of_run_figures)
    table = final_table(record)
    if table:  # as `augtune train` ends
        print(table, flush=True)
    return Run(out, record)


def search(cfg: ConfigLike, *, storage: Optional[str] = None, name: Optional[str] = None,
           address: Optional[str] = None, dashboard: bool = False, verbose: bool = False) -> Experiment:
    """Search `cfg.search`'s space on Ray, then repeat its best (`augtune search`); the experiment."""
    return run_plan(make_plan(cfg, storage=storage, name=name, address=address, dashboard=dashboard),
                    verbose=verbose)


def compare(cfg: ConfigLike, *, storage: Optional[str] = None, name: Optional[str] = None,
            address: Optional[str] = None, dashboard: bool = False, verbose: bool = False) -> Experiment:
    """Every method head to head under one budget (`augtune compare`); the experiment (`.verdict()`)."""
    return run_plan(make_plan(cfg, compare=True, storage=storage, name=name, address=address,
                              dashboard=dashboard), verbose=verbose)


def make_plan(cfg: ConfigLike, *, compare: bool = False, storage: Optional[str] = None,
              name: Optional[str] = None, address: Optional[str] = None, dashboard: bool = False):
    """What `search` (`compare=True`: `compare`) would run, every check done, before Ray starts or a file
    is written (`--plan` prints it): a `SearchPlan`, or a `ComparePlan` (which loads the data once and,
    under `compare.time_budget`, times each entrant's epochs to size the compare). `run_plan` runs it."""
    from augtune.config import ConfigError
    from augtune.data import DataError, load_dataset
    from augtune.plots import PLOTS
    from augtune.search.experiment import check_name, check_name_free, data_subject, default_name
    from augtune.search.launch import hold_to_loopback
    from augtune.search.plan import resolve_storage

    hold_to_loopback(address)  # before anything imports Ray
    cfg = config_from(cfg)
    storage = resolve_storage(storage)
    if not compare:
        from augtune.search import plan_config

        label = cfg.search.space if isinstance(cfg.search.space, str) else "search"
        return plan_config(cfg, storage=storage, name=name or default_name(label, data_subject(cfg), storage),
                           address=address, dashboard=dashboard, figure_kinds=PLOTS)
    from augtune.search.compare import plan_compare

    try:
        data = load_dataset(cfg.dataset)
    except DataError as e:
        raise ConfigError(str(e)) from None
    name = check_name(name) if name else default_name("compare", data_subject(cfg), storage)
    check_name_free(f"{storage.rstrip('/')}/{name}")
    return plan_compare(cfg, data.modality, storage=storage, name=name, address=address,
                        dashboard=dashboard, figure_kinds=PLOTS, data=data)


def run_plan(plan, *, verbose: bool = False) -> Experiment:
    """Run what `make_plan` planned, in this process (Ray, the searches, the repeat; one progress line);
    the experiment."""
    from augtune.plots import end_of_run_figures
    from augtune.search import run_search
    from augtune.search.compare import ComparePlan

    budget = time_budget_of(plan) if isinstance(plan, ComparePlan) else None
    run_job(lambda cb: run_search(plan, on_completed=end_of_run_figures, callbacks=cb), plan.experiment,
            plan.plans[0].cfg, verbose, budget=budget)
    return Experiment(plan.experiment)


def time_budget_of(plan) -> Optional[tuple[float, float]]:
    """A new compare's `time_budget` in seconds and when it began (its measuring, on time.monotonic's
    clock), or None."""
    from augtune.config import parse_duration

    if not plan.cfg.compare.time_budget or plan.budget_began is None:
        return None
    return parse_duration(plan.cfg.compare.time_budget), plan.budget_began


def resumable(path: Union[str, Path]) -> Experiment:
    """The experiment at `path` as `resume` takes it, or a ConfigError saying in one line why it cannot be
    resumed there: not an experiment, or one entrant's search of a compare (its searches run together)."""
    from augtune.config import ConfigError
    from augtune.records import is_compare
    from augtune.storage import is_uri

    exp = load(path)
    parent = str(Path(exp.path).parent)
    if not is_uri(exp.path) and is_compare(parent):
        raise ConfigError(f"{exp.path}: an entrant of the compare experiment {parent}, whose searches run "
                          f"together; continue it with: augtune resume {parent}")
    return exp


def resume(path: Union[str, Path], *, address: Optional[str] = None, restart_errored: bool = False,
           verbose: bool = False) -> Experiment:
    """Continue an interrupted search or compare (`augtune resume`); a finished one is returned as it is."""
    from augtune.plots import end_of_run_figures
    from augtune.records import is_compare
    from augtune.search import load_plan, run_search
    from augtune.search.compare import load_compare
    from augtune.search.experiment import is_finished
    from augtune.search.launch import hold_to_loopback

    hold_to_loopback(address)
    exp = resumable(path)
    if is_finished(exp.path) and not restart_errored:
        return exp
    plan = (load_compare if is_compare(exp.path) else load_plan)(exp.path, address=address)
    run_job(lambda cb: run_search(plan, restart_errored=restart_errored, on_completed=end_of_run_figures,
                                  callbacks=cb),
            plan.experiment, plan.plans[0].cfg, verbose)
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
    from augtune.storage import is_uri

    if is_uri(experiment):
        return Path(tempfile.gettempdir()) / f"augtune-{experiment.rstrip('/').rsplit('/', 1)[-1]}.log"
    return Path(experiment) / LOG_FILE
