"""Where a search's CPU goes: training, evaluation, references, checkpoints, trial set-up, process start-up,
and Ray with the driver; before and after, side by side in one invocation.

Run:  python benchmarks/search_overhead.py [--command search --config examples/search_digits.yaml]
                                           [--set key=value ...] [--before 899dad4]
                                           [--out /tmp/augtune-overhead]

Each variant runs the same augtune command on the same config in a fresh process tree:
- the current checkout ("after");
- with `--before REV`, that commit checked out in a temporary git worktree ("before"), run from there.

The whole command's CPU (every process it starts: the driver, Ray's daemons, every trial) is read from a
cpuacct cgroup made for it (Linux, root; elsewhere the CPU of reaped children, which misses Ray's daemons
and says so). The parts come from the runs' records: `cpu_seconds` (set-up, process start, references,
training, evaluation, checkpoints, end-of-run figures: the CPU of the trial processes; `seconds`, wall
time, in records that predate it) and, for records older still, the epochs' `epoch_time_s`. What the
records do not account for is Ray's daemons, the driver, Tune's bookkeeping in the trial processes and,
for old records, everything but training. The experiment's disk use (every file under it, checkpoints and
Tune's logs included) is counted after the command ends.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = [
    ("train", "training epochs"),
    ("eval", "evaluation"),
    ("references", "references (raw, random-init)"),
    ("checkpoint", "checkpoints"),
    ("figures", "end-of-run figures"),
    ("setup", "trial set-up (data, model)"),
    ("start", "process start-up (imports, Ray worker)"),
]
CGROUP = Path("/sys/fs/cgroup/cpuacct")


class CpuAccount:
    """The CPU seconds of a command and everything it starts (a cpuacct cgroup when one can be made)."""

    def __init__(self, name: str):
        self.group = CGROUP / f"augtune-bench-{os.getpid()}-{name}"
        try:
            self.group.mkdir()
        except OSError:
            self.group = None
        self.children_before = resource.getrusage(resource.RUSAGE_CHILDREN)

    def enter(self) -> None:
        """In the child, before exec: join the cgroup."""
        if self.group is not None:
            (self.group / "cgroup.procs").write_text(str(os.getpid()))

    def seconds(self) -> tuple[float, str]:
        if self.group is not None:
            return int((self.group / "cpuacct.usage").read_text()) / 1e9, "cgroup"
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        used = (after.ru_utime + after.ru_stime) - (
            self.children_before.ru_utime + self.children_before.ru_stime
        )
        return used, "reaped children only"

    def close(self) -> None:
        if self.group is None:
            return
        for _ in range(100):  # Ray's last processes leave the group as they exit
            try:
                self.group.rmdir()
                return
            except OSError:
                time.sleep(0.2)


def run_variant(name: str, checkout: Path, command: str, config: Path, out: Path,
                overrides: list[str] = ()) -> dict:
    """Run `augtune COMMAND CONFIG [--set ...]` from `checkout`; its wall time, CPU, records and disk use."""
    account = CpuAccount(name)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    # a storage folder of its own: the reference rows cached beside one variant's experiments are not the
    # other's (the cache key holds the installed version, which both variants share)
    cmd = [sys.executable, "-m", "augtune.cli", command, str(config), "--storage", str(out / name), "--name",
           name, *(a for kv in overrides for a in ("--set", kv))]
    start = time.perf_counter()
    res = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, preexec_fn=account.enter)
    wall = time.perf_counter() - start
    cpu, how = account.seconds()
    account.close()
    (out / f"{name}.out").write_text(res.stdout + res.stderr)  # the command's console: its table, verdict
    if res.returncode != 0:
        raise SystemExit(f"{name}: {' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    records = [json.loads(p.read_text()) for p in sorted((out / name / name).rglob("record.json"))
               if "checkpoint_" not in str(p)]
    disk = sum(p.stat().st_size for p in (out / name / name).rglob("*") if p.is_file() and not p.is_symlink())
    return {"name": name, "wall": wall, "cpu": cpu, "how": how, "records": records, "disk_mb": disk / 2**20}


def parts_of(records: list[dict]) -> dict[str, float | None]:
    """Seconds per part summed over every run; a part no record reports is None."""
    out: dict[str, float | None] = {}
    for key, _ in PARTS:  # CPU seconds where the records have them, else wall (equal on an idle machine)
        values = [(r.get("cpu_seconds") or r["seconds"])[key] for r in records
                  if key in (r.get("cpu_seconds") or r.get("seconds") or {})]
        out[key] = sum(values) if values else None
    if out["train"] is None:  # records older than `seconds`: the epochs' own training time
        out["train"] = sum(e.get("epoch_time_s", 0.0) for r in records for e in r.get("epochs", []))
    return out


def describe(v: dict) -> dict:
    records = v["records"]
    parts = parts_of(records)
    accounted = sum(x for x in parts.values() if x is not None)
    processes = {(r.get("host"), r.get("process")) for r in records if r.get("process") is not None}
    rss = [r["max_rss_mb"] for r in records if isinstance(r.get("max_rss_mb"), (int, float))]
    # a run's set-up (data, model: wall s), first in its process or in a reused one (no start-up of its own)
    setup = {"first": [], "reused": []}
    for r in records:
        seconds, cpu = r.get("seconds") or {}, r.get("cpu_seconds") or {}
        if "setup" in seconds and "start" in cpu:
            setup["first" if cpu["start"] > 0 else "reused"].append(seconds["setup"])
    return {**v, "parts": parts, "rest": v["cpu"] - accounted, "trials": len(records),
            "processes": len(processes) or None, "rss": max(rss) if rss else None, "setup": setup}


def table(variants: list[dict]) -> str:
    head = "| part | " + " | ".join(f"{v['name']} CPU s | share" for v in variants) + " |"
    lines = [head, "| --- |" + " ---: | ---: |" * len(variants)]

    def row(label: str, values: list[float | None]) -> None:
        cells = []
        for v, x in zip(variants, values):
            cells += ["–", "–"] if x is None else [f"{x:.1f}", f"{100 * x / v['cpu']:.0f} %"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    for key, label in PARTS:
        row(label, [v["parts"][key] for v in variants])
    row("Ray daemons, driver, Tune in the trials (the rest)", [v["rest"] for v in variants])
    row("**total CPU**", [v["cpu"] for v in variants])
    lines.append("")
    for v in variants:
        train = v["parts"]["train"]
        lines.append(
            f"- {v['name']}: wall {v['wall']:.0f} s, CPU {v['cpu']:.0f} s ({v['how']}); "
            f"{v['trials']} runs in {v['processes'] or '?'} trial processes; training share of the CPU "
            f"{100 * train / v['cpu']:.0f} %; wall / training epochs {v['wall'] / train:.2f}; "
            f"peak RSS of a trial process {v['rss'] or '?'} MiB; experiment on disk {v['disk_mb']:.1f} MiB"
        )
        for kind, values in v.get("setup", {}).items():
            if values:
                median = statistics.median(values)
                lines.append(f"  - set-up of a run {kind} in its process: median {median:.2f} s, "
                             f"max {max(values):.2f} s ({len(values)} runs)")
    return "\n".join(lines)


def worktree(rev: str, where: Path) -> Path:
    path = where / f"checkout-{rev}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True,
                   capture_output=True)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--command", choices=["search", "compare"], default="search")
    p.add_argument("--config", type=Path, default=ROOT / "examples" / "search_digits.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override passed to the command (repeatable)")
    p.add_argument("--before", help="a git revision to run beside the current checkout (e.g. 899dad4)")
    p.add_argument("--out", type=Path, help="where the experiments go (default: a temporary folder)")
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="augtune-overhead-"))
    config = args.config.resolve()
    variants, trees = [], []
    try:
        if args.before:
            trees.append(worktree(args.before, out))
            variants.append(
                describe(run_variant(f"before-{args.before}", trees[-1], args.command, config, out,
                                     args.overrides))
            )
        variants.append(describe(run_variant("after", ROOT, args.command, config, out, args.overrides)))
    finally:
        for tree in trees:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True
            )
    sets = "".join(f" --set {kv}" for kv in args.overrides)
    print(f"augtune {args.command} {args.config}{sets} ({os.cpu_count()} CPUs)\n")
    print(table(variants))
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
