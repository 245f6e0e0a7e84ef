"""Launching, resuming and inspecting searches (Ray Tune + Optuna + schedulers).

`plan_search` validates everything before Ray starts; `run_search` / `resume_search` run it;
`augtune.search.status` reads a search folder without Ray.
"""
from augtune.search.launch import SearchPlan, load_plan, plan_search, resume_search, run_search

__all__ = ["SearchPlan", "load_plan", "plan_search", "resume_search", "run_search"]
