"""The Tune run of an experiment, built in one place: a search is a compare of one entrant.

`tune_run(plan)` gives a `TuneRun` of a search or a compare, what `launch.drive` runs, new or resumed: what a
new run writes before Ray starts (`prepare`) and how it starts (`start`, a Tuner, given the records a
resume continues from: `augtune.search.resume`). Its Tuner runs every entrant's search algorithm
and scheduler (`entrant_search`) as one (`multiplex`), then the repeat its chooser picks (`choosers`),
under one run config (`run_config`). A resume is a new Tune run of the same experiment, never
`Tuner.restore`. `run_search` builds and drives; `launch` keeps Ray and the driving, `compare` the planning.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from augtune.config import Config, to_dict
from augtune.records import COMPARE_FILE, COMPARE_REPEAT, COMPARE_SEARCH, REPEAT_DIR, SEARCH_FILE
from augtune.search.choosers import BestOfEach, FirstSeedFigures, RaceOfFinalists, RepeatBest
from augtune.search.compare import ComparePlan
from augtune.search.experiment import STUDY_NAME, optuna_storage, save_plan
from augtune.search.launch import drive
from augtune.search.loggers import logger_callbacks
from augtune.search.plan import SearchPlan, trial_resources
from augtune.search.resume import read_records, settle_study
from augtune.search.schedulers import scheduling
from augtune.storage import exists

__all__ = ["TuneRun", "entrant_search", "run_config", "run_search", "tune_run"]


@dataclass(frozen=True)
class TuneRun:
    """One experiment as Tune runs it: a search (one entrant) or a compare (one per method).

    `prepare()` writes what a new run starts from (its plan files: a folder `augtune resume` takes, even
    when Ray then fails to start); `start(concurrency, log, records, restart_errored)` makes the Tuner, its
    search algorithm and the callback that keeps each trial's status at Tune's last step; `records`
    (`resume.Records`, read by `read`) is what a resumed run continues, None for a new one."""

    experiment: str  # the experiment's folder or URI: the lock is here
    path: str  # Tune's run in it: the experiment itself (a search) or its `search/` (a compare)
    cfg: Config  # sizes the local Ray and the concurrency
    prepare: Callable[[], None]
    start: Callable[..., tuple]
    resuming: bool  # its plan is in the folder already: `augtune resume` (or a start Ray refused)
    searches: dict  # entrant (None: a search's own) -> the folder its trials' records are in
    repeats: str  # the folder the repeat runs' records are in
    address: Optional[str] = None
    dashboard: bool = False

    def read(self):
        """What a resume continues from: every trial's record (`resume.read_records`)."""
        return read_records(self.path, self.searches, self.repeats, compare=None not in self.searches)


def run_config(cfg: Config, name: str, storage: str, callbacks: list, folders: dict, repeats: str,
               nested: bool = False):
    """`folders`, `repeats`: where the records of a Tune run's trials are (`SettleRecords`): each search's
    (by entrant; a search's own, None, is its Tune run) and the repeat runs'. A compare's Tune run
    (`nested`) is a part of its experiment, and logged as it."""
    from ray import tune

    from augtune.search.callbacks import SettleRecords

    return tune.RunConfig(
        name=name, storage_path=storage, verbose=0,  # augtune's own progress lines instead of Tune's tables
        failure_config=tune.FailureConfig(max_failures=cfg.search.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=scheduling(cfg).checkpoints_kept(cfg)),
        callbacks=[SettleRecords(folders, repeats),
                   *logger_callbacks(cfg, storage, name, nested=nested), *callbacks],
    )


def entrant_search(plan: SearchPlan, conc: int, held: Optional[list] = None,
                   restart_errored: bool = False) -> tuple[Any, dict, Any]:
    """One entrant's (a search's) search algorithm, the constants of its space (a search's param_space) and
    its Tune scheduler (None: FIFO). The algorithm holds the concurrency limit, the scheduler's live trials
    (`schedulers`), and continues the trials a resume holds (`held`: `resume.Held`, read from the
    entrant's records; `searchers.Continuing`)."""
    from augtune.search.searchers import Continuing, limited, searcher
    from augtune.spaces import resolve_space

    own = scheduling(plan.cfg)
    space = resolve_space(plan.cfg.search, plan.modality)
    held = list(held or ())
    storage = optuna_storage(plan)
    # a new search has no study yet; a resumed one settles the trials its journal left running
    numbers, asked = settled(storage, held, plan.cfg.search.metric) if storage is not None else ({}, 0)
    algorithm, constants = searcher(plan.cfg, space, storage, done=[h.made for h in held], asked=asked)
    live = own.live_trials(plan.cfg, conc)
    optuna = algorithm if hasattr(algorithm, "adopt") else None
    again = [h.again(restart_errored) for h in held if not h.ended]
    continuing = Continuing(limited(algorithm, live), live, again, [h.made for h in held], len(held), optuna,
                            numbers)
    return continuing, constants, own.build(plan.cfg, space)


def settled(storage, held: list, metric: str) -> tuple[dict[str, int], int]:
    """Optuna's study in `storage`, its trials left running settled (`resume.settle_study`): (the trials
    made again -> the study's trial of each, the trials the study holds). ({}, 0) with no study yet."""
    import optuna

    try:
        study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    except KeyError:  # no study: a new search, or its driver stopped before it asked for a trial
        return {}, 0
    return settle_study(study, held, metric), len(study.trials)


# -- the one builder -------------------------------------------------------------------------------------

def tune_run(plan, on_completed: Optional[Callable] = None, callbacks: Optional[list] = None) -> TuneRun:
    """The Tune run of a search (`SearchPlan`) or a compare (`ComparePlan`): a search is a compare of one
    entrant, keyed None, in its experiment folder itself; a compare's entrants share `search/`. Every
    entrant's search (`entrant_search`) runs in one `EntrantsSearch`, then the repeat its chooser picks: a
    search's best configurations (`choosers.RepeatBest`), each compare entrant's (`BestOfEach`) or a race of
    them (`RaceOfFinalists`). `on_completed` (what a completed trial runs in its folder, the CLI's
    end-of-run figures): a search's repeat runs (its trials when it has no repeat), a compare's runs of the
    first seed."""
    from ray import tune

    from augtune.trainables.ray_trainable import tune_trial

    experiment, compare, where = plan.experiment, isinstance(plan, ComparePlan), plan.plans[0]
    plans = {p.name: p for p in plan.plans} if compare else {None: plan}
    searches = {k: p.experiment for k, p in plans.items()}  # where each entrant's trials keep their records
    if compare:
        cfg = kept(where.cfg, plan)
        path, repeats = f"{experiment}/{COMPARE_SEARCH}", f"{experiment}/{COMPARE_REPEAT}"
        name, storage = COMPARE_SEARCH, experiment
        resuming = exists(f"{experiment}/{COMPARE_FILE}")
        choose = RaceOfFinalists.of(plan) if plan.cfg.compare.race.enabled else BestOfEach.of(plan)
        on_trial = None
        on_repeat = on_completed and FirstSeedFigures(on_completed, cfg.search.repeat_best.seeds[0])
    else:
        cfg = plan.cfg
        path, repeats = experiment, f"{experiment}/{REPEAT_DIR}"
        name, storage = plan.name, plan.storage  # its trials' records are in its Tune run
        resuming = exists(f"{experiment}/{SEARCH_FILE}")
        choose = RepeatBest(experiment, to_dict(cfg))
        on_trial = None if cfg.search.repeat_best.top > 0 else on_completed
        on_repeat = on_completed
    trainable = tune.with_resources(
        tune.with_parameters(tune_trial, bases={k: p.base for k, p in plans.items()},
                             experiments=searches, repeats=repeats,
                             on_completed=on_trial, on_repeat_completed=on_repeat, tune_run=path),
        trial_resources(cfg),
    )

    def prepare() -> None:
        if compare:
            plan.save()
        for p in plans.values():
            save_plan(p)

    def start(conc: int, log: Callable[[str], None], records=None, restart_errored: bool = False):
        """The Tuner (new, or continuing `records`), its search algorithm and the callback that keeps each
        trial's status at Tune's last step: every entrant's search, then the repeat runs `choose` picks,
        in one run (`repeat.SearchThenRepeat`), on the search metric, its processes reused from trial to
        trial, each trial a resume makes again in its own folder (`adapters.trial_folder`)."""
        from augtune.search.adapters import trial_folder
        from augtune.search.callbacks import ContinueResultLog, StepStatuses
        from augtune.search.multiplex import EntrantsScheduler, EntrantsSearch
        from augtune.search.repeat import SearchThenRepeat

        entrants, schedulers = {}, {}
        for key, p in plans.items():
            held = records.search.get(key) if records is not None else None
            search, constants, own = entrant_search(p, conc, held, restart_errored)
            entrants[key] = (search, constants, p.cfg.search.num_samples)
            if own is not None:
                schedulers[key] = own  # ASHA's rungs, PBT's perturbations: the entrant's own
        log(describe_run(plan, path, conc))
        populations = {key for key, p in plans.items() if scheduling(p.cfg).population}  # live whole
        algorithm = SearchThenRepeat(EntrantsSearch(entrants, conc, populations), choose, conc, records,
                                     restart_errored)
        stepped = StepStatuses()
        config = run_config(cfg, name, storage, [*(callbacks or []), ContinueResultLog(), stepped], searches,
                            repeats, nested=compare)
        for callback in config.callbacks:
            if hasattr(callback, "phases"):  # the progress line counts the repeat runs the algorithm chose
                callback.phases = algorithm
        return tune.Tuner(
            trainable,  # no param_space: each entrant's constants are its search's (`EntrantsSearch`)
            tune_config=tune.TuneConfig(metric=cfg.search.metric, mode=cfg.search.mode, search_alg=algorithm,
                                        scheduler=EntrantsScheduler(schedulers),
                                        num_samples=sum(p.cfg.search.num_samples for p in plans.values()),
                                        reuse_actors=True, trial_dirname_creator=trial_folder),
            run_config=config), algorithm, stepped

    return TuneRun(experiment, path, cfg, prepare, start, resuming, searches, repeats, where.address,
                   where.dashboard)


def describe_run(plan, path: str, conc: int) -> str:
    """The line a run starts with: what it searches, how many trials at a time, then what it repeats."""
    s = plan.plans[0].cfg.search
    aim = f"{conc} trial(s) at a time, optimising {s.metric} ({s.mode})"
    if not isinstance(plan, ComparePlan):
        rb = s.repeat_best
        return (f"search {path}: {s.algorithm}, {s.num_samples} samples, {aim}"
                + (f"; then the best {rb.top}" + (f" of each {rb.per}" if rb.per else "")
                   + f" on {len(rb.seeds)} seed(s)" if rb.top else ""))
    race = plan.cfg.compare.race
    then = (f"a race of each entrant's best {race.finalists} on {race.min_seeds} to {race.max_seeds} seeds"
            if race.enabled else f"each entrant's best on {len(s.repeat_best.seeds)} seeds")
    return f"search {path}: {len(plan.plans)} entrants x {s.num_samples} trials, {aim}; then {then}"


def run_search(plan, log: Callable[[str], None] = print, on_completed: Optional[Callable] = None,
               callbacks: Optional[list] = None, restart_errored: bool = False) -> None:
    """Start a search or a compare, or continue it from its records (`augtune resume`: `drive` continues
    from them when the plan is in the folder): finish every search, then (in the same Tune run, and only
    then) the repeat of the best."""
    drive(tune_run(plan, on_completed, callbacks), log, restart_errored)



def kept(cfg: Config, plan: ComparePlan) -> Config:
    """`cfg` keeping as many checkpoints per trial as its most demanding entrant needs (Tune keeps one
    number for the run): a PBT entrant's donor checkpoint must outlive its copy."""
    most = max(scheduling(p.cfg).checkpoints_kept(p.cfg) for p in plan.plans)
    return replace(cfg, search=replace(cfg.search, keep_checkpoints=most))
