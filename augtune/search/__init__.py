"""Planning, launching, resuming and inspecting searches (Ray Tune + Optuna + schedulers).

`plan` checks everything before Ray starts; `searchers` turns a space into Tune/Optuna search
algorithms; `launch` runs, resumes and repeats on Ray; `compare` runs the methods head to head;
`status` reads a search folder without Ray.
"""
from augtune.search.launch import SearchFailed, SearchInterrupted, resume_search, run_search
from augtune.search.plan import SearchPlan, load_plan, plan_config, plan_search

__all__ = ["SearchFailed", "SearchInterrupted", "SearchPlan", "load_plan", "plan_config", "plan_search",
           "resume_search", "run_search"]
