"""benchmarks/gpu_check.py: its guard (a failing part is recorded and the rest run; the time guard
skips and stops parts), its table, and the whole check on the CPU with --tiny, so that the script a
GPU's first run depends on cannot rot."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FASHION = Path("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz")  # the showcase's data


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location(
        "gpu_check", ROOT / "benchmarks" / "gpu_check.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_check(gpu_check, tmp_path, budget_s=60.0):
    args = argparse.Namespace(
        device="cpu", tiny=True, budget_s=budget_s, out=str(tmp_path / "c.json")
    )
    return gpu_check.Check(args)


def test_a_failing_part_is_recorded_and_the_next_one_runs(gpu_check, tmp_path):
    check = make_check(gpu_check, tmp_path)

    def broken(check):
        raise ValueError("no such kernel\nsecond line")

    check.run("views", broken, need_s=1)
    check.run("env", lambda check: {"torch": "x"}, need_s=1)
    saved = json.loads((tmp_path / "c.json").read_text())  # written after every part
    assert saved["parts"]["views"]["status"] == "error"
    assert saved["parts"]["views"]["error"] == "ValueError: no such kernel"
    env = saved["parts"]["env"]
    # the time includes the garbage collection after the part: seconds in a long session, not a number to pin
    assert env.pop("seconds") >= 0
    assert env == {"status": "ok", "torch": "x"}


def test_the_time_guard_skips_a_part_without_time_and_stops_one_that_runs_over(
    gpu_check, tmp_path
):
    check = make_check(gpu_check, tmp_path, budget_s=1.0)

    def slow(check):
        time.sleep(5)
        return {}

    check.run("share", slow, need_s=0.5)  # starts, and the alarm at the budget's end stops it
    check.run("compare", lambda check: {}, need_s=30)
    parts = check.result["parts"]
    assert parts["share"]["status"] == "error" and "time guard" in parts["share"]["error"]
    assert parts["share"]["seconds"] < 4
    assert parts["compare"]["status"] == "skipped" and "time guard" in parts["compare"]["reason"]


def test_a_part_that_does_not_apply_is_skipped_with_its_reason(gpu_check, tmp_path):
    check = make_check(gpu_check, tmp_path)

    def one_gpu(check):
        raise gpu_check.Skip("1 GPU(s): NCCL DDP needs two")

    check.run("ddp", one_gpu, need_s=1)
    assert check.result["parts"]["ddp"]["reason"] == "1 GPU(s): NCCL DDP needs two"
    text = gpu_check.table(check.result)  # the table of a run with most parts missing
    assert "NCCL DDP needs two" in text and "missing" in text


@pytest.mark.slow
@pytest.mark.ray
def test_the_tiny_check_runs_every_part_on_the_cpu(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--device",
            "cpu",
            "--tiny",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["schema"] == 1 and result["device"] == "cpu" and result["tiny"] is True
    parts = result["parts"]
    failed = {
        k: v.get("error") or v.get("reason") for k, v in parts.items() if v["status"] != "ok"
    }
    assert list(parts) == ["env", "views", "resnet18", "profile", "methods", "share", "compare", "ddp",
                           "showcase"]
    if not FASHION.is_file():  # the showcase's data (CI installs it): skipped with the reason
        assert "no Fashion-MNIST IDX files" in failed.pop("showcase")
    assert not failed, failed
    variants = parts["resnet18"]["variants"]
    assert list(variants) == ["fp32", "bf16", "bf16_cl", "bf16_cl_compile", "bf16_cl_graphs"]
    assert all(v["samples_per_s"] > 0 and v["epoch_s"] > 0 for v in variants.values()), variants
    runs = parts["methods"]["runs"]
    assert list(runs) == ["simclr", "pinda", "cocor", "nrcc", "diffaug_B", "diffaug_A"]
    assert runs["simclr"]["x_base"] == 1 and all(r["x_base"] > 0 for r in runs.values()), runs
    assert "refresh_s_per_1000" in runs["diffaug_A"]
    assert set(parts["views"]["share"]) == set(variants)
    prof = parts["profile"]  # the host's side of it on a CPU: the GPU's fields are empty
    assert prof["step_ms"] > 0 and prof["gpu_busy_fraction"] is None and prof["top_gpu"] == []
    assert prof["views_host_ms"] > 0 and prof["top_host"][0]["ms_per_step"] > 0
    assert parts["share"]["ratio"] > 0 and parts["share"]["how"] == "processes"
    assert parts["compare"]["rc"] == 0 and parts["ddp"]["backend"] == "gloo"
    if FASHION.is_file():  # every entrant's verdict line, under a budget fitted to what was left
        show = parts["showcase"]
        assert show["rc"] == 0 and 0 < show["budget_s"] < result["budget_s"]
        assert any("simclr+pinda" in line for line in show["tail"]), show["tail"]
    for name in parts:
        assert name in proc.stdout  # the table
