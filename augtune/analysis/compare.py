"""A compare experiment's answer from its folder alone: verdict, importances and report (no
Ray)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from augtune.analysis.importance import format_importances, importances
from augtune.analysis.race import RaceState, failed_candidates, race_settings, replay
from augtune.analysis.report import write_report
from augtune.analysis.verdict import Verdict, flagged_candidates, load_compare_records, verdict
from augtune.records import COMPARE_FILE, REPORT_FILE, mode_of


@dataclass
class Answer:
    verdict: Verdict
    importances: dict[str, str]
    report: Path
    race: Optional[RaceState] = None


def compare_settings(exp_dir) -> dict:
    from augtune.config import safe_load

    path = Path(exp_dir) / COMPARE_FILE
    data = safe_load(path.read_text(encoding="utf-8"), str(path))
    return data["config"]


def race_of(cfg: dict, repeat: list[dict]) -> Optional[RaceState]:
    """The race of a compare (`compare.race`), rebuilt from its repeat records; None without
    one."""
    from augtune.config import from_dict

    typed = from_dict(cfg)
    settings = race_settings(typed.compare, typed.train.seed)
    if settings is None:
        return None
    return replay(settings, repeat, {**failed_candidates(repeat), **flagged_candidates(repeat)})


def answer(exp_dir, write: bool = True) -> Answer:
    """The verdict (over `compare.metrics`), each entrant's importances and `report.html`."""
    exp_dir = Path(exp_dir)
    cfg = compare_settings(exp_dir)
    c = cfg.get("compare", {})
    metrics = tuple(c.get("metrics") or ("knn_acc",))
    repeat, search = load_compare_records(exp_dir)
    race = race_of(cfg, repeat)
    unfinished = any(r.get("status") in ("running", "interrupted") for r in repeat + search) \
        or not repeat or (race is not None and race.stopped is None)
    v = verdict(repeat, metrics, alpha=float(c.get("alpha", 0.05)), search=search,
                unfinished=unfinished, race=race, margin=c.get("margin"), equal=str(c.get("equal", "epochs")))
    groups: dict[str, list[dict]] = {}
    for r in search:
        groups.setdefault(r.get("entrant") or r["method"], []).append(r)
    mode = mode_of(metrics[0])
    imps = {name: format_importances(name, importances(records, metrics[0], mode))
            for name, records in sorted(groups.items())}
    title = f"augtune compare: {exp_dir.name}"
    report = write_report(exp_dir, v, repeat, search, imps, title=title, mode=mode) if write \
        else exp_dir / REPORT_FILE
    return Answer(v, imps, report, race)
