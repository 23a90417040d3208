"""`gputui monitor --free`: the free GPUs of every host as HOST:INDEX lines, least used first;
--count, --min-memory, --json and --local (an index list for CUDA_VISIBLE_DEVICES), exit codes;
the profile's [free] rule (against a real sshd on loopback); and `--device auto` choosing by
the same rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gputui.cli import main
from gputui.config.free import FreeRule
from gputui.jobs import gpus
from gputui.model.telemetry import GpuProcess, GpuSample, HostSnapshot, HostState, round_to_dict
from tests.sshd_fixture import Sshd, SshdFactory, free_port, sshd_factory  # noqa: F401

REFUSED = "ssh: connect to host 10.0.0.9 port 22: Connection refused"


def gpu(index: int, util: float | None, used: float | None, user: str | None = None, total: float = 81920.0) -> GpuSample:
    procs = () if user is None else (GpuProcess(pid=7000 + index, name="python", user=user, gpu_memory_mib=used),)
    return GpuSample(index, name="A100", uuid=f"GPU-{index}", util_pct=util, mem_used_mib=used, mem_total_mib=total,
                     processes=procs)


def recording(tmp_path: Path) -> Path:
    """One round: a (0 free at 4 MiB, 1 busy, 2 free at 900 MiB and 3%, 3 free at 4 MiB but 5%),
    b unreachable, c (0 free at 600 MiB of 16 GiB, 1 held by a process at 0%)."""
    hosts = [
        HostSnapshot("a", HostState.OK, 1.0, kind="ssh", gpus=(gpu(0, 0.0, 4.0), gpu(1, 99.0, 70000.0, "alice"),
                                                               gpu(2, 3.0, 900.0), gpu(3, 5.0, 4.0))),
        HostSnapshot("b", HostState.UNREACHABLE, 1.0, kind="ssh", message=REFUSED),
        HostSnapshot("c", HostState.OK, 1.0, kind="ssh", gpus=(gpu(0, 0.0, 600.0, total=16384.0),
                                                               gpu(1, 0.0, 300.0, "bob"))),
    ]
    path = tmp_path / "round.jsonl"
    path.write_text(json.dumps(round_to_dict(hosts, 1.0)) + "\n")
    return path


def free(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["monitor", "--free", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_free_gpus_least_used_first_and_a_line_for_hosts_that_did_not_answer(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = free(capsys, "--replay", str(recording(tmp_path)))
    assert code == 0 and out.splitlines() == ["a:0", "a:3", "c:0", "a:2"]  # memory in use, then utilisation
    assert err == "gputui: 1 host did not answer (b): its GPUs are not counted\n"


def test_count_takes_the_first_n_or_fails_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = str(recording(tmp_path))
    code, out, _ = free(capsys, "--replay", record, "--count", "2")
    assert code == 0 and out.splitlines() == ["a:0", "a:3"]
    code, out, err = free(capsys, "--replay", record, "--count", "5")
    assert code == 1 and out == ""
    last = err.splitlines()[-1]
    assert last.startswith("gputui: only 4 of the 5 GPUs wanted are free (free: no compute process, utilisation <= 10%")
    assert "[free]" in last


def test_min_memory_keeps_gpus_with_that_much_memory_free(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = free(capsys, "--replay", str(recording(tmp_path)), "--min-memory", "20")
    assert code == 0 and out.splitlines() == ["a:0", "a:3", "a:2"]  # c:0 has 15.4 GiB free
    code, out, err = free(capsys, "--replay", str(recording(tmp_path)), "--min-memory", "100")
    assert code == 1 and out == "" and "no GPU is free" in err and "100 GiB of memory free" in err


def test_json_is_a_list_of_the_free_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = free(capsys, "--replay", str(recording(tmp_path)), "--json", "--count", "2")
    assert code == 0 and json.loads(out) == [
        {"host": "a", "index": 0, "uuid": "GPU-0", "mem_used_mib": 4.0, "mem_total_mib": 81920.0, "util_pct": 0.0},
        {"host": "a", "index": 3, "uuid": "GPU-3", "mem_used_mib": 4.0, "mem_total_mib": 81920.0, "util_pct": 5.0},
    ]


class _LocalSource:
    """This machine with four GPUs (0 and 3 free, 3 the least used) in place of NVML."""

    def poll(self) -> list[HostSnapshot]:
        return [HostSnapshot("here", HostState.OK, 1.0, kind="local", gpus=(
            gpu(0, 1.0, 500.0), gpu(1, 90.0, 9000.0, "me"), gpu(2, 60.0, 100.0), gpu(3, 0.0, 4.0)))]

    def close(self) -> None:
        pass


def test_local_prints_an_index_list_for_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    import gputui.monitor.polling as polling

    asked: list[Any] = []
    monkeypatch.setattr(polling, "build_source", lambda request: asked.append(request) or _LocalSource())
    code, out, _ = free(capsys, "--local")
    assert code == 0 and out == "0,3\n"
    assert asked[0].local and not asked[0].hosts and asked[0].profile is None  # this machine only
    code, out, _ = free(capsys, "--local", "--count", "1")
    assert code == 0 and out == "3\n"  # the least used
    code, out, err = free(capsys, "--local", "--count", "3")
    assert code == 1 and out == "" and err.startswith("gputui: only 2 of the 3 GPUs wanted are free")


def test_local_without_a_gpu_says_why_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    from gputui.jobs.gpus import local_gpus

    found, why = local_gpus()
    if found:  # a GPU machine: the list is of its free GPUs, or it says none is
        code, out, err = free(capsys, "--local")
        assert (code == 0 and out.strip()) or (code == 1 and "free" in err)
        return
    code, out, err = free(capsys, "--local")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith(f"gputui: no GPU is free on this machine: {why}")


@pytest.mark.parametrize(("args", "words"), [
    (["--local"], "--local goes with --free"),
    (["--min-memory", "4"], "--min-memory goes with --free"),
    (["--free", "--serve", "0"], "--free prints its own view: drop --serve"),
    (["--free", "--users"], "drop --users"),
    (["--free", "--count", "0"], "--count 0: expected 1 or more GPUs"),
    (["--free", "--min-memory", "-1"], "--min-memory -1"),
    (["--free", "--local", "--sim", "2"], "--local is this machine's GPUs"),
])
def test_bad_free_arguments_are_one_line_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], words: str) -> None:
    assert main(["monitor", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gputui: error: ") and words in err and err.count("\n") == 1


# -- over SSH, with the profile's [free] --------------------------------------------------------------


@pytest.fixture(scope="module")
def a100(sshd_factory: SshdFactory) -> Sshd:  # noqa: F811
    return sshd_factory("r535-a100x8")  # GPUs 0-5 busy, 6 and 7 idle at 4 MiB


def test_free_over_ssh_follows_the_profiles_free_table(a100: Sshd, sshd_factory: SshdFactory,  # noqa: F811
                                                       ssh_home: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    (ssh_home / ".ssh" / "known_hosts").write_text(a100.known_hosts_line())
    hosts = (f'[[hosts]]\nname = "rig"\naddress = "127.0.0.1"\nport = {a100.port}\nuser = "root"\n'
             f'identity_file = "{sshd_factory.user_key}"\n'
             f'[[hosts]]\nname = "dead"\naddress = "127.0.0.1"\nport = {free_port()}\nuser = "root"\n'
             f'identity_file = "{sshd_factory.user_key}"\nconnect_timeout = 3.0\n')
    default = tmp_path / "default.toml"
    default.write_text(hosts)
    code, out, err = free(capsys, "--profile", str(default), "--no-local")
    assert code == 0 and out.splitlines() == ["rig:6", "rig:7"], err
    assert "1 host did not answer (dead)" in err
    loose = tmp_path / "loose.toml"  # every GPU counts as free, processes or not
    loose.write_text(hosts + "[free]\nmax_util_pct = 100\nmax_memory_mib = 100000\nallow_processes = true\n")
    code, out, _ = free(capsys, "--profile", str(loose), "--no-local")
    assert code == 0 and out.splitlines()[:2] == ["rig:6", "rig:7"] and len(out.splitlines()) == 8
    assert main(["monitor", "--once", "--users", "--json", "--profile", str(default), "--no-local"]) == 0
    users = {u["user"]: u for u in json.loads(capsys.readouterr().out)["users"]}
    assert users["n/a"]["gpus"] == 6 and sum(u["processes"] for u in users.values()) == 7  # pid 1's user is known


# -- --device auto ----------------------------------------------------------------------------------------


def sample(index: int, used: float, util: float, procs: int = 0) -> GpuSample:
    return GpuSample(index=index, mem_used_mib=used, mem_total_mib=80000, util_pct=util,
                     processes=tuple(GpuProcess(pid=100 + index) for _ in range(procs)))


def test_device_auto_takes_free_gpus_first_least_used_first() -> None:
    found = [sample(0, 300, 5), sample(1, 100, 0, procs=1), sample(2, 900, 8), sample(3, 1500, 0)]
    assert gpus.least_used(found, 2) == [0, 1]  # what --device auto took before: 1 runs a process
    choice = gpus.choose("auto", None, 2, {}, read=lambda: (found, None))
    assert choice.visible == (0, 2)  # 1 runs a process, 3 holds 1.5 GiB
    assert choice.why.startswith("2 of 4 GPUs free by [free]")


def test_device_auto_makes_up_the_count_from_the_others_and_says_so() -> None:
    found = [sample(0, 300, 0), sample(1, 100, 2, procs=1), sample(2, 40000, 90), sample(3, 50, 40)]
    choice = gpus.choose("auto", None, 3, {}, read=lambda: (found, None))
    assert choice.visible == (0, 1, 3)
    assert choice.why.startswith("only 1 of 4 GPUs free by [free]") and "the least-used of the others too (1,3): 0,1,3" in choice.why


def test_device_auto_follows_the_rule_it_is_given() -> None:
    found = [sample(0, 300, 5), sample(1, 100, 0, procs=1), sample(2, 900, 1)]
    loose = FreeRule(allow_processes=True)
    assert gpus.choose("auto", None, 1, {}, read=lambda: (found, None), rule=loose).visible == (1,)
    assert gpus.choose("auto", None, 1, {}, read=lambda: (found, None)).visible == (0,)


def test_a_runs_profile_copy_keeps_the_free_table(tmp_path: Path) -> None:
    from gputui.config.profile import load_profile

    profile = tmp_path / "p.toml"
    profile.write_text('[run]\ncommand = ["python", "train.py"]\n[free]\nmax_util_pct = 30\nallow_processes = true\n')
    copy = tmp_path / "run-profile.toml"
    copy.write_text(load_profile(profile).run.resolve().to_toml() + gpus.free_table(profile))
    assert gpus.free_rule_of(copy) == FreeRule(max_util_pct=30.0, allow_processes=True)
    assert gpus.free_table(tmp_path / "none.toml") == "" and gpus.free_rule_of(None) == FreeRule()


def test_a_program_run_keeps_its_profiles_free_table_when_resumed(tmp_path: Path, gputui_home: Path) -> None:
    from gputui.config.run import RunSettings
    from gputui.jobs.run import RunRequest, prepare

    profile = tmp_path / "p.toml"
    profile.write_text("[free]\nmax_util_pct = 30\n")
    run, _cfg, _ = prepare(RunRequest(profile, RunSettings(), run_dir=tmp_path / "run", program=("python", "train.py")))
    assert gpus.free_rule_of(run.profile) == FreeRule(max_util_pct=30.0)
    again, _cfg, resumed = prepare(RunRequest(None, RunSettings(), resume=str(run.path)))
    assert resumed and gpus.free_rule_of(again.profile) == FreeRule(max_util_pct=30.0)
