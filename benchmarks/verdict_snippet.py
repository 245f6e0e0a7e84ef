"""The main job's verdict as the docs show it, generated from the run's records: one file,
`docs/snippets/main-job-verdict.md`, that the docs include (`--8<--`) and the README copies (a test holds
the copy equal to it).

Run:  augtune compare examples/compare_digits.yaml --name main   # the main job
      python benchmarks/verdict_snippet.py results/main           # then record its date and commit
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SNIPPET = ROOT / "docs" / "snippets" / "main-job-verdict.md"


def main(argv: list[str] | None = None) -> Path:
    from augtune.analysis.compare import answer
    from augtune.records import write_atomic

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python benchmarks/verdict_snippet.py EXPERIMENT_FOLDER")
    verdict = answer(args[0], write=False).verdict
    table = verdict.render("md", caption=False, plainly=False).split("\n\n")[0]
    paragraphs = [table, *verdict.sentences(), verdict.plainly()]  # each sentence a paragraph of its own
    write_atomic(SNIPPET, "\n\n".join(paragraphs) + "\n")
    print(f"wrote {SNIPPET}")
    return SNIPPET


if __name__ == "__main__":
    main()
