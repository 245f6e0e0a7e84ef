"""The verdict of `augtune compare`, made from records on disk: which entrant wins, whether the win
is real, and whether training beats the untrained encoder at all.

One row per entrant: mean ± std over its repeat seeds (n), per metric; with a race (`race.py`), the
row of the entrant's candidate that raced longest (its best configuration still racing, else the
one eliminated last).

Per metric, the entrant with the highest mean (the leader; the lowest for alignment and uniformity,
`LOWER_IS_BETTER`) is named best only when the tests separate it from every other ranked entrant and
it beats the untrained encoder:
- the race's metric, when there was a race, is decided by the race: separated when the race ended
  with only this entrant's candidates left; its tests ran at the race's per-look level, which keeps
  the chance of a false winner at alpha over all the looks (`stats.sequential_level`);
- every other metric (and all of them without a race) by one look at the seeds the rows share: the
  leader against each other ranked row, a paired t-test over the shared seeds
  (scipy.stats.ttest_rel; Welch's t-test, ttest_ind with equal_var=False, for a pair sharing fewer
  than two seeds), two-sided, Holm-corrected across the tested rows; separated when every one is
  significantly worse. After a race, an entrant it eliminated early has fewer seeds on these
  metrics too: each pair is tested over the seeds it shares.
The untrained encoder is the bar: each entrant's seeds are paired with the `random-init` reference
of the same seeds (every repeat run measures it for its own seed) and tested one-sided (entrant
above it), Holm-corrected across the entrants; an entrant not significantly above it is "no better
than untrained" on that metric and never named best. The raw input (one value, unless the seeds
vary the split: then one per seed, paired like random-init) is tested the same way, by a one-sided
one-sample t-test when it is one value. When the leader is not separated, the
sentence says "no entrant is separated" and states the smallest difference the run could have
detected (power 0.8 at the level its tests used, from the paired differences' spread and n:
`stats.detectable_difference`); with a margin (`compare.margin`), entrants shown equivalent to the
leader by a paired TOST say so.

Bold marks only the entrant named best. A row with n = 1 (or every row, when the leader has n = 1)
carries no test: it says "untested (n = 1)" and is not bold. An entrant whose own diagnostics say
it did not train (the SANITY rules) is flagged with the reason, never bold, never named, not
tested: it is not in Holm's family. An entrant that reads labels while training (CoCor's MMNN:
`cocor.mmnn` with `cocor.label_fraction` > 0) is marked semi-supervised in its row and in the
sentences.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from augtune.analysis import stats
from augtune.analysis.race import RaceState, candidate_of
from augtune.analysis.stats import holm  # the verdict's own since before stats.py
from augtune.config import method_of
from augtune.records import FRACTION_SUFFIXES, LABEL_FREE, LOWER_IS_BETTER, VAL_PREFIX

# (diagnostic key in a record's final metrics, predicate on its value that means "did not train",
# reason)
SANITY: list[tuple[str, Callable[[float], bool], str]] = [
    ("diffaug_gen_std_ratio", lambda v: not 0.5 <= v <= 2.0,
     "generated positives' spread {v:.2f}x the data's"),
    ("diffaug_generator_steps", lambda v: v < 200, "generator barely trained: {v:.0f} updates"),
    ("pinda_noise_norm", lambda v: v < 1e-3, "pi-noise collapsed (mean norm {v:.2g})"),
]
PAIRED = "paired t-test over the shared seeds"
WELCH = "Welch's t-test"
UNTRAINED, RAW = "random-init", "raw"


@dataclass
class Cell:
    mean: float
    std: float
    n: int
    seeds: dict[int, float] = field(default_factory=dict)
    # raw p-value against the leader (None: the leader itself, or untested)
    p: Optional[float] = None
    p_holm: Optional[float] = None
    bold: bool = False
    note: str = ""  # "best", "highest mean", "untested (n = 1)", "Holm p = 0.003" ...
    untrained_p: Optional[float] = None  # Holm-adjusted one-sided p against random-init
    raw_p: Optional[float] = None  # Holm-adjusted one-sided p against the raw input


@dataclass
class Row:
    entrant: str
    cells: dict[str, Cell]
    flag: str = ""  # why the entrant's own diagnostics say it did not train ("" when fine)
    epoch_time: float = float("nan")  # mean seconds per epoch over its repeat runs
    relative_cost: float = float("nan")  # epoch time / the plain base's
    compute_s: float = float("nan")  # seconds of training over all its runs (search and repeat)
    candidate: str = ""  # the race's candidate the row shows (`entrant#rank`)
    semi: str = ""  # how it reads labels while training ("" when it does not)
    race_note: str = ""  # "eliminated in round 2 (n = 4)", "withdrawn: ..."
    out_round: Optional[int] = None  # the race's round that eliminated its last candidate
    untrained: dict[str, dict[int, float]] = field(default_factory=dict, repr=False)  # random-init
    # of its own runs: metric -> seed -> value


@dataclass
class Decision:
    """What the tests say about one metric."""

    metric: str
    leader: Optional[str] = None  # the highest mean among the ranked entrants
    separated: bool = False  # the tests separate the leader from every other ranked entrant
    by_race: bool = False
    contenders: list[str] = field(default_factory=list)  # tested, not shown worse than the leader
    worse: list[str] = field(default_factory=list)
    untested: list[str] = field(default_factory=list)  # n = 1
    equivalent: list[str] = field(default_factory=list)  # shown equivalent to the leader (TOST)
    detectable: Optional[float] = None  # the smallest difference the run could detect (power 0.8)
    detectable_n: int = 0
    level: float = 0.05  # the level of its tests against the leader (before Holm)
    beats_untrained: dict[str, Optional[bool]] = field(default_factory=dict)  # None: untested
    beats_raw: dict[str, Optional[bool]] = field(default_factory=dict)
    rounds: int = 0  # the race's rounds (by_race)
    stop: str = ""  # why the race stopped ("" while it races)

    @property
    def winner(self) -> Optional[str]:
        """The entrant named best: separated, and not shown no better than untrained."""
        if self.leader is None or not self.separated:
            return None
        return None if self.beats_untrained.get(self.leader) is False else self.leader


@dataclass
class Verdict:
    rows: list[Row]
    references: dict[str, dict[str, float]]  # name -> metric -> mean over the seeds
    metrics: tuple[str, ...]
    test: str  # "paired t-test over the shared seeds" or "Welch's t-test"
    alpha: float = 0.05
    unfinished: bool = False
    decisions: dict[str, Decision] = field(default_factory=dict)
    reference_cells: dict[str, dict[str, Cell]] = field(default_factory=dict)
    race: Optional[RaceState] = None
    margin: Optional[float] = None
    budget: str = ""  # what broke the equal budget of the entrants' searches, when something did
    splits: str = ""  # which split chose the configurations and which one these numbers are on
    time_budget: str = ""  # the compare.time_budget it ran under, and what that left each entrant
    untuned: tuple[str, ...] = ()  # entrants whose search ran one trial: their defaults, never searched
    unlabelled: bool = False  # the data had no labels: every column is label-free
    equal: str = ""  # under `compare.equal: compute`: the epochs each entrant trained for the same compute

    def best(self, metric: str) -> Optional[Row]:
        """The ranked row with the best mean, the highest (the lowest for a lower-is-better metric,
        `LOWER_IS_BETTER`); named best only when `winner` says so."""
        ok = [r for r in self.rows
              if not r.flag and metric in r.cells and math.isfinite(r.cells[metric].mean)]
        return max(ok, key=lambda r: _sign(metric) * r.cells[metric].mean) if ok else None

    def winner(self, metric: str) -> Optional[Row]:
        d = self.decisions.get(metric)
        name = d.winner if d else None
        return next((r for r in self.rows if r.entrant == name), None)

    def row(self, entrant: str) -> Row:
        return next(r for r in self.rows if r.entrant == entrant)

    # -- words ------------------------------------------------------------------------------------

    def sentences(self) -> list[str]:
        return [self._untuned()] * bool(self.untuned) + [self._sentence(m) for m in self.metrics] + [
            t for t in (self._label_free(), self._schedules(), self._race_apart(), self.budget,
                        self.time_budget, self.equal, self.splits)
            if t]

    def _label_free(self) -> str:
        """What a label-free column can and cannot claim: which entrant scores best, not which is
        more accurate."""
        free = [m for m in self.metrics if m in LABEL_FREE]
        if not free:
            return ""
        only = len(free) == len(self.metrics)
        what = {"rankme": "rankme is the effective rank of the embedding (Garrido et al., 2023), higher "
                          "meaning a less collapsed embedding",
                "alignment": "alignment is the mean squared distance between two views' normalised "
                             "embeddings (Wang and Isola, 2020), lower meaning views closer together",
                "uniformity": "uniformity is the log mean Gaussian potential between embeddings (Wang and "
                              "Isola, 2020), lower meaning embeddings spread more evenly"}
        one = len(free) == 1
        text = (f"{_names(free)} {'is' if one else 'are'} label-free: " + "; ".join(what[m] for m in free)
                + ("; it is not an accuracy. " if one else "; none is an accuracy. "))
        if "rankme" in free:
            text += ("RankMe's paper found that choosing hyperparameters by it loses little against "
                     "choosing by a labelled probe on ImageNet; what it loses on smaller data")
        else:
            text += f"What choosing by {'it' if one else 'them'} loses"
        text += (" is measured in docs/guides/unlabelled.md. An untrained encoder's embedding is not "
                 "collapsed either, so falling short of it does not say that training failed")
        return text + (". No accuracy is claimed here: this data has no labels." if only and self.unlabelled
                       else ".")

    def __repr__(self) -> str:  # the dataclass's would dump every cell and seed (13,000 characters)
        return f"<Verdict over {', '.join(self.metrics)} of {len(self.rows)} entrants: {self.plainly()}>"

    def _repr_markdown_(self) -> str:
        """A notebook shows the answer first, then the table and its sentences (no caption)."""
        return self.plainly() + "\n\n" + self.render("md", caption=False, plainly=False)

    def _repr_html_(self) -> str:
        import html

        return (f"<p><b>{html.escape(self.plainly())}</b></p>{self.table_html()}"
                + "".join(f"<p>{html.escape(t)}</p>" for t in self.sentences()))

    def plainly(self) -> str:
        """The answer in plain words, written from the decisions (what a reader takes away; the
        sentences above it say the same with their numbers): who leads the first metric and whether the
        tests separate it, against what the untrained encoder and the raw input give, what is not
        ranked, and how small a difference the seeds could see."""
        first = self.metrics[0] if self.metrics else None
        d = self.decisions.get(first) if first else None
        if d is None or d.leader is None:
            return "Plainly: no entrant has a value."
        leader, parts = self._named(d.leader), []
        if self.untuned:
            parts.append(f"{_names(self.untuned)} ran {'its' if len(self.untuned) == 1 else 'their'} "
                         "untuned defaults (one search trial)")
        if d.winner:
            parts.append(f"{leader} is best on {first}: the tests separate it from every other entrant, "
                         "and it beats the untrained encoder")
        elif d.separated:
            parts.append(f"{leader} has the {_most(first)} {first} and is separated from the others, "
                         "but it is no better than the untrained encoder")
        elif d.contenders:
            parts.append(f"{leader} has the {_most(first)} {first}, but {_names(d.contenders)} "
                         f"{_be(d.contenders)} not separated from it")
        else:
            parts.append(f"{leader} has the {_most(first)} {first}")
        if d.worse:
            parts.append(f"{_names(d.worse)} {_be(d.worse)} significantly "
                         f"{'above' if _sign(first) < 0 else 'below'} it")
        parts += self._plain_bars()
        parts += [f"{r.entrant} reads labels while training (semi-supervised)" for r in self.rows if r.semi]
        parts += [f"{r.entrant} is not ranked ({r.flag})" for r in self.rows if r.flag]
        sizes = [(m, dm.detectable, dm.detectable_n) for m, dm in self.decisions.items()
                 if dm.detectable is not None and math.isfinite(dm.detectable)]
        if sizes:
            n = max(k for _, _, k in sizes)
            if all(m.endswith(FRACTION_SUFFIXES) for m, _, _ in sizes):
                lo, hi = min(v for _, v, _ in sizes), max(v for _, v, _ in sizes)
                span = _pts(sizes[0][0], lo) if lo == hi else f"{100 * lo:.2g}–{_pts(sizes[0][0], hi)}"
            else:
                span = ", ".join(f"{_pts(m, v)} ({m})" for m, v, _ in sizes)
            parts.append(f"with n = {n} seeds, differences under {span} could not be detected")
        text = "; ".join(parts)
        return f"Plainly: {text}."

    def _plain_bars(self) -> list[str]:
        """Per metric, in words: who beats the untrained encoder; the metrics where nothing beats raw."""
        some, none, every, no_raw = [], [], [], []
        for m in self.metrics:
            d = self.decisions.get(m)
            if d is None:
                continue
            tested = [e for e, b in d.beats_untrained.items() if b is not None]
            yes = [e for e in tested if d.beats_untrained[e]]
            if tested and not yes:
                none.append(m)
            elif tested and len(yes) == len(tested):
                every.append(m)
            elif tested:
                some.append(f"on {m} only {_names(yes)} {'beats' if len(yes) == 1 else 'beat'} the "
                            "untrained encoder")
            raw = self.references.get(RAW, {}).get(m)
            if raw is not None and math.isfinite(raw) and not any(d.beats_raw.values()):
                no_raw.append(m)
        return [*some, *([f"no entrant beats the untrained encoder on {_names(none)}"] if none else []),
                *([f"every entrant beats the untrained encoder on {_names(every)}"] if every else []),
                *([f"nothing beats the raw input on {_names(no_raw)}"] if no_raw else [])]

    def _untuned(self) -> str:
        """First, before any ranking: which rows compare configurations nobody searched."""
        one = len(self.untuned) == 1
        return (f"Untuned defaults: {_names(self.untuned)} ran one search trial, so "
                f"{'its row is' if one else 'their rows are'} the default configuration, not a searched "
                f"one; what follows compares {'it' if one else 'them'} untuned (a larger budget or "
                "compare.trials searches).")

    def _schedules(self) -> str:
        """Schedule against constant: every method entered under both (`simclr+pinda@pbt` beside
        `simclr+pinda`, `compare.scheduler: [asha, pbt]`), per metric, the difference of the means and a
        two-sided test over the shared seeds, Holm-corrected across a metric's pairs (a planned comparison
        of its own, outside the leader's family)."""
        ranked = {r.entrant for r in self.rows if not r.flag}
        pairs = sorted((r.entrant, method_of(r.entrant)) for r in self.rows
                       if r.entrant in ranked and r.entrant != method_of(r.entrant)
                       and method_of(r.entrant) in ranked)
        said = []
        for m in self.metrics:
            tested, untested = [], []
            for sched, const in pairs:
                a, b = self.row(sched).cells.get(m), self.row(const).cells.get(m)
                if a is None or b is None or not (math.isfinite(a.mean) and math.isfinite(b.mean)):
                    continue
                if min(a.n, b.n) < 2:
                    untested.append(f"{sched} against {const}: untested (n = 1)")
                else:
                    tested.append((sched, const, a.mean - b.mean, _p_value(a, b)[0]))
            words = []
            for (sched, const, diff, _), p in zip(tested, holm([t[3] for t in tested])):
                sign = "+" if diff >= 0 else "−"
                how = f"{sign}{_pts(m, abs(diff))}, Holm p = {p:.2g}"
                if p < self.alpha:
                    verb = "beats" if diff > 0 else "is worse than"
                    words.append(f"{sched}'s schedule {verb} {const}'s constant ({how})")
                else:
                    words.append(f"{sched}'s schedule is not distinguishable from {const}'s constant ({how})")
            if words or untested:
                said.append(f"{m}: " + "; ".join(words + untested))
        return f"Schedule against constant: {'. '.join(said)}." if said else ""

    def _race_apart(self) -> str:
        """What the race did, when it decided on a metric that is not a column (its metric on the
        validation split): the columns are then each tested once, on the test split."""
        race = self.race
        if race is None or race.settings.metric in self.metrics:
            return ""
        s = race.settings
        on = s.metric[len(VAL_PREFIX):] if s.metric.startswith(VAL_PREFIX) else s.metric
        out = sorted((c for c in race.candidates if c.status == "eliminated" and c.out_round),
                     key=lambda c: (c.out_round, c.id))
        gone = (f"; {', '.join(f'{c.id} (round {c.out_round})' for c in out)} "
                f"{'was' if len(out) == 1 else 'were'} eliminated" if out else "; nobody was eliminated")
        where = ("the same rows (no labels, no other split)" if self.unlabelled else "the validation split")
        tested = "on those rows" if self.unlabelled else "on the test split"
        return (f"The race ({on} on {where}, {s.min_seeds} to {s.max_seeds} seeds, each "
                f"round's tests at level {s.level:.3g}) stopped after {len(race.rounds)} rounds, "
                f"{_stop_words(race)}{gone}; the columns are tested once, {tested}.")

    def _sentence(self, m: str) -> str:
        d = self.decisions.get(m, Decision(m))
        if d.leader is None:
            return f"{m}: no entrant has a value."
        text = f"{m}: " + self._head(d) + self._others(d) + self._bar(d)
        semi = [r for r in self.rows if r.semi and m in r.cells]
        if semi:
            text += "; " + "; ".join(f"{r.entrant} reads labels while training ({r.semi}): "
                                     "semi-supervised" for r in semi)
        flagged = [f"{r.entrant} ({r.flag})" for r in self.rows if r.flag]
        text += (f". Not ranked: {'; '.join(flagged)}" if flagged else "") + "."
        if d.detectable is not None and math.isfinite(d.detectable):
            text += (f" Differences under {_pts(m, d.detectable)} could not be detected with "
                     f"n = {d.detectable_n}.")
        return text

    def _named(self, entrant: str) -> str:
        row = next((r for r in self.rows if r.entrant == entrant), None)
        return f"{entrant} (semi-supervised)" if row is not None and row.semi else entrant

    def _head(self, d: Decision) -> str:
        c = self.row(d.leader).cells[d.metric]
        stat = f"{_val(d.metric, c.mean)} ± {_val(d.metric, c.std)}, n = {c.n}"
        race = f"; the race stopped after {d.rounds} rounds, {d.stop}" if d.by_race else ""
        if d.winner:
            how = ": the race separated it from every other entrant" if d.by_race else ""
            return f"{self._named(d.leader)} is best ({stat}){how}{race}"
        if d.separated:
            return (f"no entrant is best: {self._named(d.leader)} is separated from the others "
                    f"({stat}) but no better than untrained{race}")
        if not d.contenders and not d.worse and not d.untested:
            return f"{self._named(d.leader)} is the only ranked entrant ({stat}){race}"
        if c.n < 2:
            return (f"no entrant is separated ({_most(d.metric)} mean: {d.leader}, {stat}; with n = 1 "
                    f"nothing can be tested){race}")
        return f"no entrant is separated ({_most(d.metric)} mean: {self._named(d.leader)}, {stat}){race}"

    def _others(self, d: Decision) -> str:
        text = ""
        level = f"Holm p >= {d.level:.2g}" if d.by_race else f"Holm p >= {self.alpha:g}"
        if d.contenders:
            text += (f"; {_names(d.contenders)} {_be(d.contenders)} not distinguishable from it "
                     f"({level})")
        if d.equivalent:
            text += (f"; {_names([d.leader, *d.equivalent])} are equivalent within "
                     f"±{_pts(d.metric, self.margin)} (TOST)")
        if d.worse and d.by_race:
            out = [f"{e} (round {self.row(e).out_round})" if self.row(e).out_round else e
                   for e in d.worse]
            text += f"; {_names(out)} {'was' if len(out) == 1 else 'were'} eliminated as " \
                    "significantly worse"
        elif d.worse:
            text += f"; {_names(d.worse)} {_be(d.worse)} significantly worse"
        if d.untested:
            text += f"; {_names(d.untested)} cannot be tested (n = 1)"
        return text

    def _bar(self, d: Decision) -> str:
        """Against the untrained encoder and the raw input."""
        return self._against_untrained(d) + self._against_raw(d)

    def _against_untrained(self, d: Decision) -> str:
        ref = self.reference_cells.get(UNTRAINED, {}).get(d.metric)
        if ref is None:
            return "; the untrained encoder (random-init) was not measured"
        what = f"random-init {_val(d.metric, ref.mean)} ± {_val(d.metric, ref.std)}, n = {ref.n}"
        if not d.beats_untrained:  # no entrant with two seeds paired with it
            return f"; nothing can be tested against the untrained encoder ({what})"
        yes = [e for e, b in d.beats_untrained.items() if b]
        no = [e for e, b in d.beats_untrained.items() if b is False]
        raw_all = bool(d.beats_raw) and all(d.beats_raw.values())
        if not yes and no and raw_all:
            return (f"; every entrant beats the raw input but none beats the untrained encoder "
                    f"({what})")
        if not yes and no:
            return f"; no entrant beats the untrained encoder ({what})"
        if not no and len(yes) == len(d.beats_untrained):
            return f"; training beats the untrained encoder for every entrant ({what}, " \
                   f"Holm p < {self.alpha:g})"
        text = f"; {_names(yes)} {'beats' if len(yes) == 1 else 'beat'} the untrained encoder " \
               f"({what}, Holm p < {self.alpha:g})"
        return text + (f", {_names(no)} {_be(no)} no better than untrained" if no else "")

    def _against_raw(self, d: Decision) -> str:
        raw = self.references.get(RAW, {}).get(d.metric)
        if raw is None or not math.isfinite(raw):
            return ""
        at = _val(d.metric, raw)
        yes = [e for e, b in d.beats_raw.items() if b]
        if yes and len(yes) == len(d.beats_raw) and len(yes) > 1:
            if not any(d.beats_untrained.values()) and any(v is False for v in
                                                          d.beats_untrained.values()):
                return ""  # said with the untrained encoder
            return f"; every entrant beats the raw input ({at}, Holm p < {self.alpha:g})"
        if yes:
            return (f"; {_names(yes)} {'beats' if len(yes) == 1 else 'beat'} the raw input "
                    f"({at}, Holm p < {self.alpha:g})")
        sign = _sign(d.metric)
        above = [r.entrant for r in self.rows if not r.flag and d.metric in r.cells
                 and sign * r.cells[d.metric].mean > sign * raw]
        if above:
            return (f"; {_names(above)} {_be(above)} {'below' if sign < 0 else 'above'} the raw input "
                    f"({at}) but not significantly")
        return f"; nothing beats the raw input ({at})"

    def caption(self) -> str:
        free = [m for m in self.metrics if m in LABEL_FREE]
        units = {"rankme": "rankme in dimensions", "alignment": "alignment in squared distance",
                 "uniformity": "uniformity in log potential"}
        free_units = ", ".join(units[m] for m in free)
        unit = ("in %" if not free else free_units if len(free) == len(self.metrics)
                else f"in % ({free_units})")
        parts = [("unfinished experiment: " if self.unfinished else "")
                 + f"mean ± std over the repeat seeds (n), {unit}"]
        rows = "each row"
        if self.race is not None and self.race.settings.metric not in self.metrics:
            parts.append(f"a race on the validation split ({self.race.settings.metric}, not a column) chose "
                         "each entrant's configuration: a row shows the one that raced longest")
        elif self.race is not None:
            s = self.race.settings
            parts.append(f"{s.metric} was decided by a race of {s.min_seeds} to {s.max_seeds} "
                         f"seeds, each round's tests at level {s.level:.3g}, which keeps a false "
                         f"winner at alpha over all its looks; a row shows the entrant's "
                         "configuration that raced longest")
            rows = "in the other columns, each row"
        lower = [m for m in self.metrics if _sign(m) < 0]
        best = "the highest mean of its column" + (f" (the lowest for {_names(lower)})" if lower else "")
        parts += [f"{rows} against {best} by a {self.test}, two-sided, "
                  f"Holm-corrected across the tested rows (alpha = {self.alpha:g})",
                  "bold: only an entrant the tests separate from every other and that beats the "
                  "untrained encoder (random-init, paired by seed, one-sided, Holm-corrected)",
                  "a row with n = 1 is untested and not bold",
                  "a flagged entrant (its own diagnostics say it did not train) is neither tested "
                  "nor bold",
                  "a detectable difference: power 0.8 at the strictest Holm level of its tests",
                  "cost: epoch time relative to the plain base, and total training time of all "
                  "the entrant's runs"]
        return "; ".join(parts)

    # -- tables -----------------------------------------------------------------------------------

    def table(self) -> pd.DataFrame:
        """The table as numbers, one row per entrant then per reference (`raw`, `random-init`), in the
        printed order: `entrant`, `kind` ("entrant" or "reference"); per metric m, `m` (the mean over
        the repeat seeds, in the metric's own units: 0.9654, not "96.54"), `m_std`, `m_n`,
        `m_p_holm` (Holm-adjusted p against the column's leader; NaN for the leader, an untested or a
        reference row) and `m_best` (named best: the bold cell); then `cost_x_base` (epoch time
        relative to the plain base), `compute_min` (training minutes over all the entrant's runs) and
        `note`. `table_text` is its printed form; `numbers` the same numbers in long form with more
        tests' p-values."""
        def metric_columns(cells: Mapping[str, Cell]) -> dict:
            out: dict = {}
            for m in self.metrics:
                c = cells.get(m)
                finite = c is not None and math.isfinite(c.mean)
                out |= {m: c.mean if finite else math.nan, f"{m}_std": c.std if finite else math.nan,
                        f"{m}_n": c.n if c is not None else 0,
                        f"{m}_p_holm": math.nan if c is None or c.p_holm is None else c.p_holm,
                        f"{m}_best": bool(c is not None and c.bold)}
            return out

        lines = [{"entrant": r.entrant, "kind": "entrant", **metric_columns(r.cells),
                  "cost_x_base": r.relative_cost, "compute_min": r.compute_s / 60, "note": self._note(r)}
                 for r in self.rows]
        lines += [{"entrant": name, "kind": "reference", **metric_columns(cells), "cost_x_base": math.nan,
                   "compute_min": math.nan, "note": "reference"}
                  for name, cells in self.reference_cells.items()]
        suffixes = ("", "_std", "_n", "_p_holm", "_best")
        per_metric = [f"{m}{suffix}" for m in self.metrics for suffix in suffixes]
        columns = ["entrant", "kind", *per_metric, "cost_x_base", "compute_min", "note"]
        frame = pd.DataFrame(lines, columns=columns)
        for m in self.metrics:  # an empty table keeps its columns' kinds too
            frame = frame.astype({f"{m}_n": int, f"{m}_best": bool})
        return frame

    def table_text(self, markup: str = "md") -> list[list[str]]:
        """The printed form of `table`: the header, then one list of cells per row, references last.
        A metric's cell is `mean ± std (n)` in its printed units (accuracies in %), "–" without a
        value. `markup` "md" marks the bold cell `**...**` and a reference's name `*...*` (what
        `render` prints); "html" escapes every cell and marks them `<b>`, `<i>`."""
        import html

        if markup not in ("md", "html"):
            raise ValueError(f"markup: {markup!r} is not md or html")

        def cell(text: str, mark: str = "") -> str:
            if markup == "md":
                return f"{mark}{text}{mark}" if mark else text
            tag = {"**": "b", "*": "i"}.get(mark)
            return f"<{tag}>{html.escape(text)}</{tag}>" if tag else html.escape(text)

        out = [[cell(c) for c in ("entrant", *self.metrics, "cost (x base)", "compute", "note")]]
        for line in self.table().to_dict("records"):
            ref = line["kind"] == "reference"
            shown = [cell(_show(m, line[m], line[f"{m}_std"], line[f"{m}_n"]),
                          "**" if line[f"{m}_best"] else "") for m in self.metrics]
            cost = ["", ""] if ref else [_num(line["cost_x_base"], "{:.2f}x"),
                                         _num(line["compute_min"], "{:.1f} min")]
            out.append([cell(line["entrant"], "*" if ref else ""), *shown, *cost, cell(line["note"])])
        return out

    def table_html(self) -> str:
        """`table_text` as an HTML table: what a notebook shows and the report holds."""
        rows = self.table_text("html")
        head = "<tr>" + "".join(f"<th>{c}</th>" for c in rows[0]) + "</tr>"
        body = ["<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows[1:]]
        return "\n".join(["<table>", f"<thead>{head}</thead>", "<tbody>", *body, "</tbody>", "</table>"])

    def _note(self, r: Row) -> str:
        if r.flag:
            return r.flag
        notes = [r.race_note] if r.race_note else []
        notes += sorted({c.note for c in r.cells.values() if c.note.startswith("untested")})
        bad = [m for m in self.metrics if self.decisions.get(m)
               and self.decisions[m].beats_untrained.get(r.entrant) is False]
        if bad:
            notes.append(f"no better than untrained ({', '.join(bad)})")
        if r.semi:
            notes.append("semi-supervised")
        if r.entrant in self.untuned:
            notes.append("untuned defaults")
        return "; ".join(notes)

    def numbers(self) -> pd.DataFrame:
        """The table as numbers, long form: one line per (entrant or reference, metric) with mean,
        std, n (in the metric's own units: 0.9654, not "96.54"), the Holm-adjusted p against the
        leader and the one-sided ones against random-init and raw, whether it is named best (bold),
        its note, and the entrant's cost, flag and semi-supervision (`export --format csv`)."""
        lines = []
        for r in self.rows:
            for m in self.metrics:
                c = r.cells.get(m)
                if c is None:
                    continue
                lines.append({"entrant": r.entrant, "kind": "entrant", "metric": m, "mean": c.mean,
                              "std": c.std, "n": c.n, "p_holm": c.p_holm, "p_untrained": c.untrained_p,
                              "p_raw": c.raw_p, "best": c.bold, "note": c.note,
                              "relative_cost": r.relative_cost, "compute_s": r.compute_s,
                              "flag": r.flag, "semi_supervised": r.semi})
        for name, cells in self.reference_cells.items():
            for m, c in cells.items():
                lines.append({"entrant": name, "kind": "reference", "metric": m, "mean": c.mean,
                              "std": c.std, "n": c.n, "best": False, "note": "reference"})
        columns = ["entrant", "kind", "metric", "mean", "std", "n", "p_holm", "p_untrained", "p_raw",
                   "best", "note", "relative_cost", "compute_s", "flag", "semi_supervised"]
        return pd.DataFrame(lines, columns=columns)

    def render(self, fmt: str = "md", *, caption: bool = True, plainly: bool = True) -> str:
        """The verdict as `fmt`: md (the caption, the table, its sentences, then the plain-words answer:
        `caption`, `plainly` leave them out), latex (a booktabs table) or csv (its numbers)."""
        if fmt == "csv":  # numbers, not the text of the cells
            return self.numbers().to_csv(index=False)
        rows = self.table_text("md")
        if fmt == "latex":
            return _latex(rows, self.caption())
        lines = ["| " + " | ".join(rows[0]) + " |",
                 "| :--- |" + " ---: |" * (len(rows[0]) - 2) + " :--- |"]
        lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
        head = [f"Table: {self.caption()}", ""] if caption else []
        tail = ["", self.plainly()] if plainly else []
        return "\n".join([*head, *lines, "", *self.sentences(), *tail]) + "\n"




def _sign(metric: str) -> float:
    """+1 where higher is better, -1 for a lower-is-better metric (alignment, uniformity)."""
    return -1.0 if metric in LOWER_IS_BETTER else 1.0


def _most(metric: str) -> str:
    return "lowest" if metric in LOWER_IS_BETTER else "highest"


def _val(metric: str, v: float) -> str:
    if metric == "rankme":  # an effective rank: dimensions, to two decimals as the accuracies
        return f"{v:.2f}"
    if metric in LOWER_IS_BETTER:  # alignment in [0, 4], uniformity in [-4, 0]: three decimals
        return f"{v:.3f}"
    return f"{100 * v:.2f}" if metric.endswith(FRACTION_SUFFIXES) or metric == "" else f"{v:.4g}"


def _pts(metric: str, v: Optional[float]) -> str:
    if v is None:
        return "–"
    return f"{100 * v:.2g} points" if metric.endswith(FRACTION_SUFFIXES) else f"{v:.3g}"


def _names(names: Sequence[str]) -> str:
    return ", ".join(names)


def _be(names: Sequence[str]) -> str:
    return "is" if len(names) == 1 else "are"


def _show(metric: str, mean: float, std: float, n: int) -> str:
    """A metric's cell as printed: `mean ± std (n)`, "–" without a value."""
    if not math.isfinite(mean):
        return "–"
    return f"{_val(metric, mean)} ± {_val(metric, std)} ({n})"


def _num(v: float, fmt: str) -> str:
    return fmt.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else "–"


def _latex(rows: list[list[str]], caption: str) -> str:
    def tex(cell: str) -> str:
        for plain, tex_ in (("±", r"$\pm$"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#")):
            cell = cell.replace(plain, tex_)
        if cell.startswith("**") and cell.endswith("**"):
            return r"\textbf{" + cell[2:-2] + "}"
        return cell.replace("*", "")

    cols = "l" + "r" * (len(rows[0]) - 2) + "l"
    out = ["% needs \\usepackage{booktabs}", r"\begin{table}", r"\centering",
           f"\\caption{{{tex(caption)}}}", f"\\begin{{tabular}}{{{cols}}}", r"\toprule",
           " & ".join(tex(c) for c in rows[0]) + r" \\", r"\midrule"]
    out += [" & ".join(tex(c) for c in row) + r" \\" for row in rows[1:]]
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(out) + "\n"


# -- from records ---------------------------------------------------------------------------------

def did_not_train(final: Mapping) -> str:
    """Why a run's own diagnostics (its final metrics) say it did not train, "" when they do not:
    the race withdraws such a candidate (`race.withdraw`), the verdict flags its entrant."""
    for key, bad, reason in SANITY:
        v = final.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v) and bad(v):
            return reason.format(v=v)
    return ""


def flagged_candidates(repeat: Sequence[Mapping]) -> dict[str, str]:
    """{candidate: why its run says it did not train}: the race withdraws these (`race.replay`)."""
    out: dict[str, str] = {}
    for r in repeat:
        why = did_not_train(r.get("final") or {})
        if why:
            out.setdefault(candidate_of(r), why)
    return out


def semi_supervised(record: Mapping) -> str:
    """How a run reads labels while training ("" when it does not): CoCor's MMNN trains on a
    labelled part of train (`cocor.label_fraction`). A record without its config is read by its
    label, with CoCor's defaults (the MMNN on, 1 % labelled)."""
    cfg = record.get("config") or {}
    augment = (cfg.get("method") or {}).get("augment")
    if augment is None:
        augment = method_of(str(record.get("entrant") or record.get("method") or "")).split("+")[1:]
    if "cocor" not in augment:
        return ""
    cocor = cfg.get("cocor") or {}
    fraction = float(cocor.get("label_fraction", 0.01))
    if not cocor.get("mmnn", True) or fraction <= 0:
        return ""
    return f"CoCor's MMNN, {100 * fraction:.3g}% of train labelled"


def verdict(repeat: list[dict], metrics: tuple[str, ...], *, alpha: float = 0.05,
            search: list[dict] = (), unfinished: bool = False, race: Optional[RaceState] = None,
            margin: Optional[float] = None, equal: str = "epochs") -> Verdict:
    """The verdict from the repeat runs' records (and the search trials' records, for the cost).
    `race`: the race of the repeat (`race.replay` of these records), which decides its metric;
    `margin`: the equivalence margin (metric units) of `compare.margin`, None for no TOST; `equal`:
    what the compare held equal (`compare.equal`)."""
    metrics = tuple(metrics)
    margin = margin if margin else (race.settings.margin if race is not None else None)
    by_candidate: dict[str, list[dict]] = {}
    for r in repeat:
        if r.get("status") == "completed":
            by_candidate.setdefault(candidate_of(r), []).append(r)
    rows = _rows(by_candidate, metrics, race)
    _costs(rows, repeat, list(search))
    refs = _reference_seeds(by_candidate, rows, metrics)
    decisions, tests = {}, set()
    for m in metrics:
        if race is not None and m == race.settings.metric:
            decisions[m] = _by_race(rows, m, race)
            tests.add(PAIRED)
        else:
            decisions[m] = _by_one_look(rows, m, alpha, margin, tests)
        _against_references(rows, m, decisions[m], refs, alpha)
        winner = decisions[m].winner
        for r in rows:
            if m in r.cells:
                r.cells[m].bold = r.entrant == winner
                if r.entrant == winner:
                    r.cells[m].note = "best"
    test = PAIRED if tests <= {PAIRED} else WELCH if tests == {WELCH} else \
        f"{PAIRED} ({WELCH} where a pair shares fewer than two)"
    ref_cells = {name: {m: _cell(v) for m, v in by_m.items()} for name, by_m in refs.items()}
    means = {name: {m: c.mean for m, c in cells.items()} for name, cells in ref_cells.items()}
    return Verdict(sorted(rows, key=lambda r: r.entrant), means, metrics, test, alpha, unfinished,
                   decisions, ref_cells, race, margin, budget_note(list(search)),
                   splits_note(list(search), [r for runs in by_candidate.values() for r in runs]),
                   time_note([r for runs in by_candidate.values() for r in runs]),
                   untuned_entrants(list(search)), unlabelled(list(repeat)),
                   equal_note(repeat) if equal == "compute" else "")


def equal_note(repeat: Sequence[Mapping]) -> str:
    """Under `compare.equal: compute`: the epochs each entrant trained, from its repeat runs' configs."""
    epochs: dict[str, int] = {}
    for r in repeat:
        e = ((r.get("config") or {}).get("train") or {}).get("epochs")
        if e is not None:
            epochs.setdefault(r.get("entrant") or r.get("method"), int(e))
    if not epochs:
        return ""
    return ("Equal compute (compare.equal: compute): each entrant trained for about the seconds of the "
            "cheapest one's epochs, a costlier method for fewer epochs: "
            + ", ".join(f"{k} {v}" for k, v in sorted(epochs.items())) + ".")


def unlabelled(repeat: Sequence[Mapping]) -> bool:
    """Whether the runs trained on data without labels (their records' `rows`; older ones: no)."""
    rows = [r.get("rows") for r in repeat if r.get("rows")]
    return bool(rows) and all(int(x.get("train", 1)) == 0 for x in rows)


def untuned_entrants(search: Sequence[Mapping]) -> tuple[str, ...]:
    """The entrants whose search ran a single trial (failed ones counted: it was all they had)."""
    trials: dict[str, int] = {}
    for r in search:
        name = r.get("entrant") or r.get("method")
        if isinstance(name, str) and r.get("phase", "search") == "search":
            trials[name] = trials.get(name, 0) + 1
    return tuple(sorted(n for n, k in trials.items() if k == 1))


def time_note(repeat: Sequence[Mapping]) -> str:
    """The time budget the compare ran under, from its repeat runs' config, and what it sized."""
    configs = [r.get("config") or {} for r in repeat if isinstance(r, Mapping)]
    budgets = {(c.get("compare") or {}).get("time_budget") for c in configs} - {None}
    if len(budgets) != 1:
        return ""
    c = configs[0]
    compare, train = c.get("compare") or {}, c.get("train") or {}
    return (f"Run under compare.time_budget {budgets.pop()}: {compare.get('trials')} trial(s), "
            f"{train.get('epochs')} epoch(s) and {compare.get('seeds')} seed(s) per entrant, sized from "
            "each entrant's epochs, measured before the compare started.")


def _dataset(record: Mapping) -> Mapping:
    return ((record.get("config") or {}).get("dataset") or {}) if isinstance(record, Mapping) else {}


def splits_note(search: Sequence[Mapping], repeat: Sequence[Mapping]) -> str:
    """Which split chose the configurations and which one the verdict's numbers are on, from the records:
    a reader must know when the search read the split it is judged on."""
    chosen = {_dataset(r).get("evaluate_on", "test") for r in search}
    if not chosen or not repeat:
        return ""
    if unlabelled(repeat):
        n = repeat[0]["rows"].get("unlabeled", 0)
        return (f"No labels: every run trained on all {n} rows and was scored on a fixed subsample of them "
                "(RankMe scores the rows it trained on, as its paper does); no split was held out.")
    if chosen == {"val"}:
        fractions = sorted({_dataset(r).get("val_fraction") for r in search} - {None})
        part = f"{fractions[0]:.0%} of the training split" if len(fractions) == 1 else "the training split"
        text = (f"Configurations were chosen on a validation split ({part}, stratified); every number "
                "here is on the test split, which the searches never read")
    elif "val" in chosen:
        text = ("Some search trials were scored on a validation split and some on the test split: the "
                "numbers here may be optimistic")
    else:
        text = ("The searches chose their configurations on the test split these numbers are on "
                "(dataset.val_fraction: 0): they are optimistic")
    finalists: dict = {}
    for r in repeat:
        if r.get("candidate") is not None:
            finalists.setdefault(r.get("entrant") or r.get("method"), set()).add(r["candidate"])
    if any(len(c) > 1 for c in finalists.values()):
        if all(_dataset(r).get("evaluate_on") == "both" for r in repeat if r.get("candidate") is not None):
            text += ("; the race chose between each entrant's finalists on the same validation split, which "
                     "its runs did not train on (they trained on the rest of the training split)")
        else:  # a race run by an earlier augtune: its runs were scored on the test split only
            text += ("; the race chose between each entrant's finalists on the test split these numbers are "
                     "on, which makes the survivors' numbers slightly optimistic")
    if any(_dataset(r).get("resplit") for r in repeat):
        text += ("; each seed drew its own train/test split (compare.vary: [init, split]), and the "
                 "references were measured on each seed's split and paired with it")
    return text + "."


def budget_note(search: Sequence[Mapping]) -> str:
    """A sentence when the entrants' searches did not get the same number of trials that ended well
    (a trial that failed is a trial less for its entrant), else "". The equal budget is the protocol:
    the reader must know when it broke."""
    ended: dict[str, int] = {}
    failed: dict[str, int] = {}
    diverged: dict[str, int] = {}  # failed because the loss became NaN or infinite
    for r in search:
        name = r.get("entrant") or r.get("method")
        if not isinstance(name, str):
            continue
        for d in (ended, failed, diverged):
            d.setdefault(name, 0)
        if r.get("status") in ("completed", "stopped"):
            ended[name] += 1
        elif r.get("status") == "failed":
            failed[name] += 1
            diverged[name] += "loss became" in str(r.get("error") or "")
    if len(set(ended.values())) <= 1:
        return ""
    most = max(ended.values())

    def why(n: str) -> str:
        parts = [f"{failed[n] - diverged[n]} failed" if failed[n] > diverged[n] else "",
                 f"{diverged[n]} diverged: its loss became NaN" if diverged[n] else ""]
        parts = [p for p in parts if p]
        return f" ({'; '.join(parts)})" if parts else ""

    short = [f"{n} {ended[n]} of {most}{why(n)}" for n in sorted(ended) if ended[n] < most]
    return ("Unequal budget: the entrants' searches did not all end the same number of trials "
            f"({'; '.join(short)}); the comparison is not under one budget for them.")


def _cell(seeds: Mapping[int, float]) -> Cell:
    x = np.array(list(seeds.values()), dtype=float)
    return Cell(float(x.mean()) if len(x) else float("nan"),
                float(x.std(ddof=1)) if len(x) > 1 else 0.0, len(x), dict(seeds))


def _values(runs: Sequence[Mapping], m: str) -> dict[int, float]:
    return {int(r["seed"]): float(r["final"][m]) for r in runs
            if isinstance(r.get("final", {}).get(m), (int, float))
            and math.isfinite(r["final"][m])}


def _rows(by_candidate: Mapping[str, list[dict]], metrics: tuple[str, ...],
          race: Optional[RaceState]) -> list[Row]:
    """One row per entrant: the candidate that raced longest (most seeds on the race's metric, or
    on the first metric), a racing one first, then the best mean."""
    m0 = race.settings.metric if race is not None else metrics[0]
    sign = (-1.0 if race.settings.mode == "min" else 1.0) if race is not None else _sign(m0)
    by_entrant: dict[str, list[str]] = {}
    for cid, runs in by_candidate.items():
        by_entrant.setdefault(runs[0].get("entrant") or runs[0]["method"], []).append(cid)

    def flag(cid: str) -> str:
        why = (did_not_train(r.get("final", {})) for r in by_candidate[cid])
        return next((f for f in why if f), "")

    def rank(cid: str) -> tuple:
        racing = race is not None and cid in {c.id for c in race.racing}
        x = _values(by_candidate[cid], m0)
        mean = sign * np.mean(list(x.values())) if x else -math.inf
        return not flag(cid), racing, len(x), mean

    rows = []
    for name, cids in by_entrant.items():
        cid = max(cids, key=rank)  # a flagged row: every candidate of the entrant is flagged
        runs = by_candidate[cid]
        rows.append(Row(name, {m: _cell(_values(runs, m)) for m in metrics}, flag(cid),
                        candidate=cid, semi=semi_supervised(runs[0])))
        _race_note(rows[-1], race, cids)
    return rows


def _race_note(row: Row, race: Optional[RaceState], cids: Sequence[str]) -> None:
    """Where the race left the entrant, when none of its candidates is still racing."""
    known = {x.id for x in race.candidates} if race is not None else set()
    cands = [race.candidate(c) for c in cids if c in known]
    if not cands or any(c.status == "racing" for c in cands):
        return
    out = [c for c in cands if c.status == "eliminated"]
    if out:
        last = max(out, key=lambda c: c.out_round)
        row.out_round = last.out_round
        row.race_note = f"eliminated in round {last.out_round} " \
                        f"(n = {race.rounds[last.out_round - 1].n})"
    else:
        row.race_note = f"withdrawn: {cands[0].reason}"


def _ranked(rows: Sequence[Row], m: str) -> list[Row]:
    return [r for r in rows if not r.flag and m in r.cells and math.isfinite(r.cells[m].mean)
            and r.cells[m].n > 0]


def _by_one_look(rows: list[Row], m: str, alpha: float, margin: Optional[float],
                 tests: set) -> Decision:
    """The leader against every other ranked row at the seeds they share, Holm over the tested."""
    ok = _ranked(rows, m)
    d = Decision(m, level=alpha)
    if not ok:
        return d
    lead = max(ok, key=lambda r: _sign(m) * r.cells[m].mean)
    d.leader, b = lead.entrant, lead.cells[m]
    b.note = f"{_most(m)} mean"
    tested = []
    for r in ok:
        c = r.cells[m]
        if r is lead:
            continue
        if c.n < 2 or b.n < 2:
            c.note = "untested (n = 1)"
            d.untested.append(r.entrant)
            continue
        c.p, kind = _p_value(b, c)
        tests.add(kind)
        tested.append(r)
    for r, q in zip(tested, holm([r.cells[m].p for r in tested])):
        c = r.cells[m]
        c.p_holm, c.note = q, f"Holm p = {q:.3g}"
        (d.worse if q < alpha else d.contenders).append(r.entrant)
    d.separated = bool(tested) and not d.contenders and not d.untested
    if d.contenders:
        pairs = [_shared(b, lead_of(rows, e).cells[m]) for e in d.contenders]
        d.detectable_n = min(len(a) for a, _ in pairs)
        sd = stats.pooled_sd([a - o for a, o in pairs])
        d.detectable = stats.detectable_difference(sd, d.detectable_n, alpha / len(tested))
        if margin:
            d.equivalent = [e for e, (a, o) in zip(d.contenders, pairs)
                            if stats.tost_p(a, o, margin) < alpha]
    return d


def lead_of(rows: Sequence[Row], entrant: str) -> Row:
    return next(r for r in rows if r.entrant == entrant)


def _shared(a: Cell, b: Cell) -> tuple[np.ndarray, np.ndarray]:
    s = sorted(set(a.seeds) & set(b.seeds))
    return np.array([a.seeds[k] for k in s]), np.array([b.seeds[k] for k in s])


def _p_value(best: Cell, other: Cell) -> tuple[float, str]:
    a, b = _shared(best, other)
    if len(a) >= 2:
        return stats.paired_p(a, b), PAIRED
    a, b = np.array(list(best.seeds.values())), np.array(list(other.seeds.values()))
    if np.allclose(a.std(), 0) and np.allclose(b.std(), 0):
        return (1.0 if np.isclose(a.mean(), b.mean()) else 0.0), WELCH
    return float(sps.ttest_ind(a, b, equal_var=False).pvalue), WELCH


def _by_race(rows: list[Row], m: str, race: RaceState) -> Decision:
    """The race's decisions, said per entrant (its row's candidate)."""
    s = race.settings
    d = Decision(m, by_race=True, level=s.level, rounds=len(race.rounds),
                 stop=_stop_words(race))
    ok = _ranked(rows, m)
    racing = {c.entrant for c in race.racing}
    live = [r for r in ok if r.entrant in racing]
    if not live:
        return d
    sign = 1.0 if s.mode == "max" else -1.0
    lead = max(live, key=lambda r: sign * r.cells[m].mean)
    d.leader, b = lead.entrant, lead.cells[m]
    b.note = f"{'highest' if sign > 0 else 'lowest'} mean"
    for r in ok:
        if r is lead:
            continue
        c = r.cells[m]
        rnd = _last_test(race, r.candidate)
        if rnd is not None:
            c.p, c.p_holm = rnd.p[r.candidate], rnd.p_holm[r.candidate]
            c.note = f"Holm p = {c.p_holm:.3g}"
        (d.contenders if r.entrant in racing else d.worse).append(r.entrant)
    d.separated = race.stopped == "separated" and not d.contenders and bool(d.worse)
    if race.stopped == "equivalent":
        d.equivalent = list(d.contenders)
    if d.contenders and race.rounds:
        pairs = [_shared(b, lead_of(rows, e).cells[m]) for e in d.contenders]
        d.detectable_n = min(len(a) for a, _ in pairs)
        sd = stats.pooled_sd([a - o for a, o in pairs])
        family = max(1, len(race.rounds[-1].p))
        d.detectable = stats.detectable_difference(sd, d.detectable_n, s.level / family)
    return d


def _last_test(race: RaceState, cid: str):
    return next((r for r in reversed(race.rounds) if cid in r.p), None)


def _stop_words(race: RaceState) -> str:
    if race.stopped is None:
        return f"and is unfinished (n = {race.n} of at most {race.settings.max_seeds})"
    return {"separated": f"at n = {race.n}, one entrant left",
            "equivalent": f"at n = {race.n}, every remaining pair equivalent",
            "max_seeds": f"at max_seeds (n = {race.n})",
            "alone": "with one entrant left by withdrawals"}[race.stopped]


def _against_references(rows: list[Row], m: str, d: Decision,
                        refs: Mapping[str, Mapping[str, Mapping[int, float]]],
                        alpha: float) -> None:
    """One-sided tests of each ranked entrant above random-init (paired by seed) and above the raw
    input, Holm-corrected across the entrants of each."""
    ok = [r for r in _ranked(rows, m) if r.cells[m].n >= 2]
    if not ok:
        return
    untrained = refs.get(UNTRAINED, {}).get(m, {})
    paired = [(r, _pair_reference(r, m)) for r in ok]
    paired = [(r, x) for r, x in paired if len(x[0]) >= 2]
    if untrained and paired:
        side = "less" if _sign(m) < 0 else "greater"
        ps = [stats.paired_p(a, u, side) for _, (a, u) in paired]
        for (r, _), q in zip(paired, holm(ps)):
            r.cells[m].untrained_p = q
            d.beats_untrained[r.entrant] = q < alpha
    raw = refs.get(RAW, {}).get(m, {})
    if raw:
        qs = holm([_above_raw(r.cells[m].seeds, raw, _sign(m)) for r in ok])
        for r, q in zip(ok, qs):
            r.cells[m].raw_p = q
            d.beats_raw[r.entrant] = q < alpha


def _above_raw(values: Mapping[int, float], raw: Mapping[int, float], sign: float = 1.0) -> float:
    """One-sided p of a row's seeds better than the raw input (above it; below it when `sign` is -1, a
    lower-is-better metric): one value when every seed scored the same input (a one-sample test), else
    (`compare.vary: [init, split]`, a split per seed) paired by seed."""
    shared = sorted(set(values) & set(raw))
    if len(set(raw.values())) > 1 and len(shared) >= 2:
        return stats.paired_p(np.array([values[s] for s in shared]), np.array([raw[s] for s in shared]),
                              "less" if sign < 0 else "greater")
    return stats.above_p([sign * v for v in values.values()], sign * float(np.mean(list(raw.values()))))


def _pair_reference(r: Row, m: str) -> tuple[np.ndarray, np.ndarray]:
    """The row's values and random-init's of the same seeds (measured by the row's own runs)."""
    ref = r.untrained.get(m, {})
    seeds = sorted(set(r.cells[m].seeds) & set(ref))
    return np.array([r.cells[m].seeds[s] for s in seeds]), np.array([ref[s] for s in seeds])


def _reference_seeds(by_candidate: Mapping[str, list[dict]], rows: list[Row],
                     metrics: tuple[str, ...]) -> dict[str, dict[str, dict[int, float]]]:
    """{reference: {metric: {seed: value}}} over every repeat run (one value per seed: the runs of
    a seed measured the same reference), and each row's own random-init values by seed."""
    out: dict[str, dict[str, dict[int, list[float]]]] = {}
    for runs in by_candidate.values():
        for r in runs:
            for name, values in (r.get("references") or {}).items():
                for m in metrics:
                    v = (values or {}).get(m)
                    if isinstance(v, (int, float)) and math.isfinite(v):
                        out.setdefault(name, {}).setdefault(m, {}).setdefault(
                            int(r["seed"]), []).append(float(v))
    for row in rows:
        own: dict[str, dict[int, float]] = {}
        for r in by_candidate[row.candidate]:
            values = (r.get("references") or {}).get(UNTRAINED) or {}
            for m in metrics:
                if isinstance(values.get(m), (int, float)) and math.isfinite(values[m]):
                    own.setdefault(m, {})[int(r["seed"])] = float(values[m])
        row.untrained = own
    order = {RAW: 0, UNTRAINED: 1}
    return {name: {m: {s: float(np.mean(v)) for s, v in sorted(by_s.items())}
                   for m, by_s in out[name].items()}
            for name in sorted(out, key=lambda n: (order.get(n, 2), n))}


def _costs(rows: list[Row], repeat: list[dict], search: list[dict]) -> None:
    def epoch_times(records: list[dict], name: str) -> list[float]:
        return [e["epoch_time_s"] for r in records if (r.get("entrant") or r["method"]) == name
                for e in r.get("epochs", []) if isinstance(e.get("epoch_time_s"), (int, float))]

    for row in rows:
        t = epoch_times(repeat, row.entrant)
        row.epoch_time = float(np.mean(t)) if t else float("nan")
        row.compute_s = float(sum(t) + sum(epoch_times(search, row.entrant)))
    for row in rows:
        plain = next((r for r in rows if r.entrant == method_of(row.entrant).split("+")[0]), None)
        if plain is not None and plain.epoch_time > 0:
            row.relative_cost = row.epoch_time / plain.epoch_time


def load_compare_records(exp_dir) -> tuple[list[dict], list[dict]]:
    """(repeat records, search records) of a compare experiment folder, read without Ray."""
    from pathlib import Path

    from augtune.records import read_record

    def read(paths) -> list[dict]:
        out = []
        for p in sorted(paths):
            try:
                out.append(read_record(p))
            except (OSError, ValueError):
                continue
        return out

    from augtune.records import COMPARE_REPEAT

    exp = Path(exp_dir)  # each entrant's search records are in <exp>/<entrant>/<trial>/
    search = [p for p in exp.glob("*/*/record.json") if p.parent.parent.name != COMPARE_REPEAT]
    return read(exp.glob(f"{COMPARE_REPEAT}/*/record.json")), read(search)
