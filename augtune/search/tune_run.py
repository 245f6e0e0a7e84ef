"""The Tune run of an experiment, built in one place: a search is one entrant's, a compare every entrant's.

`search_run(plan)` and `compare_run(plan)` give a `TuneRun`, what `launch.drive` runs, new or resumed: what a
new run writes before Ray starts (`prepare`) and how it starts (`start`, a Tuner, given the records a
resume continues from: `augtune.search.resume`). Both starts build their Tuner with `tuner`, from each
entrant's search algorithm and scheduler (`entrant_search`), the repeat's chooser (`repeat.RepeatBest`,
`compare.BestOfEach`, `compare.RaceOfFinalists`) and one run config (`run_config`). A resume is a new Tune
run of the same experiment, never `Tuner.restore`. `run_search` and `run_compare` build and drive;
`launch` keeps Ray and the driving, `compare` the planning.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from augtune.config import Config, to_dict
from augtune.records import COMPARE_REPEAT, COMPARE_SEARCH, REPEAT_DIR, SEARCH_FILE
from augtune.search.compare import BestOfEach, ComparePlan, FirstSeedFigures, RaceOfFinalists
from augtune.search.experiment import optuna_storage, save_plan
from augtune.search.launch import drive
from augtune.search.plan import SearchPlan, trial_resources
from augtune.search.schedulers import scheduling
from augtune.search.storage import exists

__all__ = ["TuneRun", "compare_run", "entrant_search", "resume_search", "run_compare", "run_config",
           "run_search", "search_algorithm", "search_run", "tuner"]


def search_algorithm(search, choose, conc: int, scheduler=None, records=None, restart_errored: bool = False):
    """What Tune runs for a search and the repeat of its best (`repeat.SearchThenRepeat`, continuing
    `records` when resumed), and the scheduler: the search's own for its trials (ASHA), never one that
    stops a repeat run early."""
    from augtune.search.multiplex import EntrantsScheduler
    from augtune.search.repeat import SearchThenRepeat

    if scheduler is not None and not isinstance(scheduler, EntrantsScheduler):
        scheduler = EntrantsScheduler({None: scheduler})
    return SearchThenRepeat(search, choose, conc, records, restart_errored), scheduler


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
        from augtune.search.resume import read_records

        return read_records(self.path, self.searches, self.repeats, compare=None not in self.searches)


def search_trainable(plan: SearchPlan, on_completed: Optional[Callable] = None):
    """The trainable of a search's Tune run: its trials keep their records in the experiment folder (or
    URI), its repeat runs in `repeat_best/` of it; the repeat runs draw the end-of-run figures when there
    is a repeat phase, else the search's trials do (a figure per trial, NRCC's UMAP say, costs seconds to
    minutes each)."""
    from ray import tune

    from augtune.trainables.ray_trainable import tune_trial

    repeats = plan.cfg.search.repeat_best.top > 0
    trainable = tune.with_parameters(
        tune_trial, bases={None: plan.base}, experiments={None: plan.experiment},
        repeats=f"{plan.experiment}/{REPEAT_DIR}",
        on_completed=None if repeats else on_completed, on_repeat_completed=on_completed,
        tune_run=plan.experiment,
    )
    return tune.with_resources(trainable, trial_resources(plan.cfg))


def run_config(cfg: Config, name: str, storage: str, callbacks: list, folders: Optional[dict] = None,
                repeats: Optional[str] = None):
    """`folders`, `repeats`: where the records of a Tune run's trials are when not in Tune's folder of them:
    a compare's entrants' searches, the repeat runs (`SettleRecords`). A compare's Tune run (`folders`
    given) is nested in its experiment, and logged as it."""
    from ray import tune

    from augtune.search.callbacks import SettleRecords
    from augtune.search.loggers import logger_callbacks

    return tune.RunConfig(
        name=name, storage_path=storage, verbose=0,  # augtune's own progress lines instead of Tune's tables
        failure_config=tune.FailureConfig(max_failures=cfg.search.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=scheduling(cfg).checkpoints_kept(cfg)),
        callbacks=[SettleRecords(folders, repeats),
                   *logger_callbacks(cfg, storage, name, nested=bool(folders)), *callbacks],
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

    from augtune.search.experiment import STUDY_NAME
    from augtune.search.resume import settle_study

    try:
        study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    except KeyError:  # no study: a new search, or its driver stopped before it asked for a trial
        return {}, 0
    return settle_study(study, held, metric), len(study.trials)


def tuner(trainable, cfg: Config, search, choose, conc: int, scheduler, param_space: dict,
          num_samples: int, config, records=None, restart_errored: bool = False) -> tuple:
    """The Tuner of a run (new, or continuing `records`), its search algorithm and the callback that keeps
    each trial's status at Tune's last step: `search`'s trials, then the repeat runs `choose` picks, in one
    run (`search_algorithm`), on the search metric, its processes reused from trial to trial, each trial a
    resume makes again in its own folder (`adapters.trial_folder`)."""
    from ray import tune

    from augtune.search.adapters import trial_folder
    from augtune.search.callbacks import ContinueResultLog, StepStatuses

    search_alg, sched = search_algorithm(search, choose, conc, scheduler, records, restart_errored)
    stepped = StepStatuses()
    config.callbacks = [*config.callbacks, ContinueResultLog(), stepped]
    for callback in config.callbacks:
        if hasattr(callback, "phases"):  # the progress line counts the repeat runs the algorithm chose
            callback.phases = search_alg
    return tune.Tuner(
        trainable, param_space=param_space,
        tune_config=tune.TuneConfig(metric=cfg.search.metric, mode=cfg.search.mode, search_alg=search_alg,
                                    scheduler=sched, num_samples=num_samples, reuse_actors=True,
                                    trial_dirname_creator=trial_folder),
        run_config=config), search_alg, stepped


# -- a search -------------------------------------------------------------------------------------------

def search_run(plan: SearchPlan, on_completed: Optional[Callable] = None,
               callbacks: Optional[list] = None) -> TuneRun:
    """The Tune run of a search and, when asked, the repeat of its best configurations (`on_completed`:
    what each completed trial runs in its folder, e.g. the CLI's end-of-run figures)."""
    trainable = search_trainable(plan, on_completed)

    def start(conc: int, log: Callable[[str], None], records=None, restart_errored: bool = False):
        from augtune.search.repeat import RepeatBest

        cfg = plan.cfg
        rb = cfg.search.repeat_best
        log(f"search {plan.experiment}: {cfg.search.algorithm}, {cfg.search.num_samples} samples, "
            f"{conc} trial(s) at a time, optimising {cfg.search.metric} ({cfg.search.mode})"
            + (f"; then the best {rb.top}" + (f" of each {rb.per}" if rb.per else "")
               + f" on {len(rb.seeds)} seed(s)" if rb.top else ""))
        held = records.search.get(None) if records is not None else None
        search, param_space, own = entrant_search(plan, conc, held, restart_errored)
        return tuner(trainable, cfg, search, RepeatBest(to_dict(cfg)), conc, own, param_space,
                     cfg.search.num_samples,
                     run_config(cfg, plan.name, plan.storage, callbacks or [],
                                repeats=f"{plan.experiment}/{REPEAT_DIR}"), records, restart_errored)

    return TuneRun(plan.experiment, plan.experiment, plan.cfg, lambda: save_plan(plan), start,
                   exists(f"{plan.experiment}/{SEARCH_FILE}"), {None: plan.experiment},
                   f"{plan.experiment}/{REPEAT_DIR}", plan.address, plan.dashboard)


def run_search(plan: SearchPlan, log: Callable[[str], None] = print, on_completed: Optional[Callable] = None,
               callbacks: Optional[list] = None, restart_errored: bool = False) -> None:
    """Start a search, or continue it from its records (`augtune resume`): finish the search, then (in
    the same Tune run, and only then) the repeat of the whole search's best."""
    drive(search_run(plan, on_completed, callbacks), log, restart_errored)


resume_search = run_search  # one path: `drive` continues from the records when the plan is there


# -- a compare ------------------------------------------------------------------------------------------

def compare_run(plan: ComparePlan, on_completed=None, callbacks: Optional[list] = None):
    """The one Tune run of a compare (`search/`): every entrant's search, then the repeat of every
    entrant's best configuration on the shared seeds (`augtune.search.repeat`). Only the repeat's runs of
    the first seed draw the methods' end-of-run figures (`on_completed`): they are the runs the report
    shows."""
    from ray import tune

    from augtune.records import COMPARE_FILE
    from augtune.trainables.ray_trainable import tune_trial

    first = plan.plans[0]
    cfg = first.cfg
    path = f"{plan.experiment}/{COMPARE_SEARCH}"
    repeats = f"{plan.experiment}/{COMPARE_REPEAT}"
    folders = {p.name: p.experiment for p in plan.plans}
    figures = FirstSeedFigures(on_completed, cfg.search.repeat_best.seeds[0]) if on_completed else None
    race = plan.cfg.compare.race
    trainable = tune.with_resources(
        tune.with_parameters(tune_trial, bases={p.name: p.base for p in plan.plans},
                             experiments=folders, repeats=repeats, on_repeat_completed=figures,
                             tune_run=path),
        trial_resources(cfg),
    )

    def prepare() -> None:
        plan.save()
        for p in plan.plans:
            save_plan(p)

    def start(conc: int, log: Callable[[str], None], records=None, restart_errored: bool = False):
        from augtune.search.multiplex import EntrantsScheduler, EntrantsSearch

        entrants, schedulers = {}, {}
        for p in plan.plans:
            held = records.search.get(p.name) if records is not None else None
            search, constants, own = entrant_search(p, conc, held, restart_errored)
            entrants[p.name] = (search, constants, p.cfg.search.num_samples)
            if own is not None:
                schedulers[p.name] = own  # PBT's perturbations: the entrant's own domains
        then = (f"a race of each entrant's best {race.finalists} on {race.min_seeds} to "
                f"{race.max_seeds} seeds" if race.enabled
                else f"each entrant's best on {len(cfg.search.repeat_best.seeds)} seeds")
        log(f"search {path}: {len(plan.plans)} entrants x {cfg.search.num_samples} trials, {conc} at a "
            f"time, optimising {cfg.search.metric} ({cfg.search.mode}); then {then}")
        choose = RaceOfFinalists.of(plan) if race.enabled else BestOfEach.of(plan)
        populations = {p.name for p in plan.plans if scheduling(p.cfg).population}  # live whole
        return tuner(trainable, cfg, EntrantsSearch(entrants, conc, populations), choose, conc,
                     EntrantsScheduler(schedulers), {}, sum(p.cfg.search.num_samples for p in plan.plans),
                     run_config(kept(cfg, plan), COMPARE_SEARCH, plan.experiment, callbacks or [], folders,
                                repeats), records, restart_errored)

    return TuneRun(plan.experiment, path, cfg, prepare, start, exists(f"{plan.experiment}/{COMPARE_FILE}"),
                   folders, repeats, first.address, first.dashboard)


def kept(cfg: Config, plan: ComparePlan) -> Config:
    """`cfg` keeping as many checkpoints per trial as its most demanding entrant needs (Tune keeps one
    number for the run): a PBT entrant's donor checkpoint must outlive its copy."""
    most = max(scheduling(p.cfg).checkpoints_kept(p.cfg) for p in plan.plans)
    return replace(cfg, search=replace(cfg.search, keep_checkpoints=most))


def run_compare(plan: ComparePlan, log: Callable[[str], None] = print, on_completed=None,
                callbacks: Optional[list] = None, restart_errored: bool = False) -> None:
    """Start a compare, or continue it from its records (`augtune resume`)."""
    drive(compare_run(plan, on_completed, callbacks), log, restart_errored)
