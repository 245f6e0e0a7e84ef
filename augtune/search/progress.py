"""A console a person can read: one progress view of a search, and Ray's own chatter in a log file.

`Progress` is a Tune callback: trials done / running / pending / failed, the best value so far with
its configuration, the elapsed time and an estimate of what is left, of the phase under way (a search's
trials, then the repeat runs of its best, in one Tune run: `augtune.search.repeat`). On a terminal it
rewrites one line in place; otherwise (a file, CI) it prints a plain line at most every `every_s`
seconds and when a trial ends. No colour codes anywhere. `quiet_ray(log_file)` sends the `ray` loggers and
Python warnings to `<experiment>/augtune.log` (`augtune -v` keeps them on the console).
"""
from __future__ import annotations

import logging
import shutil
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional, TextIO

from ray.tune import Callback

from augtune.config import format_value
from augtune.records import ENTRANT, REPEAT

REPEAT_TITLE = "repeat"


class Progress(Callback):
    """The progress line of `total` trials optimising `metric` (`mode`). `stream`: sys.stdout when the line
    is made (not when imported); `tty`: redraw one line ("\\r"), by default when the stream is a terminal;
    `budget`: a compare's `time_budget` (seconds, when it began on `clock`), whose time left it shows."""

    def __init__(self, metric: str, mode: str, total: Optional[int], title: str = "search",
                 stream: Optional[TextIO] = None, tty: Optional[bool] = None, every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, budget: Optional[tuple[float, float]] = None):
        self.metric, self.mode, self.total, self.title = metric, mode, total, title
        self.budget = budget
        self.stream, self.every_s, self.clock = stream or sys.stdout, every_s, clock
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.printed = ""  # the last line written to a file: the same line is not written twice
        self.stepped: Optional[list] = None  # the trials as Tune's last step left them
        self._restart()
        # the run's search algorithm when it repeats the best (`repeat.SearchThenRepeat`): how many repeat
        # runs it chose; set by `tune_run`'s `start` for every run, new or resumed; never pickled with Tune's
        self.phases = None
        self.repeating = False  # the repeat phase is under way: its trials are the ones counted

    def __getstate__(self) -> dict:
        # Tune pickles the callback with its run; the console is the process's own (a notebook's is an
        # ipykernel stream that holds its session's signing key and does not pickle)
        return {**self.__dict__, "phases": None, "stream": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.stream is None:
            self.stream = sys.stdout

    # -- Tune's hooks ---------------------------------------------------------------------------------

    def _restart(self) -> None:
        """Counts, best and clock start again: a new Tune run, or its repeat phase."""
        self.start, self.ended, self.last_print = self.clock(), 0, -1e9
        self.best: Optional[tuple[float, dict]] = None

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        """A new Tune run (a new or resumed search)."""
        self.total = total_num_samples or self.total
        self._restart()
        self.stepped, self.repeating = None, False

    def on_step_end(self, iteration, trials, **info):
        self.stepped = [SimpleNamespace(status=t.status, config=t.config) for t in trials]

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._follow(trials)
        value = result.get(self.metric)
        if _is_repeat(trial) == self.repeating and isinstance(value, (int, float)) and (
            self.best is None or self._better(value, self.best[0])
        ):
            self.best = (float(value), _shown_config(trial.config))
        self._show(trials, force=False)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._follow(trials)
        self.ended += _is_repeat(trial) == self.repeating
        self._show(trials, force=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        self.on_trial_complete(iteration, trials, trial)

    def _follow(self, trials) -> None:
        """The repeat phase has begun (its first trial exists): the line counts its trials from now on."""
        if not self.repeating and any(_is_repeat(t) for t in trials):
            self.last_print = -1e9
            self._show(trials, force=True)  # the search's last count: every trial done
            if self.tty:
                self.stream.write("\n")
            self.repeating = True
            self._restart()

    def on_experiment_end(self, trials, **info):
        self.last_print = -1e9
        # the final count, whatever was printed last; as the last step left the trials: an interrupted
        # search's clean-up marks its running and pending trials ended, which they are not
        self._show(self.stepped if self.stepped is not None else trials, force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    # -- the line ---------------------------------------------------------------------------------

    def _better(self, a: float, b: float) -> bool:
        return a > b if self.mode == "max" else a < b

    def line(self, trials) -> str:
        trials = [t for t in trials if _is_repeat(t) == self.repeating]  # the phase under way
        counts = {"TERMINATED": 0, "RUNNING": 0, "PENDING": 0, "ERROR": 0, "PAUSED": 0}
        for t in trials:
            counts[t.status] = counts.get(t.status, 0) + 1
        # the runs a resumed experiment's records hold ended: this Tune run does not hold them
        before = (getattr(self.phases, "held", None) or {}).get("repeat" if self.repeating else "search", 0)
        done, failed = counts["TERMINATED"] + before, counts["ERROR"]
        if self.repeating:
            chosen = getattr(self.phases, "runs", None)
            title, total = REPEAT_TITLE, len(chosen) if chosen is not None else len(trials) + before
        else:
            title, total = self.title, self.total or len(trials) + before
        pending = max(counts["PENDING"] + counts["PAUSED"], total - len(trials) - before + counts["PENDING"])
        elapsed = self.clock() - self.start
        parts = [f"{title}: {done + failed}/{total} done", f"{counts['RUNNING']} running",
                 f"{pending} pending"]
        if failed:
            parts.append(f"{failed} failed")
        if self.best is not None:
            parts.append(self._best())
        parts.append(_duration(elapsed))
        finished = done + failed
        # at this session's rate: the trials a resumed search had finished took none of `elapsed`
        if 0 < self.ended and finished < total:
            parts.append(f"~{_duration(elapsed / self.ended * (total - finished))} left")
        if self.budget is not None:
            total_s, began = self.budget
            left = total_s - (self.clock() - began)
            parts.append(f"budget {_duration(total_s)}: " +
                         (f"{_duration(left)} left" if left >= 0 else f"{_duration(-left)} over"))
        return "  ".join(parts)

    def _best(self) -> str:
        """The best value so far and its parameters (with its entrant in a compare's search)."""
        value, config = self.best
        params = ", ".join(f"{k}={format_value(v)}" for k, v in config.items() if k != ENTRANT)
        if ENTRANT in config:  # a compare's search: whose trial it is
            params = f"{config[ENTRANT]}: {params}" if params else str(config[ENTRANT])
        return f"best {self.metric} {value:.4f}" + (f" ({params})" if params else "")

    def _show(self, trials, force: bool) -> None:
        now = self.clock()
        if self.tty:  # one line, rewritten in place; cut to the terminal's width, so that it never wraps
            width = shutil.get_terminal_size((100, 24)).columns - 1
            self.stream.write("\r\033[K" + self.line(trials)[:width])
            self.stream.flush()
            return
        # in a file: every `every_s`, when a trial ends (at most every 10 s), and at the experiment's end
        if (
            force and now - self.last_print >= min(10.0, self.every_s)
        ) or now - self.last_print >= self.every_s:
            line = self.line(trials)
            if line != self.printed:
                self.stream.write(line + "\n")
                self.stream.flush()
                self.printed = line
            self.last_print = now


def _shown_config(config: dict) -> dict:
    """What the line shows of a trial's config: a search trial's parameters, a repeat run's method and seed
    (its whole parameter set is the best search trial's)."""
    if REPEAT not in config:
        return dict(config)
    run = config[REPEAT]
    who = config.get(ENTRANT)  # a compare's entrant, else the method when the search varied it
    if who is None and "method.base" in run:
        who = "+".join(map(str, [run["method.base"], *(run.get("method.augment") or [])]))
    shown = {ENTRANT: who} if who else {}
    if "train.seed" in run:
        shown["train.seed"] = run["train.seed"]
    return shown


def _is_repeat(trial) -> bool:
    return REPEAT in (getattr(trial, "config", None) or {})


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class _LogFile(logging.FileHandler):
    """The experiment's log file. A record that cannot be written (a full disk) is dropped: the search
    says what went wrong in one line of its own, not in a traceback per dropped log record."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def quiet_ray(log_file: Path, verbose: bool = False) -> None:
    """Ray's and Tune's loggers and Python's warnings go to `log_file` (and stay on the console too with
    `verbose`); the console keeps augtune's own lines."""
    import optuna
    import ray  # noqa: F401 - its import sets up its own console handlers, which are replaced here

    optuna.logging.disable_default_handler()  # "A new study created ..." goes to the log file instead
    optuna.logging.enable_propagation()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = _LogFile(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("ray", "ray.tune", "ray.train", "ray.data", "optuna"):
        logger = logging.getLogger(name)
        if not any(
            isinstance(h, logging.FileHandler) and h.baseFilename == str(log_file) for h in logger.handlers
        ):
            logger.addHandler(handler)
        logger.propagate = verbose
        if not verbose:
            for h in list(logger.handlers):
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                    logger.removeHandler(h)
    logging.captureWarnings(True)
    warnings_logger = logging.getLogger("py.warnings")
    warnings_logger.addHandler(handler)
    warnings_logger.propagate = verbose
    if not verbose:
        warnings.filterwarnings("ignore", module="ray")
