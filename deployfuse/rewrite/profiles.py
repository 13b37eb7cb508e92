"""Target profiles by name, for code and tests that look a target up: derived from
`deployfuse.targets`, where each target's kernels and lowering preferences are declared."""

from __future__ import annotations

from deployfuse.targets import BY_NAME, DEPLOYFUSE, MS, TARGETS, Target, get_target, ort_private

Profile = Target
PROFILES: dict[str, Target] = BY_NAME
profile = get_target

__all__ = ["DEPLOYFUSE", "MS", "PROFILES", "TARGETS", "Profile", "ort_private", "profile"]
