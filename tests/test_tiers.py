"""The fast tier's classifier (tests/conftest.py): which tests count as starting a process."""

from __future__ import annotations

from . import gpu_runs
from .conftest import _starts_processes


def test_a_helper_reached_through_its_module_counts_as_starting_a_process() -> None:
    """`gpu_runs.sgd_run(...)` starts a run: a test that calls it that way is an integration test
    (tests/test_gpu.py's CUDA tests were left in the fast tier and failed there on an H100)."""

    def through_the_module() -> None:
        gpu_runs.sgd_run  # noqa: B018 - named, as a call names it

    def a_constant_of_the_same_module() -> int:
        return gpu_runs.BATCH

    assert _starts_processes(through_the_module, set())
    assert not _starts_processes(a_constant_of_the_same_module, set())
