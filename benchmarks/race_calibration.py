"""Does the compare's verdict keep its promises? Simulated compares, no training: each candidate's
per-seed results are drawn from a known distribution and go through the same race
(`augtune.analysis.race`) and verdict (`augtune.analysis.verdict`) code as a real compare's
records.

Run:  python benchmarks/race_calibration.py [--compares 1000] [--seed 0]

The model of a result: candidate c at seed s scores mu_c + u_s + e_cs, where u_s ~ N(0, tau^2) is
the seed's effect every candidate shares (data order, initial weights) and e_cs ~ N(0, sd^2) its
own noise; sd = 1 point, tau = 0.5 points (the seed spread of a k-NN accuracy on a small image
set). The untrained encoder (random-init) scores 15 points below the field per seed, the raw input
a constant. The race is compare.race {min_seeds: 3, max_seeds: 10} at alpha = 0.05.

It prints one table:
- false winner: how often a winner is named when no true difference exists (goal <= alpha), with
  two equal entrants (the worst case: one rejection names a winner), five, and five with two
  finalists each; beside it, the rate a race testing at alpha at every look would have, and the
  rate of the one-look verdict of every entrant on 3 seeds (the design before the race);
- power: how often the better of two entrants is named when they differ by the detectable
  difference the verdict states for such a race at max_seeds (the median of what it states over the
  null compares of two entrants, from their observed spread) (goal >= 0.8);
- runs: on a realistic case (one clear winner, two close runners-up 2.5 points behind, two clearly
  worse, 6 and 10 points behind), the race's power and mean runs against a fixed-seed design (every
  entrant on n seeds, one look by the same verdict) with the smallest n that reaches the race's
  power (goal: >= 30 % fewer runs); and a harder case (runners-up 2 points behind) for contrast.
Every rate is over `--compares` simulated compares (± its standard error; "met" allows two).
The compares are sequential and single-threaded: about 12 minutes on two busy cores with the
default 1,000.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from augtune.analysis import race as racing  # noqa: E402
from augtune.analysis import stats  # noqa: E402
from augtune.analysis.verdict import verdict  # noqa: E402

METRIC = "knn_acc"
SD, TAU = 0.01, 0.005
MIN_SEEDS, MAX_SEEDS, ALPHA = 3, 10, 0.05
UNTRAINED_BELOW, RAW = 0.15, 0.85


class World:
    """Draws the per-seed results of a compare's candidates: `means` {candidate: mu}, the entrant
    of a candidate being its id up to `#`."""

    def __init__(self, means: dict[str, float], rng: np.random.Generator):
        self.means, self.rng = means, rng

    def draw(self, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        shared = TAU * self.rng.standard_normal(n)
        values = {c: mu + shared + SD * self.rng.standard_normal(n)
                  for c, mu in self.means.items()}
        floor = min(self.means.values()) - UNTRAINED_BELOW
        return values, floor + shared + SD * self.rng.standard_normal(n)


def records(values: dict[str, np.ndarray], untrained: np.ndarray, seeds, taken=None) -> list[dict]:
    """Repeat records as a compare leaves them (`taken`: {candidate: seeds it ran}, else all)."""
    out = []
    for cid, x in values.items():
        for i, s in enumerate(seeds):
            if taken is not None and s not in taken.get(cid, ()):
                continue
            out.append({"status": "completed", "method": cid.split("#")[0],
                        "entrant": cid.split("#")[0], "candidate": cid, "seed": s,
                        "final": {METRIC: float(x[i])},
                        "references": {"raw": {METRIC: RAW},
                                       "random-init": {METRIC: float(untrained[i])}}})
    return out


def settings() -> racing.RaceSettings:
    return racing.RaceSettings(METRIC, tuple(range(1, MAX_SEEDS + 1)), MIN_SEEDS, ALPHA)


def one_race(world: World) -> tuple[str | None, int, float | None]:
    """(the entrant the verdict names best or None, runs spent, the detectable difference it
    states)."""
    s = settings()
    values, untrained = world.draw(MAX_SEEDS)
    index = {k: i for i, k in enumerate(s.seeds)}
    order = sorted(world.means, key=lambda c: (int(c.split("#")[1]), c))
    state = racing.start(s, [(c, c.split("#")[0], {}) for c in order])
    while not state.stopped:
        got: dict[str, dict[int, float]] = {}
        for cid, k in racing.due(state):
            got.setdefault(cid, {})[k] = float(values[cid][index[k]])
        state = racing.advance(state, got)
    taken = {c: set(r) for c, r in state.results.items()}
    v = verdict(records(values, untrained, s.seeds, taken), (METRIC,), alpha=ALPHA, race=state)
    w = v.winner(METRIC)
    return (w.entrant if w else None), state.runs(), v.decisions[METRIC].detectable


def one_fixed(world: World, n: int) -> str | None:
    values, untrained = world.draw(n)
    v = verdict(records(values, untrained, tuple(range(1, n + 1))), (METRIC,), alpha=ALPHA)
    w = v.winner(METRIC)
    return w.entrant if w else None


def naive_rate(world: World, compares: int) -> float:
    """Two candidates tested at alpha after every seed: how often some look rejects (no
    correction for the repeated looks)."""
    a, b = world.means
    hits = 0
    looks = range(MIN_SEEDS, MAX_SEEDS + 1)
    for _ in range(compares):
        x, _ = world.draw(MAX_SEEDS)
        hits += any(stats.paired_p(x[a][:k], x[b][:k]) < ALPHA for k in looks)
    return hits / compares


def rate(hits: int, n: int) -> str:
    p = hits / n
    return f"{p:.3f} ± {math.sqrt(max(p * (1 - p), 1e-12) / n):.3f}"


def at_most(hits: int, n: int, goal: float) -> str:
    """Met when the rate is within two standard errors of at most `goal`."""
    return _ok(hits / n <= goal + 2 * math.sqrt(goal * (1 - goal) / n))


def entrants(*mus: float, finalists: int = 1) -> dict[str, float]:
    """Candidates of entrants e1, e2, ... with means `mus`, `finalists` equal configurations
    each."""
    return {f"e{i}#{r}": mu for i, mu in enumerate(mus, 1) for r in range(1, finalists + 1)}


def false_winners(rng, n: int) -> tuple[list[tuple], list[float]]:
    """The null lines, and the detectable differences stated by the null races of two entrants
    that ran to max_seeds."""
    rows, stated = [], []
    race = f"race {MIN_SEEDS}..{MAX_SEEDS}"
    for label, means, m in (("null: 2 equal entrants", entrants(0.9, 0.9), 4 * n),
                            ("null: 5 equal entrants", entrants(*[0.9] * 5), n),
                            ("null: 5 equal entrants x 2 finalists",
                             entrants(*[0.9] * 5, finalists=2), n)):
        out = [one_race(World(means, rng)) for _ in range(m)]  # two entrants: cheap, 4x the draws
        named = sum(w is not None for w, _, _ in out)
        rows.append((label, race, f"false winner {rate(named, m)}", f"<= {ALPHA:g}",
                     at_most(named, m, ALPHA)))
        if len(means) == 2:
            stated = [d for _, runs, d in out if d is not None and runs == 2 * MAX_SEEDS]
            naive = naive_rate(World(means, rng), n)
            rows.append((label, "alpha at every look", f"false winner {naive:.3f}",
                         f"<= {ALPHA:g}", _ok(naive <= ALPHA)))
    fixed = sum(one_fixed(World(entrants(*[0.9] * 5), rng), 3) is not None for _ in range(n))
    rows.append(("null: 5 equal entrants", "fixed n = 3, one look",
                 f"false winner {rate(fixed, n)}", f"<= {ALPHA:g}", at_most(fixed, n, ALPHA)))
    return rows, stated


def power_line(rng, n: int, stated: list[float]) -> tuple:
    d = float(np.median(stated))
    truth = stats.detectable_difference(math.sqrt(2) * SD, MAX_SEEDS, settings().level)
    out = [one_race(World(entrants(0.9 + d, 0.9), rng)) for _ in range(n)]
    right = sum(w == "e1" for w, _, _ in out)
    return (f"2 entrants {100 * d:.2f} points apart: the D stated at n = {MAX_SEEDS} "
            f"({100 * truth:.2f} from the true spread)", "race", f"power {rate(right, n)}",
            ">= 0.8", _ok(right / n >= 0.8 - 2 * math.sqrt(0.8 * 0.2 / n)))


def runs_lines(rng, n: int, label: str, means: dict[str, float], goal: bool) -> list[tuple]:
    """The race's power and runs, and the fixed design with the fewest seeds that reaches it."""
    out = [one_race(World(means, rng)) for _ in range(n)]
    power = sum(w == "e1" for w, _, _ in out) / n
    runs = float(np.mean([r for _, r, _ in out]))
    fixed_n, fixed_power = None, 0.0
    for k in range(MIN_SEEDS, 4 * MAX_SEEDS):
        fixed_power = sum(one_fixed(World(means, rng), k) == "e1" for _ in range(n)) / n
        if fixed_power >= power:
            fixed_n = k
            break
    fixed_runs = len(means) * fixed_n if fixed_n else math.nan
    saving = 1 - runs / fixed_runs
    return [(label, f"race {MIN_SEEDS}..{MAX_SEEDS}", f"power {power:.3f}, {runs:.1f} runs", "",
             ""),
            (label, f"fixed n = {fixed_n}, one look",
             f"power {fixed_power:.3f}, {fixed_runs} runs: the race saves {100 * saving:.0f} %",
             ">= 30 % fewer" if goal else "(contrast)", _ok(saving >= 0.3) if goal else "")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compares", type=int, default=1000, help="simulated compares per line")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    n, rng, t0 = args.compares, np.random.default_rng(args.seed), time.time()
    rows, stated = false_winners(rng, n)
    rows.append(power_line(rng, n, stated))
    rows += runs_lines(rng, n, "realistic: winner, 2 runners-up -2.5, 2 worse -6/-10 points",
                       entrants(0.95, 0.925, 0.925, 0.89, 0.85), goal=True)
    rows += runs_lines(rng, n, "harder: runners-up -2 points",
                       entrants(0.95, 0.93, 0.93, 0.89, 0.85), goal=False)
    print(f"race calibration: {n} simulated compares per line (4x for two null entrants); race "
          f"{MIN_SEEDS}..{MAX_SEEDS} seeds at alpha {ALPHA:g}, per-look level "
          f"{settings().level:.4f}; seed sd {100 * SD:g} points, {100 * TAU:g} shared; met: "
          f"within two standard errors; {time.time() - t0:.0f} s")
    rows.insert(0, ("case", "design", "measured", "goal", "met"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def _ok(good: bool) -> str:
    return "yes" if good else "NO"


if __name__ == "__main__":
    raise SystemExit(main())
