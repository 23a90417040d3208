"""The telemetry model's edges that benchmarks/mutation.py found untested: JSON forms,
defaults, display formatting and the windows of metric histories (pure, no I/O)."""

from __future__ import annotations

import pytest

from gputui.model.telemetry import GpuSample, History, HostSnapshot, HostState, TelemetryHistory, fmt, fmt_pair


def history(*samples: tuple[float, float | None]) -> History:
    h = History()
    for t, v in samples:
        h.append(t, v)
    return h


def test_a_host_document_holds_the_state_as_a_plain_string() -> None:
    doc = HostSnapshot("h", HostState.AUTH_FAILED, 1.0).to_dict()
    assert type(doc["state"]) is str and doc["state"] == "auth-failed"


def test_fields_missing_from_a_host_document_take_their_defaults() -> None:
    host = HostSnapshot.from_dict({"name": "h", "state": "ok", "time": 5.0})
    assert host == HostSnapshot("h", HostState.OK, 5.0)
    assert host.kind == "local" and host.gpus == ()


def test_with_state_changes_state_and_reason_and_keeps_the_rest() -> None:
    gpu = GpuSample(index=0, util_pct=1.0)
    host = HostSnapshot("h", HostState.OK, 5.0, kind="ssh", gpus=(gpu,))
    failed = host.with_state(HostState.UNREACHABLE, "timed out")
    assert (failed.state, failed.message, failed.time) == (HostState.UNREACHABLE, "timed out", 5.0)
    assert failed.kind == "ssh" and failed.gpus == (gpu,)
    assert host.with_state(HostState.ERROR, None, time=9.0).time == 9.0


def test_memory_percentage_needs_both_used_and_a_nonzero_total() -> None:
    assert GpuSample(index=0, mem_used_mib=None, mem_total_mib=40.0).mem_pct is None
    assert GpuSample(index=0, mem_used_mib=10.0, mem_total_mib=0.0).mem_pct is None


def test_fmt_has_no_unit_unless_given() -> None:
    assert fmt(41.6) == "42"


def test_fmt_pair_rounds_both_sides_and_has_no_unit_unless_given() -> None:
    assert fmt_pair(1.26, 2.54, digits=1) == "1.3/2.5"
    assert fmt_pair(10, 40) == "10/40"
    assert fmt_pair(None, 40.0, " MiB") == "n/a/40 MiB"


def test_a_window_counts_back_from_the_last_known_sample() -> None:
    h = history((0.0, 1.0), (4.0, 3.0), (10.0, 5.0), (12.0, None))
    assert h.mean(window=7.0) == pytest.approx(4.0)  # t >= 3: the samples at 4 and 10


def test_peak_over_a_window_ignores_older_samples() -> None:
    h = history((0.0, 9.0), (4.0, 3.0), (10.0, 5.0))
    assert h.peak() == 9.0 and h.peak(window=7.0) == 5.0
    assert History().peak() is None


def test_rate_is_between_the_first_and_last_known_values() -> None:
    assert history((0.0, 0.0), (1.0, 10.0), (2.0, 12.0)).rate() == pytest.approx(6.0)
    assert history((0.0, 0.0), (2.0, 5.0)).rate() == pytest.approx(2.5)  # two samples are enough


def test_rate_over_a_window() -> None:
    h = history((0.0, 0.0), (4.0, 4.0), (10.0, 100.0))
    assert h.rate() == pytest.approx(10.0) and h.rate(window=7.0) == pytest.approx(16.0)


def test_no_rate_from_samples_taken_at_the_same_time() -> None:
    assert history((5.0, 1.0), (5.0, 3.0)).rate() is None


def test_a_repeated_first_time_still_gives_the_rate_over_the_whole_span() -> None:
    assert history((0.0, 0.0), (0.0, 1.0), (5.0, 10.0)).rate() == pytest.approx(2.0)


def test_telemetry_history_keeps_300_rounds_by_default() -> None:
    th = TelemetryHistory()
    for t in range(301):
        th.update([HostSnapshot("h", HostState.OK, float(t), cpu_pct=1.0)])
    assert len(th.host("h", "cpu_pct")) == 300


def test_host_metrics_are_stamped_with_the_round_time() -> None:
    th = TelemetryHistory()
    th.update([HostSnapshot("h", HostState.OK, 7.0, cpu_pct=20.0)])
    th.update([HostSnapshot("h", HostState.OK, 8.0, cpu_pct=None)])
    assert list(th.host("h", "cpu_pct")) == [(7.0, 20.0), (8.0, None)]


def test_an_unknown_metric_is_named_in_the_key_error() -> None:
    th = TelemetryHistory()
    with pytest.raises(KeyError, match="gpu_nonsense"):
        th.gpu("h", 0, "gpu_nonsense")
    with pytest.raises(KeyError, match="host_nonsense"):
        th.host("h", "host_nonsense")
