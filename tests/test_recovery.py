"""What a killed driver leaves behind, made whole before Tune restores (`augtune.search.recovery`), and
search algorithms that agree with the trials Tune restores (`adapters`).

Tune saves its trials and its search algorithm's state in separate files and copies them to storage one
by one; a driver killed in between leaves them a snapshot apart, and storage's copies cut short. These
tests build those states by hand, from real Tune objects, without a Ray runtime."""
from __future__ import annotations

import json
import pickle
import tempfile
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from ray import tune
from ray.tune.experiment import Experiment, Trial

from augtune.config import ConfigError
from augtune.search import trust
from augtune.search.recovery import finish_interrupted_copy, prepare_restore, refill_lost_checkpoints
from augtune.search.adapters import (MetricResultsOptunaSearch, ReconcilingSearchGenerator,
                                           ReplayingVariantGenerator, restorable, restored_trials)
from conftest import save_tune_trials


def _trainable(config):
    pass


def _experiment(space: dict) -> Experiment:
    return Experiment("exp", run=_trainable, config=space, storage_path=tempfile.mkdtemp(),
                      resources_per_trial={"cpu": 1})


def _ended(trial: Trial, **result) -> Trial:
    trial.set_status(Trial.TERMINATED)
    trial.run_metadata.last_result = {**result, "config": trial.config}
    return trial


def _copied(algorithm):
    """The search algorithm as `Tuner.restore` brings it back: unpickled from the Tuner's own file."""
    from ray import cloudpickle

    return cloudpickle.loads(cloudpickle.dumps(algorithm))


def _drain(gen) -> list:
    return list(iter(gen.next_trial, None))


# -- variant generators (grid, random) ---------------------------------------------------------------------

GRID = {"x": tune.grid_search([1, 2, 3, 4, 5])}


def test_a_grid_restored_from_an_older_state_runs_no_trial_twice(tmp_path):
    gen = restorable(ReplayingVariantGenerator(), 2)
    gen.add_configurations([_experiment(GRID)])
    a, b = _drain(gen)  # two at a time
    gen.save_to_dir(str(tmp_path), "s")  # the searcher's snapshot ...
    gen.on_trial_complete(a.trial_id)
    (c,) = _drain(gen)
    save_tune_trials(tmp_path, [_ended(a, knn=0.5), b, c])  # ... one behind the trials Tune saved after it

    restored = _copied(restorable(ReplayingVariantGenerator(), 2))
    restored.restore_from_dir(str(tmp_path))
    assert _drain(restored) == []  # b and c are still running: both slots taken
    restored.on_trial_complete(b.trial_id)
    (d,) = _drain(restored)
    restored.on_trial_complete(c.trial_id)
    (e,) = _drain(restored)
    assert [d.config["x"], e.config["x"]] == [4, 5]  # the rest of the grid, nothing again
    assert len({a.trial_id, b.trial_id, c.trial_id, d.trial_id, e.trial_id}) == 5
    restored.on_trial_complete(d.trial_id)
    restored.on_trial_complete(e.trial_id)
    assert _drain(restored) == [] and restored.is_finished()


def test_a_grid_restored_from_a_newer_state_loses_no_trial(tmp_path):
    gen = restorable(ReplayingVariantGenerator(), 3)
    gen.add_configurations([_experiment(GRID)])
    a, b, c = _drain(gen)
    gen.save_to_dir(str(tmp_path), "s")  # knows c, which the trials Tune saved (before it) do not hold
    save_tune_trials(tmp_path, [_ended(a, knn=0.5), b])

    restored = _copied(restorable(ReplayingVariantGenerator(), 3))
    restored.restore_from_dir(str(tmp_path))
    again = _drain(restored)
    assert [t.config["x"] for t in again] == [3, 4]  # c is made again (same id), then the next
    assert again[0].trial_id == c.trial_id


@pytest.mark.parametrize("seed", range(5))
def test_a_seeded_random_search_replays_the_same_samples(tmp_path, seed):
    space = {"lr": tune.loguniform(1e-4, 1e-1), "k": tune.choice([1, 2, 3])}
    gen = restorable(ReplayingVariantGenerator(random_state=seed), 0)
    exp = _experiment(space)
    exp.spec["num_samples"] = 6
    gen.add_configurations([exp])
    first = [gen.next_trial() for _ in range(3)]
    gen.save_to_dir(str(tmp_path), "s")
    rest = _drain(gen)
    save_tune_trials(tmp_path, [_ended(t, knn=0.5) for t in first] + rest[:1])

    restored = _copied(restorable(ReplayingVariantGenerator(random_state=seed), 0))
    restored.restore_from_dir(str(tmp_path))
    assert [(t.trial_id, t.config) for t in _drain(restored)] == [(t.trial_id, t.config) for t in rest[1:]]


# -- Optuna -----------------------------------------------------------------------------------------------

SPACE = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}


def _optuna(journal: Path, seed: int = 0) -> MetricResultsOptunaSearch:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return MetricResultsOptunaSearch(space=dict(SPACE), metric="knn", mode="max",
                                     sampler=optuna.samplers.RandomSampler(seed=seed),
                                     storage=JournalStorage(JournalFileBackend(str(journal))),
                                     study_name="augtune")


def _tune_trial(trial_id: str, config: dict, status: str = Trial.PENDING, **result) -> Trial:
    trial = Trial("_trainable", config=config, evaluated_params=dict(config), trial_id=trial_id,
                  stub=True, placement_group_factory={"cpu": 1})
    trial.set_status(status)
    trial.run_metadata.last_result = {**result, "config": config} if result else {}
    return trial


def _study(journal: Path) -> optuna.Study:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return optuna.load_study(study_name="augtune", storage=JournalStorage(JournalFileBackend(str(journal))))


def test_optuna_restored_one_snapshot_behind_tells_the_study_each_trial_once(tmp_path):
    journal = tmp_path / "optuna.journal"
    live = _optuna(journal)
    p0, p1 = live.suggest("t0"), live.suggest("t1")
    live.on_trial_complete("t0", {"knn": 0.5})
    live.save(str(tmp_path / "searcher.pkl"))  # the snapshot Tune's copy left in storage
    live.on_trial_complete("t1", {"knn": 0.7})  # after it: in the journal, not in the snapshot
    p2 = live.suggest("t2")  # the journal has t2 running; Tune saved it as a trial too
    trials = [_tune_trial("t0", p0, Trial.TERMINATED, knn=0.5),
              _tune_trial("t1", p1, Trial.TERMINATED, knn=0.7), _tune_trial("t2", p2)]
    folder = tmp_path / "staging"
    folder.mkdir()
    save_tune_trials(folder, trials)

    restored = MetricResultsOptunaSearch()
    restored.restore(str(tmp_path / "searcher.pkl"))
    restored.reconcile(restored_trials(str(folder)))
    restored.on_trial_result("t2", {"knn": 0.8, "training_iteration": 1})  # no KeyError
    restored.on_trial_complete("t2", {"knn": 0.9})
    study = _study(journal)
    assert [(t.state, t.value, t.params) for t in study.trials] == [
        (TrialState.COMPLETE, 0.5, p0), (TrialState.COMPLETE, 0.7, p1), (TrialState.COMPLETE, 0.9, p2)]


def test_optuna_trials_that_tune_never_ran_are_failed_and_unknown_ones_are_added(tmp_path):
    journal = tmp_path / "optuna.journal"
    live = _optuna(journal)
    p0 = live.suggest("t0")
    live.suggest("t1")  # the snapshot knows t1; the trials Tune saved before it do not
    live.save(str(tmp_path / "searcher.pkl"))
    folder = tmp_path / "staging"
    folder.mkdir()
    save_tune_trials(folder, [_tune_trial("t0", p0)])

    restored = MetricResultsOptunaSearch()
    restored.restore(str(tmp_path / "searcher.pkl"))
    restored.reconcile(restored_trials(str(folder)))
    restored.on_trial_complete("t0", {"knn": 0.6})
    # a trial no state knows (Tune restarted an errored one under a new id) is added when it ends
    restored.on_trial_complete("t9", {"knn": 0.4, "config/x": 0.25})
    study = _study(journal)
    assert [(t.state, t.value) for t in study.trials] == [
        (TrialState.COMPLETE, 0.6), (TrialState.FAIL, None), (TrialState.COMPLETE, 0.4)]
    assert study.trials[2].params == {"x": 0.25}


def test_the_search_generator_restored_counts_tunes_trials_and_frees_ended_slots(tmp_path):
    journal = tmp_path / "optuna.journal"
    gen = restorable(_optuna(journal), 2)
    gen.set_search_properties("knn", "max", {})
    exp = _experiment({})
    exp.spec["num_samples"] = 4
    gen.add_configurations([exp])
    a, b = _drain(gen)
    gen.save_to_dir(str(tmp_path), "s")  # both live in this snapshot
    gen.on_trial_complete(a.trial_id, {"knn": 0.5})
    (c,) = _drain(gen)
    save_tune_trials(tmp_path, [_ended(a, knn=0.5), b, c])  # a ended, c made after the snapshot

    restored = _copied(restorable(MetricResultsOptunaSearch(), 2))
    assert isinstance(restored, ReconcilingSearchGenerator)
    restored.restore_from_dir(str(tmp_path))
    assert restored._counter == 3 and restored.searcher.live_trials == {b.trial_id, c.trial_id}
    assert _drain(restored) == []  # two running: no slot
    for t, v in ((b, 0.6), (c, 0.7)):
        restored.on_trial_complete(t.trial_id, {"knn": v, **{f"config/{k}": x for k, x in t.config.items()}})
    (d,) = _drain(restored)
    assert restored.is_finished()  # 4 trials made in all: none twice, none extra
    restored.on_trial_complete(d.trial_id, {"knn": 0.8})
    study = _study(journal)
    assert sorted(t.value for t in study.trials) == [0.5, 0.6, 0.7, 0.8]
    assert all(t.state == TrialState.COMPLETE for t in study.trials)


# -- files: the dead driver's staging copy ------------------------------------------------------------------

def _staging(ray_tmp: Path, session: str, stamp: str) -> Path:
    folder = ray_tmp / "ray" / f"session_{session}" / "artifacts" / "2026-01-01_00-00-00" / "exp" / \
        "driver_artifacts"
    folder.mkdir(parents=True)
    (folder / f"experiment_state-{stamp}.json").write_text(json.dumps({"trial_data": [], "at": session}))
    (folder / f"basic-variant-state-{stamp}.json").write_bytes(pickle.dumps({"at": session}))
    return folder


RESULTS = b'{"epoch": 1}\n{"epoch": 2}\n{"epoch": 3}\n'


def test_the_dead_drivers_last_copy_is_finished(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    exp = tmp_path / "s" / "exp"
    (exp / "tune_trial_1").mkdir(parents=True)
    (exp / "tune_trial_2").mkdir()
    (exp / "tune_trial_1" / "result.json").write_bytes(b"")  # the copy was cut: the trial's log is lost
    (exp / "tune_trial_2" / "result.json").write_bytes(RESULTS + b'{"epoch": 4}\n')  # longer: untouched
    (exp / "tune_trial_2" / "progress.csv").write_bytes(b"epoch\n1\n")
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text('{"trial_data": [], "at": "old"}')
    (exp / "basic-variant-state-2026-01-01_00-00-00.json").write_bytes(pickle.dumps({"at": "old"}))
    staged = _staging(tmp_path / "raytmp", "a", "2026-01-01_00-00-00")
    for name in ("tune_trial_1", "tune_trial_2"):
        (staged / name).mkdir()
        (staged / name / "result.json").write_bytes(RESULTS + b'{"epo')  # killed mid-line
    (staged / "tune_trial_2" / "progress.csv").write_bytes(b"epoch\n1\n2\n3\n")
    (staged / "tmp-basic-variant-state-x.json").write_bytes(b"half")  # Tune's temporary file
    other = _staging(tmp_path / "raytmp", "b", "2027-01-01_00-00-00")  # a newer experiment named exp too
    (other / "tune_trial_9").mkdir()
    trust.sign(str(staged))  # as augtune signs every save where Tune writes it

    written = finish_interrupted_copy(str(exp))
    assert (exp / "tune_trial_1" / "result.json").read_bytes() == RESULTS  # whole lines only
    assert (exp / "tune_trial_2" / "result.json").read_bytes() == RESULTS + b'{"epoch": 4}\n'
    assert (exp / "tune_trial_2" / "progress.csv").read_bytes() == b"epoch\n1\n2\n3\n"
    assert json.loads((exp / "experiment_state-2026-01-01_00-00-00.json").read_text())["at"] == "a"
    assert pickle.loads((exp / "basic-variant-state-2026-01-01_00-00-00.json").read_bytes()) == {"at": "a"}
    assert not list(exp.glob("tmp-*")) and len(written) == 5  # and the staged signatures
    assert finish_interrupted_copy(str(exp)) == []  # whole now: nothing more to do


def test_a_torn_staged_snapshot_is_not_taken_and_a_torn_stored_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    exp = tmp_path / "s" / "exp"
    (exp / "tune_trial_1").mkdir(parents=True)
    torn = exp / "basic-variant-state-2026-01-01_00-00-00.json"
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text('{"trial_data": []}')
    torn.write_bytes(pickle.dumps({"at": "old"})[:5])
    with pytest.raises(ConfigError, match="truncated .* no intact copy"):
        prepare_restore(str(exp))  # no staging copy on this machine
    staged = _staging(tmp_path / "raytmp", "a", "2026-01-01_00-00-00")
    (staged / "tune_trial_1").mkdir()
    (staged / "basic-variant-state-2026-01-01_00-00-00.json").write_bytes(pickle.dumps({"at": "a"})[:-3])
    with pytest.raises(ConfigError, match="truncated"):  # the staged snapshot is torn too: none of it
        prepare_restore(str(exp))
    assert json.loads((exp / "experiment_state-2026-01-01_00-00-00.json").read_text()) == {"trial_data": []}
    (staged / "basic-variant-state-2026-01-01_00-00-00.json").write_bytes(pickle.dumps({"at": "a"}))
    trust.sign(str(staged))  # as augtune signs every save where Tune writes it
    prepare_restore(str(exp))  # a whole staged snapshot replaces the torn one, all of its files
    assert pickle.loads(torn.read_bytes()) == {"at": "a"}
    assert json.loads((exp / "experiment_state-2026-01-01_00-00-00.json").read_text())["at"] == "a"


def test_a_stale_staging_copy_leaves_newer_storage_alone(tmp_path, monkeypatch):
    """The newest state in storage was written by a later run (resumed elsewhere): an older session's
    staging copy on this machine must not roll it back."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    exp = tmp_path / "s" / "exp"
    (exp / "tune_trial_1").mkdir(parents=True)
    (exp / "tune_trial_1" / "result.json").write_bytes(RESULTS)
    (exp / "experiment_state-2026-02-01_00-00-00.json").write_text('{"trial_data": [], "at": "new"}')
    staged = _staging(tmp_path / "raytmp", "a", "2026-01-01_00-00-00")
    (staged / "tune_trial_1").mkdir()
    (staged / "tune_trial_1" / "result.json").write_bytes(RESULTS[:13])
    assert finish_interrupted_copy(str(exp)) == []
    assert (exp / "tune_trial_1" / "result.json").read_bytes() == RESULTS
    assert not (exp / "experiment_state-2026-01-01_00-00-00.json").exists()


def test_a_torn_result_log_loses_its_partial_line_without_a_staging_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    exp = tmp_path / "exp"
    (exp / "tune_trial_1").mkdir(parents=True)
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text('{"trial_data": []}')
    (exp / "tune_trial_1" / "result.json").write_bytes(RESULTS + b'{"ep')
    prepare_restore(str(exp))
    assert (exp / "tune_trial_1" / "result.json").read_bytes() == RESULTS


def _record(epoch: int) -> dict:
    return {"epochs": [{"epoch": e} for e in range(1, epoch + 1)]}


def _checkpoint(folder: Path, epoch: int, complete: bool = True) -> None:
    folder.mkdir(parents=True)
    (folder / "checkpoint.pt").write_bytes(b"weights of epoch %d" % epoch)
    if complete:
        (folder / "record.json").write_text(json.dumps(_record(epoch)))


def _named_state(exp: Path, *paths: Path) -> None:
    """An experiment state whose trials' checkpoint managers name `paths` (one trial each)."""
    from ray.train import CheckpointConfig
    from ray.train._internal.checkpoint_manager import _CheckpointManager
    from ray.train._internal.session import _TrainingResult
    from ray.tune import Checkpoint
    from ray.tune.utils.serialization import TuneFunctionEncoder

    trial_data = []
    for path in paths:
        manager = _CheckpointManager(CheckpointConfig(num_to_keep=1))
        manager._checkpoint_results = [_TrainingResult(checkpoint=Checkpoint(str(path)), metrics={})]
        trial_data.append(["{}", json.dumps({"checkpoint_manager": manager}, cls=TuneFunctionEncoder)])
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": trial_data}))


def test_a_checkpoint_deleted_after_the_last_saved_state_is_refilled_from_the_newest_complete_one(tmp_path):
    exp = tmp_path / "exp"
    lost, kept = exp / "trial_a", exp / "trial_b"
    _checkpoint(lost / "checkpoint_000004", 4)
    _checkpoint(lost / "checkpoint_000005", 5, complete=False)  # killed mid-upload: not used
    _checkpoint(kept / "checkpoint_000002", 2)
    _named_state(exp, lost / "checkpoint_000001", kept / "checkpoint_000002")  # what Tune's state names
    assert refill_lost_checkpoints(str(exp)) == [str(lost / "checkpoint_000001")]
    assert (lost / "checkpoint_000001" / "checkpoint.pt").read_bytes() == b"weights of epoch 4"
    assert json.loads((lost / "checkpoint_000001" / "record.json").read_text()) == _record(4)
    assert sorted(p.name for p in kept.iterdir()) == ["checkpoint_000002"]  # named and there: untouched
    assert refill_lost_checkpoints(str(exp)) == []  # nothing more to do
    # killed while the store deleted the named one file by file: its record is left, not its model
    (lost / "checkpoint_000001" / "checkpoint.pt").unlink()
    assert refill_lost_checkpoints(str(exp)) == [str(lost / "checkpoint_000001")]
    assert (lost / "checkpoint_000001" / "checkpoint.pt").read_bytes() == b"weights of epoch 4"


@pytest.mark.parametrize("logged, source", [(5, 5), (6, 6), (9, 6), (3, 5), (0, 5)])
def test_a_lost_checkpoint_is_refilled_from_the_newest_the_result_log_holds(tmp_path, logged, source):
    # The state names epoch 4's checkpoint, deleted when the driver registered epoch 5's; the trial had
    # uploaded epoch 6's too, but the driver died before it logged that epoch (logged = 5): continuing from
    # 6 would leave epoch 6 out of the result log for good, continuing from 5 reports it after the resume.
    # With no complete checkpoint in the log (its copy lags: 3, or none), the oldest leaves the least gap.
    # A line that is no result (zeros a crash left in the file) is passed over.
    exp = tmp_path / "exp"
    trial = exp / "trial_a"
    _checkpoint(trial / "checkpoint_000004", 5)
    _checkpoint(trial / "checkpoint_000005", 6)
    _checkpoint(trial / "checkpoint_000006", 7, complete=False)  # killed mid-upload: never used
    lines = [json.dumps({"epoch": e}) for e in range(1, logged + 1)]
    (trial / "result.json").write_text("".join(f"{line}\n" for line in [*lines[:2], "\0\0\0", *lines[2:]]))
    _named_state(exp, trial / "checkpoint_000003")
    assert refill_lost_checkpoints(str(exp)) == [str(trial / "checkpoint_000003")]
    assert (trial / "checkpoint_000003" / "checkpoint.pt").read_bytes() == b"weights of epoch %d" % source


def test_list_valued_choices_of_a_registered_space_survive_the_journal(tmp_path):
    # CoCor's space chooses among lists (cocor.lengths): Optuna warns that lists are not portable to
    # persistent storage; its journal keeps them as JSON lists, which load back as the lists the trials ran
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from augtune.config import from_dict
    from augtune.search.searchers import searcher
    from augtune.spaces import resolve_space

    cfg = from_dict({"search": {"space": "cocor", "algorithm": "optuna", "metric": "knn_acc"}})
    journal = tmp_path / "optuna.journal"
    algorithm, _ = searcher(cfg, resolve_space(cfg.search), JournalStorage(JournalFileBackend(str(journal))))
    suggested = [algorithm.suggest(f"t{i}") for i in range(4)]  # the paper's points first, then TPE's
    for i in range(4):
        algorithm.on_trial_complete(f"t{i}", {"knn_acc": 0.5 + i / 10})
    study = _study(journal)
    assert [t.params["cocor.lengths"] for t in study.trials] == [p["cocor.lengths"] for p in suggested]
    assert all(isinstance(t.params["cocor.lengths"], list) for t in study.trials)
    assert study.trials[0].params["cocor.lengths"] == [1, 2, 3]
    assert [t.value for t in study.trials] == [0.5, 0.6, 0.7, 0.8]


def test_a_running_record_of_a_trial_tune_never_saved_is_marked_failed(tmp_path):
    """Killed in the repeat phase after a repeat run started but before Tune saved its state: the resume
    runs it again as a new trial, and the old record must not stay `running` (tables would say the
    experiment is unfinished, and count the run twice). A record of a trial Tune holds is left alone."""
    from ray.train._internal.storage import StorageContext

    from augtune.records import write_record
    from augtune.search.recovery import settle_lost_records

    exp = tmp_path / "exp"
    repeats = exp / "repeat_best"
    held = _tune_trial("aaaa0000", {"train.lr": 0.1})
    held.set_storage(StorageContext(storage_path=str(tmp_path), experiment_dir_name="exp",
                                    trial_dir_name="tune_trial_aaaa0000"))
    save_tune_trials(exp, [held])
    for folder, status in ((exp / "tune_trial_aaaa0000", "running"),
                           (repeats / "tune_trial_bbbb0000", "running"),
                           (repeats / "tune_trial_cccc0000", "completed")):
        folder.mkdir(parents=True)
        write_record(folder, {"format": "augtune.record/1", "status": status, "epochs": []})
    marked = settle_lost_records(str(exp), [str(exp), str(repeats)])
    assert marked == [str(repeats / "tune_trial_bbbb0000" / "record.json")]
    status = {p.parent.name: json.loads(p.read_text())["status"] for p in exp.glob("**/record.json")}
    assert status == {"tune_trial_aaaa0000": "running", "tune_trial_bbbb0000": "failed",
                      "tune_trial_cccc0000": "completed"}
    lost = json.loads((repeats / "tune_trial_bbbb0000" / "record.json").read_text())
    assert "driver was killed" in lost["error"]
