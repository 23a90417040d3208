"""`gputui bench`: samples/s and seconds per epoch on the CPU, each GPU, DataParallel, DDP and the cluster."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser(
        "bench", help="measure samples/s on the CPU, each GPU, DataParallel, DDP and the cluster",
        description="Measure samples/s and seconds per MNIST epoch of the seed network and a larger one "
                    "(fast) on the CPU, each GPU, all GPUs with DataParallel and DDP, DDP over CPU processes, "
                    "and the cluster's nodes (--profile); speedup and scaling efficiency per row. "
                    "Rows this machine cannot run are shown as skipped. Results are kept in the ledger.")
    bench.add_argument("--steps", type=int, default=40, help="global batches measured per row (default 40)")
    bench.add_argument("--batch-size", type=int, default=256, help="global batch size (default 256, the seed recipe's)")
    bench.add_argument("--models", default="seed,fast", help="networks, comma-separated (default seed,fast)")
    bench.add_argument("--nproc", type=int, default=2, help="CPU processes of the cpu ddp row (default 2)")
    bench.add_argument("--profile", type=Path, help="a cluster profile: add rows across its nodes")
    bench.add_argument("--json", action="store_true", help="print the rows as one JSON document")
    bench.set_defaults(handler=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from gputui.jobs.bench import busy_note, run_bench, store_rows, table
    from gputui.model.errors import UserError
    from gputui.config.recipes import MODEL_NAMES

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODEL_NAMES]
    if bad or not models:
        raise UserError(f"--models {args.models}: expected names among {', '.join(MODEL_NAMES)}")
    if not 2 <= args.steps <= 100000:
        raise UserError(f"--steps {args.steps}: expected a whole number from 2 to 100000")
    if not 1 <= args.batch_size <= 60000 or not 1 <= args.nproc <= 64:
        raise UserError("--batch-size must be 1..60000 and --nproc 1..64")
    if args.batch_size % args.nproc:
        raise UserError(f"--batch-size {args.batch_size} does not split evenly over --nproc {args.nproc}")

    def progress(row: Any) -> None:
        if not args.json:
            what = f"{row.samples_per_s:,.0f} samples/s" if row.status == "ok" else f"{row.status}: {row.detail}"
            print(f"  {row.label}: {what}", file=sys.stderr, flush=True)

    rows = run_bench(models, args.steps, args.batch_size, args.profile, args.nproc, progress)
    store_rows(rows)
    note = busy_note(rows)
    if args.json:
        from dataclasses import asdict

        print(json.dumps({"steps": args.steps, "batch_size": args.batch_size, "busy_note": note,
                          "rows": [asdict(r) for r in rows]}))
    else:
        print(table(rows))
        if note:
            print(note)
    return 0 if any(r.status == "ok" for r in rows) else 1
