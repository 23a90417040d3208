"""`gputui monitor --serve`: scraped over HTTP and parsed with prometheus-client's own text
parser: every host's and GPU's gauges, throttle reasons, the cloud's money and the run's
progress; loopback unless told otherwise; `[HOST:]PORT` checked with one-line errors."""

from __future__ import annotations

import re
import sys
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gputui.monitor.alerts import AlertEngine, AlertSettings, CloudFacts, RunFacts
from gputui.cli import main
from gputui.model.errors import UserError
from gputui.monitor.exporter import ExportState, Server, parse_listen, scrape_text
from gputui.model.telemetry import THROTTLE_CODES, GpuSample, HostSnapshot, HostState
from gputui.sources.sim import SimSource
from tests.conftest import cli_env
from tests.proc_support import Child, wait_until


def samples(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """metric name -> {sorted labels: value}, through prometheus-client's parser."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


# No proxy, whatever the environment says: urllib's shared opener keeps the proxies of the first
# request of the process (a cloud test's dead proxy), and loopback's exemption leaves with its env.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scrape(url: str) -> str:
    with DIRECT.open(url, timeout=30) as answer:
        assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/plain")
        return str(answer.read().decode())


def labels(**values: Any) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in values.items()))


def test_a_scrape_shows_every_host_and_gpu_of_the_round() -> None:
    sim = SimSource(hosts=2, gpus=3, seed=4, clock=lambda: 1000.0)
    sim.set_active(0, True)
    for _ in range(5):
        hosts = sim.poll()
    down = HostSnapshot("rig", HostState.UNREACHABLE, 1000.0, kind="ssh", message="refused")
    odd = HostSnapshot("box", HostState.OK, 1000.0, gpus=(GpuSample(0, throttle=("power-cap", "sw-thermal"), util_pct=99.0),))
    state = ExportState()
    run = RunFacts(run_id="r1", active=True, step=120, loss=0.31, test_acc=97.5, samples_per_s=41000.0, last_step=999.0)
    cloud = CloudFacts("spot", budget_usd=20.0, spent_usd=3.5, committed_usd=0.5, usd_per_hour=1.25)
    engine = AlertEngine(AlertSettings(gpu_temperature_c=1.0))
    engine.evaluate([*hosts, odd], 1000.0)
    state.update([*hosts, down, odd], 1000.0, run, cloud, engine.active)
    server = Server(state, "127.0.0.1", 0)
    try:
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        got = samples(scrape(server.url))
    finally:
        server.close()
    up = got["gputui_host_up"]
    assert up == {labels(host="sim-0", kind="sim"): 1.0, labels(host="sim-1", kind="sim"): 1.0,
                  labels(host="rig", kind="ssh"): 0.0, labels(host="box", kind="local"): 1.0}
    assert got["gputui_host_state"][labels(host="rig", state="unreachable")] == 1.0
    for snap in hosts:
        assert got["gputui_host_cpu_percent"][labels(host=snap.name)] == snap.cpu_pct
        for gpu in snap.gpus:
            where = labels(host=snap.name, gpu=gpu.index)
            assert got["gputui_gpu_utilization_percent"][where] == gpu.util_pct
            assert got["gputui_gpu_memory_used_bytes"][where] == gpu.mem_used_mib * 2**20
            assert got["gputui_gpu_temperature_celsius"][where] == gpu.temperature_c
            assert got["gputui_gpu_clock_sm_hertz"][where] == gpu.clock_sm_mhz * 1e6
            assert got["gputui_gpu_processes"][where] == len(gpu.processes)
            assert got["gputui_gpu_info"][labels(host=snap.name, gpu=gpu.index, name=gpu.name, uuid=gpu.uuid,
                                                 driver=snap.driver)] == 1.0
            assert where not in got.get("gputui_gpu_fan_percent", {})  # n/a: no sample, not 0
    box = labels(host="box", gpu=0)
    assert {code: got["gputui_gpu_throttle"][labels(host="box", gpu=0, reason=code)] for code in THROTTLE_CODES} == {
        code: float(code in ("power-cap", "sw-thermal")) for code in THROTTLE_CODES}
    assert got["gputui_gpu_throttled"][box] == 1.0 and box not in got["gputui_gpu_temperature_celsius"]
    assert got["gputui_run_loss"] == {labels(run_id="r1"): 0.31} and got["gputui_run_up"][labels(run_id="r1")] == 1.0
    assert got["gputui_run_samples_per_second"][labels(run_id="r1")] == 41000.0
    assert got["gputui_run_test_accuracy_percent"][labels(run_id="r1")] == 97.5
    assert got["gputui_cloud_spent_usd"] == {labels(cluster="spot"): 3.5}
    assert got["gputui_cloud_usd_per_hour"][labels(cluster="spot")] == 1.25
    assert got["gputui_cloud_budget_used_ratio"][labels(cluster="spot")] == pytest.approx(0.2)
    assert len(got["gputui_alert_firing"]) == 6 and got["gputui_last_poll_timestamp_seconds"][()] == 1000.0


def test_without_a_run_or_cloud_those_metrics_are_absent() -> None:
    state = ExportState()
    state.update(SimSource(hosts=1, gpus=1).poll(), 5.0)
    got = samples(scrape_text(state))
    assert not [name for name in got if name.startswith(("gputui_run_", "gputui_cloud_"))]
    assert "gputui_gpu_utilization_percent" in got


@pytest.mark.parametrize(("text", "expected"), [
    ("9400", ("127.0.0.1", 9400)), ("0.0.0.0:9400", ("0.0.0.0", 9400)), ("[::1]:0", ("::1", 0)),
    ("localhost:80", ("localhost", 80)),
])
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["", "http://x:1", "99999", "a b:1", ":80", "[::1]"])
def test_bad_listen_addresses(text: str) -> None:
    with pytest.raises(UserError, match=r"expected \[HOST:\]PORT"):
        parse_listen(text)


def test_the_notice_says_who_can_reach_it() -> None:
    state = ExportState()
    local = Server(state, "127.0.0.1", 0)
    try:
        assert "this machine only" in local.notice()
        with pytest.raises(UserError, match=f"--serve 127.0.0.1:{local.port}: cannot listen there"):
            Server(state, "127.0.0.1", local.port)
    finally:
        local.close()
    opened = Server(state, "0.0.0.0", 0)
    try:
        assert "anyone who can reach 0.0.0.0" in opened.notice() and "no authentication" in opened.notice()
    finally:
        opened.close()


def test_monitor_serve_rejects_once_and_a_bad_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--once", "--sim", "1", "--serve", "9400"]) == 2
    assert "--serve keeps serving" in capsys.readouterr().err
    assert main(["monitor", "--sim", "1", "--serve", "nowhere:port"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gputui: error: --serve nowhere:port: expected") and err.count("\n") == 1


def test_gputui_monitor_serve_is_scraped_while_it_polls() -> None:
    argv = [sys.executable, "-m", "gputui", "monitor", "--serve", "0", "--sim", "2", "--sim-gpus", "2", "--json",
            "--interval", "0.2", "--allow-host", "metrics.example"]
    with Child(argv, env=cli_env(), name="gputui monitor --serve") as child:
        first = child.wait_for(lambda e: "hosts" in e, 60, "the first round")
        found = wait_until(lambda: re.search(r"serving metrics on (http://127\.0\.0\.1:\d+/metrics) \(this machine only",
                                             child.stderr), 60, "the serving notice", detail=lambda: child.stderr)
        url = found.group(1)
        got = wait_until(lambda: samples(scrape(url)).get("gputui_gpu_utilization_percent") and samples(scrape(url)), 60,
                         "a scrape with GPU metrics")
        assert {dict(k)["host"] for k in got["gputui_gpu_utilization_percent"]} == {h["name"] for h in first["hosts"]}
        assert len(got["gputui_gpu_utilization_percent"]) == 4 and set(got["gputui_host_up"].values()) == {1.0}
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert get(port, f"metrics.example:{port}")[0] == 200 and get(port, f"evil.example:{port}")[0] == 403
        child.proc.terminate()
        assert child.finish(60) == 0, child.stderr
    with pytest.raises(OSError):
        scrape(url)  # closed with the monitor


# who may scrape, and how slowly ------------------------------------------------------------------
def get(port: int, host: str | None) -> tuple[int, bytes]:
    """GET /metrics on 127.0.0.1:port with this Host header (None: no Host header at all)."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("GET", "/metrics", skip_host=True)
        if host is not None:
            connection.putheader("Host", host)
        connection.endheaders()
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_a_foreign_host_name_is_refused_and_loopback_names_answer() -> None:
    """DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 sends
    `Host: evil.example`; that must not read the metrics."""
    server = Server(ExportState(), "127.0.0.1", 0)
    try:
        port = server.port
        status, body = get(port, f"evil.example:{port}")
        assert status == 403 and b"--allow-host" in body and b"gputui_" not in body
        assert get(port, "10.1.2.3")[0] == 403  # not this loopback server's address
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", "app.localhost", None):
            status, body = get(port, host)
            assert status == 200 and b"gputui_last_poll_timestamp_seconds" in body, host
    finally:
        server.close()


def test_allow_host_and_an_open_bind_answer_to_their_names() -> None:
    state = ExportState()
    opened = Server(state, "0.0.0.0", 0)
    try:
        assert get(opened.port, f"10.1.2.3:{opened.port}")[0] == 200  # the address a scraper dials
        assert get(opened.port, f"metrics.example:{opened.port}")[0] == 403
    finally:
        opened.close()
    named = Server(state, "0.0.0.0", 0, allow_hosts=("Metrics.Example",))
    try:
        assert get(named.port, f"metrics.example:{named.port}")[0] == 200
        assert get(named.port, f"evil.example:{named.port}")[0] == 403
    finally:
        named.close()


@pytest.mark.parametrize(("header", "bound", "extra", "allowed"), [
    ("localhost:9400", "127.0.0.1", (), True), ("LOCALHOST.", "127.0.0.1", (), True),
    ("[::1]:9400", "127.0.0.1", (), True), ("a.localhost", "::1", (), True),
    ("gpubox.lan:9400", "gpubox.lan", (), True),  # the name the user bound
    ("gpubox.lan", "127.0.0.1", ("gpubox.lan",), True), ("gpubox.lan", "127.0.0.1", (), False),
    ("192.168.1.5:9400", "0.0.0.0", (), True), ("192.168.1.5:9400", "127.0.0.1", (), False),
    ("evil.example", "0.0.0.0", (), False), ("", "127.0.0.1", (), False), (None, "127.0.0.1", (), True),
])
def test_host_allowed(header: str | None, bound: str, extra: tuple[str, ...], allowed: bool) -> None:
    from gputui.monitor.exporter import host_allowed

    assert host_allowed(header, bound, extra) is allowed


def test_a_client_that_never_finishes_its_request_is_cut_off() -> None:
    """Slow loris: a request line and then nothing. The server closes the connection at its
    read deadline (without one, the connection and its thread were held for good), and
    answers others meanwhile."""
    import socket

    server = Server(ExportState(), "127.0.0.1", 0, read_timeout_s=1.0)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as slow:
            slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n")  # the blank line never comes
            assert get(server.port, "localhost")[0] == 200
            try:
                left = slow.recv(1024)
            except TimeoutError:
                raise AssertionError("the server still held the unfinished request after 30 s") from None
            assert left == b""  # closed, nothing answered
    finally:
        server.close()


def test_the_deadline_counts_every_read_not_each_one() -> None:
    """A client that sends a header line now and then, each in time for a per-read timeout,
    still runs out of time: the deadline is for the whole request."""
    import io
    import socket

    from gputui.monitor.exporter import DeadlineReader

    now = [100.0]
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader = io.BufferedReader(DeadlineReader(ours, 5.0, clock=lambda: now[0]))
        theirs.sendall(b"GET /metrics HTTP/1.1\r\n")
        assert reader.readline() == b"GET /metrics HTTP/1.1\r\n"
        now[0] += 4.0
        theirs.sendall(b"Host: localhost\r\n")
        assert reader.readline() == b"Host: localhost\r\n"
        now[0] += 1.5  # 5.5 s since the connection began
        theirs.sendall(b"X-Slow: 1\r\n")
        with pytest.raises(TimeoutError, match="within 5 s"):
            reader.readline()


def test_allow_host_without_serve_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--sim", "1", "--allow-host", "gpubox.lan"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gputui: error: --allow-host") and "--serve" in err and err.count("\n") == 1
