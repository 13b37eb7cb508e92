"""Guarded, target-aware fusion rewrites of exported ONNX models.

    from deployfuse.rewrite import fuse, FusionReport, TARGETS
    fused, report = fuse(model, "ort-cpu", feeds)
    print(report.table())

Rule families live one per module in `deployfuse.rewrite.rules` (the registration list is its
`FAMILY_MODULES`); `profiles` says which ops each target may receive; `guard` keeps a family
only if the graph stays valid and computes the same; with `fuse(..., autotune=True)`,
`autotune` also reverts a family that makes the model slower on the target. A model fused for
ONNX Runtime may hold ORT's schema-less SimplifiedLayerNormalization: validate it with
`check_model`, not a bare onnx.checker.
"""

from deployfuse.rewrite.fuser import RULE_TAG, family_names, fuse
from deployfuse.rewrite.guard import GuardFailure, check_model
from deployfuse.rewrite.report import FamilyResult, FusionReport
from deployfuse.targets import TARGETS

__all__ = ["RULE_TAG", "TARGETS", "FamilyResult", "FusionReport", "GuardFailure", "check_model", "family_names", "fuse"]
