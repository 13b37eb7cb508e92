"""`fuse`: run every rule family for a target, guard each, keep what stays valid and equal
(and, with autotune, not slower on the target)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common
import onnxscript.optimizer
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchInfo
from onnxscript.rewriter._rewrite_rule import RULE_NAME_TAG

from deployfuse.backends import ort as ort_backend
from deployfuse.errors import UsageError, first_line
from deployfuse.rewrite import autotune as tuning, guard, rules as rule_families
from deployfuse.rewrite.report import FamilyResult, FusionReport
from deployfuse.rewrite.rules._common import dtype_name
from deployfuse.targets import DEPLOYFUSE, Target, get_target

RULE_TAG = "deployfuse.rule"


def fuse(
    model: onnx.ModelProto,
    target: str | Target,
    feeds: Sequence[Mapping[str, np.ndarray]],
    debug: bool = False,
    families: Sequence[str] | None = None,
    autotune: bool = False,
    on_family: Callable[[str, int, int], None] | None = None,
    custom_ops_library: bool | str | os.PathLike[str] = True,
) -> tuple[onnx.ModelProto, FusionReport]:
    """Rewrite `model` into fused nodes for `target`, one guarded rule family at a time.

    Args:
        model: the exported model (not modified).
        target: one of `TARGETS`.
        feeds: random input dicts for the guard's numeric checks (at least one).
        debug: also record near misses (why the closest candidate of each rule failed).
        families: run only these families (names as in `family_names()`), still in
            registration order; None runs all. For ablations.
        autotune: also time each family the guard accepted on the target, on `feeds[0]`,
            and revert it when it makes the model slower (`autotune.time_family`).
        on_family: called with (family, index, count) as each family starts, for progress.
        custom_ops_library: the guard's and autotune's sessions run deployfuse nodes on this
            library's kernels: True, deployfuse's own when it is built (`backends.ort.native_library`);
            False, none (the function bodies); or a path.

    Returns:
        The fused model and the report. A family the guard rejects is rolled back and
        reported with its reason, one autotune finds slower is reverted with its timings; the
        others are kept.
    """
    target = get_target(target)
    if not feeds:
        raise ValueError("fuse needs at least one feed for the guard")
    modules = rule_families.families()
    if families is not None:
        unknown = set(families) - {m.FAMILY for m in modules}
        if unknown:
            raise UsageError(f"unknown fusion families {sorted(unknown)}; known: {', '.join(m.FAMILY for m in modules)}")
        modules = [m for m in modules if m.FAMILY in families]
    providers = guard.providers_for(target)
    library = ort_backend.native_library() if custom_ops_library is True else (None if custom_ops_library is False else custom_ops_library)
    current = onnx.ModelProto()
    current.CopyFrom(model)
    reference = guard.run_outputs(current, feeds, providers, library)
    report = FusionReport(target.name)
    for index, module in enumerate(modules):
        if on_family is not None:
            on_family(module.FAMILY, index, len(modules))
        rules = module.rules(target)
        if not rules:
            continue
        result = FamilyResult(module.FAMILY)
        report.families.append(result)
        try:
            candidate = _apply(current, rules, result, debug, target)
            if not result.fused:
                continue
            outputs = guard.check(candidate, reference, feeds, providers, library)
        except guard.GuardFailure as exc:
            result.rolled_back, result.reason = True, str(exc)
            continue
        except Exception as exc:  # a rule's own bug must not stop the export: roll back, report
            result.rolled_back, result.reason = True, f"rule error: {first_line(exc, typed=True)}"
            continue
        if autotune:
            decision = tuning.time_family(current, candidate, target, feeds[0], custom_ops_library=library)
            result.autotune, result.before_ms, result.after_ms = decision.reason, decision.before_ms, decision.after_ms
            if not decision.keep:
                result.reverted = True
                continue
        current, reference = candidate, outputs
    return _merge_duplicates(current, reference, feeds, providers, library), report


def _merge_duplicates(model: onnx.ModelProto, reference: list[dict[str, np.ndarray]], feeds: Sequence[Mapping[str, np.ndarray]], providers: Sequence[str],
                      library: str | os.PathLike[str] | None) -> onnx.ModelProto:
    """Merge nodes that compute the same thing, once every family has run: rules that rebuild a
    shared input per match (rotary's cos/sin caches) leave copies. Running it between families
    would hand later patterns values with new consumers. Guarded like a family."""
    with _ir_over(model) as ir_model:
        ir.passes.common.CommonSubexpressionEliminationPass()(ir_model)
        onnxscript.optimizer.remove_unused_nodes(ir_model)
        merged = ir.serde.serialize_model(ir_model)
    if len(merged.graph.node) == len(model.graph.node):
        return model
    try:
        guard.check(merged, reference, feeds, providers, library)
    except guard.GuardFailure:
        return model
    return merged


def family_names() -> list[str]:
    """The rule families, in the order `fuse` runs them."""
    return [m.FAMILY for m in rule_families.families()]


def _apply(model: onnx.ModelProto, rules: list[pattern.RewriteRule], result: FamilyResult, debug: bool, target: Target) -> onnx.ModelProto:
    """`rules` applied to `model` (left as it was), one rule name at a time (its variants
    together); new nodes counted and tagged, deployfuse function bodies attached.

    Raises GuardFailure when a new node is an op (or dtype) the target has no kernel for.
    """
    with _ir_over(model) as ir_model:
        out = _rewrite(ir_model, rules, result, debug, target)
    if any(n.domain == DEPLOYFUSE for n in out.graph.node):
        from deployfuse.ops import attach_functions

        attach_functions(out)
    return out


@contextlib.contextmanager
def _ir_over(model: onnx.ModelProto) -> Iterator[ir.Model]:
    """An IR model over `model`'s own messages (no copy of the weights). onnx-ir writes a renamed
    initializer's name back into the proto, so the names are put back on exit: a rolled-back
    family (or a rejected merge) leaves `model` as it was."""
    names = [t.name for t in model.graph.initializer]
    try:
        yield ir.serde.deserialize_model(model)
    finally:
        for tensor, name in zip(model.graph.initializer, names):
            tensor.name = name


def _rewrite(ir_model: ir.Model, rules: list[pattern.RewriteRule], result: FamilyResult, debug: bool, target: Target) -> onnx.ModelProto:
    """`rules` applied to `ir_model` one rule name at a time; new nodes counted, tagged and
    checked against the profile; the result as a new proto."""
    opset = ir_model.opset_imports.get("", 0)
    by_name: dict[str, list[pattern.RewriteRule]] = {}
    for rule in rules:
        by_name.setdefault(rule.name or "", []).append(rule)
    for name, group in by_name.items():
        seen = set(ir_model.graph.all_nodes())
        count = pattern.RewriteRuleSet(group).apply_to_model(ir_model)
        result.matches[name] = count
        if count:
            for node in ir_model.graph.all_nodes():
                if node not in seen and node.op_type != "Constant":
                    node.metadata_props.pop(RULE_NAME_TAG, None)
                    node.metadata_props[RULE_TAG] = name
                    _check_profile(node, target, opset)
    if debug:
        tracer = pattern.MatchingTracer()
        pattern.RewriteRuleSet(rules).apply_to_model(ir_model, tracer=tracer)
        checked: dict[str, list[str]] = {}  # candidates that reached a rule's check
        partial: dict[str, list[str]] = {}  # structures that stopped matching part-way
        for rule, infos in tracer.best_matches_map.items():
            for info in infos:
                reason = _near_miss(rule, info)
                found = checked if info.status == pattern.MatchStatus.CONDITION_FAILED else partial
                if reason and reason not in found.setdefault(rule.name or "", []):
                    found[rule.name or ""].append(reason)
        for name in {**partial, **checked}:  # a rule's checked candidates say more than other spellings' partial matches
            reasons = sorted(checked.get(name) or partial.get(name) or [])
            if reasons:
                known = result.near_misses.setdefault(name, [])
                known.extend(r for r in reasons if r not in known)
    onnxscript.optimizer.remove_unused_nodes(ir_model)
    return ir.serde.serialize_model(ir_model)


def _near_miss(rule: pattern.RewriteRule, info: MatchInfo) -> str | None:
    """Why a candidate of `rule` did not fuse: its check's reason, or, when the structure itself
    stopped matching after at least two and half of the pattern's nodes, where it stopped."""
    reason = info.match_result.reason
    if not reason or info.status not in (pattern.MatchStatus.CONDITION_FAILED, pattern.MatchStatus.NO_MATCH):
        return None
    if info.status == pattern.MatchStatus.CONDITION_FAILED:
        return reason
    pattern_nodes = getattr(getattr(rule, "_target_pattern", None), "_nodes", None)  # onnxscript keeps it private
    matched, total = len(info.match_result.nodes), len(pattern_nodes) if pattern_nodes is not None else 0
    if matched < 2 or 2 * matched < total or not total:
        return None
    return f"the structure stops matching after {matched} of {total} pattern nodes: {reason}"


def _check_profile(node: ir.Node, target: Target, opset: int) -> None:
    """GuardFailure when a fused node is an op the target cannot run on its input dtype."""
    first = node.inputs[0] if node.inputs else None
    dtype = dtype_name(first) or "float"
    if not target.emits(node.domain, node.op_type, opset, dtype):
        raise guard.GuardFailure(f"emitted {node.domain or 'ai.onnx'}::{node.op_type} on {dtype}, which {target} cannot run")
