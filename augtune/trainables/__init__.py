"""The one training loop and the two ways it runs: in this process (`run`) and as a Ray trial
(`ray_trainable`), both keeping the run's record through `run.RunLife`."""
from augtune.trainables.loop import NonFiniteLoss, Trainer
from augtune.trainables.run import train_run

__all__ = ["NonFiniteLoss", "Trainer", "train_run"]
