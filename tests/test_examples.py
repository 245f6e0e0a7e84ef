"""Every committed example config is valid as it stands: the README and the notes point at them."""
from __future__ import annotations

from pathlib import Path

import pytest

from augtune.config import load_config

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


def test_there_are_examples():
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_is_valid(path, tmp_path):
    cfg = load_config(path, [])
    if cfg.search.space is not None:  # a search: its space, trials, metric and data, as `augtune search` checks
        from augtune.search.launch import plan_search

        plan = plan_search(path, [], storage=str(tmp_path))
        assert plan is not None
