"""Writes never go through a planted link (`records.write_atomic`), `export --out` never replaces a file
unasked, and the refusals that come before anything is written (issue 40.6, in part)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

import augtune
from augtune import cli
from augtune.config import ConfigError
from augtune.records import RECORD_FILE, SEARCH_FILE, LinkRefused, write_atomic, write_json_atomic


def test_write_atomic_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a.json"
    write_json_atomic(path, {"x": 1})
    write_atomic(path, "second")
    assert path.read_text() == "second" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_link_at_the_final_name_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "users_file.txt"
    target.write_text("precious")
    link = tmp_path / "report.html"
    link.symlink_to(target)
    with pytest.raises(LinkRefused, match="is a symbolic link"):
        write_atomic(link, "<html>")
    assert target.read_text() == "precious" and link.is_symlink()


def test_a_link_planted_at_the_temporary_name_is_never_followed(tmp_path):
    target = tmp_path / "users_file.txt"
    target.write_text("precious")
    path = tmp_path / "record.json"
    for attempt in range(3):  # every name the writer would try first
        (tmp_path / f".{path.name}.tmp{os.getpid()}-{attempt}").symlink_to(target)
    write_json_atomic(path, {"ok": True})
    assert target.read_text() == "precious" and '"ok": true' in path.read_text()


def test_a_reports_planted_link_is_refused_and_its_target_untouched(tmp_path):
    from test_verdict import runs  # noqa: I001 (a sibling test module's fabricated records)

    from augtune.analysis.report import write_report
    from augtune.analysis.verdict import verdict

    target = tmp_path / "users_file.txt"
    target.write_text("precious")
    (tmp_path / "report.html").symlink_to(target)
    recs = runs({"a": [0.9, 0.91, 0.92], "b": [0.8, 0.81, 0.82]})
    with pytest.raises(LinkRefused):
        write_report(tmp_path, verdict(recs, ("knn_acc",)), recs, [], {})
    assert target.read_text() == "precious"


def _runs_folder(tmp_path: Path) -> Path:
    import json

    folder = tmp_path / "runs" / "r1"
    folder.mkdir(parents=True)
    (folder / RECORD_FILE).write_text(json.dumps({
        "format": "augtune.record/1", "status": "completed", "method": "simclr", "dataset": "digits",
        "seed": 0, "config": {"train": {"seed": 0}}, "final": {"knn_acc": 0.9}, "epochs": []}))
    return tmp_path / "runs"


def test_export_out_refuses_to_replace_a_file_without_force(tmp_path, capsys):
    runs = _runs_folder(tmp_path)
    out = tmp_path / "table.md"
    out.write_text("mine")
    assert cli.main(["export", str(runs), "--out", str(out)]) == 2
    assert "exists; add --force" in capsys.readouterr().err and out.read_text() == "mine"
    assert cli.main(["export", str(runs), "--out", str(out), "--force"]) == 0
    assert "simclr" in out.read_text()
    link = tmp_path / "link.md"
    link.symlink_to(out)
    assert cli.main(["export", str(runs), "--out", str(link), "--force"]) == 2
    assert "symbolic link" in capsys.readouterr().err


def test_export_schedule_of_a_search_without_a_schedule_is_one_line(tmp_path, capsys):
    exp = _runs_folder(tmp_path)
    (exp / SEARCH_FILE).write_text(yaml.safe_dump({
        "config": {"search": {"metric": "knn_acc", "mode": "max", "scheduler": "asha"}},
        "base": {}, "name": "runs", "storage": str(tmp_path)}))
    assert cli.main(["export", str(exp), "--schedule"]) == 2
    err = capsys.readouterr().err
    assert "searched with scheduler asha" in err and "no schedule to replay" in err and err.count("\n") == 1


@pytest.mark.parametrize("key, value, match", [
    ("compare.time_budget", "800h", "more than 30 days"),
    ("compare.race.finalists", 51, "compare.race.finalists"),
])
def test_budgets_and_finalists_have_upper_bounds(key, value, match):
    with pytest.raises(ConfigError, match=match):
        augtune.config_from({key: value})
    assert augtune.config_from({"compare.time_budget": "720h", "compare.race.finalists": 50})


# Every place in the package that opens a file for writing, with why it may: everything else goes through
# `records.atomic_file` / `write_atomic` (a temporary with O_EXCL | O_NOFOLLOW, renamed over the name).
WRITES_ALLOWED = {
    ("augtune/records.py", "os.open("): "atomic_file itself",
    ("augtune/records.py", "os.replace("): "atomic_file itself",
    ("augtune/plots/__init__.py", ".savefig("): "into an atomic_file",
    ("augtune/analysis/report.py", ".savefig("): "into a BytesIO",
    ("augtune/trainables/loop.py", "torch.save("): "into an atomic_file",
    ("augtune/search/experiment.py", "os.open("): "the lock: O_CREAT | O_EXCL never follows a link",
    ("augtune/search/experiment.py", "json.dump("): "into the lock it created with O_EXCL",
    ("augtune/search/callbacks.py", "open("): "Tune's local copy of a resumed trial's result log, in the "
                                              "driver's own staging folder, appended to as Tune does",
    ("augtune/data/cache.py", "open("): "locks, and meta.json in a folder of its own, renamed whole",
    ("augtune/data/cache.py", ".write_text("): "meta.json in a temporary folder of its own, renamed whole",
    ("augtune/data/cache.py", "os.rename("): "that folder, renamed whole",
    ("augtune/trainables/references.py", "open("): "a lock file, opened, never written",
    ("augtune/cli.py", "os.open("): "/dev/null over stdout on a closed pipe",
}
_WRITE_CALL = (r"\.write_text\(|\.write_bytes\(|(?<![\w.])open\([^)]*['\"](w|wb|a|ab|x|xb)['\"]|os\.open\("
               r"|\.savefig\(|torch\.save\(|json\.dump\(|os\.replace\(|os\.rename\(")


def test_every_write_in_the_package_goes_through_atomic_file_or_is_named_with_its_reason():
    """The sweep of issue 40.6: a new write path that is not `atomic_file` fails here until it is one, or
    is named above with why it cannot follow a planted link."""
    import re

    root = Path(__file__).resolve().parents[1]
    found = set()
    for path in sorted((root / "augtune").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for line in path.read_text().splitlines():
            for m in re.finditer(_WRITE_CALL, line):
                call = m.group(0).split("[")[0]
                call = "open(" if call.startswith("open(") else call
                found.add((rel, call))
    assert found - set(WRITES_ALLOWED) == set(), "writes that bypass records.atomic_file"
    assert set(WRITES_ALLOWED) - found == set(), "allowed writes that are gone: drop them from the list"


def test_the_helpers_writes_keep_the_full_disks_message_and_leave_no_temporary(tmp_path):
    from augtune.records import atomic_file

    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"previous")
    with pytest.raises(OSError, match="No space left"):
        with atomic_file(path) as f:
            f.write(b"half")
            raise OSError(28, "No space left on device")
    assert path.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
