"""The demo on several ranks: one process per rank, torch.distributed with gloo on CPU.

Data parallel as in a real trainer: every rank holds the same models, samples its own share
of the step's prompts, and averages gradients with all_reduce. Rank 0 opens each step's
root span and broadcasts its trace context; the other ranks join it, so one step is one trace
holding every rank's stages. Each rank exports under its own ``rl.rank`` resource; rank 0
records the per-rank load (tokens, active / idle / communication time) and the straggler.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from otel_rl.demo._rank_context import RankContext
from otel_rl.stack.process import free_port

RESULT_FILE = "demo-result.json"


def _rank_main(
    rank: int, world: int, port: int, cfg_dict: dict[str, Any], telemetry_options: dict[str, Any], out: str, progress: bool
) -> None:
    """One rank's process: join the group, start its telemetry, train, report (rank 0)."""
    import torch
    import torch.distributed as dist

    import otel_rl
    from otel_rl.demo._config import DemoConfig
    from otel_rl.demo._run import DemoTrainer

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the demo's ranks share this machine
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    options = dict(telemetry_options, rank=rank, local_rank=rank, world_size=world)
    if rank != 0:
        options["console"] = False
    tel = otel_rl.init(**options)
    try:
        cfg = DemoConfig(**cfg_dict)
        state = DemoTrainer(cfg, tel, Path(out), progress=progress and rank == 0, ranks=RankContext(rank, world)).run()
        if rank == 0:
            result = {
                "rewards": state.rewards,
                "val_scores": {str(k): v for k, v in state.val_scores.items()},
                "checkpoints": [str(p) for p in state.checkpoints],
                "step_seconds": state.step_seconds,
            }
            (Path(out) / RESULT_FILE).write_text(json.dumps(result), encoding="utf-8")
    finally:
        tel.shutdown()
        dist.destroy_process_group()


def _rank_entry(*args: Any) -> None:
    try:
        _rank_main(*args)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # a failed rank must not leave its peers waiting in a collective forever


def run_ranks(
    cfg: Any, world: int, telemetry_options: dict[str, Any], out: Path, *, progress: bool, timeout_s: float | None = None
) -> dict[str, Any]:
    """Run the demo on ``world`` processes; returns rank 0's result. A failed rank stops all."""
    import multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT_FILE).unlink(missing_ok=True)
    ctx = mp.get_context("spawn")  # fresh interpreters: no copied threads or locks
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank_entry, args=(r, world, port, asdict(cfg), telemetry_options, str(out), progress), name=f"otel-rl-demo-rank{r}"
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        failed = _wait(procs, timeout_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
    if failed:
        raise RuntimeError(f"otel-rl demo: rank(s) {failed} failed (see their traceback above); the other ranks were stopped")
    return json.loads((out / RESULT_FILE).read_text(encoding="utf-8"))


def _wait(procs: list[Any], timeout_s: float | None) -> list[int]:
    """Wait for every rank; as soon as one fails, return the failed ranks (the caller stops the rest)."""
    import time

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if failed or all(p.exitcode == 0 for p in procs):
            return failed
        if deadline is not None and time.monotonic() > deadline:
            return [r for r, p in enumerate(procs) if p.exitcode is None]
        procs[0].join(0.2)
