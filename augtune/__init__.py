"""augtune: which augmentation-learning method, with which hyperparameters, works on your data.

The Python API (`augtune.api`, for notebooks and scripts): `config_from`, `train`, `search`,
`compare`, `resume`, `load` and the objects they return. `import augtune` loads neither torch nor Ray:
each function imports what it needs when called.
"""
from augtune.api import Experiment, Run, compare, config_from, load, resume, search, train
from augtune.version import __version__

__all__ = ["Experiment", "Run", "__version__", "compare", "config_from", "load", "resume", "search", "train"]
