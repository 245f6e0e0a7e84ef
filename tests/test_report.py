"""The compare report: one self-contained HTML file, checked as a file and in a real headless browser
(Debian's chromium; the browser test skips with the reason where it is not installed, CI installs it)."""
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
    """A compare experiment's folder as augtune writes it: settings, search trials, repeat runs, a figure."""
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
            rec = {"status": "completed", "method": entrant, "entrant": entrant, "seed": 0, "phase": "search",
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
                "status": "completed",
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


def test_the_report_is_one_self_contained_file_with_the_table_and_figures(tmp_path):
    exp = fake_compare(tmp_path)
    result = answer(exp)
    page = result.report.read_text()
    assert result.report == exp / "report.html"
    assert "<table>" in page and "simclr+pinda" in page and "nothing beats the raw input (97.00)" in page
    assert page.count("<img") >= 4  # cost, curves, history, and the methods' own figures
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
