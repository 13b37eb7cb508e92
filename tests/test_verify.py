"""Export's verification and `deployfuse compare` judge an output by one rule,
|actual - reference| <= atol + rtol * |reference| per element; export's atol is rtol x the
output's max |value|."""

from __future__ import annotations

import numpy as np
import torch

from deployfuse.compare.accuracy import output_stats
from deployfuse.verify import ABS_FLOOR, compare_outputs

RTOL = 1e-4


def test_rtol_is_element_wise_with_the_outputs_scale_as_atol():
    reference = torch.randn(64, 32, dtype=torch.float64)
    scale = float(reference.abs().max())
    atol = RTOL * scale
    large, small = divmod(int(reference.abs().argmax()), 32), divmod(int(reference.abs().argmin()), 32)
    for where, passes in ((large, True), (small, False)):  # 1.5 atol: within atol + rtol |r| at the largest value only
        actual = reference.numpy().copy()
        actual[where] += 1.5 * atol
        (check,) = compare_outputs({"y": reference}, {"y": actual}, RTOL)
        assert check.passed is passes and check.tolerance == atol
        assert check.stats.max_abs_error == np.abs(actual - reference.numpy()).max() and check.max_rel_error == check.stats.max_abs_error / scale
        assert output_stats("y", reference.numpy(), actual, atol, RTOL).passed is passes  # compare's verdict with the same tolerances
        assert check.to_dict()["mismatched"] == (0 if passes else 1)


def test_nan_where_the_reference_has_none_fails():
    reference = torch.randn(8, dtype=torch.float64)
    actual = reference.numpy().copy()
    actual[3] = np.nan
    (check,) = compare_outputs({"y": reference}, {"y": actual}, RTOL)
    assert not check.passed and check.max_rel_error == np.inf


def test_an_output_that_vanishes_passes_on_the_floor_and_is_flagged():
    reference = torch.randn(16, dtype=torch.float64) * 1e-40  # every value far below ABS_FLOOR, as a model whose activations vanish
    actual = (reference * 1.3).numpy()  # 30 % off, yet within the floor
    (check,) = compare_outputs({"y": reference}, {"y": actual}, RTOL)
    assert check.passed and check.near_zero and check.to_dict()["near_zero"]
    assert check.max_rel_error == check.stats.max_abs_error / ABS_FLOOR < 1e-30  # not 0.3: the error at the floor's scale
    (normal,) = compare_outputs({"y": reference * 1e40}, {"y": actual * 1e40}, RTOL)
    assert not normal.passed and not normal.near_zero
    (reshaped,) = compare_outputs({"y": reference}, {"y": actual.reshape(4, 4)}, RTOL)  # no scale to speak of: failed, not "all ~0"
    assert not reshaped.passed and not reshaped.near_zero
