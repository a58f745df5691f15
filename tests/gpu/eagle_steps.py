"""Where a speculative step's time goes, from the engine's debug log on stdin
(`INGOT_LOG_LEVEL=debug ingot generate ... 2>&1 >/dev/null | eagle_steps.py`):
per message ("speculative step", "step", "proposals", "hidden states observed")
the count and the mean of each `*_ms` field, and the mean time from one step's
log line to the next."""

import re
import sys
from collections import defaultdict
from datetime import datetime

LINE = re.compile(r"^(\S+Z)\s+DEBUG\s+\S+:\s+(.*?)((?:\s+\w+=\S+)*)\s*$")
FIELD = re.compile(r"(\w+)=(\S+)")


def main():
    sums = defaultdict(lambda: defaultdict(float))
    counts = defaultdict(int)
    steps = []
    for line in sys.stdin:
        m = LINE.match(line.strip())
        if not m:
            continue
        stamp, msg, fields = m.groups()
        msg = msg.strip()
        kv = dict(FIELD.findall(fields))
        if msg in ("speculative step", "step"):
            steps.append(datetime.fromisoformat(stamp.replace("Z", "+00:00")))
        if msg == "step" and "tokens" in kv and "seqs" in kv:
            # Decode steps (a token a sequence) apart from those with prompt chunks.
            msg = "step (decode)" if kv["tokens"] == kv["seqs"] else "step (prompt chunks)"
        counts[msg] += 1
        for k, v in kv.items():
            if k.endswith("_ms") or k in ("tokens", "seqs"):
                sums[msg][k] += float(v)
    for msg in ("step", "step (decode)", "step (prompt chunks)", "speculative step", "hidden states observed",
                "proposals"):
        n = counts.get(msg, 0)
        if n:
            means = ", ".join(f"{k} {v / n:.3f}" for k, v in sorted(sums[msg].items()))
            print(f"{msg:24} x{n:4}: {means}")
    gaps = [(b - a).total_seconds() * 1e3 for a, b in zip(steps, steps[1:])]
    if gaps:
        gaps = sorted(gaps)[: max(1, len(gaps) * 9 // 10)]  # the prefill's gap and stragglers out
        print(f"step to step (fastest 90 %): {sum(gaps) / len(gaps):.3f} ms over {len(gaps)}")


if __name__ == "__main__":
    main()
