"""How a Tune trial is named in W&B and MLflow: by its entrant (method label) and phase."""
from __future__ import annotations

from augtune.config import Config, from_dict, method_label, set_values, to_dict
from augtune.records import REPEAT


def trial_label(trial_config: dict, cfg: Config, trial_id: str) -> tuple[str, str, str]:
    """(entrant, phase, run name) of a Tune trial from its config: `simclr+pinda`, `repeat`,
    `simclr+pinda repeat seed=2 (0918ae0b)`."""
    repeat = REPEAT in trial_config
    params = dict(trial_config[REPEAT] if repeat else trial_config)
    run_cfg = from_dict(set_values(to_dict(cfg), params))
    entrant, phase = method_label(run_cfg), "repeat" if repeat else "search"
    seed = f" seed={run_cfg.train.seed}" if repeat else ""
    return entrant, phase, f"{entrant} {phase}{seed} ({trial_id})"
