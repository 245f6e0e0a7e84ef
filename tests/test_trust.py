"""Signed state (`augtune.search.trust`): `augtune resume` unpickles nothing its user's augtune did not
sign; a folder from elsewhere is refused in one line, before anything runs, unless `--trust`."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import yaml

from augtune.cli import main
from augtune.config import load_config, to_dict
from augtune.search import trust


@pytest.fixture(autouse=True)
def loggers_left_alone(monkeypatch):
    """`resume` in-process would hand Ray's loggers and Python's warnings to the experiment's log file
    for the rest of the session."""
    monkeypatch.setattr("augtune.search.progress.quiet_ray", lambda *args, **kwargs: None)


class Pwn:
    """A pickle that runs code when loaded: it writes a file."""

    def __init__(self, target: Path):
        self.target = str(target)

    def __reduce__(self):
        return (exec, (f"open({self.target!r}, 'w').write('PWNED')",))


class Started(Exception):
    """A resume got past its checks: it would start Ray now."""


def stop_before_ray(monkeypatch) -> None:
    """`tune_run.run_search` raises Started where it would start Ray (its restore's mending skipped)."""
    from augtune.search import launch

    def connect(*args, **kwargs):
        raise Started

    monkeypatch.setattr(launch, "connect", connect)
    monkeypatch.setattr(launch, "prepare_restore", lambda path: [])


def _folder(tmp_path: Path, tuner: bytes) -> Path:
    """A folder laid out as a search's: its plan, Tune's saved state (mode 644, owned by the user)."""
    exp = tmp_path / "res" / "exp"
    exp.mkdir(parents=True)
    cfg = load_config(None, ["search.space=simclr", "dataset.as_vectors=true"])
    plan = {"config": to_dict(cfg), "base": to_dict(cfg), "name": "exp", "storage": str(exp.parent)}
    (exp / "augtune_search.yaml").write_text(yaml.safe_dump(plan))
    (exp / "tuner.pkl").write_bytes(tuner)
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text('{"trial_data": []}')
    for p in exp.iterdir():
        p.chmod(0o644)
    return exp


def test_a_malicious_pickle_with_ordinary_permissions_is_refused_and_never_run(tmp_path, capsys):
    pwned = tmp_path / "PWNED"
    exp = _folder(tmp_path, pickle.dumps(Pwn(pwned)))
    assert main(["resume", str(exp)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not signed by your augtune" in err
    assert f"augtune resume --trust {exp}" in err
    assert not pwned.exists()


@pytest.mark.parametrize("name", ["basic-variant-state-2026-01-01_00-00-00.json",
                                  "search_gen_state-2026-01-01_00-00-00.json",
                                  "callback-states-2026-01-01_00-00-00.pkl",
                                  "searcher-state-2026-01-01_00-00-00.pkl"])
def test_every_file_tune_unpickles_on_resume_is_checked_whatever_its_name(tmp_path, monkeypatch, capsys,
                                                                           name):
    """Tune's variant and search generators keep their state as cloudpickles named `.json`, its callbacks as
    `callback-states-*.pkl`: a planted one in a folder this user signed is refused like `tuner.pkl` (a
    `.json` that does not parse was once skipped as a torn experiment state)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "me"))  # this test's ledger, no other's
    pwned = tmp_path / "PWNED"
    exp = _folder(tmp_path, pickle.dumps({"benign": 1}))
    trust.sign(str(exp))
    trust.verify(str(exp))
    (exp / name).write_bytes(pickle.dumps(Pwn(pwned)))
    assert main(["resume", str(exp)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{name}: not signed by your augtune" in err
    assert not pwned.exists()


def test_a_folder_signed_with_another_key_is_refused(tmp_path, monkeypatch, capsys):
    exp = _folder(tmp_path, pickle.dumps({"benign": 1}))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "colleague"))
    trust.sign(str(exp))
    assert (exp / trust.SIGNATURES).is_file()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "me"))
    with pytest.raises(trust.Untrusted, match="signature does not match"):
        trust.verify(str(exp))
    assert main(["resume", str(exp)]) == 2
    assert "--trust" in capsys.readouterr().err


def test_what_this_user_signed_is_accepted_and_any_change_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "me"))
    exp = _folder(tmp_path, pickle.dumps({"benign": 1}))
    trust.sign(str(exp))
    trust.verify(str(exp))
    key = tmp_path / "me" / "augtune" / trust.KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    (exp / "tuner.pkl").write_bytes(pickle.dumps({"benign": 2}))
    with pytest.raises(trust.Untrusted, match="tuner.pkl"):
        trust.verify(str(exp))


def test_the_ledger_vouches_for_state_copied_after_its_signature_file(tmp_path, monkeypatch):
    """A driver killed while Tune copied its state: the experiment's signature file is older than a state
    file that this user's augtune signed where Tune wrote it."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "me"))
    staging, exp = tmp_path / "staging", _folder(tmp_path, pickle.dumps({"benign": 1}))
    trust.sign(str(exp))
    staging.mkdir()
    newer = b'{"trial_data": [], "newer": true}'
    (staging / "experiment_state-2026-01-01_00-00-00.json").write_bytes(newer)
    trust.sign(str(staging))
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_bytes(newer)  # copied; its .sig not yet
    trust.verify(str(exp))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "elsewhere"))  # no ledger, another key
    with pytest.raises(trust.Untrusted):
        trust.verify(str(exp))


class SlowCopy:
    """Tune's background copy of its staging folder to the experiment's (Ray's own `_BackgroundSyncer`,
    which runs it in a thread), slowed to `delay` seconds before it copies: what a driver killed the
    moment the copy ends leaves is checked there and then (`left`: verify's error, or None)."""

    def __new__(cls, delay: float, left: list):
        import shutil
        import time

        from ray.train._internal.syncer import _BackgroundSyncer

        class Syncer(_BackgroundSyncer):
            def _sync_up_command(self, local_path, uri, exclude=None):
                def copy(src, dst):
                    time.sleep(delay)
                    shutil.copytree(src, dst, dirs_exist_ok=True)
                    try:
                        trust.verify(dst)
                        left.append(None)
                    except trust.Untrusted as e:
                        left.append(str(e))
                return copy, {"src": local_path, "dst": uri}

        return Syncer()


@pytest.mark.parametrize("held", [False, True])
def test_a_copy_of_tunes_state_never_carries_a_file_saved_but_not_yet_signed(tmp_path, monkeypatch, held):
    """Tune saves its state into a staging folder (its experiment state, then the search algorithm's
    `save_to_dir`, which signs) while its copy of the last save may still run: unheld, that copy carries
    the new state unsigned, and a driver killed as it ends leaves a folder `resume` refuses (the CI saw
    it once). Held (`adapters.hold_copies_while_saving`, which `drive` applies), a step saves only
    when no copy is in flight, the last save waits for it: every copy starts from a signed folder."""
    import time
    from types import SimpleNamespace

    from augtune.search.adapters import hold_copies_while_saving

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "me"))
    staging, exp, left = tmp_path / "staging", tmp_path / "exp", []
    state = staging / "experiment_state-2026-01-01_00-00-00.json"

    class Controller:  # TuneController's checkpoint and save_to_dir, the searcher's pickling slowed down
        def __init__(self):
            self._storage = SimpleNamespace(syncer=SlowCopy(0.2, left), experiment_fs_path=str(exp))
            self.saves = 0

        def checkpoint(self, force: bool = False, wait: bool = False):
            self.save_to_dir()
            self._storage.syncer.sync_up(str(staging), str(exp))
            if wait:
                self._storage.syncer.wait()

        def save_to_dir(self):
            self.saves += 1
            staging.mkdir(exist_ok=True)
            state.write_text(json.dumps({"trial_data": [], "save": self.saves}))  # Tune's own write
            time.sleep(1.5)  # the search algorithm pickles its state
            trust.sign(str(staging))

    if held:
        hold_copies_while_saving(Controller)
        hold_copies_while_saving(Controller)  # idempotent: one wrapper
        assert not hasattr(Controller.checkpoint.__wrapped__, "holds_copies")
        from ray.tune.execution.tune_controller import TuneController

        hold_copies_while_saving()  # Tune's own: what `drive` holds
        assert TuneController.checkpoint.holds_copies
    controller = Controller()
    for _ in range(40):  # Tune's loop: a checkpoint each step
        controller.checkpoint()
        if controller.saves == 3:
            break
        time.sleep(0.05)
    controller.checkpoint(force=True, wait=True)  # the end of the run
    assert controller.saves >= 4 and len(left) >= 2
    unsigned = [e for e in left if e]
    if held:
        assert unsigned == [], unsigned
        trust.verify(str(exp))
        assert json.loads((exp / state.name).read_text())["save"] == controller.saves  # the last, copied
    else:
        assert unsigned and "does not match" in unsigned[0]


def test_trust_proceeds_and_signs_for_next_time(tmp_path, monkeypatch):
    """`--trust`: the user's word; nothing is verified, and the folder is signed (no second --trust)."""
    from augtune.search import tune_run
    from augtune.search.plan import load_plan

    exp = _folder(tmp_path, pickle.dumps({"benign": 1}))
    plan = load_plan(str(exp))

    stop_before_ray(monkeypatch)
    with pytest.raises(trust.Untrusted):
        tune_run.run_search(plan, log=lambda line: None)
    with pytest.raises(Started):  # past the check: it would start Ray now
        tune_run.run_search(plan, log=lambda line: None, trust=True)
    trust.verify(str(exp))


def test_status_export_and_plan_of_an_untrusted_folder_unpickle_nothing(tmp_path, capsys):
    pwned = tmp_path / "PWNED"
    exp = _folder(tmp_path, pickle.dumps(Pwn(pwned)))
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text(
        '{"trial_data": [], "runner_data": {"__pickled": "' + pickle.dumps(Pwn(pwned)).hex() + '"}}')
    main(["status", str(exp)])
    main(["export", str(exp), "--out", str(tmp_path / "t.csv")])
    capsys.readouterr()
    assert not pwned.exists()
    assert os.environ.get("XDG_CONFIG_HOME")  # the suite's own key, never the user's


def test_a_full_disk_leaves_the_ledger_to_vouch_and_a_cut_json_to_recovery(tmp_path, monkeypatch):
    """A full disk while Tune saves: the signature file cannot be written (the ledger still vouches),
    and a state JSON cut short is left to `resume`'s recovery (it cannot be parsed, so nothing in it is
    unpickled); a cut pickle is still refused (its first opcodes would run)."""
    from augtune.search import storage

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "me"))
    exp = _folder(tmp_path, pickle.dumps({"benign": 1}))

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(storage, "write_bytes", full)
        trust.sign(str(exp))
    assert not (exp / trust.SIGNATURES).exists()
    trust.verify(str(exp))
    (exp / "experiment_state-2026-01-01_00-00-01.json").write_text('{"trial_data": [["abc')
    trust.verify(str(exp))
    (exp / "searcher-state-2026-01-01_00-00-01.pkl").write_bytes(pickle.dumps({"x": 1})[:-3])
    with pytest.raises(trust.Untrusted, match="searcher-state"):
        trust.verify(str(exp))


def test_a_pickle_cut_short_by_a_full_disk_is_taken_whole_from_the_staging_copy_before_the_check(
        tmp_path, monkeypatch):
    """A full disk cut Tune's copy of the searcher state into the experiment folder: those bytes were never
    signed, but the staging copy on this machine is whole and signed. `resume` finishes the copy from it
    (bytes only, `recovery.finish_interrupted_copy`) before checking signatures, then accepts the folder;
    a staged pickle this user's augtune did not sign is still refused after the copy."""
    from augtune.search import tune_run
    from augtune.search.plan import load_plan
    from augtune.search.recovery import finish_interrupted_copy

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "me"))
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    exp = _folder(tmp_path, pickle.dumps({"benign": 1}))
    (exp / "tune_trial_a").mkdir()  # a trial folder both copies hold: the staging copy is this experiment's
    staged = tmp_path / "raytmp" / "ray" / "session_1" / "artifacts" / "2026" / exp.name / "driver_artifacts"
    (staged / "tune_trial_a").mkdir(parents=True)
    state = "search-then-repeat-state-2026-01-01_00-00-00.pkl"
    whole = pickle.dumps({"made": list(range(50))})
    for name in ("experiment_state-2026-01-01_00-00-00.json", "tuner.pkl"):
        (staged / name).write_bytes((exp / name).read_bytes())
    (staged / state).write_bytes(whole)
    trust.sign(str(staged))  # where Tune writes its state: the ledger vouches for these bytes
    trust.sign(str(exp), only=["tuner.pkl", "experiment_state-2026-01-01_00-00-00.json"])
    (exp / state).write_bytes(whole[:20])  # the copy the full disk cut short
    with pytest.raises(trust.Untrusted, match="search-then-repeat-state"):
        trust.verify(str(exp))

    stop_before_ray(monkeypatch)
    with pytest.raises(Started):  # past the signature check: it would start Ray now
        tune_run.run_search(load_plan(str(exp)), log=lambda line: None)
    assert (exp / state).read_bytes() == whole
    trust.verify(str(exp))

    (staged / state).write_bytes(pickle.dumps({"made": "not signed"}))  # staged, but not by augtune
    (exp / state).write_bytes(b"\x80")
    assert finish_interrupted_copy(str(exp)) == []  # not taken: the folder's own bytes stay, and are refused
    assert (exp / state).read_bytes() == b"\x80"
    with pytest.raises(trust.Untrusted, match="search-then-repeat-state"):
        trust.verify(str(exp))


def test_a_driver_killed_in_a_save_resumes_from_the_last_copy_not_the_unsigned_save(tmp_path, monkeypatch):
    """Killed after Tune wrote its experiment state to staging and before augtune signed it: the staged
    snapshot is whole but unsigned, and is not copied over the folder's last copy, which is signed (both
    race tests of the CI hit this once the copy was finished before the check)."""
    from augtune.search.recovery import finish_interrupted_copy

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "me"))
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    exp = _folder(tmp_path, pickle.dumps({"benign": 1}))
    (exp / "tune_trial_a").mkdir()
    staged = tmp_path / "raytmp" / "ray" / "session_1" / "artifacts" / "2026" / exp.name / "driver_artifacts"
    (staged / "tune_trial_a").mkdir(parents=True)
    name = "experiment_state-2026-01-01_00-00-00.json"
    (staged / name).write_bytes((exp / name).read_bytes())
    trust.sign(str(staged))
    trust.sign(str(exp))  # the last save, signed, then copied
    (staged / name).write_text('{"trial_data": [], "the next save": true}')  # killed before its signature
    assert finish_interrupted_copy(str(exp)) == []
    assert (exp / name).read_text() == '{"trial_data": []}'
    trust.verify(str(exp))
    trust.sign(str(staged))  # had the save been signed, its copy would be finished
    assert finish_interrupted_copy(str(exp)) == [str(exp / name)]
    trust.verify(str(exp))


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_signing_key_others_can_read_or_write_is_refused_in_one_line(tmp_path, monkeypatch, capsys, mode):
    """Anyone who can read the key can sign state that resume would unpickle: it is refused, not used."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "me"))
    exp = _folder(tmp_path, pickle.dumps({"benign": 1}))
    trust.sign(str(exp))
    key = tmp_path / "me" / "augtune" / trust.KEY_FILE
    key.chmod(mode)
    with pytest.raises(trust.Untrusted, match=f"readable or writable by others \\(mode {mode:o}\\)"):
        trust.key()
    assert main(["resume", str(exp)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "chmod 600" in err[0]
    key.chmod(0o600)
    trust.verify(str(exp))  # the same key, private again: accepted


def test_a_signing_key_that_is_a_link_is_refused_and_a_planted_temporary_never_followed(tmp_path,
                                                                                         monkeypatch):
    import os

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "me"))
    folder = tmp_path / "me" / "augtune"
    folder.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (folder / f".{trust.KEY_FILE}.{os.getpid()}").symlink_to(victim)  # where the first key is written
    made = trust.key()
    assert len(made) == 32 and victim.read_bytes() == b"keep me"
    (folder / trust.KEY_FILE).unlink()
    (folder / trust.KEY_FILE).symlink_to(victim)
    with pytest.raises(trust.Untrusted, match="symbolic link"):
        trust.key()
