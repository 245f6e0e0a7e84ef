"""A resume from what augtune wrote (`augtune.search.resume`): the records, the newest complete checkpoint
of each trial that did not end, Optuna's journal, and searchers that make only what a search still lacks.
Folders are written by hand in the layout a run leaves; Tune and Optuna objects are real, no Ray runtime.
The killed-driver runs are in test_search_faults.py, test_pbt.py and test_race_rounds.py."""
from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState
from ray import tune
from ray.tune.experiment import Experiment

from augtune.records import CANDIDATE, ENTRANT, REPEAT, RESUME, ROUND
from augtune.search.adapters import MetricResultsOptunaSearch
from augtune.search.resume import Held, read_records, settle_study
from augtune.search.searchers import Continuing, VariantGenerator, limited


def _trainable(config):
    pass


def _experiment(space: dict, samples: int = 1) -> Experiment:
    exp = Experiment("exp", run=_trainable, config=space, storage_path=tempfile.mkdtemp(),
                     resources_per_trial={"cpu": 1})
    exp.spec["num_samples"] = samples
    return exp


def _drain(gen) -> list:
    return list(iter(gen.next_trial, None))


def _record(folder: Path, status: str, epochs: int, **extra) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"status": status, "epochs": [{"epoch": e, "knn_acc": e / 10} for e in range(1, epochs + 1)],
            **extra}
    (folder / "record.json").write_text(json.dumps(data))


def _checkpoint(trial: Path, index: int, epochs: int, model: str = "whole") -> None:
    """A checkpoint folder of `epochs` epochs; its model `whole` (a zip archive, as torch.save writes it),
    `torn` (cut short before its end) or `missing`."""
    _record(trial / f"checkpoint_{index:06d}", "running", epochs)
    data = io.BytesIO()
    torch.save({"epoch": epochs}, data)
    cut = {"whole": data.getvalue(), "torn": data.getvalue()[:-7], "missing": None}[model]
    if cut is not None:
        (trial / f"checkpoint_{index:06d}" / "checkpoint.pt").write_bytes(cut)


def _log(trial: Path, epochs: int, torn: str = "") -> None:
    """Tune's result log of `epochs` epochs, then `torn`: a last line a kill cut short (no newline)."""
    text = "".join(json.dumps({"epoch": e}) + "\n" for e in range(1, epochs + 1))
    (trial / "result.json").write_text(text + torn)


# -- what the records hold -------------------------------------------------------------------------------

def test_a_search_is_read_from_its_records_the_ended_as_they_are_the_rest_from_a_checkpoint(tmp_path):
    exp = tmp_path / "exp"
    _record(exp / "t1", "completed", 4, params={"train.lr": 0.1})
    _record(exp / "t2", "stopped", 2, params={"train.lr": 0.2})
    _record(exp / "t3", "running", 3, params={"train.lr": 0.3}, variant={"train.lr": 0.03})
    for i, e in enumerate((1, 2, 3)):
        _checkpoint(exp / "t3", i, e)
    _log(exp / "t3", 3)
    _record(exp / "t4", "failed", 0, params={"train.lr": 0.4}, error="NonFiniteLoss")
    (exp / "t5").mkdir()  # a trial whose record was never written: Tune's files only
    (exp / "t6").mkdir()
    (exp / "t6" / "record.json").write_text('{"status": "runn')  # cut short
    (exp / "t7").mkdir()
    (exp / "t7" / "record.json").write_text("[" * 100_000 + "]" * 100_000)  # nested past any record
    deep = '{"epoch": 9, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n"  # in a checkpoint, in the log
    _checkpoint(exp / "t3", 3, 4)
    (exp / "t3" / "checkpoint_000003" / "record.json").write_text(deep)
    (exp / "t3" / "result.json").write_text((exp / "t3" / "result.json").read_text() + deep)

    records = read_records(str(exp), {None: str(exp)}, str(exp / "repeat_best"), compare=False)
    held = {h.name: h for h in records.search[None]}
    assert sorted(held) == ["t1", "t2", "t3", "t4"] and records.repeats == []  # t6, t7 name no parameters
    assert held["t1"].ended and held["t2"].ended and not held["t3"].ended and not held["t4"].ended
    assert held["t1"].metrics == {"epoch": 4, "knn_acc": 0.4} and held["t1"].config == {"train.lr": 0.1}
    assert held["t3"].made == {"train.lr": 0.03}  # what the searcher made it with: PBT perturbed it since
    assert held["t3"].resume == {"folder": "t3", "checkpoint": str(exp / "t3" / "checkpoint_000002"),
                                 "epoch": 3, "index": 3, "train": None}
    assert held["t3"].again() == {"train.lr": 0.3, RESUME: held["t3"].resume}
    assert held["t4"].resume["checkpoint"] is None and held["t4"].resume["index"] == -1
    # --restart-errored: a failed trial from scratch; a trial that was running keeps its checkpoint
    assert held["t4"].again(True)[RESUME]["checkpoint"] is None
    assert held["t3"].again(True)[RESUME]["checkpoint"] == held["t3"].resume["checkpoint"]


def test_a_finished_trials_result_log_cut_short_by_the_kill_is_made_whole_from_its_record(tmp_path):
    """A kill while Tune uploads its copy of the logs can leave a finished trial's cut short, even empty:
    the resume completes it from the record (each epoch once, in order); a whole log, and the log of a
    trial that did not end, are left as they are."""
    from augtune.search.resume import complete_logs

    exp = tmp_path / "exp"
    names = {"empty": "tune_trial_a0000_00000_0_x", "prefix": "tune_trial_a0000_00001_1_x",
             "whole": "tune_trial_a0000_00002_2_x", "running": "tune_trial_a0000_00003_3_x"}
    for kind, name in names.items():
        _record(exp / name, "running" if kind == "running" else "completed", 4)
    (exp / names["empty"] / "result.json").write_text("")
    _log(exp / names["prefix"], 2, torn='{"epoch": 3, "knn_')
    _log(exp / names["whole"], 4)
    _log(exp / names["running"], 1)
    before = {kind: (exp / name / "result.json").read_bytes() for kind, name in names.items()}
    complete_logs(str(exp), read_records(str(exp), {None: str(exp)}, None, compare=False).trials())
    for kind, name in names.items():
        lines = [json.loads(line) for line in (exp / name / "result.json").read_text().splitlines()]
        if kind in ("whole", "running"):
            assert (exp / name / "result.json").read_bytes() == before[kind], kind
            continue
        assert [line["epoch"] for line in lines] == [1, 2, 3, 4], kind
        kept = 0 if kind == "empty" else 2
        assert all(line.get("from_record") for line in lines[kept:]), kind
        assert lines[-1] == {"epoch": 4, "knn_acc": 0.4, "trial_id": f"a0000_0000{list(names).index(kind)}",
                             "from_record": True}


@pytest.mark.parametrize("torn", ['{"epoch": ', '{"epoch": 99}'])
@pytest.mark.parametrize("logged, chosen", [(5, 2), (4, 1), (6, 2), (7, 2), (0, 0)])
def test_the_checkpoint_continued_from_is_the_newest_complete_one_the_result_log_holds(tmp_path, logged,
                                                                                        chosen, torn):
    """A trial uploads its checkpoint before Tune logs the epoch's result: continuing from one the log
    lacks would leave that epoch out of it for good, so the newest whose epoch the log holds; with none, the
    oldest (the smallest gap). A checkpoint without its model, or with a model cut short (a kill or a full
    disk cut its upload short), is never one. A last line without its newline is not held, even one that
    reads as JSON (a kill between Tune's writes of the two): the resume leaves it out of the log it carries
    over."""
    exp = tmp_path / "exp"
    _record(exp / "t", "running", 5)
    _checkpoint(exp / "t", 0, 3)
    _checkpoint(exp / "t", 1, 4)
    _checkpoint(exp / "t", 2, 5)
    _checkpoint(exp / "t", 3, 6, model="missing")
    _checkpoint(exp / "t", 4, 7, model="torn")
    _log(exp / "t", logged, torn=torn)
    (held,) = read_records(str(exp), {None: str(exp)}, None, compare=False).search[None]
    assert held.resume["checkpoint"] == str(exp / "t" / f"checkpoint_{chosen:06d}")
    assert held.resume["index"] == 4  # numbering goes on after every checkpoint there, whole or not


def test_a_compares_trials_and_repeat_runs_get_the_configs_their_searcher_and_chooser_made(tmp_path):
    """A compare's records are in its entrants' folders and its repeat's, Tune's folders (the checkpoints)
    in its Tune run; a DDP trial continues in the Ray Train run in its folder."""
    exp = tmp_path / "cmp"
    _record(exp / "simclr" / "a", "running", 1, params={"train.lr": 0.1})
    (exp / "simclr" / "a" / "train-abc").mkdir()
    _record(exp / "repeat" / "r", "completed", 3, params={"train.lr": 0.1, "train.seed": 2},
            entrant="simclr", candidate="simclr#1", round=1)
    _record(exp / "repeat" / "q", "running", 1, params={"train.lr": 0.1, "train.seed": 3}, entrant="simclr",
            candidate="simclr#1", round=2)
    _checkpoint(exp / "search" / "q", 0, 1)
    records = read_records(str(exp / "search"), {"simclr": str(exp / "simclr"), "byol": str(exp / "byol")},
                           str(exp / "repeat"), compare=True)
    (a,) = records.search["simclr"]
    assert records.search["byol"] == []
    assert a.config == {"train.lr": 0.1, ENTRANT: "simclr"} and a.resume["train"] == "train-abc"
    repeats = {h.name: h for h in records.repeats}
    assert repeats["r"].config == {REPEAT: {"train.lr": 0.1, "train.seed": 2}, ENTRANT: "simclr",
                                   CANDIDATE: "simclr#1", ROUND: 1} and repeats["r"].ended
    assert repeats["q"].resume["checkpoint"] == str(exp / "search" / "q" / "checkpoint_000000")


# -- searchers that make only what a search lacks -------------------------------------------------------

GRID = {"x": tune.grid_search([1, 2, 3, 4, 5])}


def _held(config: dict, status: str, name: str) -> Held:
    return Held(name, dict(config), status, {"knn": 0.5} if status == "completed" else {},
                {"folder": name, "checkpoint": None, "epoch": 0, "index": -1}, dict(config))


@pytest.mark.parametrize("samples", [1, 2])
def test_a_resumed_grid_makes_the_unfinished_again_and_only_the_variants_no_record_holds(samples):
    """num_samples repeats the grid: each configuration is held as often as records hold it."""
    gen = limited(VariantGenerator(), 0)
    gen.add_configurations([_experiment(GRID, samples)])
    first = _drain(gen)
    assert len(first) == 5 * samples
    held = [_held(first[0].config, "completed", "a"), _held(first[3].config, "running", "b"),
            _held(first[5 if samples == 2 else 1].config, "completed", "c")]  # x=1 twice: once per grid
    resumed = Continuing(limited(VariantGenerator(), 0), 0, [h.again() for h in held if not h.ended],
                         [h.made for h in held], len(held))
    resumed.add_configurations([_experiment(GRID, samples)])
    made = _drain(resumed)
    assert made[0].config == {**first[3].config, RESUME: held[1].resume}  # the unfinished one, first
    rest = sorted(t.config["x"] for t in made[1:])
    expected = sorted(t.config["x"] for t in first)
    for h in held:
        expected.remove(h.config["x"])
    assert rest == expected and resumed.is_finished()


@pytest.mark.parametrize("seed", range(5))
def test_a_resumed_seeded_random_search_makes_the_same_samples_the_uninterrupted_one_would(seed):
    space = {"lr": tune.loguniform(1e-4, 1e-1), "k": tune.choice([1, 2, 3])}
    whole = limited(VariantGenerator(random_state=seed), 0)
    whole.add_configurations([_experiment(space, 6)])
    every = [t.config for t in _drain(whole)]
    held = [_held(every[0], "completed", "a"), _held(every[2], "completed", "b"), _held(every[1], "running",
                                                                                            "c")]
    resumed = Continuing(limited(VariantGenerator(random_state=seed), 0), 0,
                         [h.again() for h in held if not h.ended], [h.made for h in held], len(held))
    resumed.add_configurations([_experiment(space, 6)])
    made = [{k: v for k, v in t.config.items() if k != RESUME} for t in _drain(resumed)]
    assert made == [every[1], *every[3:]]


def test_a_resumed_search_holds_its_concurrency_limit_with_the_trials_made_again():
    gen = limited(VariantGenerator(), 2)
    held = [_held({"x": 1}, "running", "a"), _held({"x": 2}, "running", "b")]
    resumed = Continuing(gen, 2, [h.again() for h in held], [h.made for h in held], 2)
    resumed.add_configurations([_experiment(GRID)])
    made = _drain(resumed)
    assert [t.config["x"] for t in made] == [1, 2]  # the two made again fill the two slots
    resumed.on_trial_complete(made[0].trial_id, {"knn": 0.5})
    (new,) = _drain(resumed)
    assert new.config == {"x": 3} and RESUME not in new.config


# -- Optuna's study ------------------------------------------------------------------------------------

SPACE = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}


def _storage(journal: Path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(journal)))


def _optuna(journal: Path, seed: int = 0, points=None) -> MetricResultsOptunaSearch:
    return MetricResultsOptunaSearch(space=dict(SPACE), metric="knn", mode="max",
                                     sampler=optuna.samplers.RandomSampler(seed=seed),
                                     storage=_storage(journal), study_name="augtune",
                                     points_to_evaluate=points)


def test_optunas_running_trials_are_told_adopted_or_failed_as_the_records_say(tmp_path):
    """Killed with three trials asked: one whose record ended (the driver died before Tune told Optuna),
    one part-way, one never started. Resumed: the first is told its record's value, the second is told when
    its trial made again ends, the third fails; the search asks the one it still lacks; each trial once."""
    journal = tmp_path / "optuna.journal"
    first = limited(_optuna(journal), 3)
    first.add_configurations([_experiment({}, 4)])
    a, b, c = _drain(first)
    held = [Held("ta", {"x": a.config["x"]}, "completed", {"knn": 0.7, "epoch": 3}, {"folder": "ta"},
                 {"x": a.config["x"]}),
            Held("tb", {"x": b.config["x"]}, "running", {},
                 {"folder": "tb", "checkpoint": "/ckpt", "epoch": 1, "index": 0}, {"x": b.config["x"]})]
    study = optuna.load_study(study_name="augtune", storage=_storage(journal))
    numbers = settle_study(study, held, "knn")
    assert numbers == {"tb": 1}
    assert [(t.state, t.value) for t in study.trials] == [
        (TrialState.COMPLETE, 0.7), (TrialState.RUNNING, None), (TrialState.FAIL, None)]
    searcher = _optuna(journal, seed=1)
    resumed = Continuing(limited(searcher, 3), 3, [held[1].again()], [h.made for h in held], 2, searcher,
                         numbers)
    resumed.add_configurations([_experiment({}, 4)])
    again, new, newer = _drain(resumed)  # 4 less the 2 recorded: 2 new (one for the trial that never ran)
    assert again.config[RESUME]["folder"] == "tb" and RESUME not in new.config
    for trial, value in ((again, 0.8), (new, 0.9), (newer, 0.6)):
        resumed.on_trial_complete(trial.trial_id, {"knn": value, **{f"config/{k}": v
                                                                     for k, v in trial.config.items()}})
    assert resumed.is_finished()
    study = optuna.load_study(study_name="augtune", storage=_storage(journal))
    assert [(t.state, t.value) for t in study.trials] == [
        (TrialState.COMPLETE, 0.7), (TrialState.COMPLETE, 0.8), (TrialState.FAIL, None),
        (TrialState.COMPLETE, 0.9), (TrialState.COMPLETE, 0.6)]


def test_a_resumed_study_does_not_ask_its_first_points_again(tmp_path):
    from augtune.search.resume import take

    points = [{"x": 0.25}, {"x": 0.5}]
    done = [{"x": 0.25}]
    held = [dict(d) for d in done]
    assert [p for p in points if not take(held, p)] == [{"x": 0.5}]


def test_list_valued_choices_of_a_registered_space_survive_the_journal(tmp_path):
    # CoCor's space chooses among lists (cocor.lengths): Optuna warns that lists are not portable to
    # persistent storage; its journal keeps them as JSON lists, which load back as the lists the trials ran,
    # and a resumed study does not ask a first point a record holds again
    from augtune.config import from_dict
    from augtune.search.searchers import searcher
    from augtune.spaces import resolve_space

    cfg = from_dict({"search": {"space": "cocor", "algorithm": "optuna", "metric": "knn_acc"}})
    journal = tmp_path / "optuna.journal"
    algorithm, _ = searcher(cfg, resolve_space(cfg.search), _storage(journal))
    suggested = [algorithm.suggest(f"t{i}") for i in range(4)]  # the paper's points first, then TPE's
    for i in range(4):
        algorithm.on_trial_complete(f"t{i}", {"knn_acc": 0.5 + i / 10})
    study = optuna.load_study(study_name="augtune", storage=_storage(journal))
    assert [t.params["cocor.lengths"] for t in study.trials] == [p["cocor.lengths"] for p in suggested]
    assert all(isinstance(t.params["cocor.lengths"], list) for t in study.trials)
    assert study.trials[0].params["cocor.lengths"] == [1, 2, 3]
    assert [t.value for t in study.trials] == [0.5, 0.6, 0.7, 0.8]
    again, _ = searcher(cfg, resolve_space(cfg.search), _storage(journal), done=suggested[:1])
    assert again._points_to_evaluate == [p for p in resolve_space(cfg.search).points_to_evaluate
                                         if p != {k: suggested[0][k] for k in p}] or None


def test_a_pbt_trial_that_copied_another_after_its_last_checkpoint_continues_from_the_copy(tmp_path):
    """Its record's lineage says it copied trial d at epoch 4; its own checkpoints are from before the copy
    (epoch 2, and epoch 6: PBT may copy a donor that is behind): it continues from d's checkpoint of epoch 4
    (still kept), so the copy stays in its run. Gone, from its own newest. One of its own made after the
    copy (its record's lineage) is the one, whatever d keeps."""
    import shutil

    copy = [{"epoch": 4, "trial": "t", "from": "d"}]
    exp = tmp_path / "exp"
    _record(exp / "t", "running", 5, lineage=copy)
    _checkpoint(exp / "t", 0, 2)
    _checkpoint(exp / "t", 1, 6)
    _log(exp / "t", 6)
    _record(exp / "d", "running", 6)
    _checkpoint(exp / "d", 1, 4)
    _checkpoint(exp / "d", 2, 6)

    def held() -> Held:
        return next(h for h in read_records(str(exp), {None: str(exp)}, None, compare=False).search[None]
                    if h.name == "t")

    assert held().resume["checkpoint"] == str(exp / "d" / "checkpoint_000001")
    assert held().resume["epoch"] == 4 and held().resume["index"] == 1  # its own numbering goes on
    shutil.rmtree(exp / "d" / "checkpoint_000001")
    assert held().resume["checkpoint"] == str(exp / "t" / "checkpoint_000001") and held().resume["epoch"] == 6
    _checkpoint(exp / "t", 2, 5)
    record = json.loads((exp / "t" / "checkpoint_000002" / "record.json").read_text())
    (exp / "t" / "checkpoint_000002" / "record.json").write_text(json.dumps({**record, "lineage": copy}))
    assert held().resume["checkpoint"] == str(exp / "t" / "checkpoint_000002") and held().resume["epoch"] == 5


def test_a_ddp_trials_driver_keeps_a_record_a_resume_can_continue(tmp_path):
    """A DDP trial's workers write their records into their checkpoints; its driver writes the trial's
    record at the start (its parameters: what a resume makes it again with, continuing its Train run) and
    when it fails (with the worker's reason), never over a record already there."""
    from augtune.config import load_config
    from augtune.trainables.ray_trainable import TrialFolder, _driver_record

    cfg = load_config(None, ["dataset.as_vectors=true"])
    folder = TrialFolder(str(tmp_path), name="tune_trial_x")
    about = {"params": {"train.lr": 0.1}, "variant": {"train.lr": 0.1}, "phase": "search",
             "trial": "tune_trial_x"}
    _driver_record(cfg, folder, about)
    first = json.loads((tmp_path / "tune_trial_x" / "record.json").read_text())
    assert first["status"] == "running" and first["params"] == {"train.lr": 0.1}
    (tmp_path / "tune_trial_x" / "train-abc").mkdir()
    _driver_record(cfg, folder, {**about, "params": {"train.lr": 9.9}})  # resumed: its record stays
    assert json.loads((tmp_path / "tune_trial_x" / "record.json").read_text()) == first
    (held,) = read_records(str(tmp_path), {None: str(tmp_path)}, None, compare=False).search[None]
    assert held.again()[RESUME]["train"] == "train-abc" and held.config == {"train.lr": 0.1}
    _driver_record(cfg, folder, about, "RuntimeError: a worker died")
    failed = json.loads((tmp_path / "tune_trial_x" / "record.json").read_text())
    assert (failed["status"], failed["error"], failed["params"]) == ("failed", "RuntimeError: a worker died",
                                                                   {"train.lr": 0.1})


@pytest.mark.parametrize("seed", range(6))
def test_a_resumed_studys_sampler_draws_anew_not_what_it_drew_before(tmp_path, seed):
    """The sampler is made again on a resume: seeded as before it would draw its first draws again, and a
    search would run trials it had run (the S3 resume test saw one). Seeded on by the trials the study
    holds, its draws are new, and the same on every resume of the same journal."""
    from augtune.config import from_dict
    from augtune.search.searchers import searcher
    from augtune.spaces import resolve_space

    cfg = from_dict({"search": {"space": {"train.lr": "loguniform(1e-4, 1e-1)"}, "algorithm": "optuna",
                                "metric": "knn_acc", "seed": seed}})
    space = resolve_space(cfg.search)
    journal = tmp_path / "optuna.journal"
    first, _ = searcher(cfg, space, _storage(journal))
    before = [first.suggest(f"t{i}")["train.lr"] for i in range(3)]
    for i in range(3):
        first.on_trial_complete(f"t{i}", {"knn_acc": 0.5})
    again = [searcher(cfg, space, _storage(journal), asked=3)[0].suggest(f"u{i}")["train.lr"]
             for i in range(2)]
    assert again[0] not in before and again[1] not in before


@pytest.mark.parametrize("logged", [0, 2, 4, 5])
def test_a_trial_made_again_logs_every_epoch_up_to_its_checkpoint_once(tmp_path, logged):
    """Tune keeps the newest checkpoints only and its copy of a trial's result log can lag them: a trial
    continued from a checkpoint past its log's last whole line gets the epochs between from the checkpoint's
    record (the numbers it reported then), so that its log holds each epoch once; a log ahead of the
    checkpoint is carried as it is."""
    from types import SimpleNamespace

    import pyarrow.fs

    from augtune.search.callbacks import ContinueResultLog

    stored, local = tmp_path / "exp" / "t", tmp_path / "staging" / "t"
    _checkpoint(stored, 3, 4)
    if logged:
        _log(stored, logged, torn='{"epoch": 9')
    resume = {"folder": "t", "checkpoint": str(stored / "checkpoint_000003"), "epoch": 4, "index": 3}
    trial = SimpleNamespace(config={"train.lr": 0.1, RESUME: resume}, trial_id="new", local_path=str(local),
                            storage=SimpleNamespace(storage_filesystem=pyarrow.fs.LocalFileSystem(),
                                                    trial_fs_path=str(stored)))
    callback = ContinueResultLog()
    callback.on_trial_start(0, [trial], trial)
    callback.on_trial_start(0, [trial], trial)  # a trial Tune starts again (paused, say): carried once
    lines = [json.loads(line) for line in (local / "result.json").read_text().splitlines()]
    assert [line["epoch"] for line in lines] == list(range(1, max(logged, 4) + 1))
    filled = [line for line in lines if line.get("from_record")]
    assert [line["epoch"] for line in filled] == list(range(logged + 1, 5))
    assert all(line["trial_id"] == "new" and line["knn_acc"] == line["epoch"] / 10 for line in filled)
