"""The search's console line, without Ray: counts, best, time left; plain lines in a file, one rewritten
line on a terminal."""
from __future__ import annotations

import io
import os
import shutil
from types import SimpleNamespace

from augtune.search.progress import Progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def trial(status: str, lr: float = 0.01) -> SimpleNamespace:
    return SimpleNamespace(status=status, config={"train.lr": lr})


def test_in_a_file_plain_lines_with_counts_best_and_time_left_each_said_once():
    clock, out = Clock(), io.StringIO()
    p = Progress("knn_acc", "max", total=4, stream=out, every_s=30, clock=clock)
    trials = [trial("RUNNING", 0.01), trial("RUNNING", 0.1)]
    p.on_trial_result(0, trials, trials[0], {"knn_acc": 0.5})
    clock.t = 20
    p.on_trial_result(0, trials, trials[1], {"knn_acc": 0.7})  # within 30 s of the last line: not printed
    clock.t = 40
    trials[0].status = "TERMINATED"
    p.on_trial_complete(0, trials, trials[0])
    trials[1].status = "ERROR"
    clock.t = 60
    p.on_trial_error(0, trials, trials[1])
    p.on_experiment_end(trials)  # the same line as the last: not written twice
    lines = out.getvalue().splitlines()
    assert lines == [
        "search: 0/4 done  2 running  2 pending  best knn_acc 0.5000 (train.lr=0.01)  0s",
        "search: 1/4 done  1 running  2 pending  best knn_acc 0.7000 (train.lr=0.1)  40s  ~2m00s left",
        "search: 2/4 done  0 running  2 pending  1 failed  best knn_acc 0.7000 (train.lr=0.1)  1m00s"
        "  ~1m00s left",
    ]
    assert "\x1b" not in out.getvalue()


def test_min_mode_keeps_the_lowest_and_a_new_experiment_starts_afresh():
    clock, out = Clock(), io.StringIO()
    p = Progress("loss", "min", total=None, stream=out, clock=clock)
    trials = [trial("RUNNING")]
    for value in (3.0, 2.0, 2.5):
        p.on_trial_result(0, trials, trials[0], {"loss": value})
    assert p.best[0] == 2.0
    p.setup(total_num_samples=6)  # the next entrant of a compare, or the repeat phase
    assert p.best is None and p.total == 6 and p.ended == 0


def test_on_a_terminal_one_line_rewritten_in_place_and_cut_to_its_width(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    # a real terminal_size: pytest's own reporter asks for the size too, before the patch is undone
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((40, 24)))
    out = Tty()
    p = Progress("knn_acc", "max", total=4, stream=out, clock=Clock())
    trials = [trial("RUNNING")]
    p.on_trial_result(0, trials, trials[0], {"knn_acc": 0.5})
    p.on_trial_result(0, trials, trials[0], {"knn_acc": 0.6})
    shown = out.getvalue().split("\r\x1b[K")[1:]
    assert len(shown) == 2 and all(len(s) <= 39 and "\n" not in s for s in shown)


def test_ray_messages_go_to_the_log_file_and_with_verbose_to_the_console_too(tmp_path):
    import logging
    import warnings

    from augtune.search.progress import quiet_ray

    seen: list[str] = []

    class Console(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    console = Console()
    logging.getLogger().addHandler(console)
    try:
        quiet_ray(tmp_path / "quiet.log")
        logging.getLogger("ray.tune").warning("snapshotting was triggered")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a library's warning")
        assert seen == []  # nothing on the console
        logged = (tmp_path / "quiet.log").read_text()
        assert "snapshotting was triggered" in logged and "a library's warning" in logged
        quiet_ray(tmp_path / "loud.log", verbose=True)  # augtune -v
        logging.getLogger("ray.tune").warning("shown")
        assert seen == ["shown"] and "shown" in (tmp_path / "loud.log").read_text()
    finally:
        logging.getLogger().removeHandler(console)
        logging.captureWarnings(False)
        for name in ("ray", "ray.tune", "ray.train", "ray.data", "optuna", "py.warnings"):
            logger = logging.getLogger(name)
            logger.propagate = True
            for h in [h for h in logger.handlers if isinstance(h, logging.FileHandler)]:
                logger.removeHandler(h)
                h.close()


def test_a_resumed_search_estimates_the_time_left_from_what_ended_since_it_resumed():
    clock, out = Clock(), io.StringIO()
    p = Progress("knn_acc", "max", total=4, stream=out, every_s=30, clock=clock)
    trials = [trial("TERMINATED"), trial("TERMINATED"), trial("RUNNING"), trial("PENDING")]  # 2 done before
    clock.t = 60
    assert "left" not in p.line(trials)  # nothing ended in this session yet: no rate to go by
    trials[2].status = "TERMINATED"
    p.on_trial_complete(0, trials, trials[2])
    assert p.line(trials) == "search: 3/4 done  0 running  1 pending  1m00s  ~1m00s left"  # one in 60 s
