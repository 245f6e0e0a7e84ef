"""`search.loggers`: Ray Tune's own logger callbacks, with every run named by method and phase.

- tensorboard: `ray.tune.logger.TBXLoggerCallback` (Tune's default), event files in each trial's folder;
- wandb: `ray.air.integrations.wandb.WandbLoggerCallback` (`pip install 'augtune[wandb]'`): project
  $WANDB_PROJECT or `augtune`, group the search's experiment name, job type the phase (`search` or
  `repeat`), run name `<entrant> <phase> ...` (e.g. `simclr+pinda repeat seed=2 (0918ae0b)`); the
  run files of a local experiment go to `<experiment>/wandb` ($WANDB_MODE=offline keeps them there,
  for `wandb sync` later);
- mlflow: `ray.air.integrations.mlflow.MLflowLoggerCallback` (`pip install 'augtune[mlflow]'`): tracking
  URI $MLFLOW_TRACKING_URI, else for a local experiment `sqlite:///<experiment>/mlflow.db`; MLflow
  experiment the search's experiment name; run name as W&B's, tags `augtune.entrant`, `augtune.phase`.

Tune's CSV and JSON loggers (`progress.csv`, `result.json`: what Tune's analysis reads) are always on;
Tune's automatic loggers are switched off so that TensorBoard is written only when asked for. A logger
whose package is missing is refused by `check_loggers` before Ray starts, naming the extra to install.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

from augtune.config import Config, ConfigError
from augtune.storage import is_uri

# logger -> (the module it needs, the pip requirement that brings it)
PACKAGES = {"tensorboard": ("tensorboardX", "tensorboardX"),  # comes with ray[tune]
            "wandb": ("wandb", "augtune[wandb]"), "mlflow": ("mlflow", "augtune[mlflow]")}


def check_loggers(cfg: Config) -> None:
    """Refuse, in one line, a logger whose package is not installed (before Ray starts)."""
    for name in cfg.search.loggers:
        module, requirement = PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"search.loggers: {name} needs the {module} package; install it with "
                              f"pip install '{requirement}'")


def _experiment(storage: str, name: str, nested: bool) -> tuple[str, str]:
    """(location, name) of the experiment a Tune run belongs to: a Tune run `nested` in its experiment (a
    compare's `search/`, its entrants' searches and repeat) is logged with it."""
    if nested:
        return storage.rstrip("/"), storage.rstrip("/").rsplit("/", 1)[-1]
    return f"{storage.rstrip('/')}/{name}", name


def only_chosen_loggers() -> None:
    """Tune adds CSV, JSON and TensorBoard loggers to every run unless told not to: augtune passes the
    ones it wants itself (a resumed run gets back the callbacks it was started with)."""
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"


def logger_callbacks(cfg: Config, storage: str, name: str, nested: bool = False) -> list[Any]:
    """The Tune callbacks of `search.loggers` for the Tune run `name` in `storage` (`nested`: the run is a
    part of the experiment in `storage`, as a compare's `search/` is)."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    only_chosen_loggers()
    location, experiment = _experiment(storage, name, nested)
    local = None if is_uri(location) else location
    out: list[Any] = [CSVLoggerCallback(), JsonLoggerCallback()]
    for logger in cfg.search.loggers:
        if logger == "tensorboard":
            from ray.tune.logger import TBXLoggerCallback

            out.append(TBXLoggerCallback())
        elif logger == "wandb":
            from augtune.search.loggers.wandb_logger import WandbByMethod

            out.append(WandbByMethod(cfg, experiment, local))
        elif logger == "mlflow":
            from augtune.search.loggers.mlflow_logger import MLflowByMethod

            out.append(MLflowByMethod(cfg, experiment, local))
    return out
