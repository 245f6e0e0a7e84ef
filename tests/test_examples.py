"""Every committed example config is valid as it stands: the README and the notes point at them."""
from __future__ import annotations

from pathlib import Path

import pytest

from augtune.checks import check_config
from augtune.config import load_config
from augtune.plots import PLOTS

_ROOT = Path(__file__).resolve().parents[1] / "examples"
EXAMPLES = sorted([*_ROOT.glob("*.yaml"), *_ROOT.glob("papers/*.yaml")])  # cluster/: Kubernetes manifests
# Debian's dataset-fashion-mnist; CI installs it (.ci/run), a fresh machine may not have it
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")


def test_there_are_examples():
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_is_valid(path, tmp_path):
    cfg = check_config(load_config(path, []), PLOTS)
    if "fashion_mnist" in path.read_text() and not FASHION_MNIST.is_file():
        pytest.skip(f"{path.name} reads Fashion-MNIST and {FASHION_MNIST.parent} is absent "
                    "(apt-get install -y dataset-fashion-mnist)")
    missing = [p for p in (cfg.dataset.path, cfg.dataset.root) if p and not Path(p).exists()]
    # a cluster's data (ImageNet-100, CIFAR-10): not on this machine
    if missing and cfg.search.space is not None:
        pytest.skip(f"{path.name} reads {missing[0]}, which this machine does not have")
    # a search: its space, trials, metric and data, as `augtune search` checks
    if cfg.search.space is not None:
        from augtune.search import plan_search

        plan = plan_search(path, [], storage=str(tmp_path))
        assert plan is not None


def test_the_cluster_examples_launch_example_configs():
    """examples/cluster/ (a KubeRay RayJob, a SLURM script; checked in tests/test_docs.py) launches
    configs of examples/, which the test above validates."""
    import re

    cluster = EXAMPLES[0].parent / "cluster"
    named = set()
    for path in cluster.iterdir():
        named |= set(re.findall(r"examples/(\w+\.yaml)", path.read_text(encoding="utf-8")))
    assert named, f"{cluster} names no example config"
    assert named <= {p.name for p in EXAMPLES}, sorted(named - {p.name for p in EXAMPLES})
