"""Mutation score of the data model, the cost maths, the budget guard and the event log (issue 19).

mutmut 3 rewrites every function of the measured modules into variants with one change
each (a comparison or boolean flipped, a number or string altered, an argument dropped...)
and runs the tests that call that function against each variant. A variant the tests
fail on is "killed"; one they pass is a "survivor": a change nobody would notice.

    .venv/bin/python benchmarks/mutation.py               # the score (about 10 min on 1 core)
    .venv/bin/python benchmarks/mutation.py --survivors   # then each survivor's diff
    .venv/bin/python benchmarks/mutation.py --rerun       # after adding tests: re-test the survivors only

The run happens in a scratch copy of gputui/, tests/, profiles/ and pyproject.toml under .mutation/
(mutmut's own copy is .mutation/mutants/), with mutmut configured there: the repository's
pyproject.toml needs no [tool.mutmut] table, and edits made elsewhere while it runs do not
change what is measured. One mutant is tested at a time (--max-children 1) with the fast
in-process unit tests only (no sshd, torchrun or trainer subprocesses); --timeout bounds
the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = 0.80

# The measured modules. "Event emitters": gputui.runs holds the events.jsonl writer
# (EventLog), the one-line JSON form of every event (encode) and its reader (read_events);
# the trainer (gputui.train.loop) and the cluster master only build dicts and pass them here.
MODULES = [
    "gputui/model/telemetry.py",
    "gputui/model/cloud.py",
    "gputui/cloud/budget.py",
    "gputui/cloud/costs.py",
    "gputui/runs.py",
]

# Fast in-process tests that reach those modules; mutmut runs, for each mutant, only the
# ones among them that called the mutated function.
TESTS = [
    "tests/test_telemetry_model.py",
    "tests/test_cost_maths.py",
    "tests/test_cloud_budget.py",
    "tests/test_cost_ledger.py",
    "tests/test_dashboard_model.py",
    "tests/test_cloud_sim.py",
    "tests/test_cloud_stubber.py",
    "tests/test_cluster_manager.py",
    "tests/test_telemetry_nvml.py",
]
# Tests in those files that start processes (a CLI, a killed writer, a guard subprocess).
DESELECT = [
    "tests/test_cost_ledger.py::test_ledger_survives_a_kill_mid_write",
    "tests/test_dashboard_model.py::test_bad_dashboard_flags_are_one_line_errors",
    "tests/test_dashboard_model.py::test_imports_stay_apart",
    "tests/test_dashboard_model.py::test_training_child_reports_the_error_line",
    "tests/test_cloud_sim.py::test_up_leaves_a_guard_that_goes_when_the_slaves_do",
]

# What the tests read besides the package: the shipped profiles (resolve_profile's default).
COPY = ["gputui", "tests", "profiles"]

STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout",
          24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout", None: "not checked"}
DETECTED = ("killed", "timeout")  # a mutant that makes the tests hang is caught too


def test_modules() -> list[str]:
    """TESTS plus every tests/test_mutants_*.py (tests written to kill survivors)."""
    extra = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_mutants_*.py"))
    return TESTS + [t for t in extra if t not in TESTS]


def mutmut_table() -> str:
    selection = test_modules() + [arg for nodeid in DESELECT for arg in ("--deselect", nodeid)]
    table = {
        "source_paths": ["gputui"],
        "only_mutate": MODULES,
        "also_copy": ["profiles"],
        "pytest_add_cli_args_test_selection": selection,
        "pytest_add_cli_args": ["-p", "no:cacheprovider"],
        "use_git_change_detection": False,  # the scratch copy is no git repository
    }
    # JSON strings, lists and booleans (lower-cased) are valid TOML values.
    lines = ["", "[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def prepare(work: Path, fresh: bool) -> None:
    """Copy the tree mutmut needs into `work`, with [tool.mutmut] appended to pyproject.toml."""
    if fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPY:
        shutil.copytree(REPO / name, work / name, ignore=skip, dirs_exist_ok=True)
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    if "[tool.mutmut]" in pyproject:
        raise SystemExit("pyproject.toml has its own [tool.mutmut]; this script configures mutmut itself")
    (work / "pyproject.toml").write_text(pyproject + mutmut_table(), encoding="utf-8")


def mutmut(work: Path, args: list[str], timeout: float) -> int:
    """Run mutmut in `work`; on timeout kill its whole process group."""
    exe = Path(sys.executable).with_name("mutmut")
    proc = subprocess.Popen([str(exe), *args], cwd=work, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        print(f"mutation.py: mutmut did not finish in {timeout:.0f} s; the figures below are partial", file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def results(work: Path) -> dict[str, dict[str, str]]:
    """{module: {mutant name: status}} from mutmut's .meta files."""
    out: dict[str, dict[str, str]] = {}
    for module in MODULES:
        meta = work / "mutants" / (module + ".meta")
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.is_file() else {}
        out[module] = {name: STATUS.get(code, "suspicious") for name, code in codes.items()}
    return out


def report(found: dict[str, dict[str, str]]) -> float:
    """Print killed/total per module and overall; return the overall score."""
    columns = ("killed", "timeout", "survived", "no tests", "other")
    print(f"\n{'module':<28}" + "".join(f"{c:>10}" for c in columns) + f"{'total':>8}{'score':>8}")
    overall: Counter[str] = Counter()
    rows = [(m, Counter(s if s in columns else "other" for s in found[m].values())) for m in MODULES]
    for module, counts in rows + [("overall", overall)]:
        if module != "overall":
            overall.update(counts)
        total = sum(counts.values())
        score = sum(counts[s] for s in DETECTED) / total if total else 0.0
        print(f"{module:<28}" + "".join(f"{counts[c]:>10}" for c in columns) + f"{total:>8}{score:>8.1%}")
    total = sum(overall.values())
    score = sum(overall[s] for s in DETECTED) / total if total else 0.0
    unchecked = overall["other"]
    print(f"\nkilled {sum(overall[s] for s in DETECTED)}/{total} = {score:.1%} (target >= {TARGET:.0%})"
          + (f"; {unchecked} not checked or suspicious" if unchecked else ""))
    return score


def survivors(found: dict[str, dict[str, str]]) -> list[str]:
    return [name for module in MODULES for name, status in found[module].items() if status not in DETECTED]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=REPO / ".mutation", help="scratch directory (default .mutation/)")
    parser.add_argument("--max-children", type=int, default=1, help="mutants tested at once (default 1)")
    parser.add_argument("--timeout", type=float, default=1800, help="bound on the whole mutmut run, seconds")
    parser.add_argument("--rerun", action="store_true", help="re-test only the survivors of the last run")
    parser.add_argument("--survivors", action="store_true", help="print the last run's survivors with their diffs")
    args = parser.parse_args()
    work = args.work.resolve()

    if args.survivors:
        for name in survivors(results(work)):
            mutmut(work, ["show", name], timeout=60)
        return 0
    started = time.monotonic()
    if args.rerun:
        names = survivors(results(work))
        if not names:
            print("no survivors to re-test")
            return 0
        prepare(work, fresh=False)
        code = mutmut(work, ["run", "--max-children", str(args.max_children), *names], args.timeout)
    else:
        prepare(work, fresh=True)
        code = mutmut(work, ["run", "--max-children", str(args.max_children)], args.timeout)
    print(f"\nmutmut exit {code} after {time.monotonic() - started:.0f} s "
          f"({args.max_children} child{'ren' if args.max_children > 1 else ''}), {time.strftime('%Y-%m-%d')}")
    score = report(results(work))
    return 0 if code == 0 and score >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
