"""One torchrun rank of a cluster run (started by gputui.cluster.node on every node).

    python -m torch.distributed.run ... -m gputui.cluster.worker --gputui-run-dir DIR --gputui-node NAME

Differences from the single-node worker (gputui.train.distributed):
- rank 0, wherever c10d placed it, prints its events as tagged JSON lines on stdout; the
  master reads every node's output and relays them into its own run directory;
- every node's local rank 0 keeps a checkpoint in its run directory (DDP keeps the
  weights identical), so any surviving node can resume the run;
- at start (also after torchrun restarts the group), the ranks agree on the newest
  checkpoint any node holds and share it before training, so a replacement node with an
  empty run directory resumes with the others.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from gputui.errors import GputuiError, UserError
from gputui.runs import RunDir, encode

EVENT_TAG = "@@gputui-event "


def emit_line(event: dict[str, Any]) -> None:
    sys.stdout.write(EVENT_TAG + encode(event) + "\n")
    sys.stdout.flush()


def _checkpoint_step(run: RunDir) -> int:
    from gputui.train import checkpoint

    if not run.checkpoint.is_file():
        return -1
    try:
        return int(checkpoint.load(run.checkpoint)["step"])
    except (UserError, KeyError, TypeError, ValueError):
        return -1  # damaged: another node's copy will do


def sync_checkpoint(run: RunDir, rank: int, world: int, local_rank: int, restart: int) -> tuple[int | None, int]:
    """Share the newest checkpoint among the ranks: (the step it is at or None when there is
    none, the highest torchrun restart count of any rank: each node counts its own)."""
    import torch.distributed as tdist

    mine = _checkpoint_step(run)
    gathered: list[Any] = [None] * world
    tdist.all_gather_object(gathered, (mine, restart))
    steps = [int(s) for s, _ in gathered]
    restarts = max(int(r) for _, r in gathered)
    best = max(steps)
    if best < 0:
        return None, restarts
    src = steps.index(best)
    payload: list[Any] = [run.checkpoint.read_bytes() if rank == src else None]
    tdist.broadcast_object_list(payload, src=src)
    if local_rank == 0 and mine != best:
        tmp = run.checkpoint.with_name(run.checkpoint.name + ".sync")
        tmp.write_bytes(payload[0])
        os.replace(tmp, run.checkpoint)
    tdist.barrier()
    return best, restarts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gputui-cluster-worker")
    # Unusual names: torchrun's own parser would take prefixes of its options (--node-rank).
    parser.add_argument("--gputui-run-dir", dest="run_dir", required=True, type=Path)
    parser.add_argument("--gputui-node", dest="node", required=True, help="this node's name (shown in the events)")
    args = parser.parse_args(argv)

    from gputui.profiles import load_profile
    from gputui.train import checkpoint
    from gputui.train.data import load_dataset
    from gputui.train.distributed import error_event, init_rank, leave_group
    from gputui.train.loop import Dist, StopFlag, Trainer

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    run = RunDir(args.run_dir)

    class NodeTrainer(Trainer):
        def save(self) -> None:  # every node keeps the checkpoint, not only global rank 0
            if local_rank == 0:
                checkpoint.save(self.run.checkpoint, self.state())

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
        resumed, restart = sync_checkpoint(run, rank, world, local_rank, restart)
        if restart:
            emit({"event": "restarted", "time": round(time.time(), 3), "restart": restart, "world_size": world,
                  "nodes": world // local_world, "resumed_from_step": resumed})
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
    raise SystemExit(main())
