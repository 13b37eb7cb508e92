"""Issue 3's floor on CPU: deployfuse's ort-cpu graph is never slower than the plain export, for
every model of the test zoo (tests/zoo.py: small configs of real architectures, random weights).

Both graphs come from one dynamo export; sessions use ORT's normal optimisations and 2 threads
(what a user runs). Runs are interleaved (one of each per round, the order alternating) so load
from other processes falls on both alike; the figure is the median over rounds.

    python bench/cpu_zoo.py --out bench/results/cpu_zoo.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "rewrite")]

from _export import exported, feeds  # noqa: E402
from zoo import ZOO  # noqa: E402


def main() -> None:
    from deployfuse.backends.ort import run, session
    from deployfuse.rewrite import fuse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        plain = exported(name, "dynamo")
        feed = feeds(name, plain, count=1)[0]
        fused, _ = fuse(plain, "ort-cpu", [feed])
        sessions = {"plain": session(plain, threads=args.threads), "deployfuse": session(fused, threads=args.threads)}
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for _ in range(10):
            for sess in sessions.values():
                run(sess, feed)
        for round_ in range(args.rounds):
            for variant, sess in sorted(sessions.items(), reverse=round_ % 2 == 1):  # alternate who goes first
                start = time.perf_counter()
                run(sess, feed)
                times[variant].append((time.perf_counter() - start) * 1e3)
        plain_ms, ours_ms = statistics.median(times["plain"]), statistics.median(times["deployfuse"])
        rows.append({"model": name, "plain_ms": round(plain_ms, 4), "deployfuse_ms": round(ours_ms, 4), "ratio": round(ours_ms / plain_ms, 3)})
        print(f"{name:16s} plain {plain_ms:8.3f} ms   deployfuse {ours_ms:8.3f} ms   ratio {ours_ms / plain_ms:.3f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
