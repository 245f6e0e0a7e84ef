"""Ray Tune's W&B callback, its runs named by method and phase (imports wandb: loaded only when asked)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ray.air.integrations.wandb import WandbLoggerCallback

from augtune.config import Config
from augtune.search.loggers.labels import trial_label


class WandbByMethod(WandbLoggerCallback):
    """`WandbLoggerCallback` whose runs are grouped by the search experiment, typed by phase and named
    `<entrant> <phase> ... (<trial id>)`; the run files of a local experiment go to `<experiment>/wandb`."""

    def __init__(self, cfg: Config, experiment: str, local: Optional[str]):
        kwargs = {}
        if local is not None:  # W&B makes its `wandb/` folder in `dir`
            kwargs["dir"] = local
            Path(local).mkdir(parents=True, exist_ok=True)
        if os.environ.get("WANDB_MODE"):  # the logging actor may run where the driver's variable is unset
            kwargs["mode"] = os.environ["WANDB_MODE"]
        super().__init__(project=os.environ.get("WANDB_PROJECT") or "augtune", group=experiment, **kwargs)
        self.cfg = cfg

    def log_trial_start(self, trial) -> None:
        entrant, phase, run_name = trial_label(trial.config, self.cfg, trial.trial_id)
        # WandbLoggerCallback passes its own kwargs to wandb.init last, over the names it picks
        fixed = dict(self.kwargs)
        self.kwargs.update(name=run_name, job_type=phase, tags=[entrant, phase])
        try:
            super().log_trial_start(trial)
        finally:
            self.kwargs = fixed
