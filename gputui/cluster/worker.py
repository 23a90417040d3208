"""One torchrun rank of a cluster run (started by gputui.cluster.node on every node).

    python -m torch.distributed.run ... -m gputui.cluster.worker --gputui-run-dir DIR --gputui-node NAME

Differences from the single-node worker (gputui.train.distributed):
- rank 0 (on the attempt's first node) prints its events as tagged JSON lines on stdout; the
  master reads every node's output and relays them into its own run directory;
- every node's local rank 0 keeps a checkpoint in its run directory (DDP keeps the
  weights identical), so any surviving node can resume the run;
- at start (also after torchrun restarts the group), the ranks agree on the newest
  checkpoint any node holds and share it before training, so a replacement node with an
  empty run directory resumes with the others;
- a run resumes only when the master says so (`--gputui-resume CHECKPOINT`, from its second
  attempt on, or for a resumed run), or from a checkpoint this very launch wrote (torchrun
  restarted the group in place: `ckpt.pt.launch` names the launch that wrote `ckpt.pt`).
  Otherwise it starts at step 0, and a checkpoint found in the run directory is set aside
  (renamed `ckpt.pt.stale`), never resumed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

from gputui.model import events
from gputui.model.errors import GputuiError, UserError
from gputui.runs.store import RunDir, encode

EVENT_TAG = "@@gputui-event "


def emit_line(event: dict[str, Any]) -> None:
    sys.stdout.write(EVENT_TAG + encode(event) + "\n")
    sys.stdout.flush()


def _checkpoint_step(path: Path | None) -> int:
    from gputui.train import checkpoint

    if path is None or not path.is_file():
        return -1
    try:
        return int(checkpoint.load(path)["step"])
    except (UserError, KeyError, TypeError, ValueError):
        return -1  # damaged: another node's copy will do


def _launch_file(run: RunDir) -> Path:
    return run.checkpoint.with_name(run.checkpoint.name + ".launch")


def mark_launch(run: RunDir, launch_id: str) -> None:
    """Note which launch (torchrun's run id: the master's rendezvous id) wrote the checkpoint."""
    tmp = _launch_file(run).with_name(_launch_file(run).name + ".part")
    tmp.write_text(launch_id, encoding="utf-8")
    os.replace(tmp, _launch_file(run))


def resume_source(run: RunDir, named: Path | None, launch_id: str, local_rank: int) -> Path | None:
    """The checkpoint this node may resume from: the one the master named, one this launch
    wrote (before torchrun restarted the group in place), or none: then a checkpoint there is
    stale, and the node's local rank 0 sets it aside."""
    if named is not None:
        return named if named.is_absolute() else run.path / named
    try:
        written_by = _launch_file(run).read_text(encoding="utf-8").strip()
    except OSError:
        written_by = None
    if launch_id and written_by == launch_id:
        return run.checkpoint
    if local_rank == 0 and run.checkpoint.is_file():
        os.replace(run.checkpoint, run.checkpoint.with_name(run.checkpoint.name + ".stale"))
    return None


def _collective_device() -> Any:
    """Where collective tensors live: the rank's GPU under NCCL, else the CPU."""
    import torch
    import torch.distributed as tdist

    if tdist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sync_checkpoint(run: RunDir, rank: int, world: int, local_rank: int, restart: int,
                    source: Path | None = None) -> tuple[int | None, int]:
    """Share the newest checkpoint among the ranks (each offers `source`, none when it is None):
    (the step it is at or None when there is none, the highest torchrun restart count of any
    rank: each node counts its own). The shared one ends up in every node's run directory.

    Only tensors cross the network (never pickles: a peer's objects would run code here):
    each rank's (step, restart) as int64, then the checkpoint file as a uint8 tensor whose
    length is bounded before anything is allocated; the receiver validates it on load."""
    import torch
    import torch.distributed as tdist

    from gputui.train import checkpoint

    device = _collective_device()
    mine = _checkpoint_step(source)
    gathered = [torch.zeros(2, dtype=torch.int64, device=device) for _ in range(world)]
    tdist.all_gather(gathered, torch.tensor([mine, restart], dtype=torch.int64, device=device))
    steps = [int(t[0]) for t in gathered]
    restarts = max(int(t[1]) for t in gathered)
    best = max(steps)
    if best < 0:
        return None, restarts
    src = steps.index(best)
    data = source.read_bytes() if rank == src and source is not None else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    tdist.broadcast(size, src=src)
    length = int(size.item())
    if not 0 < length <= checkpoint.MAX_BYTES:
        raise GputuiError(f"rank {src} offered a checkpoint of {length} bytes (at most {checkpoint.MAX_BYTES}); "
                          "start a new run")
    if rank == src:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        payload = torch.empty(length, dtype=torch.uint8, device=device)
    tdist.broadcast(payload, src=src)
    tmp = run.checkpoint.with_name(run.checkpoint.name + ".sync")
    if local_rank == 0 and mine != best:
        tmp.write_bytes(payload.cpu().numpy().tobytes())
        os.replace(tmp, run.checkpoint)
    elif local_rank == 0 and source is not None and source != run.checkpoint:
        shutil.copyfile(source, tmp)
        os.replace(tmp, run.checkpoint)
    tdist.barrier()
    return best, restarts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gputui-cluster-worker")
    # Unusual names: torchrun's own parser would take prefixes of its options (--node-rank).
    parser.add_argument("--gputui-run-dir", dest="run_dir", required=True, type=Path)
    parser.add_argument("--gputui-node", dest="node", required=True, help="this node's name (shown in the events)")
    parser.add_argument("--gputui-resume", dest="resume", type=Path, default=None,
                        help="the checkpoint to resume from, named by the master (without it: step 0)")
    args = parser.parse_args(argv)

    from gputui.config.profile import load_profile
    from gputui.train import checkpoint
    from gputui.train.data import load_dataset
    from gputui.train.distributed import error_event, init_rank, leave_group
    from gputui.train.loop import Dist, StopFlag, Trainer
    from gputui.cloud.heartbeat import beat

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    launch_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    run = RunDir(args.run_dir)

    class NodeTrainer(Trainer):
        def save(self) -> None:  # every node keeps the checkpoint, not only global rank 0
            if local_rank == 0:
                checkpoint.save(self.run.checkpoint, self.state())
                mark_launch(self.run, launch_id)

        def _report_step(self, pace: Any) -> None:  # every rank, so a slave without rank 0 shows progress too
            super()._report_step(pace)
            beat()  # the slave's watchdog: [cloud] stalled_minutes

    def emit(event: dict[str, Any]) -> None:
        if rank == 0:
            emit_line(event)

    stop = StopFlag()
    stop.reason = "stopped on another node"  # what this rank reports when a peer's signal stops the group
    # Until training starts there is nothing to checkpoint: SIGTERM ends the process at once, even
    # inside a blocking gloo connect (torchrun stopping a group it restarts waits for that).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    code = 0
    try:
        cfg = load_profile(run.profile).run.resolve()
        device = init_rank(cfg, local_rank)
        source = resume_source(run, args.resume, launch_id, local_rank)
        resumed, restart = sync_checkpoint(run, rank, world, local_rank, restart, source)
        if resumed is not None and local_rank == 0:
            mark_launch(run, launch_id)  # what this launch resumes from is its own now (an in-place restart's)
        if restart:
            emit(events.make("restarted", restart=restart, world_size=world, nodes=world // local_world,
                             resumed_from_step=resumed))
        data = load_dataset(Path(cfg.data) if cfg.data else None)
        info = {"node": args.node, "nodes": world // local_world, "nproc_per_node": local_world, "restart": restart}
        trainer = NodeTrainer(cfg, run, data, device, emit, stop, dist=Dist(rank, world), start_info=info)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda s, _f: stop.set(signal.Signals(s).name))
        trainer.train(resume=resumed is not None)
    except GputuiError as exc:
        emit(error_event(exc))
        code = exc.exit_code
    finally:
        leave_group()
    return code


if __name__ == "__main__":
    from gputui.train.distributed import exit_rank

    exit_rank(main())
