"""augtune's version: the one place it is written (pyproject.toml reads it; this module imports nothing)."""
__version__ = "0.4.0"
