"""Reads with a bound: `gputui runs` over a run of a million steps streams its events once and
then reads a cached summary; exporting its curves streams too; an SSH poll that floods is cut
at its byte cap; a cluster node's output line without a newline is cut, and split linearly."""

from __future__ import annotations

import builtins
import io
import json
import os
import queue
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from gputui.runs import summaries
from gputui.runs import history
from gputui.runs import store as runs
from gputui.cli import main
from gputui.cluster import procs
from gputui.config.hosts import HostSpec
from gputui.model.lines import LineSplitter
from gputui.model.telemetry import HostState
from gputui.sources.hostkeys import SshOptions
from gputui.sources.ssh import SshHost
from tests.proc_support import wait_until
from tests.sshd_fixture import Sshd, SshdFactory, free_port, sshd_factory  # noqa: F401

MIB = 1 << 20
START = {"event": "start", "time": 1_000_000_000.0, "run_id": "long", "model": "fast", "device": "cuda:0",
         "strategy": "single", "world_size": 1, "epochs": 10, "total_steps": 1_000_000}


# -- an instrument: who opens which file, and the largest single read of it -------------------------

class Reads:
    """Counts the opens of one file and the bytes (or characters) each read of it returned."""

    def __init__(self, path: Path) -> None:
        self.path = os.path.realpath(path)
        self.opens = 0
        self.total = 0
        self.largest = 0

    def note(self, data: Any) -> Any:
        size = len(data) if isinstance(data, (bytes, str)) else 0
        self.total += size
        self.largest = max(self.largest, size)
        return data


class _Watched:
    """A file object whose reads are counted (everything else is the file's own)."""

    def __init__(self, fh: Any, reads: Reads) -> None:
        self._fh, self._reads = fh, reads

    def read(self, *args: Any) -> Any:
        return self._reads.note(self._fh.read(*args))

    def readline(self, *args: Any) -> Any:
        return self._reads.note(self._fh.readline(*args))

    def read1(self, *args: Any) -> Any:
        return self._reads.note(self._fh.read1(*args))

    def readinto(self, buffer: Any) -> int:
        n = int(self._fh.readinto(buffer))
        self._reads.note(b"\0" * n)
        return n

    def __iter__(self) -> Iterator[Any]:
        return (self._reads.note(line) for line in self._fh)

    def __enter__(self) -> "_Watched":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._fh.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Any:
    """watch(path) -> Reads: every open of `path` from now on (open(), Path.open/read_text) is counted."""
    real_open = builtins.open

    def start(path: Path) -> Reads:
        reads = Reads(path)

        def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
            fh = real_open(file, *args, **kwargs)
            if isinstance(file, (str, bytes, os.PathLike)) and os.path.realpath(os.fsdecode(file)) == reads.path:
                reads.opens += 1
                return _Watched(fh, reads)
            return fh

        monkeypatch.setattr(builtins, "open", counting_open)
        monkeypatch.setattr(io, "open", counting_open)  # what pathlib's open and read_text call
        return reads

    return start


def long_run(home: Path, steps: int = 1_000_000, name: str = "long") -> runs.RunDir:
    """A finished run of `steps` step events (~100 bytes each: 1 M steps is ~100 MB), written fast."""
    run = runs.RunDir(home / name)
    run.path.mkdir(parents=True)
    run.profile.write_text('[run]\nmodel = "fast"\nepochs = 10\n')
    per_epoch = steps // 10
    with open(run.events, "wb") as fh:
        fh.write((json.dumps(START) + "\n").encode())
        for first in range(0, steps, 100_000):
            fh.write(b"".join(
                b'{"event": "step", "time": %d.5, "epoch": %d, "step": %d, "loss": 0.25, "l1": 0.125, "elapsed_s": %d.25}\n'
                % (1_000_000_000 + s // 1000, s // per_epoch + 1, s + 1, s // 1000) for s in range(first, min(steps, first + 100_000))))
            epoch = min(steps, first + 100_000) // per_epoch
            fh.write((json.dumps({"event": "epoch", "time": 1_000_001_000.0, "epoch": epoch, "step": first + 100_000,
                                  "train_loss": 0.3, "test_loss": 0.2, "test_acc": 90.0 + epoch / 10}) + "\n").encode())
        fh.write((json.dumps({"event": "done", "time": 1_000_002_000.0, "step": steps, "epochs": 10, "test_acc": 91.0,
                              "best_acc": 91.0, "elapsed_s": 1234.5}) + "\n").encode())
    return run


def listed(capsys: pytest.CaptureFixture[str], home: Path) -> dict[str, dict[str, Any]]:
    capsys.readouterr()
    assert main(["runs", "--json", "--dir", str(home)]) == 0
    return {r["run_id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}


# -- the run history ---------------------------------------------------------------------------------

def test_a_million_step_run_is_listed_without_reading_it_whole_then_from_its_cached_summary(
        tmp_path: Path, watch: Any, capsys: pytest.CaptureFixture[str]) -> None:
    run = long_run(tmp_path / "runs")
    size = run.events.stat().st_size
    assert size > 90 * MIB
    reads = watch(run.events)
    row = listed(capsys, tmp_path / "runs")["long"]
    assert (row["state"], row["epochs_done"], row["epochs"], row["best_acc"], row["final_acc"], row["train_s"]) == \
        ("done", 10, 10, 91.0, 91.0, 1234.5)
    assert reads.total >= size and reads.largest <= 2 * MIB, (reads.total, reads.largest)  # streamed, once
    cache = run.path / summaries.SUMMARY
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    again = watch(run.events)
    assert listed(capsys, tmp_path / "runs")["long"] == row
    assert again.opens == 0  # the second listing reads summary.json alone


def test_a_run_that_grew_is_folded_on_from_the_cached_offset(tmp_path: Path, watch: Any,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = long_run(tmp_path / "runs", steps=20_000)
    lines = run.events.read_bytes().splitlines(keepends=True)
    run.events.write_bytes(b"".join(lines[:-1]))  # still going: no done event yet
    first = listed(capsys, tmp_path / "runs")["long"]
    assert first["state"] == "stopped" and first["epochs_done"] == 10
    more = (json.dumps({"event": "eval", "time": 1_000_003_000.0, "step": 20_001, "test_acc": 99.5}) + "\n").encode()
    with open(run.events, "ab") as fh:
        fh.write(more + lines[-1])
    reads = watch(run.events)
    row = listed(capsys, tmp_path / "runs")["long"]
    assert (row["state"], row["best_acc"], row["final_acc"]) == ("done", 99.5, 91.0)
    # the new lines, and the 64 bytes before the cached offset and before the new one (the checks)
    assert reads.total <= len(more) + len(lines[-1]) + 2 * 64, reads.total


def test_a_rewritten_log_or_a_tampered_summary_is_read_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = long_run(tmp_path / "runs", steps=1_000)
    assert listed(capsys, tmp_path / "runs")["long"]["state"] == "done"
    cache = run.path / summaries.SUMMARY
    doc = json.loads(cache.read_text())
    doc["whole"]["last_kind"] = ["not", "text"]
    cache.write_text(json.dumps(doc))
    assert listed(capsys, tmp_path / "runs")["long"]["state"] == "done"
    run.events.write_text(json.dumps(START) + "\n" + json.dumps({"event": "error", "message": "out of memory"}) + "\n")
    row = listed(capsys, tmp_path / "runs")["long"]
    assert (row["state"], row["detail"], row["epochs_done"]) == ("failed", "out of memory", 0)


def test_an_over_long_line_or_bytes_not_utf8_cost_that_line_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = long_run(tmp_path / "runs", steps=100)
    body = run.events.read_bytes()
    run.events.write_bytes(b"x" * (3 * MIB) + b"\n\xff\xfe not json\n" + body)
    row = listed(capsys, tmp_path / "runs")["long"]
    assert (row["state"], row["epochs_done"], row["best_acc"]) == ("done", 10, 91.0)


def test_export_of_a_resumed_long_run_streams_and_keeps_each_step_once(tmp_path: Path, watch: Any,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = long_run(tmp_path / "runs", steps=300_000)
    with open(run.events, "ab") as fh:  # resumed from step 250,000: the steps after it come again
        fh.write((json.dumps({**START, "resumed_from_step": 250_000}) + "\n").encode())
        fh.write(b"".join(b'{"event": "step", "step": %d, "loss": 0.5}\n' % s for s in range(250_001, 300_001)))
    reads = watch(run.events)
    out = tmp_path / "curves.csv"
    assert main(["runs", "export", str(run.path), "--csv", str(out)]) == 0
    assert reads.largest <= 2 * MIB, reads.largest
    with open(out, encoding="utf-8") as fh:
        header = fh.readline()
        steps = [line.split(",", 3)[1] for line in fh if line.startswith("step,")]
    assert header.startswith("event,step,") and len(steps) == 300_000 and len(set(steps)) == 300_000
    # the same rows as the in-memory reader gives
    small = long_run(tmp_path / "small", steps=2_000)
    with open(small.events, "ab") as fh:
        fh.write((json.dumps({**START, "resumed_from_step": 1_500}) + "\n").encode())
        fh.write(b"".join(b'{"event": "step", "step": %d, "loss": 0.5}\n' % s for s in range(1_501, 1_600)))
    assert list(history.curve_rows(small.events)) == history.curves(runs.read_events(small.events))


# -- a cluster node's output --------------------------------------------------------------------------

class FloodChannel:
    """An SSH channel whose node prints `size` bytes without a newline, `chunk` at a time."""

    def __init__(self, size: int, chunk: int = 65536, then: bytes = b"\nlast words\n") -> None:
        self.left, self.chunk, self.then = size, chunk, then
        self.status_event = type("E", (), {"wait": staticmethod(lambda timeout=None: True)})()

    def recv(self, n: int) -> bytes:
        if self.left > 0:
            size = min(n, self.chunk, self.left)
            self.left -= size
            return b"x" * size
        data, self.then = self.then, b""
        return data

    def recv_exit_status(self) -> int:
        return 0


def node_lines(items: "queue.Queue[procs.Item]") -> list[str]:
    out = []
    while True:
        _name, kind, value = items.get(timeout=60)
        if kind == "exit":
            return out
        out.append(value)


def test_a_slaves_32_mib_line_is_cut_and_split_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    items: "queue.Queue[procs.Item]" = queue.Queue()
    node = procs.RemoteNode.__new__(procs.RemoteNode)
    procs.NodeProc.__init__(node, "slave-1", items)
    node.channel = FloodChannel(32 * MIB)
    node._read()
    lines = node_lines(items)
    assert len(lines) == 2 and lines[1] == "last words"
    assert lines[0].startswith("x" * 1000) and lines[0].endswith("[line cut at 64 KiB]")
    assert len(lines[0]) <= procs.MAX_LINE + 100
    assert node.lines.scanned == 32 * MIB + len(b"\nlast words\n")  # each byte searched once: linear
    assert node.lines.held == 0


def test_the_masters_own_node_line_without_newline_is_cut_too(tmp_path: Path) -> None:
    items: "queue.Queue[procs.Item]" = queue.Queue()
    node = procs.LocalNode.__new__(procs.LocalNode)
    procs.NodeProc.__init__(node, "master", items)
    code = "import sys; w = sys.stdout.buffer.write; [w(b'y' * (1 << 20)) for _ in range(32)]; w(b'\\nbye')"
    node.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    node._read()
    lines = node_lines(items)
    assert lines[-1] == "bye" and len(lines) == 2
    assert len(lines[0]) <= 64 * 1024 + 100 and lines[0].endswith("[line cut at 64 KiB]")
    assert node.exit_code == 0


def test_line_splitter_holds_at_most_a_line_and_searches_each_byte_once() -> None:
    splitter = LineSplitter(16, b"~")
    out: list[bytes] = []
    for piece in [b"ab", b"c\nde", b"f" * 40, b"g\nh", b"\n"]:
        out += splitter.feed(piece)
        assert splitter.held <= 16
    assert out == [b"abc", b"de" + b"f" * 14 + b"~", b"h"]
    assert splitter.scanned == splitter.fed == 2 + 4 + 40 + 3 + 1
    dropping = LineSplitter(4)
    assert dropping.feed(b"12345\nok\n") == [b"ok"] and dropping.cut == 1 and dropping.finish() is None


def test_with_redraws_a_progress_bar_is_short_segments_never_one_line_cut() -> None:
    """tqdm draws "\r" + the bar each update and ends with "\n": an hour of it is megabytes with
    no newline. Split as a terminal shows it, each redraw is a segment ending in b"\r"."""
    bar = LineSplitter(64, b"~", redraws=True)
    out: list[bytes] = []
    for i in range(5000):  # 5000 x ~30 bytes: far past max_line
        out += bar.feed(f"\rEpoch 1: {i}/5000 loss=0.{i:04d}".encode())
        assert bar.held <= 64
    assert bar.pending(64) == b"Epoch 1: 4999/5000 loss=0.4999"  # what a terminal shows now
    assert bar.pending(5) == b"Epoch"
    out += bar.feed(b"\nnext\n")
    assert bar.cut == 0 and out[0] == b"Epoch 1: 0/5000 loss=0.0000\r" and len(out) == 5001
    assert out[-2:] == [b"Epoch 1: 4999/5000 loss=0.4999", b"next"]  # the last frame is a line
    assert bar.scanned == bar.fed  # each byte searched once


@pytest.mark.parametrize("chunks, segments", [
    ([b"a\r\nb\n"], [b"a", b"b"]),  # CRLF ends a line
    ([b"a\r", b"\nb\n"], [b"a", b"b"]),  # ... also when the chunk ends between the two
    ([b"a\r", b"b\n"], [b"a\r", b"b"]),  # a redraw that ended a chunk
    ([b"\r\ra\r \r", b"z\n"], [b"a\r", b" \r", b"z"]),  # empty segments are nothing; a blank one clears a bar
])
def test_redraw_segments_and_crlf_lines(chunks: list[bytes], segments: list[bytes]) -> None:
    splitter = LineSplitter(64, redraws=True)
    out = [seg for chunk in chunks for seg in splitter.feed(chunk)]
    assert out == segments and splitter.scanned == splitter.fed
    assert splitter.finish() is None


def test_a_last_redraw_keeps_its_return_and_without_redraws_nothing_changed() -> None:
    splitter = LineSplitter(64, redraws=True)
    assert splitter.feed(b"x\ry\r") == [b"x\r"] and splitter.finish() == b"y\r"
    plain = LineSplitter(64)
    assert plain.feed(b"a\rb\r\nc\n") == [b"a\rb\r", b"c"]  # an events file's splitter: bytes as they are


# -- SSH telemetry -------------------------------------------------------------------------------------

def flooding_host(factory: SshdFactory, root: Path, script: str) -> Sshd:
    """An sshd whose nvidia-smi runs `script` (sh)."""
    root.mkdir()
    bin_dir = root / "fakebin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\n" + script + "\n")
    fake.chmod(0o755)
    server = Sshd(root, [free_port()], factory.host_key, factory.user_key, None, path=f"{bin_dir}:/usr/bin:/bin")
    factory.servers.append(server)
    return server.start()


def remote_processes(server: Sshd, name: str) -> list[psutil.Process]:
    assert server.process is not None
    try:
        children = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for child in children:
        try:
            if child.name() == name:
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


def ssh_host(factory: SshdFactory, server: Sshd, tmp_path: Path, command_timeout: float = 30.0) -> SshHost:
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts_line())
    options = SshOptions(known_hosts=(known,), gputui_known_hosts=tmp_path / "gputui_known_hosts", ssh_config=None)
    spec = HostSpec(name="flood", address="127.0.0.1", port=server.port, user="root", identity_file=factory.user_key,
                    connect_timeout=5.0, command_timeout=command_timeout)
    return SshHost(spec, options)


def test_a_flooding_nvidia_smi_is_an_error_at_the_poll_cap_and_its_channel_closed(
        sshd_factory: SshdFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    server = flooding_host(sshd_factory, tmp_path / "flood", 'exec yes "0, NVIDIA H100, 100, 80"')
    host = ssh_host(sshd_factory, server, tmp_path, command_timeout=5.0)  # the old reader read on for 5 s
    import paramiko

    received: list[int] = []
    real_recv = paramiko.Channel.recv
    monkeypatch.setattr(paramiko.Channel, "recv", lambda self, n: received.append(len(data := real_recv(self, n))) or data)
    try:
        snap = host.poll_now()
        assert snap.state == HostState.ERROR and snap.message is not None
        assert snap.message.startswith("output over 1024 KiB"), snap.message
        assert sum(received) <= MIB + 65536, sum(received)  # it stopped reading at the cap
        assert host.connected and host.attempts == 1  # the connection stays for the next poll
        wait_until(lambda: not remote_processes(server, "yes"), 30, "the flooding command to end with its channel")
        assert host.poll_now().state == HostState.ERROR and host.attempts == 1  # and the next poll says the same
    finally:
        host.close()
        server.stop()


def test_a_line_over_the_line_cap_is_an_error_too(sshd_factory: SshdFactory, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    server = flooding_host(sshd_factory, tmp_path / "long", "head -c 200000 /dev/zero | tr '\\0' x")
    host = ssh_host(sshd_factory, server, tmp_path)
    try:
        snap = host.poll_now()
        assert snap.state == HostState.ERROR and (snap.message or "").startswith("a line of output over 64 KiB")
    finally:
        host.close()
        server.stop()


def test_a_torn_last_step_line_leaves_the_last_whole_steps_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = long_run(tmp_path / "runs", steps=1_000)
    lines = run.events.read_bytes().splitlines(keepends=True)[:-1]  # killed: no done event
    whole = b'{"event": "step", "time": 1000000009.5, "epoch": 10, "step": 1001, "loss": 0.5, "elapsed_s": 77.5}\n'
    run.events.write_bytes(b"".join(lines) + whole + b'{"event": "step", "time": 1000000010.5, "ela\n')
    row = listed(capsys, tmp_path / "runs")["long"]
    assert (row["state"], row["train_s"], row["last_event"]) == ("stopped", 77.5, 1000000009.5)


def test_a_slave_nodes_supervisor_relays_a_huge_line_cut() -> None:
    """gputui.cluster.node relays torchrun's output on the slave: a rank printing 32 MiB with no
    newline costs it one bounded line (cut with a marker), not its memory; lines around it pass."""
    import io

    from gputui.cluster.node import relay
    from gputui.model.lines import OUTPUT_LINE

    out = io.BytesIO()
    relay(io.BytesIO(b"first\n" + b"x" * (32 << 20) + b"\nlast"), out)
    lines = out.getvalue().split(b"\n")
    assert lines[0] == b"first" and lines[2] == b"last" and lines[3] == b""
    assert lines[1].startswith(b"x" * OUTPUT_LINE) and lines[1].endswith(b"[line cut at 64 KiB]")
    assert len(lines[1]) < OUTPUT_LINE + 64


def test_a_watched_run_is_read_through_the_one_bounded_reader(tmp_path: Path) -> None:
    """`gputui monitor --run`'s watch (monitor.watches.RunWatch) reads through runs.store's
    EventLines: a 5 MiB line with no event in it costs that line, not the watch; the events
    around it fold; a line still being written waits for the next poll."""
    from gputui.monitor.watches import RunWatch

    events = tmp_path / "events.jsonl"
    start = json.dumps({"event": "start", "run_id": "r1", "time": 1.0})
    step = json.dumps({"event": "step", "step": 7, "loss": 0.5, "time": 2.0})
    events.write_bytes(start.encode() + b"\n" + b"x" * (5 << 20) + b"\n" + step.encode() + b"\n" + b'{"event": "st')
    watch = RunWatch(events)
    facts = watch.poll()
    assert facts.run_id == "r1" and facts.step == 7 and facts.loss == 0.5
    with events.open("ab") as fh:
        fh.write(b'ep", "step": 8, "loss": 0.25, "time": 3.0}\n')
    assert watch.poll().step == 8
