"""Rank, local rank, world size and node from the launcher's environment and a real torch.distributed group."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from loopback import in_loopback_namespace, rerun_in_loopback_namespace

from otel_rl._sdk.lifecycle.distributed import detect_placement, from_environment
from otel_rl.runs.folder import read_spans
from otel_rl.semconv import attributes as A
from otel_rl.stack.process import free_port


def test_the_launchers_environment_gives_the_placement():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "GROUP_RANK": "2"}
    found = from_environment(env)
    assert (found.rank, found.local_rank, found.world_size, found.node_rank, found.source) == (5, 1, 8, 2, "environment")
    assert detect_placement(env) == found  # no process group in this process


def test_a_bad_rank_variable_is_named_and_ignored(caplog):
    found = detect_placement({"RANK": "zero", "WORLD_SIZE": "2"})
    assert found.rank is None and found.world_size == 2
    assert "RANK='zero'" in caplog.text


def test_explicit_arguments_beat_detection(make_telemetry, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("NODE_RANK", "1")
    tel = make_telemetry(rank=0)
    assert (tel.rank, tel.config.world_size, tel.config.node_rank) == (0, 4, 1)
    assert tel.resource.attributes[A.RL_NODE_RANK] == 1


RANK_SCRIPT = textwrap.dedent("""
    import sys, torch.distributed as dist, otel_rl
    rank, port, run_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tel = otel_rl.init(run_dir=run_dir, console=False)   # no rank given, no RANK variable
    with tel.step(1), tel.stage("train_step"):
        dist.barrier()
    tel.shutdown()
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_ranks_come_from_a_real_gloo_process_group(request, tmp_path: Path):
    pytest.importorskip("torch")
    if not in_loopback_namespace():  # gloo and the TCP store bind every interface
        rerun_in_loopback_namespace(request, timeout_s=240)
        return
    port = str(free_port())
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(r), port, str(tmp_path)], env=env) for r in (0, 1)]
    assert [p.wait(timeout=180) for p in procs] == [0, 0]
    infos = [json.loads((tmp_path / name).read_text()) for name in ("run.json", "run.rank1.json")]
    assert [(i["rank"], i["world_size"]) for i in infos] == [(0, 2), (1, 2)]
    ranks = sorted(s.resource[A.RL_RANK] for s in read_spans(tmp_path) if s.name == "rl.train_step")
    assert ranks == [0, 1]
