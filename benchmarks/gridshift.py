"""GridShift against scikit-learn's MeanShift: wall time on 10^4, 10^5, 10^6 points in 2-D and 3-D.

Run:  python benchmarks/gridshift.py [--sizes 10000,100000,1000000] [--meanshift-max 100000]

Blobs (8 centres, std 1, spread over [-20, 20]^d), both at the same bandwidth (scikit-learn's rule
at quantile 0.05 on a 2000-point subsample; MeanShift with bin seeding). MeanShift is skipped above
`--meanshift-max` points. Printed: seconds, clusters found, ARI against the true blobs, and
GridShift's time per point (about constant when the cost is linear in N).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.cluster import MeanShift
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score

from augtune.eval.gridshift import auto_bandwidth, gridshift


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--meanshift-max", type=int, default=100000)
    args = p.parse_args()
    print(f"{'d':>2}{'N':>10}{'h':>7}{'gridshift s':>13}{'us/point':>10}{'k':>4}{'ARI':>7}"
          f"{'meanshift s':>13}{'k':>4}{'ARI':>7}")
    for d in (2, 3):
        centres = np.random.default_rng(0).uniform(-20, 20, (8, d))
        for n in (int(s) for s in args.sizes.split(",")):
            x, y = make_blobs(n, n_features=d, centers=centres, cluster_std=1.0, random_state=0)
            h = auto_bandwidth(x)
            start = time.perf_counter()
            labels, centres_found = gridshift(x, h)
            t = time.perf_counter() - start
            line = (f"{d:>2}{n:>10}{h:>7.2f}{t:>13.3f}{1e6 * t / n:>10.2f}{len(centres_found):>4}"
                    f"{adjusted_rand_score(y, labels):>7.3f}")
            if n <= args.meanshift_max:
                start = time.perf_counter()
                ms = MeanShift(bandwidth=h, bin_seeding=True).fit_predict(x)
                line += (f"{time.perf_counter() - start:>13.3f}{len(np.unique(ms)):>4}"
                         f"{adjusted_rand_score(y, ms):>7.3f}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
