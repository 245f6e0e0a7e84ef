"""Planning, launching, resuming and inspecting searches (Ray Tune + Optuna + schedulers).

`plan` checks everything before Ray starts; `experiment` owns an experiment folder (names, lock, plan
file, Optuna's journal); `resume` reads what a resume continues from (the records); `searchers` turns a
space into Tune/Optuna search algorithms; `schedulers` says what each scheduler needs; `tune_run` builds
the one Tune run of a search or a compare, which `launch`, the one driver, starts or resumes on Ray;
`repeat` runs the searches, then the repeat its chooser (`choosers`) picks; `compare` plans the methods
head to head; `adapters` is the one door to Ray's, Optuna's (and MLflow's callback's) private names;
`status` reads a search folder without Ray.
"""
from augtune.search.experiment import SearchFailed, SearchInterrupted
from augtune.search.tune_run import run_search
from augtune.search.plan import SearchPlan, load_plan, plan_config, plan_search

__all__ = ["SearchFailed", "SearchInterrupted", "SearchPlan", "load_plan", "plan_config", "plan_search",
           "run_search"]
