"""The accuracy gate's budget syntax and its error measures, checked against torch's own maths."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from deployfuse.errors import UsageError
from deployfuse.quantize.gate import Budget, OutputError, output_error


def test_budget_parses_what_help_shows_and_keeps_defaults():
    assert Budget.parse("cos=0.999,rel=2e-2") == Budget()
    assert Budget.parse("rel=0.05") == Budget(cos=0.999, rel=0.05)
    assert Budget.parse(" cos=0.99 , abs=0.1, p99=1e-3") == Budget(cos=0.99, abs=0.1, p99=1e-3)
    assert Budget.from_dict(Budget(abs=0.5).to_dict()) == Budget(abs=0.5)


@pytest.mark.parametrize("text", ["", "cos", "cos=high", "cos=1.5", "rel=-1", "mse=0.1", "rel=nan"])
def test_bad_budgets_are_usage_errors(text):
    with pytest.raises(UsageError, match="--accuracy-budget"):
        Budget.parse(text)


def test_output_error_matches_torch():
    generator = np.random.default_rng(0)
    refs = [generator.standard_normal((4, 32)).astype(np.float32) for _ in range(3)]
    gots = [r + generator.standard_normal(r.shape).astype(np.float32) * s for r, s in zip(refs, (0.01, 0.05, 0.02))]
    error = output_error("y", "held-out", refs, gots)
    diffs = [torch.from_numpy(g).double() - torch.from_numpy(r).double() for r, g in zip(refs, gots)]
    cos = [torch.nn.functional.cosine_similarity(torch.from_numpy(r).double().flatten(), torch.from_numpy(g).double().flatten(), dim=0) for r, g in zip(refs, gots)]
    assert error.max_abs == pytest.approx(max(float(d.abs().max()) for d in diffs))
    assert error.p99_abs == pytest.approx(max(float(torch.quantile(d.abs().flatten(), 0.99)) for d in diffs))
    assert error.rel == pytest.approx(max(float(d.abs().max() / torch.from_numpy(r).abs().max()) for d, r in zip(diffs, refs)))
    assert error.cos == pytest.approx(min(float(c) for c in cos))


def test_budget_names_what_it_breaks():
    within = OutputError("y", "calibration", 0.01, 0.005, 0.01, 0.9995)
    assert Budget().exceeded(within) == []
    over = Budget(abs=0.001).exceeded(OutputError("y", "calibration", 0.01, 0.005, 0.03, 0.99))
    assert [b.split()[0] for b in over] == ["cos", "rel", "abs"]
    nan = OutputError("y", "calibration", math.nan, math.nan, math.nan, math.nan)
    assert len(Budget().exceeded(nan)) == 2  # NaN never passes
    assert output_error("y", "x", [np.ones(4, np.float32)], [np.array([1, np.nan, 1, 1], np.float32)]).cos == 0.0


def test_budget_score_is_the_largest_share_of_any_bound():
    budget = Budget(cos=0.999, rel=0.02, abs=0.5)
    errors = [OutputError("a", "calibration", 0.1, 0.05, 0.01, 0.9995), OutputError("b", "held-out", 0.6, 0.1, 0.001, 0.99999)]
    assert budget.score(errors) == pytest.approx(max(0.5, 0.5, 0.2, 0.01, 0.05, 1.2))  # b's max abs 0.6 of 0.5
    assert budget.score([OutputError("a", "x", 0.0, 0.0, math.nan, 1.0)]) == math.inf
    assert Budget(rel=0.0).score([OutputError("a", "x", 0.0, 0.0, 0.0, 1.0)]) == 0.0
