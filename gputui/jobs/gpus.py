"""Which GPUs a user's program gets: `CUDA_VISIBLE_DEVICES`, decided once per run.

`--gpus 0,2` and `--device cuda:N` name GPUs as `gputui monitor` shows them (NVML's order,
which is the PCI bus order: the program also gets CUDA_DEVICE_ORDER=PCI_BUS_ID, so index N
means the same GPU to CUDA). With `auto` (or `cuda`) gputui takes free GPUs first, by the
rule of the profile's `[free]` table (the one `gputui monitor --free` uses: no compute
process, low utilisation and memory), least used first; when fewer are free than wanted, the
least used of the others make up the count, and the reason says so. Least used: the least
memory in use, then the lowest utilisation, then the lowest index. The reason is one line,
said in the run's `start` event (`device_choice`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from gputui.model.errors import UserError
from gputui.model.telemetry import GpuSample
from gputui.model.units import plural

if TYPE_CHECKING:
    from gputui.config.free import FreeRule


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
           read: Callable[[], tuple[list[GpuSample], str | None]] = local_gpus,
           rule: "FreeRule | None" = None) -> Choice:
    """The GPUs for a program that wants `count` of them (1, or one per DDP process): free ones
    by `rule` (the profile's [free]; default FreeRule()) first, least used first."""
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
    from gputui.config.free import FreeRule
    from gputui.monitor.lab import is_free

    rule = rule or FreeRule()
    free = [g for g in found if is_free(g, rule)]
    taken = least_used(free, count)
    if len(taken) == count:
        return Choice(tuple(taken), f"{len(free)} of {len(found)} GPUs free by [free] ({rule.describe()}); the "
                                    f"least-used {count}: {','.join(map(str, taken))}")
    others = least_used([g for g in found if g.index not in taken], count - len(taken))
    chosen = sorted(taken + others)
    busy = ",".join(map(str, others))
    lead = f"only {len(free)} of {len(found)} GPUs free by [free]" if free else f"none of {len(found)} GPUs free by [free]"
    return Choice(tuple(chosen), f"{lead} ({rule.describe()}) and {count} wanted: the least-used of the others "
                                 f"too ({busy}): {','.join(map(str, chosen))}")


def _uuid(text: object) -> str:
    """A GPU's UUID as NVML ("GPU-7b0d...") and torch (with or without "GPU-") both give it."""
    value = str(text).strip().lower()
    return value[4:] if value.startswith("gpu-") else value


def net_gpu(visible: Sequence[str], read: Callable[[], tuple[list[GpuSample], str | None]] | None = None,
            rule: "FreeRule | None" = None) -> tuple[int, str] | None:
    """The torch index of the GPU a network's single-process run takes under `--device auto`:
    the least used free GPU by `rule` among those torch sees (`visible`: their UUIDs, in torch's
    order), else the least used of them; with the reason. None where NVML cannot tell which
    of them is which (the run keeps cuda:0, as torch's own default)."""
    found, _why = (read or local_gpus)()
    where = {_uuid(u): i for i, u in enumerate(visible)}
    seen = [g for g in found if g.uuid is not None and _uuid(g.uuid) in where]
    if len(seen) < 2:
        return None
    from gputui.config.free import FreeRule
    from gputui.monitor.lab import is_free

    rule = rule or FreeRule()
    free = [g for g in seen if is_free(g, rule)]
    pick = least_used(free or seen, 1)[0]
    chosen = next(g for g in seen if g.index == pick)
    index = where[_uuid(chosen.uuid)]
    lead = (f"{len(free)} of {len(seen)} GPUs free by [free] ({rule.describe()}): the least used"
            if free else f"none of {len(seen)} GPUs free by [free] ({rule.describe()}): the least used of them")
    return index, f"auto: {lead}, GPU {chosen.index} (cuda:{index}, {chosen.name or 'n/a'})"


def free_rule_of(profile_path: "Path | None") -> "FreeRule":
    """The [free] rule of a profile file (a run's own copy: see free_table); the defaults without one."""
    from gputui.monitor.lab import free_rule

    if profile_path is None or not profile_path.is_file():
        return free_rule(None)
    from gputui.config.profile import load_profile

    return free_rule(load_profile(profile_path))


def free_table(profile_path: "Path | None") -> str:
    """A profile's [free] table as TOML ("" without one), for a run's copy of its profile: the run's
    `--device auto` keeps the rule its profile had, resumed or not."""
    if profile_path is None or not profile_path.is_file():
        return ""
    from gputui.config.profile import load_profile

    table = load_profile(profile_path).tables.get("free")
    if not table:
        return ""
    import tomli_w

    return "\n" + tomli_w.dumps({"free": dict(table)})
