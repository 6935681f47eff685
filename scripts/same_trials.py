"""Compare two runs of one scenario trial by trial: the same trial ids, statuses and greedy outputs?

For a change that should leave behaviour alone (a refactor): run a scenario with the old code and the new, then

    python scripts/same_trials.py results/quick-OLD results/quick-NEW

prints whether the trial ids are the same and, per field (status, output_sha256, output_ids_head, tokens_match,
cached_prompt_tokens), how many trials differ, with examples. A server's outputs may differ run to run under
concurrent load (batch composition changes the numerics at a near tie): compare such trials between repeats of
one run before blaming the change.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

FIELDS = ("status", "output_sha256", "output_ids_head", "tokens_match", "cached_prompt_tokens")


def trials(run_dir: Path) -> dict[str, dict]:
    """trial id -> its last row in ``run_dir/trials.jsonl`` (a partial last line left out)."""
    out = {}
    for line in (run_dir / "trials.jsonl").read_text(encoding="utf-8").splitlines(keepends=True):
        if line.endswith("\n") and line.strip():
            row = json.loads(line)
            out[row["trial_id"]] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="the run directory of the old code")
    ap.add_argument("after", type=Path, help="the run directory of the new code")
    args = ap.parse_args()
    a, b = trials(args.before), trials(args.after)
    print(f"{args.before}: {len(a)} trials; {args.after}: {len(b)} trials")
    print("same trial ids:", sorted(a) == sorted(b))
    if sorted(a) != sorted(b):
        print("only before:", sorted(set(a) - set(b))[:5], "only after:", sorted(set(b) - set(a))[:5])
    common = sorted(set(a) & set(b))
    for k in FIELDS:
        diff = [t for t in common if a[t].get(k) != b[t].get(k)]
        print(f"{k}: {'same in all' if not diff else f'{len(diff)} differ, e.g. ' + ', '.join(diff[:3])}")
    print("statuses before:", dict(Counter(r["status"] for r in a.values())),
          "after:", dict(Counter(r["status"] for r in b.values())))


if __name__ == "__main__":
    main()
