"""--calibration-data: the file forms it takes, the split into calibration and held-out samples,
and one-line refusals of files the model cannot take (exit 2 from the CLI, nothing written)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deployfuse.errors import UsageError
from deployfuse.inputs import DynamicAxis
from deployfuse.quantize.calibration import load_calibration, random_calibration

EXAMPLE = {"input_ids": torch.zeros(2, 16, dtype=torch.int64), "attention_mask": torch.ones(2, 16, dtype=torch.int64)}


def _samples(count: int, seq: int = 16) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(count)
    return [{"input_ids": torch.randint(0, 100, (2, seq), generator=generator), "attention_mask": torch.ones(2, seq, dtype=torch.int64)}
            for _ in range(count)]


def test_torch_list_is_split_with_the_last_quarter_held_out(tmp_path):
    samples = _samples(8)
    torch.save(samples, tmp_path / "calib.pt")
    calibration = load_calibration(tmp_path / "calib.pt", EXAMPLE)
    assert len(calibration.samples) == 6 and len(calibration.held_out) == 2 and not calibration.random
    assert torch.equal(calibration.held_out[-1]["input_ids"], samples[-1]["input_ids"])
    assert "6 calibration + 2 held-out" in calibration.source


def test_npz_with_a_sample_axis_and_a_folder_of_them(tmp_path):
    ids = np.random.default_rng(0).integers(0, 100, (4, 2, 16))
    np.savez(tmp_path / "a.npz", input_ids=ids, attention_mask=np.ones((4, 2, 16), np.int64))
    calibration = load_calibration(tmp_path / "a.npz", EXAMPLE)
    assert len(calibration.samples) + len(calibration.held_out) == 4
    assert np.array_equal(calibration.samples[1]["input_ids"].numpy(), ids[1])
    np.savez(tmp_path / "b.npz", input_ids=ids[0], attention_mask=np.ones((2, 16), np.int64))  # one sample: the input's own rank
    folder = load_calibration(tmp_path, EXAMPLE)
    assert len(folder.samples) + len(folder.held_out) == 5
    assert folder.samples[0]["input_ids"].dtype == torch.int64


def test_dynamic_axes_may_change_static_ones_may_not(tmp_path):
    torch.save(_samples(4, seq=24), tmp_path / "long.pt")
    dynamic = [DynamicAxis("input_ids", 1, "seq"), DynamicAxis("attention_mask", 1, "seq")]
    assert load_calibration(tmp_path / "long.pt", EXAMPLE, dynamic).samples[0]["input_ids"].shape == (2, 24)
    with pytest.raises(UsageError, match="axis 1 is static in the export, size 16"):
        load_calibration(tmp_path / "long.pt", EXAMPLE)


@pytest.mark.parametrize(("content", "message"), [
    ([{"input_ids": torch.zeros(2, 16, dtype=torch.int64)}] * 4, "lacks input 'attention_mask'"),
    ([{"input_ids": torch.zeros(16, dtype=torch.int64), "attention_mask": torch.ones(16, dtype=torch.int64)}] * 4, "input_ids has rank 1"),
    ([{**EXAMPLE, "pixel_values": torch.zeros(1)}] * 4, "'pixel_values', which is not an input"),
    ([{"input_ids": torch.zeros(2, 16), "attention_mask": torch.ones(2, 16, dtype=torch.int64)}] * 4, "input_ids is float32; the model takes int64"),
    (torch.zeros(3), "holds a Tensor; expected a list of dicts"),
    ([[torch.zeros(2, 16)]], "holds a list; expected a list of dicts"),
    ([EXAMPLE], "1 sample"),
])
def test_bad_torch_files_are_one_line_usage_errors(tmp_path, content, message):
    torch.save(content, tmp_path / "bad.pt")
    with pytest.raises(UsageError, match=message) as caught:
        load_calibration(tmp_path / "bad.pt", EXAMPLE)
    assert "\n" not in str(caught.value)


def test_unreadable_files(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(UsageError, match="not a readable .npz"):
        load_calibration(tmp_path / "junk.npz", EXAMPLE)
    (tmp_path / "junk.pt").write_bytes(b"not a pickle")
    with pytest.raises(UsageError, match="not a torch.save'd list"):
        load_calibration(tmp_path / "junk.pt", EXAMPLE)
    with pytest.raises(UsageError, match="no such file"):
        load_calibration(tmp_path / "absent.npz", EXAMPLE)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="holds no .npz"):
        load_calibration(tmp_path / "empty", EXAMPLE)


def test_random_calibration_is_marked_and_varied():
    calibration = random_calibration(EXAMPLE, object(), seed=3)
    assert calibration.random and "random inputs" in calibration.source
    assert calibration.held_out and calibration.samples
    masks = [s["attention_mask"] for s in calibration.samples]
    assert bool(masks[0].all()) and not bool(masks[1].all())  # padded after the first, as verification draws
