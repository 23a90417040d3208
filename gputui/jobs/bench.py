"""`gputui bench`: the seed studies' experiments in one command.

Every row is a real, short `gputui run` (one epoch of a slice of the bundled MNIST holding
`steps` global batches) through the same code paths as training: single process on the CPU
and on each GPU (eager, and GPU 0 with the CUDA-graph step), DataParallel and DDP over all local GPUs, DDP over CPU processes (gloo),
and the cluster's nodes when a cluster profile is given. The rate is taken between the
first step event and the end of the epoch, so start-up and the first step's one-time costs
are left out; evaluation is never counted. A configuration this machine cannot run (no GPU)
is a row marked skipped with the reason, never a number. torch is imported lazily.

Each row also records what other processes used of the CPUs while it ran (from /proc/stat, the
bench's own time and its children's taken out) and the load average: a busy machine is said
under the table, and an efficiency over 100% is never shown without its likely reason.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from gputui.views.progress import CollectView
from gputui.model.errors import GputuiError
from gputui.train.threads import busy_between, take_sample
from gputui.model.units import plural

FULL_EPOCH = 60000  # images in one epoch of MNIST: what "s/epoch" is quoted for
TEST_IMAGES = 200


@dataclass(frozen=True)
class RowSpec:
    """One configuration to measure."""

    label: str
    model: str
    device: str  # the run's --device
    strategy: str  # single, dataparallel, ddp, cluster
    workers: int  # processes, GPUs or nodes x processes doing the work
    baseline: str  # label of the row the speedup is relative to
    nproc: int | None = None
    gpus: tuple[int, ...] | None = None
    threads: int | None = None
    profile: Path | None = None  # the cluster profile (cluster rows)
    skip: str | None = None  # why this row cannot run here
    cuda_graph: bool | None = None  # single on CUDA: the graph-captured step (True) or the eager one


@dataclass
class BenchRow:
    label: str
    model: str
    device: str
    strategy: str
    workers: int
    baseline: str
    status: str  # ok, skipped, failed
    samples_per_s: float | None = None
    s_per_epoch: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    busy: float | None = None  # CPUs other processes kept busy while the row ran (None: not known)
    load: float | None = None  # the 1-minute load average, the higher of before and after the row


def plan(models: Sequence[str], gpu_count: int, cpu_procs: int, cluster: Any = None, cluster_profile: Path | None = None) -> list[RowSpec]:
    """The rows, in order: CPU, each GPU, all GPUs (DataParallel, DDP), the cluster; per model."""
    rows: list[RowSpec] = []
    no_gpu = "no GPU (CUDA) visible here" if gpu_count == 0 else None
    for model in models:
        cpu = f"{model} cpu x1"
        rows.append(RowSpec(cpu, model, "cpu", "single", 1, cpu))
        rows.append(RowSpec(f"{model} cpu ddp x{cpu_procs}", model, "cpu", "ddp", cpu_procs, cpu, nproc=cpu_procs))
        gpu0 = f"{model} cuda:0"
        for index in range(max(gpu_count, 1)):
            rows.append(RowSpec(f"{model} cuda:{index}", model, f"cuda:{index}", "single", 1, gpu0, skip=no_gpu,
                                cuda_graph=False))
        rows.append(RowSpec(f"{model} cuda:0 graph", model, "cuda:0", "single", 1, gpu0, skip=no_gpu, cuda_graph=True))
        n = max(gpu_count, 1)
        gpus = tuple(range(gpu_count)) or None
        rows.append(RowSpec(f"{model} dataparallel x{n} GPU", model, "cuda", "dataparallel", n, gpu0, gpus=gpus, skip=no_gpu))
        rows.append(RowSpec(f"{model} ddp x{n} GPU", model, "cuda", "ddp", n, gpu0, nproc=n, gpus=gpus, skip=no_gpu))
        if cluster is not None:
            workers = cluster.nodes * cluster.nproc_per_node
            rows.append(RowSpec(f"{model} cluster {plural(cluster.nodes, 'node')} x{cluster.nproc_per_node}", model, "auto",
                                "cluster", workers, cpu if gpu_count == 0 else gpu0, profile=cluster_profile))
    return rows


def slice_dataset(folder: Path, train_images: int) -> Path:
    """The first `train_images` training images of the bundled MNIST (and a few test images) as IDX files."""
    import gzip

    import numpy as np

    from gputui.train.data import load_dataset

    full = load_dataset()
    folder.mkdir(parents=True, exist_ok=True)
    parts = {"train-images-idx3-ubyte": full.train_images[:train_images], "train-labels-idx1-ubyte": full.train_labels[:train_images],
             "t10k-images-idx3-ubyte": full.test_images[:TEST_IMAGES], "t10k-labels-idx1-ubyte": full.test_labels[:TEST_IMAGES]}
    for name, array in parts.items():
        array = np.ascontiguousarray(array, dtype=np.uint8)
        header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
        (folder / (name + ".gz")).write_bytes(gzip.compress(header + array.tobytes(), compresslevel=1))
    return folder


def measure(spec: RowSpec, data: Path, batch_size: int, work: Path) -> BenchRow:
    """Run one row for one epoch of `data`; its rate from the events."""
    from gputui.config.run import RunSettings
    from gputui.jobs.run import RunRequest, run

    row = BenchRow(spec.label, spec.model, spec.device, spec.strategy, spec.workers, spec.baseline, "skipped", detail=spec.skip or "")
    if spec.skip:
        return row
    settings = RunSettings(model=spec.model, device=None if spec.strategy == "cluster" else spec.device,
                           strategy=None if spec.strategy == "cluster" else spec.strategy, nproc=spec.nproc, gpus=spec.gpus,
                           epochs=1, batch_size=batch_size, evals_per_epoch=1, seed=0, data=str(data), threads=spec.threads,
                           cuda_graph=spec.cuda_graph)
    view = CollectView()
    request = RunRequest(profile=spec.profile, overrides=settings, run_dir=work / spec.label.replace(" ", "_").replace(":", ""))
    before, load = take_sample(), _load()
    try:
        run(request, view, say=lambda _m: None)
    except GputuiError as exc:
        row.status, row.detail = "failed", str(exc)
        return row
    finally:
        row.busy = busy_between(before, take_sample())
        after = _load()
        row.load = None if load is None or after is None else max(load, after)
    steps = [e for e in view.events if e.get("event") == "step"]
    done = next((e for e in view.events if e.get("event") == "done"), None)
    start = next((e for e in view.events if e.get("event") == "start"), {})
    if done is None or not steps or done["step"] <= steps[0]["step"] or done["elapsed_s"] <= steps[0]["elapsed_s"]:
        row.status, row.detail = "failed", "the run ended without a measurable epoch"
        return row
    samples = (done["step"] - steps[0]["step"]) * batch_size
    rate = samples / (done["elapsed_s"] - steps[0]["elapsed_s"])
    row.status, row.samples_per_s, row.s_per_epoch = "ok", round(rate, 1), round(FULL_EPOCH / rate, 2)
    row.extra = {"device": start.get("device"), "world_size": start.get("world_size"), "params": start.get("params"),
                 "steps": done["step"] - steps[0]["step"]}
    return row


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def add_speedups(rows: list[BenchRow], cores: int | None = None) -> None:
    """Speedup against each row's baseline row, and scaling efficiency = speedup / workers; an
    efficiency over 100% says why in the row's detail."""
    cores = cores or cpu_count()
    by_label = {r.label: r for r in rows if r.status == "ok"}
    for row in rows:
        base = by_label.get(row.baseline)
        if row.samples_per_s is not None and base is not None and base.samples_per_s:
            row.speedup = round(row.samples_per_s / base.samples_per_s, 3)
            row.efficiency = round(row.speedup / row.workers, 3)
            if row.efficiency > 1.0:
                row.detail = superlinear(base, row, cores)


def _busy_words(row: BenchRow) -> str:
    load = f", load {row.load:.1f}" if row.load is not None else ""
    return f"others used {row.busy:.1f} CPUs{load}" if row.busy is not None else f"load {row.load:.1f}"


def was_busy(row: BenchRow, cores: int) -> bool:
    """Whether other processes took a fair share of the machine while the row ran."""
    if row.busy is not None:
        return row.busy > max(0.5, 0.25 * cores)
    return row.load is not None and row.load > cores


def superlinear(base: BenchRow, row: BenchRow, cores: int) -> str:
    """Why a row scaled better than linearly, in the words its note shows."""
    if was_busy(base, cores) and (base.busy is None or row.busy is None or base.busy > row.busy + 0.25):
        return f"superlinear: the 1-process baseline was slowed by a busy machine ({_busy_words(base)})"
    if was_busy(row, cores) or was_busy(base, cores):
        return f"superlinear: the machine was busy while measuring ({_busy_words(base)}); re-run on a quiet one"
    return "superlinear: more than linear scaling (each process's share fits the caches better); re-run to confirm"


def busy_note(rows: Sequence[BenchRow], cores: int | None = None) -> str | None:
    """A line saying the machine was busy while the bench measured, or None if it was quiet."""
    cores = cores or cpu_count()
    busy = [r for r in rows if r.status != "skipped" and was_busy(r, cores)]
    if not busy:
        return None
    shares = [r.busy for r in busy if r.busy is not None]
    loads = [r.load for r in busy if r.load is not None]
    used = f"other processes used up to {max(shares):.1f} of {cores} CPUs" if shares else "the machine was loaded"
    load = f" (load average up to {max(loads):.1f})" if loads else ""
    return (f"note: the machine was busy while {len(busy)} of the rows ran: {used}{load}; their rates are lower "
            "than on a quiet machine and speedups between them are not reliable")


def run_bench(models: Sequence[str], steps: int, batch_size: int, cluster_profile: Path | None = None,
              cpu_procs: int = 2, progress: Callable[[BenchRow], None] = lambda r: None) -> list[BenchRow]:
    """Measure every row; rows that cannot run here are skipped with the reason."""
    import torch

    from gputui.cluster.settings import load_cluster

    cluster = load_cluster(cluster_profile) if cluster_profile is not None else None
    gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="gputui-bench-") as tmp:
        data = slice_dataset(Path(tmp) / "data", min(FULL_EPOCH, steps * batch_size))
        for spec in plan(models, gpu_count, cpu_procs, cluster, cluster_profile):
            row = measure(spec, data, batch_size, Path(tmp) / "runs")
            rows.append(row)
            progress(row)
    add_speedups(rows)
    return rows


def store_rows(rows: Sequence[BenchRow], when: float | None = None) -> None:
    """Keep the results in the ledger (table bench_results)."""
    from gputui.cluster.store import ClusterStore

    with ClusterStore() as store:
        store.add_bench(time.time() if when is None else when, [asdict(r) for r in rows])


def table(rows: Sequence[BenchRow]) -> str:
    """The results as a text table."""
    head = ("configuration", "workers", "samples/s", "s/epoch", "speedup", "efficiency", "vs / note")
    lines = [head]
    for r in rows:
        def num(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        note = r.detail if r.status != "ok" else (r.baseline if r.baseline != r.label else "baseline")
        if r.status == "ok" and r.detail:
            note += f" ({r.detail})"
        lines.append((r.label, str(r.workers), num(r.samples_per_s, ",.0f"), num(r.s_per_epoch, ".1f"),
                       num(r.speedup, ".2f") + ("x" if r.speedup is not None else ""),
                       num(None if r.efficiency is None else r.efficiency * 100, ".0f") + ("%" if r.efficiency is not None else ""),
                       note))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for n, line in enumerate(lines):
        cells = [line[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(line[1:-1], widths[1:-1])] + [line[-1]]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
