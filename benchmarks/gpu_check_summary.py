"""summary.txt of benchmarks/gpu_check.sh: every figure on its own line beside its target (issue 29,
targets of issue 11), from the files the steps left in OUT. A step that failed or left nothing
gives its line with "no figure" and the reason; a dry run (--device cpu) says "cpu dry run"
instead of a verdict.

Usage: python benchmarks/gpu_check_summary.py OUT [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, Callable

# (key, label, target text, check of the figure or None when the line is informative)
FIGURES: list[tuple[str, str, str, Callable[[Any], bool] | None]] = [
    ("startup", "start-up costs (device init / dataset / to device / first step, s)", "reported", None),
    ("fast_eager", "fast net, eager step (ms/step)", "reported", None),
    ("fast_graph", "fast net, graph step (ms/step)", "< eager, replays move the weights", None),
    ("seed_eager", "seed net, eager step (ms/step)", "reported", None),
    ("seed_graph", "seed net, graph step (ms/step)", "< eager, replays move the weights", None),
    ("failed_capture", "deliberately failed capture", "1 fallback, default stream current, trains after", None),
    ("time_to_99", "fast: median time to 99.0% over the seeds (warm, s)", "<= 0.3 s", lambda v: v <= 0.3),
    ("time_to_99_cold", "fast: median time to 99.0%, cold (warm-up included, s)", "reported", None),
    ("ratio", "public recipe's warm epoch / gputui's warm median to 99.0%", ">= 3x", lambda v: v >= 3.0),
    ("seed_12", "seed: 12 epochs, training clock (s)", "<= 0.8 s", lambda v: v <= 0.8),
    ("fast_wall", "gputui run --model fast --json: command to done (s)", "<= 6 s", lambda v: v <= 6.0),
    ("nvml", "NVML utilisation over a long seed run (%)", ">= 70%", lambda v: v >= 70.0),
    ("gpu_tests", "GPU tests (pytest -m gpu)", "all pass", None),
]


def _json_tail(path: Path) -> Any:
    lines = path.read_text(encoding="utf-8").strip().splitlines() if path.is_file() else []
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def _steps(out: Path) -> dict[str, tuple[int | None, float]]:
    rows: dict[str, tuple[int | None, float]] = {}
    path = out / "steps.txt"
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        parts = line.split()
        if len(parts) == 3:
            rows[parts[0]] = (int(parts[1]) if parts[1].isdigit() else None, float(parts[2]))
    return rows


def figures(out: Path) -> dict[str, tuple[Any, str]]:
    """key -> (value or None, a note)."""
    got: dict[str, tuple[Any, str]] = {}
    steps = _steps(out)
    graph: dict[str, Any] = {}
    if (out / "graph.json").is_file():
        graph = json.loads((out / "graph.json").read_text(encoding="utf-8"))
    start = graph.get("startup", {})
    if "error" in start or not start:
        got["startup"] = (None, start.get("error", "no graph.json"))
    else:
        got["startup"] = (" / ".join(f"{start[k]:.3f}" for k in ("device_init_s", "load_dataset_s", "to_device_s",
                                                                  "first_step_s")), "")
    ms = graph.get("ms_per_step", {})
    for key in ("fast_eager", "fast_graph", "seed_eager", "seed_graph"):
        row = ms.get(key) if isinstance(ms, dict) else None
        if not row or "ms_per_step" not in row:
            got[key] = (None, ms.get("error", "not measured") if isinstance(ms, dict) else "not measured")
        else:
            note = f"impl {row['impl']}, weights moved: {row['weights_moved']}"
            if row["fallbacks"]:
                note += f", fallback: {row['fallbacks'][0]}"
            got[key] = (row["ms_per_step"], note)
    fail = graph.get("failed_capture", {})
    if not fail or "error" in fail:
        got["failed_capture"] = (None, fail.get("error", "not run") if fail else "not run")
    else:
        got["failed_capture"] = (f"{len(fail['fallbacks'])} fallback(s)", f"default stream current: "
                                 f"{fail['default_stream_current']}, trains after: {fail['trains_after']}")
    t99 = _json_tail(out / "time_to_99.out")
    if isinstance(t99, dict) and "medians" in t99:
        med = t99["medians"]
        got["time_to_99"] = (med.get("b_warm"), f"{t99.get('failed', 0)} failed run(s)")
        got["time_to_99_cold"] = (med.get("b_cold"), f"public recipe cold {med.get('a_cold')}")
        epoch, b = t99.get("public_epoch_s"), med.get("b_warm")
        got["ratio"] = (round(epoch / b, 2) if epoch and b else None, f"public epoch {epoch} s")
    else:
        for key in ("time_to_99", "time_to_99_cold", "ratio"):
            got[key] = (None, _why(out, "time_to_99", steps))
    seed = _json_tail(out / "seed_run.out")
    got["seed_12"] = ((seed["elapsed_s"], "") if isinstance(seed, dict) and seed.get("event") == "done"
                      else (None, _why(out, "seed_run", steps)))
    fast = _json_tail(out / "fast_run.out")
    got["fast_wall"] = ((steps["fast_run"][1], "") if isinstance(fast, dict) and fast.get("event") == "done"
                        and "fast_run" in steps else (None, _why(out, "fast_run", steps)))
    nvml = _json_tail(out / "seed_long_nvml.out")
    if isinstance(nvml, dict):
        got["nvml"] = (nvml.get("util_mean_pct"), f"{nvml.get('samples')} samples"
                       + (f"; {nvml['error']}" if nvml.get("error") else ""))
    else:
        got["nvml"] = (None, _why(out, "seed_long_nvml", steps))
    text = (out / "pytest.out").read_text(encoding="utf-8") if (out / "pytest.out").is_file() else ""
    counts = re.findall(r"(\d+) (passed|failed|skipped|error|errors|deselected)", text)
    rc = steps.get("pytest", (None, 0.0))[0]
    got["gpu_tests"] = (", ".join(f"{n} {w}" for n, w in counts) or None,
                        f"exit {rc}" if rc is not None else _why(out, "pytest", steps))
    return got


def _why(out: Path, name: str, steps: dict[str, tuple[int | None, float]]) -> str:
    rc = steps.get(name, (None, 0.0))[0]
    if name not in steps:
        return "step not run"
    if rc in (124, 137):
        return "timed out"
    err = (out / f"{name}.err").read_text(encoding="utf-8").strip().splitlines() if (out / f"{name}.err").is_file() else []
    return f"exit {rc}" + (f": {err[-1][:200]}" if err else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    dry = args.device == "cpu"
    got = figures(args.out)
    print(f"gputui gpu_check summary ({'cpu dry run' if dry else args.device}); "
          f"{(args.out / 'meta.txt').read_text(encoding='utf-8').strip() if (args.out / 'meta.txt').is_file() else ''}")
    for key, label, target, check in FIGURES:
        value, note = got.get(key, (None, "not measured"))
        if dry:
            verdict = "cpu dry run"
        elif value is None:
            verdict = "NO FIGURE"
        elif key == "gpu_tests":
            verdict = "PASS" if note == "exit 0" else "FAIL"
        elif check is not None:
            verdict = "PASS" if check(float(value)) else "FAIL"
        else:
            verdict = "see note"
        shown = "no figure" if value is None else value
        print(f"{key}: {label}: {shown} (target {target}) [{verdict}]" + (f" -- {note}" if note else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
