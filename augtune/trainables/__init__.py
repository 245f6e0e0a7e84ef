"""The one training loop and its wrappers (in-process run; the Ray Train trainable builds on it).

Names are imported lazily so that `augtune.config` can use the phase parser without importing
torch models, data and evaluation.
"""
from importlib import import_module

_NAMES = {"NonFiniteLoss": "loop", "Trainer": "loop", "parse_phases": "phases", "train_run": "run"}

__all__ = list(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(import_module(f"augtune.trainables.{_NAMES[name]}"), name)
    raise AttributeError(name)
