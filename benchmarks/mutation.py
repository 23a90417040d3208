"""Mutation score of the data model, the cost maths, the budget guard and the event log (issue 19).

mutmut 3 rewrites every function of the measured modules into variants with one change
each (a comparison or boolean flipped, a number or string altered, an argument dropped...)
and runs the tests that call that function against each variant. A variant the tests
fail on is "killed"; one they pass is a "survivor": a change nobody would notice.

    .venv/bin/python benchmarks/mutation.py               # the score (about 5 min on 1 core)
    .venv/bin/python benchmarks/mutation.py --survivors   # then each survivor's diff
    .venv/bin/python benchmarks/mutation.py --rerun       # after adding tests: re-test the survivors
                                                          # (all mutants if the test files changed)

The run happens in a scratch copy (gputui/, tests/, profiles/ and pyproject.toml) under
.mutation/, mutmut's own copy in .mutation/mutants/, with mutmut configured there: the
repository's pyproject.toml needs no [tool.mutmut] table, and edits made elsewhere while it
runs do not change what is measured. One mutant is tested at a time (--max-children 1),
with the fast in-process unit tests only (no sshd, torchrun or trainer subprocesses);
--timeout bounds the whole run. Exit status 0: the run finished and the score reaches 80%.
"""

from __future__ import annotations

import argparse
import ast
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

# The measured code: a module, or some of its functions. The "event emitters": gputui.runs.store
# writes every training event as one JSON line (encode, EventLog) and reads them back
# (read_events); error_event builds a DDP rank's `error` event; emit_line prints a cluster
# rank's events for the master. The trainer builds its start/step/eval/epoch/done events
# inside Trainer.train (gputui.train.loop), reachable only by training, which the tests do in
# subprocesses mutmut cannot see into: it is not measured.
MODULES: dict[str, tuple[str, ...] | None] = {
    "gputui/model/telemetry.py": None,
    "gputui/model/cloud.py": None,
    "gputui/model/text.py": None,
    "gputui/cloud/budget.py": None,
    "gputui/cloud/costs.py": None,
    "gputui/runs/store.py": None,
    "gputui/train/distributed.py": ("error_event",),
    "gputui/cluster/worker.py": ("emit_line",),
    # Pure logic the later changes added or touched (issue 28 item 8). gputui/runs/store.py above holds
    # the run resolver (`find`) and the one events reader (read_events, iter_events, EventLines,
    # parse_event) already; here: the event builder, the "number from outside" parser, the
    # plural helper, and the sweep's trial states (counted / requeued, as `sweep show` names them).
    "gputui/model/events.py": None,
    "gputui/model/outside.py": None,
    "gputui/model/units.py": ("plural",),
    "gputui/sweep/study.py": ("counted", "requeue_running"),
    "gputui/sweep/reader.py": ("state_name", "best_so_far"),
    "gputui/sweep/show.py": ("trial_rows",),
    "gputui/sweep/lifecycle.py": None,  # a trial's states and their moves, one table
    "gputui/dashboard/session.py": None,  # the dashboard's run: its states and moves, one table
}

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
    "tests/test_hostile_text.py::test_clean_makes_one_printable_line",
    "tests/test_hostile_text.py::test_clean_cuts_a_huge_value_and_leaves_none",
    "tests/test_run_resolver.py",
    "tests/test_events.py",
    "tests/test_hostile_lines.py",
    "tests/test_units.py",
    "tests/test_first_minutes.py",
    "tests/test_sweep.py",
    "tests/test_sweep_master.py",
    "tests/test_sweep_scheduler.py",
    "tests/test_trial_states.py",
    "tests/test_run_session.py",
]
# Tests in those files that start processes (a CLI, a killed writer, a guard subprocess).
DESELECT = [
    "tests/test_cost_ledger.py::test_ledger_survives_a_kill_mid_write",
    "tests/test_dashboard_model.py::test_bad_dashboard_flags_are_one_line_errors",
    "tests/test_dashboard_model.py::test_imports_stay_apart",
    "tests/test_dashboard_model.py::test_training_child_reports_the_error_line",
    "tests/test_cloud_sim.py::test_up_leaves_a_guard_that_goes_when_the_slaves_do",
]

# What the tests read besides the package: the shipped profiles (resolve_profile's default) and MNIST.
COPY = ["gputui", "tests", "profiles", "assets"]  # assets: the bundled MNIST some fixtures cut from

# mutmut skips every decorated function but static and class methods, so in the scratch
# copy `@property def x(self)` becomes `def _prop_x(self)` followed by `x = property(_prop_x)`:
# the same class, and its properties (budget levels, spot interruptions...) are mutated too.
PROPERTY_PREFIX = "_prop_"

STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout",
          24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout", None: "not checked"}
DETECTED = ("killed", "timeout")  # a mutant that makes the tests hang is caught too


def test_files() -> list[str]:
    """TESTS plus every tests/test_mutants_*.py (tests written to kill survivors)."""
    extra = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_mutants_*.py"))
    return TESTS + [t for t in extra if t not in TESTS]


def mutmut_table() -> str:
    selection = test_files() + [arg for nodeid in DESELECT for arg in ("--deselect", nodeid)]
    table = {
        "source_paths": ["gputui"],
        "only_mutate": list(MODULES),
        "also_copy": ["profiles", "assets"],
        "pytest_add_cli_args_test_selection": selection,
        # The fast tier only (tests/conftest.py): no test that starts a process or a server.
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-m", "not integration"],
        "use_git_change_detection": False,  # the scratch copy is no git repository
    }
    # JSON strings, lists and booleans (lower-cased) are valid TOML values.
    lines = ["", "[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def unwrap_properties(source: str) -> str:
    """Rewrite each `@property` method of `source` as a plain method plus `name = property(...)`."""
    found = [node for cls in ast.walk(ast.parse(source)) if isinstance(cls, ast.ClassDef) for node in cls.body
             if isinstance(node, ast.FunctionDef) and len(node.decorator_list) == 1
             and isinstance(node.decorator_list[0], ast.Name) and node.decorator_list[0].id == "property"]
    lines = source.splitlines(keepends=True)
    for node in sorted(found, key=lambda n: n.lineno, reverse=True):  # bottom-up: line numbers stay valid
        assert node.end_lineno is not None
        plain = PROPERTY_PREFIX + node.name
        lines.insert(node.end_lineno, f"{' ' * node.col_offset}{node.name} = property({plain})\n")
        lines[node.lineno - 1] = lines[node.lineno - 1].replace(f"def {node.name}(", f"def {plain}(", 1)
        del lines[node.decorator_list[0].lineno - 1]
    return "".join(lines)


def write_if_changed(path: Path, data: bytes) -> None:
    """Write only what changed, so that mutmut keeps its results for unchanged files (--rerun)."""
    if not path.is_file() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def prepare(work: Path, fresh: bool) -> None:
    """Copy the tree mutmut needs into `work`, with [tool.mutmut] appended to pyproject.toml."""
    if fresh and work.exists():
        shutil.rmtree(work)
    for name in COPY:
        for src in sorted((REPO / name).rglob("*")):
            if src.is_file() and "__pycache__" not in src.parts and src.suffix != ".pyc":
                rel = src.relative_to(REPO)
                data = src.read_bytes()
                if str(rel) in MODULES:
                    data = unwrap_properties(data.decode("utf-8")).encode("utf-8")
                write_if_changed(work / rel, data)
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    if "[tool.mutmut]" in pyproject:
        raise SystemExit("pyproject.toml has its own [tool.mutmut]; this script configures mutmut itself")
    write_if_changed(work / "pyproject.toml", (pyproject + mutmut_table()).encode("utf-8"))


def mutmut(work: Path, args: list[str], timeout: float, log: Path | None = None) -> int:
    """Run mutmut in `work` (its output to `log` if given); on timeout kill its whole process group."""
    exe = Path(sys.executable).with_name("mutmut")
    with open(log, "w") if log else open(os.devnull) as out:
        proc = subprocess.Popen([str(exe), *args], cwd=work, start_new_session=True,
                                stdout=out if log else None, stderr=subprocess.STDOUT if log else None)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(f"mutation.py: mutmut did not finish in {timeout:.0f} s; the figures are partial", file=sys.stderr)
            return 124
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise


def function_of(module: str, name: str) -> str:
    """"gputui.runs.store.xǁEventLogǁwrite__mutmut_3" -> "EventLog.write"; "...x_encode__mutmut_1" -> "encode"."""
    mangled = name.partition("__mutmut_")[0][len(module[:-3].replace("/", ".")) + 1:]
    return mangled[2:] if mangled.startswith("x_") else ".".join(mangled.split("\u01c1")[1:])


def selected(module: str, name: str) -> bool:
    functions = MODULES[module]
    return functions is None or function_of(module, name) in functions


def patterns() -> list[str]:
    """mutmut run's arguments: every mutant of the measured modules and functions."""
    out = []
    for module, functions in MODULES.items():
        dotted = module[:-3].replace("/", ".")
        out += [f"{dotted}.*"] if functions is None else [f"{dotted}.x_{f}__mutmut_*" for f in functions]
    return out


def results(work: Path) -> dict[str, dict[str, str]]:
    """{module: {mutant name: status}} from mutmut's .meta files."""
    out: dict[str, dict[str, str]] = {}
    for module in MODULES:
        meta = work / "mutants" / (module + ".meta")
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.is_file() else {}
        out[module] = {name: STATUS.get(code, "suspicious") for name, code in codes.items() if selected(module, name)}
    return out


def report(found: dict[str, dict[str, str]]) -> float:
    """Print killed/total per module and overall; return the overall score."""
    columns = ("killed", "timeout", "survived", "no tests", "other")
    label = {m: m + ("" if f is None else ": " + ", ".join(f)) for m, f in MODULES.items()}
    width = max(len(v) for v in label.values()) + 2
    print(f"\n{'module':<{width}}" + "".join(f"{c:>10}" for c in columns) + f"{'total':>8}{'score':>8}")
    overall: Counter[str] = Counter()
    for module in MODULES:
        counts = Counter(s if s in columns else "other" for s in found[module].values())
        overall.update(counts)
        print(f"{label[module]:<{width}}" + "".join(f"{counts[c]:>10}" for c in columns)
              + f"{sum(counts.values()):>8}{score_of(counts):>8.1%}")
    print(f"{'overall':<{width}}" + "".join(f"{overall[c]:>10}" for c in columns)
          + f"{sum(overall.values()):>8}{score_of(overall):>8.1%}")
    detected, total = sum(overall[s] for s in DETECTED), sum(overall.values())
    print(f"\nkilled {detected}/{total} = {score_of(overall):.1%} (target >= {TARGET:.0%})"
          + (f"; {overall['other']} not checked or suspicious" if overall["other"] else ""))
    return score_of(overall)


def score_of(counts: Counter[str]) -> float:
    total = sum(counts.values())
    return sum(counts[s] for s in DETECTED) / total if total else 0.0


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
    for path in sorted((REPO / "gputui" / "model").glob("*.py")):
        module = str(path.relative_to(REPO))
        if module not in MODULES and path.name != "__init__.py":
            print(f"mutation.py: {module} is not measured: add it to MODULES and its unit tests to TESTS",
                  file=sys.stderr)
    names = patterns()
    if args.rerun:
        previous = work / "pyproject.toml"
        if not previous.is_file() or not previous.read_text(encoding="utf-8").endswith(mutmut_table()):
            # Another test selection makes mutmut drop every verdict: re-test them all.
            print("the modules or test files changed since the last run: a full run")
            args.rerun = False
        else:
            names = survivors(results(work))
            if not names:
                print("no survivors to re-test")
                return 0
    prepare(work, fresh=not args.rerun)
    log = work / "mutmut.log"
    print(f"mutmut: {len(MODULES)} modules, {len(test_files())} test files, {args.max_children} child(ren); "
          f"its output goes to {log}", flush=True)
    started = time.monotonic()
    code = mutmut(work, ["run", "--max-children", str(args.max_children), *names], args.timeout, log)
    if code != 0:
        print(log.read_text(errors="replace")[-3000:])
    print(f"mutmut exit {code} after {time.monotonic() - started:.0f} s, {time.strftime('%Y-%m-%d')}")
    score = report(results(work))
    return 0 if code == 0 and score >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
