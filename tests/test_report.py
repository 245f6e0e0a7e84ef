"""The compare report: one self-contained HTML file, checked as a file and in a real headless
browser (Debian's chromium; the browser test skips with the reason where it is not installed, CI
installs it)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from augtune.analysis.compare import answer


def fake_compare(root: Path) -> Path:
    """A compare experiment's folder as augtune writes it: settings, search trials, repeat runs, a
    figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    exp = root / "exp"
    exp.mkdir()
    (exp / "augtune_compare.yaml").write_text(
        yaml.safe_dump(
            {
                "config": {"compare": {"metrics": ["knn_acc"], "alpha": 0.05}},
                "entrants": ["simclr", "simclr+pinda"],
            }
        )
    )
    rng = np.random.default_rng(0)
    for entrant, level in (("simclr", 0.90), ("simclr+pinda", 0.93)):
        for i in range(4):  # search trials
            lr = float(10 ** rng.uniform(-4, -2))
            rec = {"format": "augtune.record/1", "status": "completed", "method": entrant, "entrant": entrant,
                   "seed": 0, "phase": "search",
                   "started": f"2026-01-01T00:0{i}", "params": {"train.lr": lr},
                   "epochs": [{"epoch": e, "loss": 5 - e, "knn_acc": level - 0.1 / e, "epoch_time_s": 1.0}
                              for e in (1, 2, 3)], "final": {"knn_acc": level}}
            folder = exp / entrant / f"trial{i}"
            folder.mkdir(parents=True)
            (folder / "record.json").write_text(json.dumps(rec))
        for seed in (1, 2, 3):  # repeat runs
            folder = exp / "repeat" / f"{entrant}_{seed}"
            (folder / "figures").mkdir(parents=True)
            fig, ax = plt.subplots(figsize=(2, 2))
            ax.plot([0, 1], [0, 1])
            fig.savefig(folder / "figures" / "own.png")
            plt.close(fig)
            value = level + 0.005 * rng.normal()
            rec = {
                "format": "augtune.record/1", "status": "completed",
                "method": entrant,
                "entrant": entrant,
                "seed": seed,
                "phase": "repeat",
                "epochs": [
                    {"epoch": e, "loss": 5 - e, "knn_acc": value - 0.1 / e, "epoch_time_s": 1.0}
                    for e in (1, 2, 3)
                ],
                "final": {"knn_acc": value},
                "figures": ["figures/own.png"],
                "references": {"raw": {"knn_acc": 0.97}, "random-init": {"knn_acc": 0.6}},
            }
            (folder / "record.json").write_text(json.dumps(rec))
    return exp


def fake_race(root: Path) -> Path:
    """A compare whose repeat was a race: settings with `compare.race`, every entrant's two
    finalists, the records of the runs the race gave them (as the search layer leaves them)."""
    from augtune.analysis import race

    exp = root / "race"
    exp.mkdir()
    compare = {"metrics": ["knn_acc", "kmeans_nmi"], "alpha": 0.05,
               "race": {"enabled": True, "min_seeds": 3, "max_seeds": 10, "finalists": 2}}
    (exp / "augtune_compare.yaml").write_text(yaml.safe_dump(
        {"config": {"compare": compare, "train": {"seed": 0}},
         "entrants": ["simclr", "simclr+pinda", "simclr+cocor", "simclr+nrcc"]}))
    means = {"simclr": 0.93, "simclr+pinda": 0.95, "simclr+cocor": 0.94, "simclr+nrcc": 0.85}
    from augtune.config import from_dict

    settings = race.race_settings(from_dict({"compare": compare}).compare, 0)
    rng = np.random.default_rng(1)
    shared = 0.005 * rng.standard_normal(10)
    values = {f"{e}#{r}": mu - 0.004 * (r - 1) + shared + 0.008 * rng.standard_normal(10)
              for e, mu in means.items() for r in (1, 2)}
    state = race.start(settings, [(c, c.split("#")[0], {"train.lr": 0.01 * int(c[-1])})
                                  for c in values])
    while not state.stopped:
        got: dict = {}
        for cid, seed in race.due(state):
            got.setdefault(cid, {})[seed] = float(values[cid][seed - 1])
        state = race.advance(state, got)
    for cid, by_seed in state.results.items():
        entrant = cid.split("#")[0]
        for seed, value in by_seed.items():
            folder = exp / "repeat" / f"{cid.replace('#', '_')}_{seed}"
            folder.mkdir(parents=True)
            noise = 0.01 * rng.standard_normal(3)
            rec = {"format": "augtune.record/1", "status": "completed", "method": entrant, "entrant": entrant,
                   "candidate": cid,
                   "seed": seed, "phase": "repeat", "params": {"train.lr": 0.01 * int(cid[-1])},
                   "epochs": [{"epoch": e, "loss": 5 - e, "knn_acc": value - 0.1 / e,
                               "epoch_time_s": 1.0} for e in (1, 2, 3)],
                   # the race decided on the validation split; the verdict reports the test split
                   "final": {"val_knn_acc": value, "knn_acc": value, "kmeans_nmi": value - 0.3 + noise[0]},
                   "references": {"raw": {"knn_acc": 0.90, "kmeans_nmi": 0.5},
                                  "random-init": {"knn_acc": 0.80 + noise[1],
                                                  "kmeans_nmi": 0.55 + noise[2]}}}
            (folder / "record.json").write_text(json.dumps(rec))
    return exp


def test_the_report_of_a_race_shows_every_seed_and_the_rounds(tmp_path):
    exp = fake_race(tmp_path)
    result = answer(exp)
    assert result.race is not None and result.race.stopped is not None
    page = result.report.read_text()
    assert "<h2>Every seed</h2>" in page and "<h2>The race</h2>" in page
    assert "round 1 (n = 3)" in page and "stopped: " in page
    assert "simclr+cocor reads labels while training" in page  # semi-supervised, said so
    assert "a race on the validation split (val_knn_acc, not a column)" in page
    assert "The race (knn_acc on the validation split" in page
    md = result.verdict.render("md")
    assert "| *random-init* | 79." in md and "(10) |" in md  # the reference's ± and n


def test_the_report_is_one_self_contained_file_with_the_table_and_figures(tmp_path):
    exp = fake_compare(tmp_path)
    result = answer(exp)
    page = result.report.read_text()
    assert result.report == exp / "report.html"
    assert "<table>" in page and "simclr+pinda" in page and "nothing beats the raw input (97.00)" in page
    assert page.count("<img") >= 5  # seeds, cost, curves, history, and the methods' own figures
    srcs = [chunk.split('"')[0] for chunk in page.split('src="')[1:]]
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)  # nothing outside the file
    assert "http" not in page.replace("https://", "") or "http://" not in page
    assert "train.lr" in page  # the importances


def test_the_report_in_a_real_headless_browser(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium); CI installs it")
    exp = fake_compare(tmp_path)
    report = answer(exp).report
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", report.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<table>" in dom.stdout and "<img" in dom.stdout and "simclr+pinda" in dom.stdout
    shot = tmp_path / "shot.png"
    run = subprocess.run(
        [
            chromium,
            *flags,
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={shot}",
            "--window-size=1280,2200",
            report.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.is_file(), run.stderr[-2000:]
    assert "Uncaught" not in run.stderr and "CONSOLE" not in run.stderr  # no console errors
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.std() > 0.05  # not a blank page
    assert len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 50  # text and plots


def test_the_report_draws_each_pbt_entrants_schedules_and_nothing_without_one():
    from augtune.analysis.report import _schedule_figures

    def trial(entrant, scheduler, lrs, lineage=()):
        return {"entrant": entrant, "trial": f"t_{entrant}_{lrs[0]}", "lineage": list(lineage),
                "config": {"search": {"scheduler": scheduler}},
                "epochs": [{"epoch": i, "knobs": {"train.lr": lr}} for i, lr in enumerate(lrs, 1)]}

    population = [trial("simclr+pinda@pbt", "pbt", [0.1, 0.1, 0.2]),
                  trial("simclr+pinda@pbt", "pbt", [0.3] * 3)]
    html = _schedule_figures([*population, trial("simclr+pinda", "asha", [0.1])])
    assert html[0] == "<h2>Schedules</h2>" and len(html) == 2 and "data:image/png;base64," in html[1]
    assert "simclr+pinda@pbt: each trial" in html[1]
    assert _schedule_figures([trial("simclr+pinda", "asha", [0.1])]) == []
    no_knobs = [{**population[0], "epochs": [{"epoch": 1}]}]
    assert "recorded knob values per epoch" in _schedule_figures(no_knobs)[1]  # said, not a traceback
