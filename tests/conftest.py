"""Shared fixtures: small MNIST-format datasets cut from the bundled copy, an isolated GPUTUI_HOME;
the two tiers (the `integration` marker) and one torch thread per test process.

Two tiers. A test is `integration` when it starts processes or servers: it uses a fixture that
does (sshd, cluster nodes, the wheel, moto's server), it lives in a file listed in
INTEGRATION_FILES, or its code (or a helper of tests/ it calls, or a fixture of tests/ it uses)
names something that starts a process (`run_cli`, `Child`, `subprocess`, `sys.executable`, ...).
The developer loop leaves them out:

    .venv/bin/python -m pytest -q -n auto -m "not integration"

and a test of the fast tier that starts a Python, torchrun, ssh, sshd, tmux or Chromium anyway
fails, naming what it started (`_tier_guard`), so the tiers stay what they say.
"""

from __future__ import annotations

import os

# One torch thread per test process and per child it starts (through the environment), set before
# anything imports torch: two xdist workers each running a pool of one thread per core would
# oversubscribe the cores. Tests about the thread count gputui chooses delete it (monkeypatch).
os.environ["OMP_NUM_THREADS"] = "1"
# A terminal width only where a test sets one: xdist's workers inherit COLUMNS=80, and gputui's
# piped tables fit $COLUMNS when it is set, so the same test cut its tables under -n auto alone.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

import gzip  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterator  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from gputui.train.data import load_dataset  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# -- the two tiers ---------------------------------------------------------------------------

# Fixtures that start servers or build the wheel (the fixtures that use them are found too:
# pytest lists the whole closure in `item.fixturenames`).
INTEGRATION_FIXTURES = frozenset({"sshd_factory", "cluster_nodes", "cluster_wheel", "pinned_wheel", "moto_server"})
# Files whose tests start processes through gputui itself (torchrun, ssh, a child dashboard run)
# rather than through a name the code scan sees.
INTEGRATION_FILES = frozenset({
    "test_ddp.py", "test_dashboard_tmux.py", "test_serve.py", "test_stop_matrix.py", "test_cli_promises.py",
    "test_dashboard_promises.py", "test_telemetry_ssh.py", "test_bastion.py", "test_sweep_remote.py",
    "test_sweep_cloud.py",
})
# Tests of otherwise fast files that start a process through gputui (the dashboard's training
# child, a sweep worker): the end-to-end tests of those paths.
INTEGRATION_TESTS = frozenset({
    "test_dashboard_app.py::test_a_crashed_run_shows_its_error_line",
    "test_dashboard_app.py::test_t_trains_stops_and_r_resumes_through_the_child",
    "test_dashboard_model.py::test_training_child_reports_the_error_line",
    "test_dashboard_model.py::test_a_run_refused_before_it_starts_leaves_no_directory_but_its_error_line",
    "test_dashboard_runs.py::test_an_exit_without_the_question_leaves_the_run_going_and_the_app_ends",
    "test_dashboard_runs.py::test_quit_keeps_the_run_going_headless_and_a_later_dashboard_attaches",
    "test_dashboard_runs.py::test_resume_from_the_runs_screen_of_a_complete_run_says_so",
    "test_slave_stops.py::test_a_sweep_worker_beats_the_heartbeat_in_its_gputui_home_as_it_trains",
})
# Names whose mention in a test's code (or in a tests/ helper or fixture it uses) means it starts
# a process: subprocess and its helpers here, a supervised Tree, the interpreter's path.
PROCESS_NAMES = frozenset({"subprocess", "Popen", "run_cli", "Child", "executable", "Tree", "fork", "forkserver",
                           "create_subprocess_exec", "create_subprocess_shell", "ThreadedMotoServer", "spawn"})


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _starts_processes(obj: Any, seen: set[int]) -> bool:
    """Whether `obj` (a function, or a class of tests/) names a process-starting thing, itself or
    through the functions and classes of tests/ it names."""
    if id(obj) in seen:
        return False
    seen.add(id(obj))
    if inspect.isclass(obj):
        return any(_starts_processes(v, seen) for v in vars(obj).values() if inspect.isfunction(v))
    func = inspect.unwrap(obj) if callable(obj) else obj
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    glob = getattr(func, "__globals__", {})
    for c in _codes(code):
        # A helper reached as `module.name` (`gpu_runs.sgd_run`): the names a function uses
        # include both, so each tests/ module it names is searched for the other names too.
        modules = [m for name in c.co_names if inspect.ismodule(m := glob.get(name))
                   and m.__name__.startswith("tests")]
        for name in c.co_names:
            if name in PROCESS_NAMES:
                return True
            for target in (glob.get(name), *(getattr(m, name, None) for m in modules)):
                if target is not None and str(getattr(target, "__module__", "")).startswith("tests") \
                        and (inspect.isfunction(target) or inspect.isclass(target)) \
                        and _starts_processes(target, seen):
                    return True
    return False


_OWN_FIXTURES = frozenset({"_tier_guard", "_one_torch_thread"})  # this file's autouse fixtures (the guard names Popen)


def _is_integration(item: pytest.Item) -> bool:
    if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    if item.path.name in INTEGRATION_FILES or f"{item.path.name}::{item.name.split('[')[0]}" in INTEGRATION_TESTS:
        return True
    seen: set[int] = set()
    func = getattr(item, "function", None)
    if func is not None and _starts_processes(func, seen):
        return True
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        if name in _OWN_FIXTURES:
            continue
        for definition in (info.name2fixturedefs.get(name, ()) if info is not None else ()):
            fixture = definition.func
            if str(getattr(fixture, "__module__", "")).startswith("tests") and _starts_processes(fixture, seen):
                return True
    return False


def _module_scoped(item: pytest.Item) -> bool:
    """Whether the test uses a module-scoped fixture (built once for its file's tests)."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope == "module" for name in item.fixturenames
                                    for d in info.name2fixturedefs.get(name, ()))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: one worker more than the cores when the whole suite runs. Its tests wait on the
    processes they start for about a third of their time (CPU time against wall time, measured
    with 2 and 3 workers on 2 cores: 70% and 86% busy), so a third worker on 2 cores fills those
    waits. The fast tier (`-m "not integration"`) starts no process: one worker per core.
    PYTEST_XDIST_AUTO_NUM_WORKERS, or a number after -n, still decides."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    fast_tier = "not integration" in (config.getoption("markexpr", "") or "")
    return cores if fast_tier else cores + 1


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("integration") is None and _is_integration(item):
            item.add_marker(pytest.mark.integration)
        # pyproject's `--dist loadgroup`: a file's tests that share a module-scoped fixture (two sshd
        # nodes, a DDP run) go to one xdist worker, which builds it once; the others spread out.
        if item.get_closest_marker("xdist_group") is None and _module_scoped(item):
            item.add_marker(pytest.mark.xdist_group(item.path.name))


# What a fast-tier test must not start: interpreters and the programs whose start costs seconds.
_HEAVY = ("python", "torchrun", "gputui", "ssh", "sshd", "tmux", "chromium", "moto_server")


def _argv0(args: Any) -> str:
    """The program a Popen starts, by name ('' when it cannot tell)."""
    try:
        if isinstance(args, (str, bytes)):
            first: Any = args.split()[0] if args.split() else ""
        elif isinstance(args, os.PathLike):
            first = args
        else:
            items = list(args)
            first = items[0] if items else ""
        return os.path.basename(os.fsdecode(first))
    except (TypeError, ValueError):
        return ""


@pytest.fixture(autouse=True)
def _tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test of the fast tier that starts a Python, ssh, tmux, ... fails, naming it: it belongs
    in the integration tier (INTEGRATION_FILES, or @pytest.mark.integration)."""
    if request.node.get_closest_marker("integration") is not None:
        yield
        return
    started: list[str] = []
    real_init = subprocess.Popen.__init__

    def init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        name = _argv0(args)
        if (name.startswith(_HEAVY) or name == os.path.basename(sys.executable)) and name != "ssh-keygen":
            started.append(name)
        real_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", init)
    yield
    if started:
        pytest.fail(f"{request.node.nodeid} is in the fast tier but started {', '.join(sorted(set(started)))}: "
                    "mark it integration (tests/conftest.py INTEGRATION_FILES or @pytest.mark.integration)",
                    pytrace=False)


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Back to one torch thread after a test that ran gputui in this process with more."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def write_idx(path: Path, array: np.ndarray, gz: bool = True) -> None:
    """Write a uint8 array as an IDX file (magic 0x0000 08 ndim, sizes, data)."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    raw = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(raw, compresslevel=1))
    else:
        path.write_bytes(raw)


def make_dataset(directory: Path, n_train: int, n_test: int, gz: bool = True) -> Path:
    """A slice of the bundled MNIST in IDX form under `directory`."""
    full = load_dataset()
    directory.mkdir(parents=True, exist_ok=True)
    write_idx(directory / "train-images-idx3-ubyte", full.train_images[:n_train], gz)
    write_idx(directory / "train-labels-idx1-ubyte", full.train_labels[:n_train].astype(np.uint8), gz)
    write_idx(directory / "t10k-images-idx3-ubyte", full.test_images[:n_test], gz)
    write_idx(directory / "t10k-labels-idx1-ubyte", full.test_labels[:n_test].astype(np.uint8), gz)
    return directory


@pytest.fixture(scope="session")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """512 training and 256 test images: 8 steps an epoch at batch 64."""
    return make_dataset(tmp_path_factory.mktemp("small"), 512, 256)


@pytest.fixture(scope="session")
def medium_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4096 training and 1000 test images, for runs that must last a few seconds."""
    return make_dataset(tmp_path_factory.mktemp("medium"), 4096, 1000)


@pytest.fixture(autouse=True)
def gputui_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own user data directory."""
    home = tmp_path / "home"
    monkeypatch.setenv("GPUTUI_HOME", str(home))
    return home


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 300, **popen: Any) -> subprocess.CompletedProcess[str]:
    """Run `python -m gputui ARGS` and capture its output (stdin empty unless given: a program reads it)."""
    if "input" not in popen:
        popen.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(
        [sys.executable, "-m", "gputui", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        **popen,
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    """Parse stdout that must hold nothing but JSON lines."""
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def ssh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of our own: ~/.ssh/config and ~/.ssh/known_hosts are read from here; no ssh-agent."""
    home = tmp_path / "user"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home
