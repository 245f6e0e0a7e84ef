"""The first run on a GPU: what works and how fast, in one command, one JSON file and one table.

    python benchmarks/gpu_check.py --out gpu_check.json            # on a GPU machine, <= 8 min
    python benchmarks/gpu_check.py --device cpu --tiny --out x.json   # every part, small, on a CPU

Parts, in this order (each guarded: a part that fails records its error and the others still run; a
global time guard, `--budget-s` (480 s), skips a part that has too little time left and stops one
that runs past it):

- env: the device, its memory, and the versions of torch, CUDA, cuDNN, NCCL, torchvision, Ray,
  augtune.
- views: SimCLR's views of one step (two views, their random parameters and pixels) at the
  ResNet-18 batch, ms; their share of a training step (against each ResNet-18 variant's step
  below); on a GPU, the host-to-device copies the profiler sees while they run (0 expected) and
  their largest difference from the same views made on the CPU with the same parameters.
- resnet18: SimCLR with the CIFAR-stem ResNet-18 on CIFAR-shaped synthetic uint8 images (50 000 of
  3x32x32, batch 512; no download), the real `Trainer.train_epoch`, in five variants: fp32 (with
  torch's default TF32 settings), bf16 (autocast, `train.precision: bf16`), bf16 + channels_last
  (`train.channels_last`), bf16 + channels_last + compile (`train.compile: true`), and the same with
  CUDA graphs (`train.compile: reduce-overhead`: the step is bound by kernel launches). Per variant: samples/s
  (training images per second; each gives two views), seconds per epoch-equivalent (50 000 /
  samples/s), ms per step, peak GPU memory (GiB), the warm-up's seconds (compilation included).
- profile: the bf16 + channels_last ResNet-18 step (10 steps after the warm-up) under torch's
  profiler: the fraction of the step's wall the GPU is busy (the union of its kernels' and copies'
  intervals: well under 1 means the host bounds the step), kernels per step, the views' host and
  GPU ms inside the step, and the ten ops with the most GPU time and the most host time.
- methods: SimCLR alone and with PiNDA (its ResNet-18 generator), CoCor (lengths 1-3, MMNN), NRCC
  (one SGHMC step), DiffAug (`diffaug.gen_steps: 1`, Alg. 1) in the bf16 + channels_last setting
  (`--methods-variant VARIANT` trains them in another of resnet18's variants, `bf16_cl_graphs` say),
  each against the base as the papers' tables give it: `x_base` = the method's epoch-equivalent
  seconds over the base's (what an epoch costs relative to the base). DiffAug is timed per phase
  (B: generator steps; A: encoder steps with generated positives) on 5120 images (ten full
  batches), and its refresh (at the start of each A-epoch, the positives of the ~lambda of the
  training images that the epoch replaces) is reported in seconds per 1000 generated images and folded
  into its A epoch-equivalent.
- share: trials sharing one GPU, as `resources.gpus_per_worker: 0.25` lets four do: the main job's
  trial (examples/compare_digits.yaml: digits, CNN width 16, batch 128) in 1 process alone, then in
  4 processes at once, each training for the same wall time; total samples/s of 4 against 1. The
  processes are started directly, not by Ray: Ray's fractional GPUs only set CUDA_VISIBLE_DEVICES
  and count, they do not partition the GPU, so 4 processes measure the same sharing without Ray's
  start-up time (which benchmarks/overhead.py measures on its own).
- compare: the main job, `augtune compare examples/compare_digits.yaml --set train.device=cuda`,
  timed (wall seconds, exit status, the last lines of its output). Ray 2.60 leaves
  CUDA_VISIBLE_DEVICES alone in a trial that asks for no GPU, so the in-trial loop sees the GPU.
- ddp: SimCLR ResNet-18 with DDP over two GPUs (NCCL), samples/s of 2 processes against 1 on the
  same global batch; skipped with the reason where the machine has fewer than two GPUs. On the CPU
  (`--device cpu`) the same code runs over 2 gloo processes: a check that the path works, not a
  speed figure.

- showcase: every method on all of Fashion-MNIST's images, `augtune compare examples/compare_fashion.yaml`
  (ResNet-18 with the CIFAR stem, the race), with `compare.time_budget` set to what is left of
  `--budget-s` less a minute, four trials sharing the GPU; its output's last 80 lines (the verdict)
  go into the JSON. It wants a device window of its own, so a plain run leaves it out:

      python benchmarks/gpu_check.py --only showcase --budget-s 600 --data-root DIR --out showcase.json

  (DIR: Fashion-MNIST's four IDX `.gz` files, carried along; default Debian's
  /usr/share/datasets/fashion-mnist). Skipped with its reason where the files are not there.

`--tiny` (for `--device cpu`): the same parts on small inputs (a 3x16x16 set of 256, batch 32, the
small CNN instead of ResNet-18, a few steps; compile with dynamo's eager backend; the compare job
with one entrant, one trial, one seed, one epoch; the showcase on 512 of Fashion-MNIST's images with a
small CNN, two entrants, the time budget as above), so that every part runs in a few minutes on two
CPU cores (share: 2 processes); tests/test_gpu_check.py runs it, so the script cannot rot.

JSON (`--out FILE`, rewritten after every part, so a killed run keeps what it measured):

    {"schema": 1, "command": str, "device": "cuda" | "cpu", "tiny": bool, "started": ISO-8601 str,
     "budget_s": float, "wall_s": float,
     "parts": {PART: {"status": "ok" | "error" | "skipped", "seconds": float,
                      "error": str (status error: "Type: message", first line),
                      "reason": str (status skipped), ...the part's fields}}}

Fields per part (units in the names; null where a device does not have it):

    env:      device_name, gpu_count, gpu_memory_gib, capability, driver, torch, cuda, cudnn, nccl,
              torchvision, ray, augtune, python, platform, threads
    views:    batch, shape [C, H, W], views_ms, share {VARIANT: fraction of its step}, h2d_copies,
              kernels (launched by one call),
              max_abs_diff_vs_cpu, bitwise_equal_fraction
    resnet18: n, shape, batch, model, steps, variants {VARIANT: {samples_per_s, epoch_s, step_ms,
              peak_mem_gib, warmup_s, loss (the measured epoch's mean), x_fp32 (speed-up),
              autocast, channels_last, compile}} for
              VARIANT in fp32, bf16, bf16_cl, bf16_cl_compile, bf16_cl_graphs (a failed one:
              {"error": str})
    profile:  variant, batch, steps, step_ms (unprofiled), profiled_step_ms, gpu_busy_ms,
              gpu_busy_fraction, kernels_per_step, views_host_ms, views_gpu_ms, top_gpu and
              top_host [{name, ms_per_step, calls_per_step}] (GPU fields null on a CPU)
    methods:  setting (the variant), n, batch, steps, runs {NAME: {samples_per_s, epoch_s, step_ms,
              peak_mem_gib, loss, x_base}} for NAME in simclr, pinda, cocor, nrcc, diffaug_B, diffaug_A;
              diffaug_A also has refresh_s_per_1000 (per 1000 generated), n_refreshed (of its
              n_diffaug images), and an epoch_s that includes the refresh for 50 000 images
    share:    how ("processes"), config, measure_s, alone {samples_per_s}, shared {processes,
              samples_per_s [per process], total_samples_per_s}, ratio (total shared / alone)
    compare:  command [argv], rc, wall_s, tail (last lines of its output)
    ddp:      backend, world, model, batch (global), steps, single {samples_per_s},
              ranks {samples_per_s}, speedup
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's augtune, also when run as a plain script

from augtune.config import from_dict, load_config  # noqa: E402
from augtune.data.batches import as_float  # noqa: E402
from augtune.data.datasets import DataSplit  # noqa: E402
from augtune.trainables.loop import Trainer  # noqa: E402

PARTS = ("env", "views", "resnet18", "profile", "methods", "share", "compare", "ddp", "showcase")
# parts a plain run leaves out: the showcase wants a device window of its own (`--only showcase`)
OWN_WINDOW = ("showcase",)
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist
VARIANTS = {  # name -> train section
    "fp32": {"precision": "fp32"},
    "bf16": {"precision": "bf16"},
    "bf16_cl": {"precision": "bf16", "channels_last": True},
    "bf16_cl_compile": {"precision": "bf16", "channels_last": True, "compile": True},
    "bf16_cl_graphs": {"precision": "bf16", "channels_last": True, "compile": "reduce-overhead"},
}
METHODS = {  # name -> config sections added to the base's
    "pinda": {"method": {"augment": ["pinda"]}},
    "cocor": {"method": {"augment": ["cocor"]}},
    "nrcc": {"method": {"augment": ["nrcc"]}},
    "diffaug": {
        "method": {"augment": ["diffaug"]},
        "diffaug": {"schedule": "B:2,A:2", "gen_steps": 1},
    },
}
GIB = 1024**3


class Sizes:
    """How big each part runs: the real check, or `--tiny` (small enough for two CPU cores)."""

    def __init__(self, tiny: bool) -> None:
        self.tiny = tiny
        self.n, self.shape, self.batch = (
            (256, (3, 16, 16), 32) if tiny else (50_000, (3, 32, 32), 512)
        )
        self.model = {"backbone": "cnn", "width": 4} if tiny else {"backbone": "resnet18"}
        self.warm, self.steps, self.method_steps = (1, 2, 2) if tiny else (3, 20, 10)
        self.n_diffaug = 64 if tiny else 5_120  # the warm-up's and the measured epoch's 10 full batches
        # share: seconds each trial process trains, and how many share the device (tiny: the path)
        self.share_s, self.share_processes = (1.0, 2) if tiny else (10.0, 4)
        self.method_extra = (
            {
                "pinda": {"generator": "unet", "width": 4},
                "cocor": {"meta_batch": 8},
                "diffaug": {"steps": 20, "sample_steps": 3, "gen_width": 4},
            }
            if tiny
            else {}
        )
        # tiny tensors on a shared CPU: one torch thread (spinning idle threads: ~30x slower)
        self.threads = 1 if tiny else None


# -- the guard ------------------------------------------------------------------------------------


class TimeGuard(Exception):
    """The global time budget ran out inside a part."""


class Check:
    """Runs the parts in turn, each guarded, and keeps the JSON up to date."""

    def __init__(self, args) -> None:
        self.args = args
        self.start = time.monotonic()
        self.result = {
            "schema": 1,
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "device": args.device,
            "tiny": args.tiny,
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "budget_s": args.budget_s,
            "wall_s": 0.0,
            "parts": {},
        }

    def remaining(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.start)

    def run(self, name: str, fn, need_s: float) -> None:
        """`fn()` -> the part's fields; its error or the guard's skip is recorded when it fails."""
        left = self.remaining()
        entry: dict = {}
        t0 = time.monotonic()
        if left < need_s:
            entry = {
                "status": "skipped",
                "reason": f"time guard: {left:.0f} s left, the part needs ~{need_s:.0f} s",
            }
        else:

            def expired(signum, frame):
                raise TimeGuard(f"time guard: the budget of {self.args.budget_s:.0f} s ran out")

            previous = signal.signal(signal.SIGALRM, expired)
            signal.alarm(max(1, int(left)))
            try:
                entry = {"status": "ok", **fn(self)}
            except Skip as e:
                entry = {"status": "skipped", "reason": str(e)}
            except (Exception, TimeGuard) as e:
                first = f"{type(e).__name__}: {e}".strip().splitlines()[0][:300]
                entry = {
                    "status": "error",
                    "error": first,
                    "where": traceback.format_exc().strip().splitlines()[-3][:300],
                }
            finally:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, previous)
                free_memory()
        entry["seconds"] = round(time.monotonic() - t0, 2)
        self.result["parts"][name] = entry
        self.result["wall_s"] = round(time.monotonic() - self.start, 2)
        self.save()

    def save(self) -> None:
        if self.args.out:
            Path(self.args.out).write_text(json.dumps(self.result, indent=1))


class Skip(Exception):
    """A part that does not apply here (the reason is recorded)."""


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_gib(device: torch.device) -> float | None:
    return (
        round(torch.cuda.max_memory_allocated(device) / GIB, 3) if device.type == "cuda" else None
    )


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


# -- training on synthetic images -----------------------------------------------------------------


def synthetic(n: int, shape: tuple[int, ...], seed: int = 0) -> DataSplit:
    """`n` uint8 images of `shape` with random labels: CIFAR's form without its download."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)  # (n, C, H, W)
    y = torch.randint(0, 10, (n,), generator=g)
    c = shape[0]
    return DataSplit(
        "synthetic",
        "image",
        tuple(shape),
        10,
        x,
        y,
        x[:256],
        y[:256],
        (0.5,) * c,
        (0.25,) * c,
        tuple(str(k) for k in range(10)),
    )


def config(sizes: Sizes, device: str, train: dict, extra: dict | None = None, epochs: int = 8):
    data = {
        "model": dict(sizes.model),
        "train": {
            "epochs": epochs,
            "batch_size": sizes.batch,
            "device": device,
            "num_threads": sizes.threads,
            **train,
        },
        "eval": {
            "every": 0,
            "metrics": [],
            "epoch_metrics": [],
            "references": False,
            "figures": [],
        },
    }
    for k, v in {**sizes.method_extra, **(extra or {})}.items():
        data.setdefault(k, {}).update(v)
    return from_dict(data)


def timed_epoch(trainer: Trainer, steps: int) -> float:
    """Wall seconds of an epoch cut to `steps` steps (of the whole set's permutation), synced."""
    n, batch = len(trainer.x_train), trainer.cfg.train.batch_size
    if steps * batch > n:  # a short last batch would not match the views drawn for a full one
        raise ValueError(f"{steps} steps of {batch} need {steps * batch} images; the set has {n}")
    trainer.steps_per_epoch = steps
    sync(trainer.device)
    t0 = time.perf_counter()
    trainer.last_metrics = trainer.train_epoch()  # measure() reports its loss
    sync(trainer.device)
    return time.perf_counter() - t0


def measure(trainer: Trainer, sizes: Sizes, steps: int, n: int) -> dict:
    """A warm-up epoch, then a measured one: samples/s, epoch-equivalent s, ms/step, peak GiB."""
    warm = timed_epoch(trainer, sizes.warm)
    reset_peak(trainer.device)
    wall = timed_epoch(trainer, steps)
    rate = steps * sizes.batch / wall
    return {
        "samples_per_s": round(rate, 1),
        "epoch_s": round(n / rate, 2),
        "step_ms": round(1e3 * wall / steps, 2),
        "peak_mem_gib": peak_gib(trainer.device),
        "warmup_s": round(warm, 2),
        "loss": round(float(trainer.last_metrics["loss"]), 4),  # same seed: variants comparable
    }


@contextlib.contextmanager
def eager_compile(tiny: bool):
    """`--tiny`: `nn.Module.compile` with dynamo's eager backend (the switch's path, without
    inductor's minutes of C++ compilation on a CPU)."""
    if not tiny:
        yield
        return
    real = torch.nn.Module.compile

    def compile(self, *a, **k):
        k.setdefault("backend", "eager")
        return real(self, *a, **k)

    torch.nn.Module.compile = compile
    try:
        yield
    finally:
        torch.nn.Module.compile = real


# -- the parts ------------------------------------------------------------------------------------


def part_env(check: Check) -> dict:
    import torchvision

    import augtune

    device = torch.device(check.args.device)
    out = {
        "device_name": platform.processor() or platform.machine(),
        "gpu_count": torch.cuda.device_count(),
        "gpu_memory_gib": None,
        "capability": None,
        "driver": None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nccl": None,
        "torchvision": torchvision.__version__,
        "ray": None,
        "augtune": augtune.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
    }
    with contextlib.suppress(ImportError):
        import ray

        out["ray"] = ray.__version__
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda, but torch sees no GPU")
        p = torch.cuda.get_device_properties(device)
        out.update(
            device_name=p.name,
            gpu_memory_gib=round(p.total_memory / GIB, 1),
            capability=f"{p.major}.{p.minor}",
        )
        with contextlib.suppress(Exception):
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        with contextlib.suppress(Exception):
            out["driver"] = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
                .stdout.strip()
                .splitlines()[0]
            )
    return out


def part_views(check: Check) -> dict:
    sizes, device = check.sizes, torch.device(check.args.device)
    trainer = Trainer(
        config(sizes, check.args.device, {"precision": "fp32"}),
        synthetic(sizes.batch * 2, sizes.shape),
        log=lambda s: None,
    )
    x = as_float(trainer.x_train[: sizes.batch])  # (B, C, H, W) float on the device
    mine = slice(0, sizes.batch)
    times = []
    for _ in range(11):
        sync(device)
        t0 = time.perf_counter()
        trainer._views(x, sizes.batch, mine)
        sync(device)
        times.append(1e3 * (time.perf_counter() - t0))
    out = {
        "batch": sizes.batch,
        "shape": list(sizes.shape),
        "views_ms": round(statistics.median(times[1:]), 3),
        "share": {},
        "h2d_copies": None,
        "kernels": None,
        "max_abs_diff_vs_cpu": None,
        "bitwise_equal_fraction": None,
    }
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            trainer._views(x, sizes.batch, mine)
            sync(device)
        out["h2d_copies"] = sum(1 for e in prof.events() if "HtoD" in e.name)
        out["kernels"] = sum(1 for e in gpu_work(prof) if "Memcpy" not in e.name)
        params = trainer.view.sample(sizes.batch, x)
        gpu = trainer.view.apply(x, params).cpu()
        cpu = trainer.view.cpu().apply(x.cpu(), {k: v.cpu() for k, v in params.items()})
        out["max_abs_diff_vs_cpu"] = (gpu - cpu).abs().max().item()
        out["bitwise_equal_fraction"] = round((gpu == cpu).float().mean().item(), 6)
    check.views_ms = out["views_ms"]
    return out


def part_resnet18(check: Check) -> dict:
    sizes, device = check.sizes, check.args.device
    data = synthetic(sizes.n, sizes.shape)
    out = {
        "n": sizes.n,
        "shape": list(sizes.shape),
        "batch": sizes.batch,
        "model": sizes.model["backbone"],
        "steps": sizes.steps,
        "variants": {},
    }
    for name, train in VARIANTS.items():
        if check.remaining() < (90 if train.get("compile") and not sizes.tiny else 5):
            out["variants"][name] = {"error": "time guard: skipped"}
            continue
        try:
            with eager_compile(sizes.tiny):
                reset_peak(torch.device(device))
                trainer = Trainer(config(sizes, device, train), data, log=lambda s: None)
                m = measure(trainer, sizes, sizes.steps, sizes.n)
            m.update(
                autocast=trainer.bf16,
                channels_last=bool(train.get("channels_last")),
                compile=train.get("compile", False),  # false, true (torch's default mode) or a mode
            )
            out["variants"][name] = m
        except Exception as e:  # one variant failing (compile, say) leaves the others
            out["variants"][name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
        finally:
            trainer = None
            free_memory()
    fp32 = out["variants"].get("fp32", {}).get("samples_per_s")
    for v in out["variants"].values():
        if fp32 and v.get("samples_per_s"):
            v["x_fp32"] = round(v["samples_per_s"] / fp32, 3)  # speed-up over fp32
    check.variants = out["variants"]
    return out


def gpu_work(prof) -> list:
    """The profile's kernels, copies and sets on the GPU, without the spans the profiler draws on the
    GPU's timeline for a `record_function` label (they cover idle time too)."""
    from torch.autograd import DeviceType

    return [
        e
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and e.name != "augtune.views"
    ]


def part_profile(check: Check) -> dict:
    """The bf16 + channels_last ResNet-18 SimCLR step under torch's profiler: how much of its wall the
    GPU is busy (the union of its kernels' and copies' intervals; a step bound by the host leaves it
    idle), kernels launched per step, the views' host and GPU time inside the step, and the ops with
    the most GPU and host time. Without a GPU only the host columns are filled."""
    from torch.profiler import ProfilerActivity, profile, record_function

    sizes, device = check.sizes, torch.device(check.args.device)
    steps = min(sizes.steps, 10)
    trainer = Trainer(
        config(sizes, check.args.device, VARIANTS["bf16_cl"]),
        synthetic(sizes.batch * max(steps, sizes.warm), sizes.shape),
        log=lambda s: None,
    )
    timed_epoch(trainer, sizes.warm)
    plain = timed_epoch(trainer, steps)  # the same steps unprofiled: what the profiler adds
    views = trainer._views

    def labelled(*a):
        with record_function("augtune.views"):
            return views(*a)

    trainer._views = labelled
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        wall = timed_epoch(trainer, steps)
    on_gpu = sorted((e.time_range.start, e.time_range.end) for e in gpu_work(prof))
    busy, reach = 0, None  # the union of the GPU's intervals, us
    for start, end in on_gpu:
        if reach is None or start > reach:
            busy += end - start
            reach = end
        elif end > reach:
            busy += end - reach
            reach = end
    per_step = 1e3 * steps  # us in all -> ms per step
    table = prof.key_averages()

    def top(key: str) -> list[dict]:
        rows = sorted(table, key=lambda a: getattr(a, key), reverse=True)[:10]
        return [
            {
                "name": a.key[:80],
                "ms_per_step": round(getattr(a, key) / per_step, 3),
                "calls_per_step": round(a.count / steps, 1),
            }
            for a in rows
            if getattr(a, key) > 0
        ]

    mark = next((a for a in table if a.key == "augtune.views"), None)
    gpu = device.type == "cuda"
    return {
        "variant": "bf16_cl",
        "batch": sizes.batch,
        "steps": steps,
        "step_ms": round(1e3 * plain / steps, 2),
        "profiled_step_ms": round(1e3 * wall / steps, 2),
        "gpu_busy_ms": round(busy / per_step, 2) if gpu else None,
        "gpu_busy_fraction": round(busy / (1e6 * wall), 3) if gpu else None,
        "kernels_per_step": round(sum(1 for _ in on_gpu) / steps, 1) if gpu else None,
        "views_host_ms": round(mark.cpu_time_total / per_step, 3) if mark else None,
        "views_gpu_ms": round(mark.device_time_total / per_step, 3) if mark and gpu else None,
        "top_gpu": [t for t in top("self_device_time_total") if t["name"] != "augtune.views"]
        if gpu
        else [],
        "top_host": top("self_cpu_time_total"),
    }


def part_methods(check: Check) -> dict:
    sizes, device = check.sizes, check.args.device
    variant = getattr(check.args, "methods_variant", "bf16_cl")
    train = dict(VARIANTS[variant])
    out = {
        "setting": variant,
        "n": sizes.n,
        "batch": sizes.batch,
        "steps": sizes.method_steps,
        "runs": {},
    }
    data = synthetic(sizes.n, sizes.shape)
    runs = out["runs"]
    for name in ("simclr", *METHODS):
        if check.remaining() < 10:
            runs[name] = {"error": "time guard: skipped"}
            continue
        try:
            reset_peak(torch.device(device))
            with eager_compile(sizes.tiny):
                if name == "diffaug":
                    runs.update(diffaug_runs(sizes, device, train))
                    continue
                trainer = Trainer(
                    config(sizes, device, train, METHODS.get(name)), data, log=lambda s: None
                )
                runs[name] = measure(trainer, sizes, sizes.method_steps, sizes.n)
        except Exception as e:
            runs[name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
        finally:
            trainer = None
            torch.compiler.reset()  # each method compiles afresh (dynamo's caches are per code object)
            free_memory()
    base = runs.get("simclr", {}).get("epoch_s")
    for r in runs.values():
        if base and r.get("epoch_s"):
            r["x_base"] = round(r["epoch_s"] / base, 3)  # an epoch's time against the base's
    return out


def diffaug_runs(sizes: Sizes, device: str, train: dict) -> dict:
    """DiffAug per phase on `sizes.n_diffaug` images: B (generator) and A (encoder with generated
    positives); the refresh at the start of each A-epoch (the positives of the ~lambda of the images
    that the epoch replaces) is timed apart and scaled to `sizes.n`."""
    n = sizes.n_diffaug
    trainer = Trainer(
        config(sizes, device, train, METHODS["diffaug"], epochs=4),
        synthetic(n, sizes.shape),
        log=lambda s: None,
    )
    refresh: list[float] = []
    real_start = trainer.method.on_epoch_start

    def on_epoch_start(info):
        sync(trainer.device)
        t0 = time.perf_counter()
        real_start(info)
        sync(trainer.device)
        refresh.append(time.perf_counter() - t0)

    trainer.method.on_epoch_start = on_epoch_start
    out = {}
    for phase in ("B", "A"):
        m = measure(trainer, sizes, sizes.method_steps, sizes.n)
        spent = refresh[-1]  # the measured epoch's refresh (the warm-up's is the same work)
        wall = m["step_ms"] * sizes.method_steps / 1e3 - spent
        rate = sizes.method_steps * sizes.batch / wall
        m.update(
            samples_per_s=round(rate, 1),
            step_ms=round(1e3 * wall / sizes.method_steps, 2),
            epoch_s=round(sizes.n / rate, 2),
        )
        if phase == "A":
            made = len(trainer.method.augments[0].positives)  # this epoch's chosen ~lambda n
            m.update(
                refresh_s_per_1000=round(spent / max(1, made) * 1000, 3),
                epoch_s=round(sizes.n / rate + spent * sizes.n / n, 2),  # the refresh scales with n too
                n_refreshed=made,
            )
        out[f"diffaug_{phase}"] = m
    return out


def main_job_config(device: str, tiny: bool, *more: str):
    """examples/compare_digits.yaml on `device` (`--tiny`: 256 training images, one epoch)."""
    overrides = [f"train.device={device}"] + (
        ["dataset.max_train=256", "train.epochs=1"] if tiny else []
    )
    overrides += more
    return load_config(ROOT / "examples" / "compare_digits.yaml", overrides)


def part_share(check: Check) -> dict:
    sizes, device = check.sizes, check.args.device
    spec = {"device": device, "tiny": sizes.tiny, "seconds": sizes.share_s}
    with tempfile.TemporaryDirectory(prefix="gpu-check-share-") as tmp:
        alone = run_workers(1, spec, Path(tmp) / "one", check)
        shared = run_workers(sizes.share_processes, spec, Path(tmp) / "many", check)
    total = sum(shared)
    return {
        "how": "processes",
        "config": "examples/compare_digits.yaml" + (" (tiny)" if sizes.tiny else ""),
        "measure_s": sizes.share_s,
        "alone": {"samples_per_s": round(alone[0], 1)},
        "shared": {
            "processes": len(shared),
            "samples_per_s": [round(r, 1) for r in shared],
            "total_samples_per_s": round(total, 1),
        },
        "ratio": round(total / alone[0], 3),
    }


def run_workers(k: int, spec: dict, folder: Path, check: Check) -> list[float]:
    """`k` trial processes: each warms up, waits for all, trains spec.seconds; their samples/s."""
    folder.mkdir(parents=True)
    go = folder / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker-share", json.dumps(spec), str(folder / f"w{i}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(k)
    ]
    try:
        deadline = time.monotonic() + max(5.0, check.remaining() - 5)
        while not all((folder / f"w{i}.ready").exists() for i in range(k)):
            if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                raise RuntimeError(f"a trial process did not start: {worker_output(procs)}")
            time.sleep(0.1)
        go.touch()
        for p in procs:
            p.wait(timeout=max(5.0, deadline - time.monotonic()))
        if any(p.returncode for p in procs):
            raise RuntimeError(f"a trial process failed: {worker_output(procs)}")
        return [json.loads((folder / f"w{i}.json").read_text())["samples_per_s"] for i in range(k)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def worker_output(procs) -> str:
    for p in procs:
        if p.poll() not in (None, 0) and p.stdout is not None:
            return p.stdout.read().strip().splitlines()[-1][:300]
    return "no output"


def worker_share(spec_json: str, stem: str) -> None:
    """A trial process of `share`: the main job's trial config, trained spec.seconds after `go`."""
    from augtune.data import load_dataset

    spec = json.loads(spec_json)
    cfg = main_job_config(
        spec["device"],
        spec["tiny"],
        "train.epochs=100000",
        "eval.every=0",
        "eval.metrics=[]",
        "eval.epoch_metrics=[]",
        "eval.references=false",
        "eval.figures=[]",
    )
    trainer = Trainer(cfg, load_dataset(cfg.dataset), log=lambda s: None)
    trainer.train_epoch()  # warm-up
    Path(stem + ".ready").touch()
    go = Path(stem).parent / "go"
    while not go.exists():
        time.sleep(0.02)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < spec["seconds"]:
        trainer.train_epoch()
        n += trainer.steps_per_epoch * cfg.train.batch_size
    sync(trainer.device)
    Path(stem + ".json").write_text(json.dumps({"samples_per_s": n / (time.perf_counter() - t0)}))


def part_compare(check: Check) -> dict:
    sets = [f"train.device={check.args.device}"]
    if check.args.tiny:  # one entrant, one trial, one seed, one epoch: Ray's start and the job's path
        sets += [
            "compare.trials=1",
            "compare.seeds=1",
            "compare.race.enabled=false",  # the main job races its repeat; one seed here
            "train.epochs=1",
            "compare.methods=[base]",
            "dataset.max_train=256",
            "eval.metrics=[knn]",
            "compare.metrics=[knn_acc]",
        ]
    return compare_job(check, ROOT / "examples" / "compare_digits.yaml", sets, lines=8)


def part_showcase(check: Check) -> dict:
    """examples/compare_fashion.yaml: every method on all of Fashion-MNIST's images (ResNet-18 with the
    CIFAR stem, the race), under a `compare.time_budget` fitted to what is left of the check's budget."""
    root = Path(check.args.data_root)
    if not (root / "t10k-labels-idx1-ubyte.gz").is_file():
        raise Skip(f"no Fashion-MNIST IDX files in {root} (Debian's dataset-fashion-mnist, or --data-root "
                   "pointing at the files carried along)")
    budget_s = int(check.remaining() - SHOWCASE_MARGIN_S)  # the rest: the verdict, the report, Ray's stop
    sets = [f"dataset.root={root}", f"compare.time_budget={budget_s}s", f"train.device={check.args.device}"]
    if check.args.device == "cuda":  # four trials share the GPU (and its 16 cores, cpus_per_worker: 4)
        sets += ["resources.use_gpu=true", "resources.gpus_per_worker=0.25"]
    if check.args.tiny:  # a tiny subset and a small CNN: the part's path on two CPU cores
        sets += ["dataset.max_train=512", "dataset.max_test=256", "model.backbone=cnn", "model.width=4",
                 "train.batch_size=64", "train.epochs=3", "train.num_threads=1",
                 "resources.cpus_per_worker=1", "compare.methods=[base,pinda]", "compare.trials=1",
                 "compare.min_trials=1", "compare.seeds=2", "compare.race.enabled=false",
                 "eval.metrics=[knn]", "compare.metrics=[knn_acc]", "pinda.width=4"]
    out = compare_job(check, ROOT / "examples" / "compare_fashion.yaml", sets, lines=80)
    return {"budget_s": budget_s, **out}


SHOWCASE_MARGIN_S = 60  # seconds the showcase keeps back from its compare's time budget


def compare_job(check: Check, config: Path, sets: list[str], lines: int) -> dict:
    """`augtune compare CONFIG --set ...` in a temporary folder, timed: its exit status, wall seconds and
    the last `lines` lines of its output (the verdict's), stopped with its Ray by the time guard."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-compare-") as tmp:
        argv = [sys.executable, "-m", "augtune.cli", "compare", str(config), "--storage", tmp,
                "--name", "gpu-check"]
        for item in sets:
            argv += ["--set", item]
        timeout = max(10.0, check.remaining() - 25)  # room to stop it and its Ray
        t0 = time.monotonic()
        # its own session: on the time guard, the job and the Ray it started are stopped as a group
        proc = subprocess.Popen(argv, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            raise TimeGuard(f"time guard: the compare job ran past {timeout:.0f} s") from None
        wall = time.monotonic() - t0
    tail = output.strip().splitlines()[-lines:]
    if proc.returncode:
        raise RuntimeError(f"exit status {proc.returncode}: {tail[-1] if tail else ''}")
    return {"command": ["augtune", *argv[3:]], "rc": proc.returncode, "wall_s": round(wall, 1), "tail": tail}


def stop_group(proc: subprocess.Popen) -> None:
    """Interrupt `proc`'s process group (the CLI then stops its Ray), then kill what is left."""
    for sig, wait_s in ((signal.SIGINT, 20), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=wait_s)
            return


def part_ddp(check: Check) -> dict:
    sizes, device = check.sizes, check.args.device
    if device == "cuda" and torch.cuda.device_count() < 2:
        raise Skip(f"{torch.cuda.device_count()} GPU(s): NCCL DDP needs two")
    backend = "nccl" if device == "cuda" else "gloo"
    world, steps = 2, sizes.steps
    # one process on the whole global batch
    trainer = Trainer(
        config(sizes, device, VARIANTS["bf16_cl"]),
        synthetic(sizes.n, sizes.shape),
        log=lambda s: None,
    )
    single = measure(trainer, sizes, steps, sizes.n)
    trainer = None
    free_memory()
    with tempfile.TemporaryDirectory(prefix="gpu-check-ddp-") as tmp:
        spec = {
            "device": device,
            "tiny": sizes.tiny,
            "backend": backend,
            "world": world,
            "steps": steps,
            "init": str(Path(tmp) / "init"),
        }
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker-ddp",
                    json.dumps(spec),
                    str(rank),
                    str(Path(tmp) / f"rank{rank}.json"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for rank in range(world)
        ]
        try:
            for p in procs:
                p.wait(timeout=max(5.0, check.remaining() - 2))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode for p in procs):
            raise RuntimeError(f"a DDP rank failed: {worker_output(procs)}")
        rate = json.loads((Path(tmp) / "rank0.json").read_text())["samples_per_s"]
    return {
        "backend": backend,
        "world": world,
        "model": sizes.model["backbone"],
        "batch": sizes.batch,
        "steps": steps,
        "single": {"samples_per_s": single["samples_per_s"]},
        "ranks": {"samples_per_s": round(rate, 1)},
        "speedup": round(rate / single["samples_per_s"], 3),
    }


def worker_ddp(spec_json: str, rank: int, out: str) -> None:
    """One DDP rank: half of every global batch; rank 0 writes the global samples/s."""
    import torch.distributed as dist

    spec = json.loads(spec_json)
    sizes = Sizes(spec["tiny"])
    device = spec["device"]
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        spec["backend"],
        init_method=f"file://{spec['init']}",
        rank=rank,
        world_size=spec["world"],
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        trainer = Trainer(
            config(sizes, device, VARIANTS["bf16_cl"]),
            synthetic(sizes.n, sizes.shape),
            rank=rank,
            world_size=spec["world"],
            log=lambda s: None,
        )
        m = measure(trainer, sizes, spec["steps"], sizes.n)
        Path(out).write_text(json.dumps(m))
        # no rank tears its connections down while the other still uses them: gloo's thread would
        # std::terminate the other ("terminate called without an active exception"; CI saw it once)
        dist.barrier()
    finally:
        dist.destroy_process_group()


# -- the table ------------------------------------------------------------------------------------


def table(result: dict) -> str:
    """One table of the run (the JSON holds everything)."""
    rows = [("part", "what", "samples/s", "s/epoch", "x base", "peak GiB", "note")]
    parts = result["parts"]

    def status(name):
        p = parts.get(name, {"status": "missing"})
        return p.get("reason") or p.get("error") or p["status"]

    env = parts.get("env", {})
    rows.append(
        (
            "env",
            env.get("device_name", "?"),
            "",
            "",
            "",
            str(env.get("gpu_memory_gib") or ""),
            f"torch {env.get('torch')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}"
            if env.get("status") == "ok"
            else status("env"),
        )
    )
    views = parts.get("views", {})
    if views.get("status") == "ok":
        share = ", ".join(f"{k} {100 * v:.1f}%" for k, v in views["share"].items())
        rows.append(
            (
                "views",
                f"2 views of {views['batch']}, {views['views_ms']:.2f} ms",
                "",
                "",
                "",
                "",
                f"share of a step: {share}; H2D copies {views['h2d_copies']}; kernels {views['kernels']}",
            )
        )
    else:
        rows.append(("views", "", "", "", "", "", status("views")))
    r18 = parts.get("resnet18", {})
    for name, v in r18.get("variants", {}).items():
        rows.append(
            (
                "resnet18",
                name,
                _num(v.get("samples_per_s")),
                _num(v.get("epoch_s")),
                "",
                _num(v.get("peak_mem_gib")),
                v.get("error", f"warm-up {v.get('warmup_s')} s"),
            )
        )
    if r18.get("status") != "ok":
        rows.append(("resnet18", "", "", "", "", "", status("resnet18")))
    prof = parts.get("profile", {})
    if prof.get("status") == "ok":
        busy = prof["gpu_busy_fraction"]
        lead = prof["top_gpu"][:1] or prof["top_host"][:1]
        rows.append(
            (
                "profile",
                f"{prof['variant']} step {prof['step_ms']:.1f} ms",
                "",
                "",
                "",
                "",
                (f"GPU busy {100 * busy:.0f}%, {prof['kernels_per_step']:.0f} kernels/step; "
                 if busy is not None else "")
                + f"views {prof['views_host_ms']} ms host / {prof['views_gpu_ms']} ms GPU"
                + "".join(f"; most: {t['name']} {t['ms_per_step']} ms" for t in lead),
            )
        )
    else:
        rows.append(("profile", "", "", "", "", "", status("profile")))
    m = parts.get("methods", {})
    for name, v in m.get("runs", {}).items():
        rows.append(
            (
                "methods",
                name,
                _num(v.get("samples_per_s")),
                _num(v.get("epoch_s")),
                _num(v.get("x_base")),
                _num(v.get("peak_mem_gib")),
                v.get("error", m.get("setting", "")),
            )
        )
    if m.get("status") != "ok":
        rows.append(("methods", "", "", "", "", "", status("methods")))
    s = parts.get("share", {})
    if s.get("status") == "ok":
        rows.append(
            (
                "share",
                f"1 process / {s['shared']['processes']}",
                f"{s['alone']['samples_per_s']:.0f} / {s['shared']['total_samples_per_s']:.0f}",
                "",
                "",
                "",
                f"x{s['ratio']:.2f} total (processes)",
            )
        )
    else:
        rows.append(("share", "", "", "", "", "", status("share")))
    c = parts.get("compare", {})
    rows.append(
        (
            "compare",
            "main job",
            "",
            "",
            "",
            "",
            f"{c['wall_s']:.0f} s, exit {c['rc']}"
            if c.get("status") == "ok"
            else status("compare"),
        )
    )
    d = parts.get("ddp", {})
    if d.get("status") == "ok":
        rows.append(
            (
                "ddp",
                f"{d['backend']} x{d['world']}",
                f"{d['ranks']['samples_per_s']:.0f}",
                "",
                "",
                "",
                f"x{d['speedup']:.2f} against 1 process",
            )
        )
    else:
        rows.append(("ddp", "", "", "", "", "", status("ddp")))
    if "showcase" in parts:
        s = parts["showcase"]
        note = (f"{s['wall_s']:.0f} s of a {s['budget_s']} s budget, exit {s['rc']}: the verdict in the JSON"
                if s.get("status") == "ok" else status("showcase"))
        rows.append(("showcase", "compare_fashion.yaml", "", "", "", "", note))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r[:-1], widths)) + "  " + str(r[-1])
        for r in rows
    ]
    return "\n".join(lines)


def _num(v) -> str:
    if v is None:
        return ""
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument(
        "--tiny", action="store_true", help="small inputs: every part in < 2 min on a CPU"
    )
    ap.add_argument("--out", help="the JSON file (rewritten after every part)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="global time guard, seconds")
    ap.add_argument("--only", help="comma-separated parts to run (default: all but showcase; --tiny: all)")
    ap.add_argument("--data-root", default=FASHION_MNIST,
                    help="the folder of Fashion-MNIST's IDX files, for the showcase (carried along to a GPU)")
    ap.add_argument(
        "--methods-variant",
        default="bf16_cl",
        choices=tuple(VARIANTS),
        help="the resnet18 variant the methods part trains in (default bf16_cl)",
    )
    args = ap.parse_args(argv)
    check = Check(args)
    check.sizes = Sizes(args.tiny)
    check.views_ms, check.variants = None, {}
    only = set(args.only.split(",")) if args.only else set(PARTS) - (set() if args.tiny else set(OWN_WINDOW))
    need = {
        "env": 1,
        "views": 2,
        "resnet18": 20,
        "profile": 10,
        "methods": 20,
        "share": 15,
        "compare": 30,
        "ddp": 15,
        "showcase": 90,
    }
    if not args.tiny:
        need.update(resnet18=60, profile=30, methods=60, share=45, compare=120, ddp=45, showcase=300)
    fns = {
        "env": part_env,
        "views": part_views,
        "resnet18": part_resnet18,
        "profile": part_profile,
        "methods": part_methods,
        "share": part_share,
        "compare": part_compare,
        "ddp": part_ddp,
        "showcase": part_showcase,
    }
    for name in PARTS:
        if name in only:
            check.run(name, fns[name], need[name])
            if name == "resnet18":
                _fill_views_share(check)
    print(table(check.result))
    if args.out:
        print(f"\nJSON: {args.out}")
    return check.result


def _fill_views_share(check: Check) -> None:
    """The views' share of each variant's step, once both are measured."""
    views = check.result["parts"].get("views")
    if not views or views.get("status") != "ok":
        return
    for name, v in check.variants.items():
        if v.get("step_ms"):
            views["share"][name] = round(views["views_ms"] / v["step_ms"], 4)
    check.save()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker-share":
        worker_share(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "--worker-ddp":
        worker_ddp(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        main()
