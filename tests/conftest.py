"""What the tests share: the CPU (a GPU only for the GPU tests, with AUGTUNE_TEST_GPU=1), tiny
networks, one torch thread for tiny tensors, a cache of the session, and one Ray for the CLI tests that
do not kill their driver.

The data cache (`$XDG_CACHE_HOME/augtune`: prepared data shared per node, numba's kernels) and the config
home (`$XDG_CONFIG_HOME`) go to folders of this test session, inherited by every CLI and Ray process a
test starts: the suite never reads or fills the user's own, and a run of it starts from nothing, as CI
does.
"""
from __future__ import annotations

import collections
import contextlib
import os
import signal
import shutil

import pytest

# The suite trains on the CPU, as CI does, on a machine with a GPU too: `train.device: auto` would take
# the GPU, with bf16 autocast and other kernels, and change numbers the tests pin (bitwise resumes, DDP
# against one process). AUGTUNE_TEST_GPU=1 leaves the GPU visible, for the GPU tests (`needs_gpu`: `-k gpu`).
GPU_TESTS = os.environ.get("AUGTUNE_TEST_GPU") == "1"
if not GPU_TESTS:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch's first look at CUDA; inherited by Ray's workers

# Ray on loopback only, as a local search holds it (augtune.search.launch.hold_to_loopback): read when Ray is
# imported, so set before any test imports it, and inherited by every process the suite starts
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import torch  # noqa: E402

from augtune import scratch  # noqa: E402

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU and AUGTUNE_TEST_GPU=1 (without it the suite hides any GPU)" if not GPU_TESTS
    else "needs a CUDA GPU (none on this machine)",
)

# The smallest networks the tests train: an MLP for vectors, a CNN for images (every base's heads)
TINY_MLP = {"backbone": "mlp", "hidden_dim": 32, "num_layers": 2, "embed_dim": 16, "proj_hidden_dim": 16,
            "proj_dim": 8, "pred_hidden_dim": 16}
TINY_CNN = {"backbone": "cnn", "width": 4, "proj_hidden_dim": 16, "proj_dim": 8, "pred_hidden_dim": 16}

# in this process's scratch: gone when the session is, even one killed before it could unconfigure
_CACHE = str(scratch.scratch_dir("test-cache-"))
_CONFIG = str(scratch.scratch_dir("test-config-"))  # no test reads or writes the user's config home


def pytest_configure(config):
    os.environ["XDG_CACHE_HOME"] = _CACHE
    os.environ["XDG_CONFIG_HOME"] = _CONFIG


def pytest_collection_modifyitems(config, items):
    """The files with the most Ray tests first (then the most slow ones), each file's tests in their order:
    the two test processes (`-n 2 --dist loadfile --no-loadscope-reorder`) take whole files in this order,
    so the long ones start first and short ones fill in at the end (longest first). pytest-xdist's own
    order puts the files with the most tests first, which left the killed-driver tests, few but long, for
    the end."""
    ray, slow = collections.Counter(), collections.Counter()
    for item in items:
        ray[item.path] += item.get_closest_marker("ray") is not None
        slow[item.path] += item.get_closest_marker("slow") is not None
    items.sort(key=lambda item: (-ray[item.path], -slow[item.path]))  # stable: every other order stays


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE, ignore_errors=True)
    shutil.rmtree(_CONFIG, ignore_errors=True)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread (on a shared 2-core machine torch's spinning threads made them up
    to 50x slower); the count is restored after the module."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def sigkill_driver(driver) -> None:
    """SIGKILL a driver process (a crash, the OOM killer), then its process group: its local Ray, and
    nothing else (a driver that is no group leader has none of its own)."""
    if driver.poll() is None:
        driver.send_signal(signal.SIGKILL)
    driver.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(driver.pid, signal.SIGKILL)


# The shared Ray's process: a head node as a local search's Ray is (every CPU, no dashboard, no metrics, on
# loopback), its address on a line of its own, stopped on SIGTERM. In a process of its own: a cluster made in
# this one would leave Ray's key-value client here, and Tune's in-process objects would then connect to it.
_SHARED_RAY = """
import os, signal, sys, time
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": os.cpu_count() or 1, "include_dashboard": False,
    "_system_config": {"enable_metrics_collection": False}})
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
try:
    print("address:", cluster.address, flush=True)
    while True:
        time.sleep(3600)
finally:
    cluster.shutdown()
"""


@pytest.fixture(scope="session")
def shared_ray(tmp_path_factory) -> str:
    """The address of one Ray for the session, for the CLI runs of tests that do not kill their driver
    (`--address`): Ray's start and stop, ~5-10 s of every local search, paid once. A test that kills its
    driver, or whose point is what a local search prints while its Ray starts, keeps a Ray of its own."""
    import subprocess
    import sys
    import time

    said = tmp_path_factory.mktemp("shared-ray") / "out.txt"
    with said.open("w") as out:
        ray = subprocess.Popen([sys.executable, "-c", _SHARED_RAY], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline, address = time.monotonic() + 300, []
        while not address:
            if ray.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the shared Ray did not start: {said.read_text()[-2000:]}")
            time.sleep(0.1)
            address = [line.split()[1] for line in said.read_text().splitlines()
                       if line.startswith("address: ")]
        yield address[0]
    finally:
        ray.terminate()
        try:
            ray.wait(timeout=60)
        except subprocess.TimeoutExpired:
            ray.kill()
            ray.wait()
