"""Prometheus / OpenMetrics exposition of the latest telemetry round (`gputui monitor --serve`).

The monitor loop hands each round to an `ExportState`; a scrape reads that state under a
lock and builds the metric families from it, so scraping costs no poll and never waits for
one. Every host's and GPU's metrics are labelled gauges (`host`, `gpu`); a GPU's name, UUID
and driver are in `gputui_gpu_info`; a metric a host does not give has no sample. The
`[cloud]` cluster's money and the watched run's progress are there when known; for a run of
the user's own program, `gputui_run_metric{run_id, name}` is the latest value of each metric
it reported (a name is data: cleaned to one printable line of at most METRIC_NAME_CHARS, then
escaped by the exposition; of names that clean to the same text, the first).

Units follow Prometheus' conventions: bytes, hertz, watts, celsius, ratios as 0-1 where
the name says `ratio`, percentages where it says `percent`.

The server answers only to a Host header that names this machine (no DNS rebinding: a web
page cannot read the metrics through a name it rebinds to 127.0.0.1), and a request must
arrive whole within READ_TIMEOUT_S (a client that trickles bytes is cut off, not served
forever by its thread).
"""

from __future__ import annotations

import io
import re
import socket
import threading
import time
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable, Iterator, Sequence
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from gputui.monitor.alerts import CloudFacts, RunFacts
from gputui.model.errors import UserError
from gputui.model.outside import finite
from gputui.model.telemetry import THROTTLE_CODES, HostSnapshot

DEFAULT_ADDRESS = "127.0.0.1"
READ_TIMEOUT_S = 10.0  # a request's line and headers, all of them, arrive within this
MIB = 2.0**20
METRIC_NAME_CHARS = 200  # a program's metric name as a label value, at most

# GpuSample attribute -> (metric name, help, scale)
GPU_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("util_pct", "gputui_gpu_utilization_percent", "SM (kernel) utilisation of the GPU", 1.0),
    ("mem_util_pct", "gputui_gpu_memory_bandwidth_utilization_percent", "Memory-bandwidth utilisation of the GPU", 1.0),
    ("mem_used_mib", "gputui_gpu_memory_used_bytes", "GPU memory used (without what the driver reserves)", MIB),
    ("mem_total_mib", "gputui_gpu_memory_total_bytes", "GPU memory in total", MIB),
    ("temperature_c", "gputui_gpu_temperature_celsius", "GPU core temperature", 1.0),
    ("power_w", "gputui_gpu_power_watts", "GPU power draw", 1.0),
    ("power_limit_w", "gputui_gpu_power_limit_watts", "GPU power limit in force", 1.0),
    ("fan_pct", "gputui_gpu_fan_percent", "GPU fan speed", 1.0),
    ("clock_sm_mhz", "gputui_gpu_clock_sm_hertz", "SM clock", 1e6),
    ("clock_mem_mhz", "gputui_gpu_clock_memory_hertz", "Memory clock", 1e6),
    ("pcie_rx_kib_s", "gputui_gpu_pcie_rx_bytes_per_second", "PCIe receive rate", 1024.0),
    ("pcie_tx_kib_s", "gputui_gpu_pcie_tx_bytes_per_second", "PCIe transmit rate", 1024.0),
    ("ecc_corrected", "gputui_gpu_ecc_corrected_errors", "Corrected ECC errors since the driver loaded", 1.0),
    ("ecc_uncorrected", "gputui_gpu_ecc_uncorrected_errors", "Uncorrected ECC errors since the driver loaded", 1.0),
)
HOST_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("cpu_pct", "gputui_host_cpu_percent", "Host CPU busy share", 1.0),
    ("mem_used_mib", "gputui_host_memory_used_bytes", "Host memory used", MIB),
    ("mem_total_mib", "gputui_host_memory_total_bytes", "Host memory in total", MIB),
    ("duration_s", "gputui_host_poll_seconds", "How long the host's last poll took", 1.0),
)


@dataclass(frozen=True)
class Exported:
    """One round as the exporter shows it."""

    time: float
    hosts: tuple[HostSnapshot, ...] = ()
    run: RunFacts | None = None
    cloud: CloudFacts | None = None
    alerts: tuple[tuple[str, str, str], ...] = ()  # (rule, host, gpu) of the alerts firing


class ExportState:
    """The latest round, replaced whole by the monitor loop and read by scrapes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current = Exported(time=0.0)
        self.scrapes = 0

    def update(self, hosts: Sequence[HostSnapshot], now: float, run: RunFacts | None = None,
               cloud: CloudFacts | None = None, alerts: Sequence[Any] = ()) -> None:
        firing = tuple((a.rule, a.host or "", "" if a.gpu is None else str(a.gpu)) for a in alerts)
        with self._lock:
            self._current = Exported(now, tuple(hosts), run, cloud, firing)

    def get(self) -> Exported:
        with self._lock:
            self.scrapes += 1
            return self._current


class Collector:
    """A prometheus-client collector over an ExportState."""

    def __init__(self, state: ExportState) -> None:
        self.state = state

    def describe(self) -> list[Any]:
        return []  # the families depend on the round: none are declared up front

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        now = self.state.get()

        def gauge(name: str, doc: str, labels: Sequence[str]) -> Any:
            return GaugeMetricFamily(name, doc, labels=list(labels))

        up = gauge("gputui_host_up", "1 when the host answered its last poll (with or without GPUs)", ("host", "kind"))
        state = gauge("gputui_host_state", "The host's state (1 for the one it is in)", ("host", "state"))
        hosts = {name: gauge(name, doc, ("host",)) for _, name, doc, _ in HOST_GAUGES}
        gpus = {name: gauge(name, doc, ("host", "gpu")) for _, name, doc, _ in GPU_GAUGES}
        info = gauge("gputui_gpu_info", "A GPU's name, UUID and driver (value 1)", ("host", "gpu", "name", "uuid", "driver"))
        pstate = gauge("gputui_gpu_pstate", "Performance state (0 = full speed .. 15)", ("host", "gpu"))
        procs = gauge("gputui_gpu_processes", "Compute processes on the GPU", ("host", "gpu"))
        throttle = gauge("gputui_gpu_throttle", "1 while this clocks-event reason holds the GPU's clocks", ("host", "gpu", "reason"))
        throttled = gauge("gputui_gpu_throttled", "1 while a slowdown (power cap, thermal, hw slowdown, sync boost) holds the clocks",
                          ("host", "gpu"))
        for host in now.hosts:
            up.add_metric([host.name, host.kind], 1.0 if host.state.worked else 0.0)
            state.add_metric([host.name, host.state.value], 1.0)
            for attr, name, _, scale in HOST_GAUGES:
                value = finite(getattr(host, attr))
                if value is not None:
                    hosts[name].add_metric([host.name], float(value) * scale)
            for gpu in host.gpus:
                labels = [host.name, str(gpu.index)]
                info.add_metric(labels + [gpu.name or "", gpu.uuid or "", host.driver or ""], 1.0)
                for attr, name, _, scale in GPU_GAUGES:
                    value = finite(getattr(gpu, attr))
                    if value is not None:
                        gpus[name].add_metric(labels, float(value) * scale)
                p = _pstate(gpu.pstate)
                if p is not None:
                    pstate.add_metric(labels, p)
                procs.add_metric(labels, float(len(gpu.processes)))
                if gpu.throttle is not None:
                    for code in THROTTLE_CODES:
                        throttle.add_metric(labels + [code], 1.0 if code in gpu.throttle else 0.0)
                    throttled.add_metric(labels, 1.0 if gpu.throttled else 0.0)
        yield from (up, state, *hosts.values(), info, *gpus.values(), pstate, procs, throttle, throttled)
        yield from self._cloud(now.cloud, gauge)
        yield from self._run(now.run, gauge)
        alerts = gauge("gputui_alert_firing", "1 for each alert firing now", ("rule", "host", "gpu"))
        for rule, host_name, index in now.alerts:
            alerts.add_metric([rule, host_name, index], 1.0)
        yield alerts
        yield GaugeMetricFamily("gputui_last_poll_timestamp_seconds", "When the round shown was polled (Unix time)", value=now.time)

    @staticmethod
    def _cloud(cloud: CloudFacts | None, gauge: Any) -> Iterator[Any]:
        if cloud is None:
            return
        for name, doc, value in (
            ("gputui_cloud_usd_per_hour", "What the cluster's running slaves cost per hour", cloud.usd_per_hour),
            ("gputui_cloud_spent_usd", "What the cluster has cost so far", cloud.spent_usd),
            ("gputui_cloud_committed_usd", "What keeping the running slaves one more minute adds", cloud.committed_usd),
            ("gputui_cloud_budget_usd", "The cluster's budget_usd", cloud.budget_usd),
            ("gputui_cloud_budget_used_ratio", "Spent plus committed over the budget", cloud.fraction),
        ):
            yield _one(gauge, name, doc, "cluster", cloud.cluster, value)

    @staticmethod
    def _run(run: RunFacts | None, gauge: Any) -> Iterator[Any]:
        if run is None or run.run_id is None:
            return
        for name, doc, value in (
            ("gputui_run_up", "1 while the watched run is training", 1.0 if run.active else 0.0),
            ("gputui_run_step", "The run's last step", run.step),
            ("gputui_run_loss", "The run's last training loss", run.loss),
            ("gputui_run_test_accuracy_percent", "The run's last test accuracy", run.test_acc),
            ("gputui_run_samples_per_second", "The run's training throughput", run.samples_per_s),
            ("gputui_run_last_step_timestamp_seconds", "When the run's last step event was written", run.last_step),
        ):
            yield _one(gauge, name, doc, "run_id", run.run_id, value)
        if run.metrics:
            yield _metrics(gauge, run.run_id, run.metrics)


def _metrics(gauge: Any, run_id: str, metrics: Sequence[tuple[str, float]]) -> Any:
    """A program run's metrics: one sample per name (the latest value), the name a label value."""
    from gputui.model.text import clean

    family = gauge("gputui_run_metric", "The latest value of each metric the run's program reported", ("run_id", "name"))
    seen: set[str] = set()
    for raw, value in metrics:
        name, number = clean(str(raw), METRIC_NAME_CHARS), finite(value)
        if number is None or not name or name in seen:  # two samples with one label set break a scrape
            continue
        seen.add(name)
        family.add_metric([run_id, name], float(number))
    return family


def _one(gauge: Any, name: str, doc: str, label: str, key: str, value: Any) -> Any:
    """A gauge family of one labelled sample (none when the value is not a finite number)."""
    family = gauge(name, doc, (label,))
    number = finite(value)
    if number is not None:
        family.add_metric([key], float(number))
    return family


def _pstate(text: str | None) -> float | None:
    m = re.fullmatch(r"P(\d{1,2})", text or "")
    return float(m.group(1)) if m else None


_LISTEN = re.compile(r"^(?:(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.\-]+)):)?(?P<port>\d{1,5})$")


def parse_listen(text: str) -> tuple[str, int]:
    """`[HOST:]PORT` (IPv6 in brackets) -> (host, port); the host defaults to 127.0.0.1."""
    m = _LISTEN.match(text.strip())
    port = int(m.group("port")) if m else -1
    if m is None or not 0 <= port <= 65535:
        raise UserError(f"--serve {text}: expected [HOST:]PORT, e.g. 9400 or 0.0.0.0:9400 (port 0-65535)")
    return m.group("v6") or m.group("host") or DEFAULT_ADDRESS, port


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_address(name: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_name(header: str) -> str:
    """The name in a Host header (or an address): no port, no brackets, lower case, no final dot."""
    text = header.strip().lower()
    if text.startswith("["):
        text = text[1:].split("]", 1)[0]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    return text.rstrip(".")


def host_allowed(header: str | None, bound: str, extra: Iterable[str] = ()) -> bool:
    """Whether a request's Host header names this server, which listens on `bound`.

    DNS rebinding makes a browser send the attacker's own name to this machine, so a name
    passes only if it can mean nothing but this machine (localhost, *.localhost, a loopback
    address), is the address bound, or is one of `extra` (--allow-host). On a bind beyond
    loopback an address literal passes too, as does this machine's host name: a rebound name
    is neither. A request without Host is no browser's (every browser sends one)."""
    if header is None:
        return True
    name = host_name(header)
    if not name:
        return False
    if is_loopback(name) or name.endswith(".localhost") or name == host_name(bound):
        return True
    if name in {host_name(e) for e in extra}:
        return True
    return not is_loopback(bound) and (_is_address(name) or name == socket.gethostname().lower())


class DeadlineReader(io.RawIOBase):
    """A socket's reads, all of them together within `seconds`: a client that sends a byte
    now and then (slow loris) is cut off at the deadline, not only one that goes quiet."""

    def __init__(self, sock: socket.socket, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._sock = sock
        self._seconds = seconds
        self._clock = clock
        self._deadline = clock() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - self._clock()
        if left <= 0:
            raise TimeoutError(f"the request did not arrive within {self._seconds:g} s")
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._seconds)  # for the answer's writes


class _Handler(WSGIRequestHandler):
    """One request; its line and headers within `timeout`, which also bounds each write."""

    timeout = READ_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, float(self.timeout or READ_TIMEOUT_S)))

    def handle(self) -> None:
        try:
            super().handle()
        except (TimeoutError, ConnectionError):
            self.close_connection = True  # too slow, or gone: nothing to answer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a scrape is not news."""


class _HTTPServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a thread per request, not joined at close


class Server:
    """The HTTP endpoint: /metrics (any path answers) on a daemon thread, for a Host header
    that names this machine (`host_allowed`; `allow_hosts` adds names)."""

    def __init__(self, state: ExportState, host: str, port: int, allow_hosts: Sequence[str] = (),
                 read_timeout_s: float = READ_TIMEOUT_S) -> None:
        from prometheus_client import CollectorRegistry, make_wsgi_app

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(Collector(state))  # type: ignore[arg-type]
        metrics = make_wsgi_app(self.registry)
        allowed = tuple(allow_hosts)

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            if not host_allowed(environ.get("HTTP_HOST"), host, allowed):
                start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8")])
                return [b"gputui: this exporter does not answer to that Host name "
                        b"(gputui monitor --allow-host NAME adds one)\n"]
            return metrics(environ, start_response)  # type: ignore[no-any-return]

        handler = type("Handler", (_Handler,), {"timeout": read_timeout_s})
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                           flags=socket.AI_PASSIVE)[0]
            server = type("HTTPServer", (_HTTPServer,), {"address_family": family})
            self._httpd = server((sockaddr[0], port), handler)
        except OSError as exc:
            raise UserError(f"--serve {host}:{port}: cannot listen there: {exc.strerror or exc}") from None
        self._httpd.set_app(app)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="gputui-exporter", daemon=True)
        self._thread.start()
        self.host = host
        self.port = int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def notice(self) -> str:
        """One line saying where it serves and who can reach it."""
        if is_loopback(self.host):
            return f"serving metrics on {self.url} (this machine only; --serve 0.0.0.0:{self.port} to open it)"
        return (f"serving metrics on {self.url}: anyone who can reach {self.host}:{self.port} can read them "
                "(no authentication; firewall it); it answers to addresses and this machine's name "
                "(--allow-host NAME adds a name)")

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def scrape_text(state: ExportState) -> str:
    """The exposition text of the state (what a scrape returns), without a server."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(state))  # type: ignore[arg-type]
    return generate_latest(registry).decode()

