"""`search.scheduler: pbt | pb2`: the perturbation rules per domain kind, the refusals at planning, and
PBT's exploit in a trial (in-process, Tune's checkpoint handed over by hand): the copy continues bitwise
as the donor would have, for every augmentation x base, and the record keeps the lineage."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from ray import tune

from augtune.config import ConfigError, from_dict, to_dict
from augtune.methods import AUGMENTATIONS, BASES
from augtune.records import CHECKPOINT_FILE, RECORD_FILE
from augtune.search.pbt import Explore, check_pbt, pbt_scheduler
from augtune.spaces import Space, resolve_space
from conftest import TINY_MLP

# -- the perturbation rules ------------------------------------------------------------------------


def explore(domain, value, p=0.0, seed=0, n=200):
    ex = Explore({"k": domain}, p, seed)
    return [ex({"k": value})["k"] for _ in range(n)]


def test_a_log_domain_is_multiplied_by_1_2_or_0_8_within_its_bounds():
    out = explore(tune.loguniform(1e-4, 1e-1), 1e-2)
    assert set(round(v, 12) for v in out) == {0.012, 0.008}
    assert set(round(v, 12) for v in explore(tune.loguniform(1e-4, 1e-1), 0.1)) == {0.1, 0.08}  # clipped


def test_a_linear_domain_moves_a_tenth_of_its_range_and_leaves_zero():
    out = explore(tune.uniform(0.0, 1.0), 0.0)
    assert set(out) == {0.0, 0.1}  # a multiplicative step never would leave 0
    assert set(round(v, 12) for v in explore(tune.uniform(0.0, 1.0), 0.5)) == {0.4, 0.6}


def test_an_integer_domain_stays_an_integer_in_bounds_and_moves():
    out = explore(tune.randint(1, 4), 1)  # Tune's upper bound is exclusive: 1..3
    assert set(out) == {1, 2} and all(type(v) is int for v in out)
    assert set(explore(tune.randint(1, 4), 3)) == {2, 3}
    assert set(explore(tune.lograndint(1, 100), 10)) == {12, 8}


def test_a_choice_moves_to_a_neighbour_inward_at_an_end_and_resamples_at_its_rate():
    choice = tune.choice(["a", "b", "c", "d"])
    assert set(explore(choice, "b")) == {"a", "c"}
    assert set(explore(choice, "a")) == {"b"}
    assert set(explore({"grid_search": [1, 2, 3]}, 3)) == {2}
    resampled = explore(choice, "a", p=1.0)
    assert set(resampled) == {"a", "b", "c", "d"}
    some = explore(tune.loguniform(1e-4, 1e-1), 1e-2, p=0.5, n=400)
    fresh = [v for v in some if round(v, 12) not in (0.012, 0.008)]
    assert 120 < len(fresh) < 280 and all(1e-4 <= v <= 1e-1 for v in fresh)


def test_exploration_is_seeded_and_touches_only_the_mutated_keys():
    domains = {"train.lr": tune.loguniform(1e-4, 1e-2), "pinda.mu": tune.choice(["zero", "learned"])}
    config = {"train.lr": 1e-3, "pinda.mu": "zero", "pinda.penalty": 1.0}
    a = [Explore(domains, 0.25, 7)(config) for _ in range(1)] + [Explore(domains, 0.25, 7)(config)]
    assert a[0] == a[1] and a[0]["pinda.penalty"] == 1.0


def test_pb2s_values_are_only_rounded_and_clipped():
    ex = Explore({"n": tune.randint(0, 5), "x": tune.uniform(0, 1)}, 0.0, 0, perturb=False)
    assert ex({"n": 2.6, "x": 1.3}) == {"n": 3, "x": 1.0}


# -- planning ---------------------------------------------------------------------------------------

PBT = {
    "dataset": {"name": "digits", "as_vectors": True, "max_train": 128, "max_test": 64},
    "model": TINY_MLP,
    "train": {"epochs": 6, "batch_size": 32},
    "search": {"space": "pinda", "algorithm": "random", "num_samples": 4, "scheduler": "pbt",
               "pbt": {"interval": 2, "mutate": ["pinda.penalty", "train.lr"]}},
}


def planned(**search):
    cfg = from_dict({**PBT, "search": {**PBT["search"], **search}})
    return check_pbt(cfg, resolve_space(cfg.search, "vector"), to_dict(cfg))


@pytest.mark.parametrize("search, message", [
    ({"pbt": {"mutate": ["pinda.mu"]}}, "search.pbt.mutate[0]: pinda.mu is read only at set-up"),
    ({"pbt": {"mutate": ["nrcc.lam"]}}, "search.pbt.mutate[0]: nrcc.lam is not searched by space 'pinda'"),
    ({"algorithm": "optuna"}, "search.algorithm: optuna with scheduler pbt"),
    ({"repeat_best": {"top": 1}}, "search.repeat_best.top: a pbt trial's values are a schedule"),
    ({"num_samples": 1}, "search.num_samples: pbt needs a population of at least 2"),
    ({"pbt": {"interval": 6, "mutate": ["train.lr"]}}, "search.pbt.interval: 6 epochs is not below"),
    ({"scheduler": "pb2", "pbt": {"mutate": ["train.temperature", "pinda.noise"]}},
     "search.pbt.mutate[1]: pinda.noise is read only at set-up"),
])
def test_a_bad_pbt_search_is_refused_before_ray_in_one_line_naming_the_key(search, message):
    with pytest.raises(ConfigError) as e:
        planned(**search)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_pb2_refuses_a_choice_and_pbt_defaults_to_every_searched_knob():
    inline = {"train.lr": "loguniform(1e-4, 1e-2)", "nrcc.steps": "choice([1, 2])", "method.base": "byol",
              "method.augment": "nrcc", "model.width": "choice([4, 8])"}
    with pytest.raises(ConfigError, match="pb2 chooses numbers within bounds; nrcc.steps is choice"):
        planned(space=inline, scheduler="pb2", pbt={"mutate": ["nrcc.steps"]})
    cfg = planned(space=inline, pbt={"interval": 2})
    assert cfg.search.pbt.mutate == ("train.lr", "nrcc.steps")  # model.width is set-up only
    assert planned().search.pbt.mutate == ("pinda.penalty", "train.lr")


def test_the_plan_checkpoints_and_evaluates_where_pbt_perturbs(tmp_path):
    from augtune.search.plan import describe, plan_config, rung_epochs

    cfg = from_dict(PBT)
    plan = plan_config(cfg, storage=str(tmp_path), name="pbt", check_name_free=False)
    assert rung_epochs(plan.cfg) == (2, 4)
    assert plan.base["train"]["checkpoint_every"] == 2 and plan.base["eval"]["at"] == [2, 4]
    assert plan.base["search"]["pbt"]["mutate"] == ["pinda.penalty", "train.lr"]
    assert any("PBT every 2 epoch(s)" in line for line in describe(plan))
    sched = pbt_scheduler(plan.cfg, resolve_space(plan.cfg.search, "vector"))
    assert type(sched).__name__ == "PopulationBasedTraining"
    pb2 = from_dict({**PBT, "search": {**PBT["search"], "scheduler": "pb2"}})
    pb2 = check_pbt(pb2, resolve_space(pb2.search, "vector"), to_dict(pb2))
    assert type(pbt_scheduler(pb2, resolve_space(pb2.search, "vector"))).__name__ == "PB2"


def test_a_define_by_run_space_is_refused():
    cfg = from_dict(PBT)
    space = Space(name="dbr", define_by_run=lambda trial: None)
    with pytest.raises(ConfigError, match="search.scheduler: pbt perturbs a space of Tune domains"):
        check_pbt(cfg, space, to_dict(cfg))


# -- the exploit in a trial ------------------------------------------------------------------------


class _Checkpoint:
    def __init__(self, folder: Path):
        self.folder = folder

    def as_directory(self):
        import contextlib

        return contextlib.nullcontext(str(self.folder))


class Trial:
    """One trial's run_loop with Tune's checkpoints kept by hand: {epoch: folder} of what it reported."""

    def __init__(self, root: Path, name: str):
        self.root, self.name = root, name
        self.checkpoints: dict[int, Path] = {}
        self.reported: list[int] = []

    def run(self, cfg, start: "Trial | None" = None, at: int | None = None) -> dict:
        from augtune.trainables.ray_trainable import TrialFolder, run_loop

        store = Path(tempfile.mkdtemp(dir=self.root))

        def from_directory(d):
            keep = store / f"{len(list(store.iterdir()))}"
            shutil.copytree(d, keep)
            return _Checkpoint(keep)

        def report(metrics, checkpoint=None):
            self.reported.append(metrics["epoch"])
            if checkpoint is not None:
                self.checkpoints[metrics["epoch"]] = checkpoint.folder

        folder = TrialFolder(str(self.root / "exp"), name=self.name)
        ckpt = None if start is None else _Checkpoint(start.checkpoints[at])
        run_loop(cfg, rank=0, world_size=1, get_checkpoint=lambda: ckpt, report=report,
                 Checkpoint=type("C", (), {"from_directory": staticmethod(from_directory)}), folder=folder,
                 about={"trial": self.name, "params": {}})
        return json.loads((folder.local / RECORD_FILE).read_text())


@pytest.fixture
def on_a_node(monkeypatch):
    import ray

    class Context:
        @staticmethod
        def get_node_id():
            return "node-a"

    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context)


def trial_cfg(base: str, augment: str, epochs: int = 3, **changes):
    from test_contract import contract_cfg

    data = to_dict(contract_cfg(base, augment))
    data["train"].update(epochs=epochs, checkpoint_every=1)
    data["search"].update(scheduler="pbt", algorithm="random", pbt={"interval": 1, "mutate": ["train.lr"]})
    data["train"]["track"] = ["train.lr"]  # what the plan writes for a PBT trial (`trial_base`)
    for key, value in changes.items():
        section, name = key.split("__")
        data[section][name] = value
    return from_dict(data)


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("augment", sorted(AUGMENTATIONS))
def test_an_exploit_without_perturbation_continues_bitwise_as_the_donor(tmp_path, on_a_node, base, augment):
    """Trial B restores trial A's checkpoint after epoch 1 into a fresh Trainer (PBT's exploit, no new
    values): its epochs 2-3 are A's, bit for bit (losses, diagnostics, final metrics, every weight)."""
    cfg = trial_cfg(base, augment)
    a, b = Trial(tmp_path, "A"), Trial(tmp_path, "B")
    donor = a.run(cfg)
    torch.manual_seed(12345)  # the process's RNG moved on: the checkpoint must restore it
    copy = b.run(cfg, start=a, at=1)
    assert b.reported == [2, 3]
    strip = ("epoch_time_s", "samples_per_s")
    assert [{k: v for k, v in e.items() if k not in strip} for e in copy["epochs"]] == \
        [{k: v for k, v in e.items() if k not in strip} for e in donor["epochs"]]
    assert copy["final"] == donor["final"] and copy["status"] == "completed"
    wa = torch.load(a.checkpoints[3] / CHECKPOINT_FILE, weights_only=True)
    wb = torch.load(b.checkpoints[3] / CHECKPOINT_FILE, weights_only=True)
    for part in ("method", "optimizers"):
        flat_a, flat_b = _tensors(wa[part]), _tensors(wb[part])
        assert flat_a.keys() == flat_b.keys()
        assert all(torch.equal(flat_a[k], flat_b[k]) for k in flat_a), part
    assert copy["lineage"] == [{"epoch": 1, "trial": "B", "from": "A"}] and copy["exploits"] == 1
    assert copy["trial"] == "B" and "lineage" not in donor


def _tensors(tree, prefix=""):
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_tensors(v, f"{prefix}{k}/"))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(_tensors(v, f"{prefix}{i}/"))
    elif isinstance(tree, torch.Tensor):
        out[prefix] = tree
    else:
        out[prefix] = torch.tensor(float(tree)) if isinstance(tree, (int, float)) else torch.tensor(0.0)
    return out


def test_an_exploit_applies_the_new_values_from_the_next_epoch_and_the_record_keeps_the_lineage(
        tmp_path, on_a_node):
    """A scripted sequence: B copies A after epoch 1 with new values, C copies B after 2, B copies C
    after 3. Each record lists per epoch the values in force along its lineage, and who was copied when."""
    keys = ["pinda.penalty", "train.lr"]

    def cfg(penalty, lr):
        c = to_dict(trial_cfg("simclr", "pinda", epochs=4))
        c["search"]["pbt"]["mutate"] = c["train"]["track"] = keys  # the plan tracks what PBT mutates
        c["pinda"]["penalty"], c["train"]["lr"] = penalty, lr
        return from_dict(c)

    a, b, c = Trial(tmp_path, "A"), Trial(tmp_path, "B"), Trial(tmp_path, "C")
    ra = a.run(cfg(1.0, 1e-3))
    rb = b.run(cfg(0.5, 2e-3), start=a, at=1)
    rc = c.run(cfg(0.25, 3e-3), start=b, at=2)
    rb2 = b.run(cfg(2.0, 4e-3), start=c, at=3)

    def knobs(record):
        return [(e["knobs"]["pinda.penalty"], e["knobs"]["train.lr"]) for e in record["epochs"]]

    assert knobs(ra) == [(1.0, 1e-3)] * 4
    assert knobs(rb) == [(1.0, 1e-3), (0.5, 2e-3), (0.5, 2e-3), (0.5, 2e-3)]
    assert knobs(rc) == [(1.0, 1e-3), (0.5, 2e-3), (0.25, 3e-3), (0.25, 3e-3)]
    assert knobs(rb2) == [(1.0, 1e-3), (0.5, 2e-3), (0.25, 3e-3), (2.0, 4e-3)]
    assert rc["lineage"] == [{"epoch": 1, "trial": "B", "from": "A"}, {"epoch": 2, "trial": "C", "from": "B"}]
    assert rb2["lineage"] == [*rc["lineage"], {"epoch": 3, "trial": "B", "from": "C"}]
    assert (rb2["exploits"], rc["exploits"]) == (2, 1)
    assert rb2["config"]["pinda"]["penalty"] == 2.0  # the trial's own (last) values
    # what the donor's run had trained is the copy's: epoch 1's loss is A's
    assert rb2["epochs"][0]["loss"] == ra["epochs"][0]["loss"]
    # the record's config holds the schedule it trained under: runs of other schedules are not pooled with it
    assert rb2["config"]["schedule"] == [
        {"epoch": 1, "set": {"pinda.penalty": 1.0, "train.lr": 1e-3}},
        {"epoch": 2, "set": {"pinda.penalty": 0.5, "train.lr": 2e-3}},
        {"epoch": 3, "set": {"pinda.penalty": 0.25, "train.lr": 3e-3}},
        {"epoch": 4, "set": {"pinda.penalty": 2.0, "train.lr": 4e-3}}]
    assert "schedule" not in ra["config"] or ra["config"]["schedule"] == []

    # a donor that had finished when Tune saved it (async PBT saves the donor's latest checkpoint): the copy
    # is its finished run, completed with its final metrics, nothing left to train
    d = Trial(tmp_path, "D")
    rd = d.run(cfg(3.0, 5e-3), start=a, at=4)
    assert d.reported == [] and rd["status"] == "completed" and rd["final"] == ra["final"]
    assert rd["lineage"] == [{"epoch": 4, "trial": "D", "from": "A"}] and knobs(rd) == knobs(ra)

    # the population's schedules in one figure, from the records alone
    from augtune.plots import PlotError, find_runs, plot

    assert [p.name for p in plot("schedule", find_runs([tmp_path / "exp"]), tmp_path)] == ["schedule.png"]
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / RECORD_FILE).write_text(json.dumps({**ra, "epochs": [{"epoch": 1, "loss": 1.0}]}))
    with pytest.raises(PlotError, match="no run here recorded knob values per epoch"):
        plot("schedule", find_runs([plain]), tmp_path)

    # Tune restarts the copy again before it trained an epoch (paused anew): the same exploit, counted once
    again = b.run(cfg(2.0, 4e-3), start=c, at=3)
    assert again["exploits"] == 2 and again["lineage"] == rb2["lineage"]

    # export --schedule of the trial, trained from scratch: the same values in every epoch, and (one seed,
    # each exploit a bitwise continuation) the very same run
    from augtune import cli
    from augtune.config import load_config
    from augtune.data import load_dataset
    from augtune.trainables import train_run

    out = tmp_path / "replay.yaml"
    assert cli.main(["export", str(tmp_path / "exp"), "--schedule", "--trial", "B", "--out", str(out)]) == 0
    replay_cfg = load_config(out)
    assert replay_cfg.search == from_dict({}).search  # the search that found it is not replayed
    replay = train_run(replay_cfg, load_dataset(replay_cfg.dataset), tmp_path / "replay", log=lambda s: None)
    assert knobs(replay) == knobs(again)
    assert [e["loss"] for e in replay["epochs"]] == [e["loss"] for e in again["epochs"]]
    assert replay["final"]["knn_acc"] == again["final"]["knn_acc"]
    # best by the metric, without --trial: one of the four; a trial named ambiguously is exit 2
    exp = str(tmp_path / "exp")
    assert cli.main(["export", exp, "--schedule", "--out", str(tmp_path / "best.yaml")]) == 0
    assert cli.main(["export", exp, "--schedule", "--trial", "zzz"]) == 2
    assert cli.main(["export", exp, "--trial", "B"]) == 2


# -- a real PBT search -----------------------------------------------------------------------------


def write_pbt_search(path, epochs: int) -> None:
    """A PBT search of 4 PiNDA trials on digits vectors, perturbing every 2 epochs."""
    import yaml

    path.write_text(yaml.safe_dump({
        "dataset": {"name": "digits", "as_vectors": True, "max_train": 256, "max_test": 128},
        "model": TINY_MLP, "pinda": {"generator": "mlp"},
        "train": {"epochs": epochs, "batch_size": 32, "num_threads": 1},
        "eval": {"metrics": ["knn"], "references": False},
        "resources": {"cpus_per_worker": 0.5},
        "search": {"space": "pinda", "algorithm": "random", "num_samples": 4, "scheduler": "pbt",
                   "pbt": {"interval": 2, "mutate": ["pinda.penalty", "train.lr"], "quantile": 0.5}},
    }))


@pytest.mark.ray
@pytest.mark.slow
def test_a_pbt_search_on_ray_copies_trials_records_lineages_and_exports_a_replayable_schedule(tmp_path,
                                                                                               shared_ray):
    """4 trials of 8 epochs, perturbed every 2 (the bottom half copies the top half): every trial
    completes all its epochs with the values in force listed per epoch; a copy's lineage names trials of
    the search, and its record's schedule gives exactly its epochs' values; status shows the exploits."""
    import subprocess
    import sys


    write_pbt_search(tmp_path / "c.yaml", epochs=8)
    cli = [sys.executable, "-m", "augtune.cli"]
    run = subprocess.run([*cli, "search", "c.yaml", "--storage", "res", "--name", "exp", "--address",
                          shared_ray], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    exp = tmp_path / "res" / "exp"
    records = {p.parent.name: json.loads(p.read_text()) for p in exp.glob("*/record.json")}
    assert len(records) == 4
    for name, r in records.items():
        assert r["status"] == "completed" and [e["epoch"] for e in r["epochs"]] == list(range(1, 9))
        assert all(set(e["knobs"]) == {"pinda.penalty", "train.lr"} for e in r["epochs"])
        assert r["trial"] == name
        from augtune.records import knob_schedule

        assert (r["config"].get("schedule") or []) == (knob_schedule(r["epochs"]) if r.get("lineage") else [])
    copies = [r for r in records.values() if r.get("lineage")]
    assert copies, "no trial copied another in 3 perturbations of a population of 4"
    for r in copies:
        assert all(step["from"] in records and step["epoch"] % 2 == 0 for step in r["lineage"])
        assert r["exploits"] >= 1
    status = subprocess.run([*cli, "status", str(exp)], capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "exploit" in status.stdout, status.stdout + status.stderr
    out = tmp_path / "best.yaml"
    assert subprocess.run([*cli, "export", str(exp), "--schedule", "--out", str(out)],
                          capture_output=True, text=True, timeout=120).returncode == 0
    from augtune.config import load_config

    assert load_config(out).schedule  # the best trial's values, epoch by epoch


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("stop", ["ctrl-c", "sigkill after an exploit"])
def test_a_stopped_pbt_search_resumes_every_trial_from_its_checkpoint(tmp_path, stop):
    """Ctrl-C once trials have passed a perturbation (exit 130), or SIGKILL of the driver and its Ray once a
    trial has copied another (a PBT exploit): `augtune resume` finishes the same 4 trials, none lost, none
    made anew, each one that had checkpointed continued from it (its record carries on: a second start in
    `nodes`), every epoch listed once with its values, and each exploit continued from the copy (its
    lineage kept until PBT copies into the trial again; undone only when neither the trial nor its donor
    keeps the copy)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import sigkill_driver

    write_pbt_search(tmp_path / "c.yaml", epochs=10)
    cli = [sys.executable, "-m", "augtune.cli"]
    proc = subprocess.Popen([*cli, "search", "c.yaml", "--storage", "res", "--name", "exp"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    exp = tmp_path / "res" / "exp"

    def records() -> dict:
        out = {}
        for p in exp.glob("*/record.json"):
            try:
                out[p.parent.name] = json.loads(p.read_text())
            except ValueError:
                pass  # being replaced
        return out

    def moment() -> bool:
        now = records().values()
        if stop == "ctrl-c":  # two trials past their first perturbation (epoch 2's checkpoint)
            return sum(len(r["epochs"]) >= 3 for r in now) >= 2
        return any(r.get("lineage") for r in now) and any(3 <= len(r["epochs"]) < 9 for r in now)

    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None and not moment():
        time.sleep(0.3)
    assert proc.poll() is None, "the search ended before the moment: " + proc.stderr.read()[-2000:]
    if stop == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 130, out[-2000:] + err[-2000:]
    else:
        sigkill_driver(proc)
    before = records()
    copies = {name: r["lineage"] for name, r in before.items() if r.get("lineage")}
    assert stop == "ctrl-c" or copies
    # what the resume will continue each copier from: the copy, wherever it can be continued
    from augtune.search.resume import read_records

    held = {h.name: h for h in read_records(str(exp), {None: str(exp)}, None, compare=False).search[None]}
    continuable = {name: copy_continuable(exp / name, lineage) for name, lineage in copies.items()}
    for name, lineage in copies.items():
        if continuable[name] and not held[name].ended:
            source = Path(held[name].resume["checkpoint"])
            saved = json.loads((source / RECORD_FILE).read_text())
            copy = lineage[-1]
            donors = source.parent.name == copy["from"] and len(saved["epochs"]) == copy["epoch"]
            assert saved.get("lineage") == lineage or donors, (name, str(source))
    resumed = subprocess.run([*cli, "resume", str(exp)], capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    after = records()
    assert len(after) == 4 and set(after) >= set(before)
    for name, r in after.items():
        assert r["status"] == "completed", (name, r.get("error"), resumed.stdout[-2000:])
        assert [e["epoch"] for e in r["epochs"]] == list(range(1, 11)), name
        assert all("knobs" in e for e in r["epochs"])
        if len(before.get(name, {}).get("epochs", [])) >= 3:  # epoch 2 checkpointed: continued, not redone
            assert len(r["nodes"]) >= 2, name
    for name, lineage in copies.items():  # a copy made before the kill is still in the trial's lineage ...
        now = after[name]["lineage"]
        # ... unless undone (it could not be continued) or PBT has copied another trial into it since: a
        # trial's lineage is that of the run it continues, its donor's
        later = now[-1]["trial"] == name and now[-1]["epoch"] > lineage[-1]["epoch"]
        assert now[:len(lineage)] == lineage or later or not continuable[name], (name, now)


def copy_continuable(trial: Path, lineage: list) -> bool:
    """Whether a trial's last copy (PBT's exploit, `lineage[-1]`) can be continued after its driver was
    killed: from a complete checkpoint of its own made since (one whose record has this lineage), or from
    the donor's checkpoint it copied while the donor still keeps it (on a loaded machine a donor can run on
    past its kept checkpoints while its copy waits for a slot)."""
    def complete(folder: Path) -> dict:
        if not (folder / CHECKPOINT_FILE).is_file():
            return {}
        try:
            return json.loads((folder / RECORD_FILE).read_text())
        except (OSError, ValueError):
            return {}

    copy = lineage[-1]
    own = any(complete(c).get("lineage") == lineage for c in trial.glob("checkpoint_*"))
    donor = [complete(c) for c in (trial.parent / copy["from"]).glob("checkpoint_*")]
    return own or any(len(r.get("epochs") or []) == copy["epoch"] for r in donor)


def test_a_resumed_trial_keeps_its_pbt_clock(tmp_path):
    """Tune's PBT starts every trial's clock at 0, so a trial a resume made again from its checkpoint at
    epoch 4 of interval 4 (a PBT trial checkpoints where it may be perturbed) would be perturbed at epoch 5.
    augtune's scheduler gives it back its place: its last perturbation at 4, the next at 8."""
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import PopulationBasedTraining, TrialScheduler

    from augtune.records import RESUME
    from augtune.search.multiplex import EntrantsScheduler

    class Controller:
        search_alg = None

        def get_trials(self):
            return []

    pbt = PopulationBasedTraining(time_attr="epoch", perturbation_interval=4, require_attrs=False,
                                  hyperparam_mutations={"train.lr": [0.1, 0.2]})
    sched = EntrantsScheduler({None: pbt})
    assert sched.set_search_properties("knn_acc", "min")
    resumed = Trial("fn", config={"train.lr": 0.1, RESUME: {"folder": "t", "epoch": 4}}, stub=True)
    fresh = Trial("fn", config={"train.lr": 0.1}, stub=True)
    for t in (resumed, fresh):
        sched.on_trial_add(Controller(), t)
    state = pbt._trial_state[resumed]
    assert state.last_perturbation_time == 4 and pbt._trial_state[fresh].last_perturbation_time == 0
    for epoch in (5, 6, 7):
        decision = sched.on_trial_result(Controller(), resumed, {"epoch": epoch, "knn_acc": 0.7})
        assert decision == TrialScheduler.CONTINUE
    assert state.last_perturbation_time == 4  # not perturbed at 5: the clock kept its place


@pytest.mark.ray
@pytest.mark.slow
def test_a_compare_enters_a_method_for_a_constant_and_a_schedule_and_replays_the_best_schedule(tmp_path,
                                                                                                 shared_ray):
    """`compare.scheduler: [asha, pbt]`: PiNDA searched by TPE+ASHA and by a PBT population under the same
    trials and epochs; the repeat replays the best PBT trial's schedule from scratch (its values epoch by
    epoch, on each new seed), the verdict says whether the schedule beats the constant, and the report
    draws the population's schedules."""
    import subprocess
    import sys

    import yaml

    from augtune.records import knob_schedule

    (tmp_path / "c.yaml").write_text(yaml.safe_dump({
        "dataset": {"name": "digits", "as_vectors": True, "max_train": 256, "max_test": 128},
        "model": TINY_MLP, "pinda": {"generator": "mlp"},
        "train": {"epochs": 6, "batch_size": 32, "num_threads": 1},
        "eval": {"metrics": ["knn"]},
        "resources": {"cpus_per_worker": 0.5},
        "search": {"pbt": {"interval": 2, "quantile": 0.5}},
        "compare": {"methods": ["pinda"], "scheduler": ["asha", "pbt"], "trials": 4, "seeds": 2},
    }))
    run = subprocess.run([sys.executable, "-m", "augtune.cli", "compare", "c.yaml", "--storage", "res",
                          "--name", "exp", "--address", shared_ray], cwd=tmp_path, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    exp = tmp_path / "res" / "exp"
    population = [json.loads(p.read_text()) for p in (exp / "simclr+pinda@pbt").glob("*/record.json")]
    # PBT perturbs at epochs 2, 4 (and a finished donor's 6): a copy that copied a paused donor again and
    # again (70 restarts of one trial before `EntrantsScheduler.choose_trial_to_run`) is a loop
    assert all((r.get("exploits") or 0) <= 3 and len(r["nodes"]) <= 8 for r in population), [
        (r.get("exploits"), len(r["nodes"])) for r in population]
    constant = [json.loads(p.read_text()) for p in (exp / "simclr+pinda").glob("*/record.json")]
    assert len(population) == len(constant) == 4
    assert all(r["entrant"] == "simclr+pinda@pbt" and r["config"]["search"]["scheduler"] == "pbt"
               and all(e.get("knobs") for e in r["epochs"]) for r in population)
    assert all(r["config"]["search"]["scheduler"] == "asha" for r in constant)
    finished = sorted((r for r in population if r["status"] == "completed"), key=lambda r: r["trial"])
    best = max(finished, key=lambda r: r["epochs"][-1]["knn_acc"])  # ties: the first trial, as Tune's order
    repeats = [json.loads(p.read_text()) for p in (exp / "repeat").glob("*/record.json")]
    replays = [r for r in repeats if r["entrant"] == "simclr+pinda@pbt"]
    assert sorted(r["seed"] for r in replays) == [1, 2] and len(repeats) == 4
    for r in replays:  # the best trial's schedule, from epoch 1, whatever its lineage
        assert r["params"]["schedule"] == knob_schedule(best["epochs"])
        assert [e["knobs"] for e in r["epochs"]] == [e["knobs"] for e in best["epochs"]]
    assert "Schedule against constant: knn_acc: simclr+pinda@pbt's schedule " in run.stdout
    page = (exp / "report.html").read_text()
    assert "<h2>Schedules</h2>" in page and "simclr+pinda@pbt: each trial&#x27;s schedule" in page


@pytest.mark.ray
@pytest.mark.slow
def test_a_race_runs_a_pbt_entrants_best_schedules_beside_the_constants_finalists(tmp_path, shared_ray):
    """`compare.race` with `compare.scheduler: [asha, pbt]`: the PBT entrant's finalists are its best
    trials' schedules, each replayed from scratch on every seed the race gives it (its epochs' values
    are the schedule's), beside the constant's finalists; the verdict reads the race and says whether
    the schedule beats the constant."""
    import subprocess
    import sys

    import yaml

    from augtune.records import knob_schedule

    (tmp_path / "c.yaml").write_text(yaml.safe_dump({
        "dataset": {"name": "digits", "as_vectors": True, "max_train": 256, "max_test": 128},
        "model": TINY_MLP,
        "train": {"epochs": 4, "batch_size": 32, "num_threads": 1},
        "eval": {"metrics": ["knn"]},
        "resources": {"cpus_per_worker": 0.5},
        "search": {"pbt": {"interval": 2, "quantile": 0.5}},
        "compare": {"methods": ["base"], "scheduler": ["asha", "pbt"], "trials": 3, "metrics": ["knn_acc"],
                    "race": {"enabled": True, "min_seeds": 2, "max_seeds": 3, "finalists": 2}},
    }))
    run = subprocess.run([sys.executable, "-m", "augtune.cli", "compare", "c.yaml", "--storage", "res",
                          "--name", "exp", "--address", shared_ray], cwd=tmp_path, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    exp = tmp_path / "res" / "exp"
    race = json.loads((exp / "race.json").read_text())
    schedules = {c["id"]: c["params"].get("schedule") for c in race["candidates"]}
    pbt = [c for c in schedules if c.startswith("simclr@pbt#")]
    assert pbt and all(schedules[c] for c in pbt)  # the PBT entrant's finalists: schedules
    assert all(schedules[c] is None for c in schedules if c.startswith("simclr#"))  # the constant's: none
    assert len({json.dumps(schedules[c]) for c in pbt}) == len(pbt)  # distinct schedules, distinct candidates
    repeats = [json.loads(p.read_text()) for p in (exp / "repeat").glob("*/record.json")]
    replays = [r for r in repeats if r["entrant"] == "simclr@pbt"]
    assert {r["candidate"] for r in replays} == set(pbt) and len(replays) >= 2 * len(pbt)
    for r in replays:  # each run trained under its candidate's schedule, from epoch 1, on its own seed
        assert r["params"]["schedule"] == schedules[r["candidate"]] == knob_schedule(r["epochs"])
    assert len({(r["candidate"], r["seed"]) for r in repeats}) == len(repeats)  # nothing run twice
    assert "race: round 1 (n = 2)" in run.stdout
    assert "Schedule against constant: knn_acc: simclr@pbt" in run.stdout


def test_a_paused_trial_least_far_along_runs_first_so_a_donor_is_not_starved_by_its_copy():
    """Pending trials first, in order; then the paused one whose last result is the earliest epoch (the
    copy of a paused donor has trained further than the donor: the donor goes first)."""
    from types import SimpleNamespace

    from ray.tune.experiment import Trial

    from augtune.search.multiplex import EntrantsScheduler

    def trial(status, epoch=None):
        return SimpleNamespace(status=status, last_result={"epoch": epoch} if epoch else {})

    copy, donor, other = trial(Trial.PAUSED, 4), trial(Trial.PAUSED, 2), trial(Trial.PAUSED, 2)
    controller = SimpleNamespace(get_trials=lambda: trials)
    sched = EntrantsScheduler({})
    trials = [copy, donor, other, trial(Trial.RUNNING, 1)]
    assert sched.choose_trial_to_run(controller) is donor  # ties: the first made
    trials = [copy, donor, trial(Trial.TERMINATED, 6), fresh := trial(Trial.PENDING)]
    assert sched.choose_trial_to_run(controller) is fresh
    trials = [trial(Trial.RUNNING, 3), trial(Trial.TERMINATED, 6)]
    assert sched.choose_trial_to_run(controller) is None
