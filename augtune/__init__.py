"""augtune: which augmentation-learning method, with which hyperparameters, works on your data."""
__version__ = "0.2.0"
