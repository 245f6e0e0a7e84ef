"""Named training phases: `A:200,B:400,A:800` -> one phase name per epoch, scaled to the run."""
from __future__ import annotations

import re

_SEGMENT = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*)\s*:\s*(\d+)\s*$")


def parse_phases(text: str, epochs: int) -> list[str]:
    """Phase name of every epoch (0-based) for a schedule string, scaled to `epochs`.

    Counts are relative (DiffAug's `A:200,B:400,A:800` is in its own epochs); when they do not sum
    to `epochs`, segment boundaries are the rounded cumulative fractions, so the order and the
    proportions are kept and the total is exact. A segment may vanish in a very short run.
    """
    if not text or not text.strip():
        return [""] * epochs
    return [name for name, n in segments(text, epochs) for _ in range(n)]


def segments(text: str, epochs: int) -> list[tuple[str, int]]:
    """(name, epochs) of every segment of a schedule string scaled to `epochs` (`parse_phases`); a
    segment that vanishes in a short run has 0 epochs."""
    names, counts = [], []
    for part in text.split(","):
        m = _SEGMENT.match(part)
        if not m:
            raise ValueError(
                "expected NAME:EPOCHS[,NAME:EPOCHS...] such as A:200,B:400,A:800; "
                f"got segment {part.strip()!r}"
            )
        if int(m.group(2)) <= 0:
            raise ValueError(f"segment {part.strip()!r} must last at least one epoch")
        names.append(m.group(1))
        counts.append(int(m.group(2)))
    total, out, cum, start = sum(counts), [], 0, 0
    for name, count in zip(names, counts):
        cum += count
        end = round(cum * epochs / total)
        out.append((name, end - start))
        start = end
    return out


def phase_names(text: str) -> set[str]:
    return {part.split(":")[0].strip() for part in text.split(",")} if text.strip() else set()
