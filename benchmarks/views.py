"""Time per batch of the batched SimCLR view vs a per-sample torchvision.transforms.v2 loop.

    python benchmarks/views.py [--batch 256] [--repeats 10] [--device cpu] [--threads N]

Both pipelines are SimCLR's (crop 0.2-1, flip 0.5, jitter 0.4/0.1 with p 0.8, grayscale 0.2; blur 0.5
at 96 px); times are milliseconds per batch, median over repeats, after one warm-up call.

Then a step's two views (`augtune.trainables.loop.two_views`: the parameters of 2B views drawn at
once) made in one pass over the batch twice over (the loop's way on an accelerator) against two passes
(its way on the CPU), with the ops each dispatches (torch's profiler; on a GPU most are kernel
launches).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torchvision.transforms import v2

from augtune.data.views import SimCLRView, blur_kernel_size
from augtune.trainables.loop import two_views


def _median_ms(fn, repeats: int, device: torch.device) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    print(f"device={device} threads={torch.get_num_threads()} batch={args.batch}")
    for c, side, blur_p in ((3, 32, 0.0), (1, 28, 0.0), (1, 8, 0.0), (3, 96, 0.5)):
        x = torch.rand(args.batch, c, side, side, device=device)
        batched = SimCLRView(blur_p=blur_p)
        per_sample = v2.Compose([
            v2.RandomResizedCrop(side, scale=(0.2, 1.0), antialias=True),
            v2.RandomHorizontalFlip(0.5),
            v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
            v2.RandomGrayscale(0.2),
            v2.RandomApply([v2.GaussianBlur(blur_kernel_size(side), (0.1, 2.0))], p=blur_p),
        ])
        t_batched = _median_ms(lambda: batched(x), args.repeats, device)
        t_loop = _median_ms(
            lambda: torch.stack([per_sample(img) for img in x]), max(1, args.repeats // 3), device
        )
        print(
            f"{c}x{side}x{side} blur_p={blur_p}: batched {t_batched:8.1f} ms  per-sample v2 {t_loop:8.1f} ms"
            f"  speed-up x{t_loop / t_batched:.1f}"
        )

    print("two views of a step: two passes (the CPU's) against one pass (an accelerator's)")
    for c, side, batch in ((3, 32, 32), (3, 32, args.batch), (3, 32, 512)):
        x = torch.rand(batch, c, side, side, device=device)
        view = SimCLRView()

        def two_passes():
            return two_views(view, x, batch, slice(0, batch), one_pass=False)

        def one_pass():
            return two_views(view, x, batch, slice(0, batch), one_pass=True)

        t_two, t_one = (_median_ms(f, args.repeats, device) for f in (two_passes, one_pass))
        ops = [_ops(f) for f in (two_passes, one_pass)]
        print(f"{c}x{side}x{side} batch {batch}: two passes {t_two:7.2f} ms ({ops[0]} ops)  "
              f"one pass {t_one:7.2f} ms ({ops[1]} ops)  speed-up x{t_two / t_one:.2f}")


def _ops(fn) -> int:
    """The ops `fn` dispatches (the profiler's top-level events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.cpu_parent is None)


if __name__ == "__main__":
    main()
