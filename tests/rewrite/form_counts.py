"""Print the fused-op counts of every zoo model in every export form, per target.

    python tests/rewrite/form_counts.py [--models bert,llama] [--slow] [--targets ort-cpu]

One row per model / form / target: the fused ops by kind (short names), or why the form failed
(export error, a rolled-back family, a verification failure). The form-matrix test asserts on
the same numbers (tests/rewrite/test_form_matrix.py).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]

from _forms import FP32_FORMS, SLOW_FORMS, exported, fused, fused_ops, supported, verify  # noqa: E402
from zoo import ZOO  # noqa: E402

from deployfuse.rewrite import TARGETS  # noqa: E402


def _short(counts: dict[str, int]) -> str:
    return " ".join(f"{k.split('::')[-1]}={v}" for k, v in sorted(counts.items(), key=lambda kv: kv[0].split("::")[-1])) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--slow", action="store_true", help="also the fp16 / bf16 forms and TorchScript *args")
    args = parser.parse_args()
    forms = FP32_FORMS + (SLOW_FORMS if args.slow else ())
    print("| model | form | target | fused ops |")
    print("|---|---|---|---|")
    for model in args.models.split(","):
        for form in forms:
            if not supported(model, form):
                continue
            try:
                exported(model, form)
            except Exception as exc:  # noqa: BLE001 - a row says why the form failed
                print(f"| {model} | {form.name} | all | export fails: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]} |", flush=True)
                continue
            for target in args.targets.split(","):
                try:
                    cell = _short(fused_ops(model, form, target))
                    rolled = fused(model, form, target)[1]
                    bad = verify(model, form, target)
                except Exception:  # noqa: BLE001
                    cell, rolled, bad = "error: " + traceback.format_exc().strip().splitlines()[-1][:120], (), []
                notes = [f"rolled back {r[:80]}" for r in rolled] + [f"VERIFY FAILS {b}" for b in bad[:1]]
                print(f"| {model} | {form.name} | {target} | {cell}{' (' + '; '.join(notes) + ')' if notes else ''} |", flush=True)


if __name__ == "__main__":
    main()
