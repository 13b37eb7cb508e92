"""The form matrix's `slow` forms (fp16, bf16, TorchScript *args) run only when asked for with
`-m slow` (or any -m expression naming slow): the suite's addopts deselect nothing by marker, so
without this they would run in CI. They must pass when run."""

from __future__ import annotations


def pytest_collection_modifyitems(config, items) -> None:
    if "slow" in (config.getoption("markexpr") or ""):
        return
    slow = [i for i in items if i.get_closest_marker("slow") is not None and "test_form_matrix" in i.nodeid]
    if slow:
        items[:] = [i for i in items if i not in slow]
        config.hook.pytest_deselected(items=slow)
