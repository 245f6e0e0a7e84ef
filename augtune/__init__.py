"""augtune: which augmentation-learning method, with which hyperparameters, works on your data."""
__version__ = "0.3.0"
