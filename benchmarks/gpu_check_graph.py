"""gpu_check.sh's direct measurements of the graph step (gputui.train.graphstep) on one device.

Usage: python benchmarks/gpu_check_graph.py OUT.json [--device cuda|cpu] [--data DIR] [--steps N]
Writes OUT.json after each section (a timeout keeps what was measured):
- startup: CUDA context, dataset load, copy to the device, the first eager step (cold);
- ms_per_step: eager and graph steps of both nets (fast, seed), the mean of N steps after warm-up,
  and whether the graph's replays moved the weights;
- failed_capture: a capture made to fail part-way (a host sync inside the captured body): the
  number of fallback reports, whether the default stream is current afterwards, and whether the
  eager steps that follow still train.
On the CPU (a dry run) the graph cannot be captured: the figures are the eager step's, and the
summary says "cpu dry run" beside them.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

RESULT: dict[str, Any] = {}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _section(out: Path, name: str, fn: Callable[[], Any]) -> None:
    t0 = time.perf_counter()
    try:
        RESULT[name] = fn()
    except Exception as exc:  # noqa: BLE001 - recorded; the next section still runs
        RESULT[name] = {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}", "trace": traceback.format_exc()[-1500:]}
    RESULT[name + "_wall_s"] = round(time.perf_counter() - t0, 3)
    out.write_text(json.dumps(RESULT, indent=1, default=str), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data", default=None)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    device = torch.device(args.device)
    RESULT.update(device=str(device), torch=torch.__version__, cuda_build=torch.version.cuda,
                  dry_run=device.type != "cuda")
    if device.type == "cuda":
        RESULT["gpu"] = torch.cuda.get_device_name(device)
    data: dict[str, torch.Tensor] = {}

    def startup() -> dict[str, float]:
        from gputui.train import nets
        from gputui.train.data import load_dataset
        from gputui.train.step import to_device

        figures: dict[str, float] = {}
        t = time.perf_counter()
        torch.zeros(1, device=device)
        _sync(device)
        figures["device_init_s"] = time.perf_counter() - t
        t = time.perf_counter()
        ds = load_dataset(None if args.data is None else Path(args.data))
        figures["load_dataset_s"] = time.perf_counter() - t
        t = time.perf_counter()
        data["x"], data["y"] = to_device(ds.train_images, ds.train_labels, device)
        _sync(device)
        figures["to_device_s"] = time.perf_counter() - t
        model = nets.build("fast", (28, 28), 10).to(device=device, memory_format=torch.channels_last)  # type: ignore[call-overload]
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        t = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(data["x"][:128]), data["y"][:128])
        loss.backward()
        opt.step()
        _sync(device)
        figures["first_step_s"] = time.perf_counter() - t
        return {k: round(v, 4) for k, v in figures.items()}

    def step_fn(net: str, capture: bool, report: list[str]) -> Any:
        from gputui.config.recipes import RECIPES
        from gputui.train import nets
        from gputui.train.graphstep import GraphStep, graph_optimizer

        torch.manual_seed(0)
        model = nets.build(net, (28, 28), 10).to(device=device, memory_format=torch.channels_last)  # type: ignore[call-overload]
        batch = RECIPES[net].batch_size
        opt = graph_optimizer("adam", model.parameters(), 1e-3, device)
        return GraphStep(model, opt, data["x"], data["y"], batch, 0.0, capacity=args.steps + 8,
                         on_fallback=report.append, capture=capture), batch

    def timed(net: str, capture: bool) -> dict[str, Any]:
        reports: list[str] = []
        gs, batch = step_fn(net, capture, reports)
        n = len(data["x"])
        idx = [torch.randint(0, n, (batch,), device=device) for _ in range(8)]
        for i in range(6):  # warm-up and (graph) capture, outside the timing
            gs(i, idx[i % 8], 1e-3)
        gs.take()
        before = [p.detach().clone() for p in gs.model.parameters()]
        _sync(device)
        t = time.perf_counter()
        for i in range(args.steps):
            gs(i, idx[i % 8], 1e-3)
        _sync(device)
        ms = (time.perf_counter() - t) * 1000 / args.steps
        gs.take()
        moved = any(not torch.equal(a, b) for a, b in zip(before, gs.model.parameters()))
        return {"ms_per_step": round(ms, 4), "impl": gs.impl, "weights_moved": moved, "fallbacks": reports,
                "batch": batch}

    def ms_per_step() -> dict[str, Any]:
        return {f"{net}_{'graph' if capture else 'eager'}": timed(net, capture)
                for net in ("fast", "seed") for capture in (False, True)}

    def failed_capture() -> dict[str, Any]:
        reports: list[str] = []
        gs, batch = step_fn("fast", True, reports)
        body = gs.body

        def syncing_body() -> None:  # a host sync inside the capture: the capture fails part-way
            body()
            float(gs.losses.sum())

        gs.body = syncing_body  # type: ignore[method-assign]
        n = len(data["x"])
        for i in range(8):
            gs(i, torch.randint(0, n, (batch,), device=device), 1e-3)
        gs.body = body  # type: ignore[method-assign]
        before = [p.detach().clone() for p in gs.model.parameters()]
        for i in range(4):
            gs(8 + i, torch.randint(0, n, (batch,), device=device), 1e-3)
        gs.take()
        default = True
        if device.type == "cuda":
            default = torch.cuda.current_stream(device) == torch.cuda.default_stream(device)
        return {"fallbacks": reports, "failed_at": gs.failed_at, "default_stream_current": default,
                "trains_after": any(not torch.equal(a, b) for a, b in zip(before, gs.model.parameters())),
                "impl": gs.impl}

    _section(args.out, "startup", startup)
    _section(args.out, "ms_per_step", ms_per_step)
    _section(args.out, "failed_capture", failed_capture)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
