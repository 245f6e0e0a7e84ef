"""Ray Tune's MLflow callback, its runs named by method and phase (imports mlflow: loaded only when asked)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ray.air.integrations.mlflow import MLflowLoggerCallback

from augtune.config import Config
from augtune.search.adapters import mlflow_run_of
from augtune.search.loggers.labels import trial_label


class MLflowByMethod(MLflowLoggerCallback):
    """`MLflowLoggerCallback` logging to $MLFLOW_TRACKING_URI (else the local experiment's `mlflow.db`),
    in an MLflow experiment named after the search's, runs named `<entrant> <phase> ... (<trial id>)`
    and tagged `augtune.entrant` / `augtune.phase`."""

    def __init__(self, cfg: Config, experiment: str, local: Optional[str]):
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None and local is not None:
            Path(local).mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{Path(local).resolve() / 'mlflow.db'}"
        super().__init__(tracking_uri=uri, experiment_name=experiment)
        self.cfg = cfg

    def log_trial_start(self, trial) -> None:
        entrant, phase, run_name = trial_label(trial.config, self.cfg, trial.trial_id)
        fixed = self.tags
        self.tags = {**(fixed or {}), "augtune.entrant": entrant, "augtune.phase": phase}
        try:
            new = mlflow_run_of(self, trial) is None
            super().log_trial_start(trial)  # names the run str(trial); renamed here, once
        finally:
            self.tags = fixed
        if new:
            from mlflow.tracking import MlflowClient

            MlflowClient(self.tracking_uri).update_run(mlflow_run_of(self, trial), name=run_name)
