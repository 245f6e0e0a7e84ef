"""Resident memory of concurrent trials on Fashion-MNIST, and streaming `imagefolder` against in-memory.

    python benchmarks/memory.py [--part memory|stream|all] [--trials 1 2 4] [--steps 20]
                                [--per-class 600] [--image-size 32] [--workers 2] [--repeats 3]

memory: 1, 2 and 4 trials at once, each a fresh process (spawned, as Ray starts its workers) that loads
the full 60k/10k split, trains a small CNN for `--steps` steps with the real Trainer, then extracts the
backbone's features of the whole training split (as its end-of-run evaluation does: every sample read),
and holds still while its memory is read from /proc/<pid>/smaps_rollup. Two layouts side by side:
``float32`` (what every trial held before: its own float32 copy, converted here from the loaded uint8 the
way the old loaders did) and ``shared`` (now: uint8 in one memory-mapped file per node). RSS counts a
shared page in every process that maps it; PSS splits it between them (the sum over processes is what
the node holds); USS is the memory a process holds alone. "data PSS" is the PSS of the shared file's
mappings (0 for float32, whose copy is anonymous memory inside USS). The page cache that backs the shared
file is charged through PSS only while mapped; after the trials end it is reclaimable cache.

stream: samples/s of one training epoch on a JPEG tree written from Fashion-MNIST into /tmp (resized to
`--image-size`), in memory (decoded once, uint8) vs streamed (decoded per batch in `--workers` DataLoader
processes, and in the training process itself), both on the same model, medians of interleaved runs;
plus decoding alone (`--workers` processes, no training).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from pathlib import Path

FMNIST = Path("/usr/share/datasets/fashion-mnist")
MODEL = {"backbone": "cnn", "width": 8}


def _cfg(dataset: dict, batch: int = 256, epochs: int = 1):
    from augtune.config import from_dict

    train = {"epochs": epochs, "batch_size": batch, "num_threads": 1}
    return from_dict({"dataset": dataset, "model": MODEL, "train": train,
                      "eval": {"metrics": ["knn"], "references": False, "figures": []}})


# ---------------------------------------------------------------------------------------------
# memory of concurrent trials

def _trial(layout: str, shared_dir: str, steps: int, ready, release) -> None:
    import torch

    from augtune.data import as_float, load_dataset
    from augtune.eval import extract_features
    from augtune.trainables.loop import Trainer

    torch.set_num_threads(1)
    cfg = _cfg({"name": "fashion_mnist", "shared": layout == "shared", "shared_dir": shared_dir})
    data = load_dataset(cfg.dataset)
    if layout == "float32":  # the old layout: this process's own float32 copy, the uint8 one dropped
        data = dataclasses.replace(data, x_train=as_float(data.x_train), x_test=as_float(data.x_test))
    trainer = Trainer(cfg, data, log=lambda s: None)
    trainer.steps_per_epoch = steps  # a few steps of the real loop, not an epoch
    trainer.train_epoch()
    trainer.method.eval()
    extract_features(trainer.method.features, data.x_train, 1024, torch.device("cpu"))
    ready.put(os.getpid())
    release.wait()


def _smaps(pid: int, shared_dir: str) -> dict[str, float]:
    """RSS, PSS, USS (private) and the PSS of mappings of files under `shared_dir`, in MiB; peak RSS."""
    rollup = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        rollup[key] = int(value.split()[0]) / 1024  # kB -> MiB
    data_pss, in_shared = 0.0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        # a mapping's first line: range perms offset dev inode [path]
        if head and "-" in head[0] and len(head) >= 5:
            in_shared = len(head) >= 6 and head[5].startswith(shared_dir)
        elif in_shared and line.startswith("Pss:"):
            data_pss += int(head[1]) / 1024
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return {
        "rss": rollup["Rss"],
        "pss": rollup["Pss"],
        "uss": rollup["Private_Clean"] + rollup["Private_Dirty"],
        "data_pss": data_pss,
        "peak_rss": int(status["VmHWM"].split()[0]) / 1024,
    }


def run_trials(layout: str, k: int, steps: int, shared_dir: str) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    ready, release = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_trial, args=(layout, shared_dir, steps, ready, release)) for _ in range(k)]
    for p in procs:
        p.start()
    try:
        pids = [ready.get(timeout=1800) for _ in procs]
        per = [_smaps(pid, shared_dir) for pid in pids]
    finally:
        release.set()
        for p in procs:
            p.join()
    total = {key: sum(m[key] for m in per) for key in per[0]}
    total["peak_rss"] = max(m["peak_rss"] for m in per)
    return total


def memory(trials: list[int], steps: int) -> list[dict]:
    shared_dir = tempfile.mkdtemp(prefix="augtune-memory-bench-")
    try:
        from augtune.config import DatasetConfig
        from augtune.data import load_dataset

        load_dataset(DatasetConfig(name="fashion_mnist", shared_dir=shared_dir))  # built once, before timing
        rows = []
        for k in trials:
            for layout in ("float32", "shared"):
                m = run_trials(layout, k, steps, shared_dir)
                rows.append({"trials": k, "layout": layout, **{key: round(v, 1) for key, v in m.items()}})
                print(json.dumps(rows[-1]), flush=True)
        return rows
    finally:
        shutil.rmtree(shared_dir, ignore_errors=True)


def memory_table(rows: list[dict]) -> str:
    one = {r["layout"]: r for r in rows if r["trials"] == 1}
    out = [
        "| trials | layout | RSS (MiB) | PSS (MiB) | USS (MiB) | data PSS (MiB) | PSS / 1 trial "
        "| peak RSS (MiB) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ratio = r["pss"] / one[r["layout"]]["pss"] if r["layout"] in one else float("nan")
        out.append(f"| {r['trials']} | {r['layout']} | {r['rss']:.0f} | {r['pss']:.0f} | {r['uss']:.0f} | "
                   f"{r['data_pss']:.0f} | {ratio:.2f}x | {r['peak_rss']:.0f} |")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# streaming imagefolder against in-memory

def write_tree(root: Path, per_class: int, size: int) -> Path:
    """train/<class>/*.jpg and val/<class>/*.jpg from Fashion-MNIST's training images (JPEG quality 90)."""
    import numpy as np
    from PIL import Image

    from augtune.data import formats

    x = formats.read_idx(FMNIST / "train-images-idx3-ubyte.gz")
    y = formats.read_idx(FMNIST / "train-labels-idx1-ubyte.gz")
    for split, start, n in (("train", 0, per_class), ("val", 40000, max(2, per_class // 5))):
        for c in range(10):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in np.flatnonzero(y[start:] == c)[:n] + start:
                img = Image.fromarray(x[i]).convert("RGB")
                img.resize((size, size), Image.Resampling.BILINEAR).save(folder / f"{i}.jpg", quality=90)
    return root


def _epoch(cfg, data) -> float:
    from augtune.trainables.loop import Trainer

    trainer = Trainer(cfg, data, log=lambda s: None)
    trainer.train_epoch()  # warm-up: first-call costs (and the DataLoader's first start) out of the timing
    return trainer.train_epoch()["samples_per_s"]


def stream(per_class: int, size: int, workers: int, repeats: int) -> dict[str, float]:
    """Median samples/s over `repeats` interleaved runs of: in memory, streamed by `workers` processes,
    streamed in the training process (workers 0); and images/s of decoding alone by `workers` processes."""
    import statistics

    import torch

    from augtune.data import load_dataset
    from augtune.data.batches import sequential

    torch.set_num_threads(1)
    root = write_tree(Path(tempfile.mkdtemp(prefix="augtune-jpeg-tree-")), per_class, size)
    try:
        base = {"name": "imagefolder", "path": str(root), "image_size": size, "shared": False}
        modes = {"in_memory": {"cache": "memory"}, "streaming": {"cache": "none", "workers": workers},
                 "in_process": {"cache": "none", "workers": 0}}
        runs: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(repeats):  # interleaved: a change in the machine's load hits every mode alike
            for mode, kw in modes.items():
                cfg = _cfg({**base, **kw}, 128, epochs=2)
                runs[mode].append(_epoch(cfg, load_dataset(cfg.dataset)))
        out = {m: statistics.median(v) for m, v in runs.items()}
        files = load_dataset(_cfg({**base, "cache": "none"}).dataset).x_train
        start = time.perf_counter()
        for _ in files.read(sequential(len(files), 128), workers):
            pass
        out["decode_only"] = len(files) / (time.perf_counter() - start)
        out["images"] = len(files)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["memory", "stream", "all"], default="all")
    ap.add_argument("--trials", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument(
        "--steps", type=int, default=20, help="training steps per trial before its memory is read"
    )
    ap.add_argument(
        "--per-class", type=int, default=600, help="stream: training images per class in the tree"
    )
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2, help="stream: DataLoader decoding processes")
    ap.add_argument("--repeats", type=int, default=3, help="stream: interleaved runs of each mode (median)")
    args = ap.parse_args()
    if not (FMNIST / "train-images-idx3-ubyte.gz").is_file():
        raise SystemExit(f"{FMNIST} absent: apt-get install -y dataset-fashion-mnist")
    print(f"cpus={os.cpu_count()} date={time.strftime('%Y-%m-%d')}")
    if args.part in ("memory", "all"):
        print(memory_table(memory(args.trials, args.steps)))
    if args.part in ("stream", "all"):
        s = stream(args.per_class, args.image_size, args.workers, args.repeats)
        print(
            f"imagefolder, {s['images']} JPEGs at {args.image_size} px, batch 128, median of {args.repeats}: "
            f"in memory {s['in_memory']:.0f} samples/s; "
            f"streamed by {args.workers} workers {s['streaming']:.0f} "
            f"(x{s['streaming'] / s['in_memory']:.2f}); streamed in-process {s['in_process']:.0f} "
            f"(x{s['in_process'] / s['in_memory']:.2f}); decoding alone, {args.workers} workers: "
            f"{s['decode_only']:.0f} images/s"
        )


if __name__ == "__main__":
    main()
