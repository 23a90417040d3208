"""Which GPUs a user's program gets: `CUDA_VISIBLE_DEVICES`, decided once per run.

`--gpus 0,2` and `--device cuda:N` name GPUs as `gputui monitor` shows them (NVML's order,
which is the PCI bus order: the program also gets CUDA_DEVICE_ORDER=PCI_BUS_ID, so index N
means the same GPU to CUDA). With `auto` (or `cuda`) gputui takes the least-used GPUs by
NVML: the least memory in use, then the lowest utilisation, then the lowest index. The
reason is one line, said in the run's `start` event (`device_choice`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from gputui.model.errors import UserError
from gputui.model.telemetry import GpuSample
from gputui.model.units import plural


@dataclass(frozen=True)
class Choice:
    visible: tuple[int, ...] | None  # CUDA_VISIBLE_DEVICES (None: leave the environment's as it is)
    why: str
    device: str = "cuda"  # what the program will find: cuda (GPUs visible) or cpu

    def env(self) -> dict[str, str]:
        if self.visible is None:
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, self.visible)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def least_used(gpus: Sequence[GpuSample], count: int) -> list[int]:
    """The indices of the `count` least-used GPUs (memory in use, then utilisation, then index)."""
    def load(g: GpuSample) -> tuple[float, float, int]:
        memory = (g.mem_used_mib / g.mem_total_mib) if g.mem_used_mib is not None and g.mem_total_mib else 1.0
        return (round(memory, 2), g.util_pct if g.util_pct is not None else 100.0, g.index)

    return sorted(g.index for g in sorted(gpus, key=load)[:count])


def local_gpus() -> tuple[list[GpuSample], str | None]:
    """This machine's GPUs through NVML, and why there are none (NVML's one line) when so."""
    from gputui.sources.nvml import NvmlSource

    source = NvmlSource()
    try:
        snapshot = source.poll()[0]
    finally:
        source.close()
    return list(snapshot.gpus), (snapshot.message if not snapshot.gpus else None)


def choose(device: str, gpus: Sequence[int] | None, count: int, env: Mapping[str, str],
           read: Callable[[], tuple[list[GpuSample], str | None]] = local_gpus) -> Choice:
    """The GPUs for a program that wants `count` of them (1, or one per DDP process)."""
    if device == "cpu":
        return Choice((), "cpu asked: no GPU is visible to the program", "cpu")
    if gpus:
        return Choice(tuple(gpus), f"--gpus {','.join(map(str, gpus))}")
    if device.startswith("cuda:"):
        index = int(device.split(":", 1)[1])
        return Choice((index,), f"{device} asked")
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return Choice(None, f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} kept from the environment")
    found, why_none = read()
    if not found:
        if device == "cuda":
            raise UserError(f"device cuda: no GPU found ({why_none or 'NVML sees none'}); use --device auto or cpu")
        return Choice(None, f"no GPU found ({why_none or 'NVML sees none'}): the program runs as it would alone", "cpu")
    if count > len(found):
        raise UserError(f"{plural(count, 'GPU')} wanted, {len(found)} found: use --nproc {len(found)} or fewer")
    chosen = least_used(found, count)
    return Choice(tuple(chosen), f"least-used {plural(count, 'GPU')} of {len(found)} by memory and utilisation: "
                                 f"{','.join(map(str, chosen))}")
