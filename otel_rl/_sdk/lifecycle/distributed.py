"""Where this process sits in a distributed job: rank, local rank, world size, node.

Read, in order, from torch.distributed (when a process group is initialised), Ray Train's
worker context (inside a Ray Train worker), and the launcher's environment (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``NODE_RANK`` / ``GROUP_RANK``, as torchrun, accelerate and
DeepSpeed set them). torch and ray are only consulted when the program has imported them
already: detection never imports a framework.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("otel_rl")


@dataclass(frozen=True)
class Placement:
    """This process's place in the job; None where nothing says."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    node_rank: int | None = None
    source: str = "none"


def _env_int(environ: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        raw = environ.get(name)
        if raw not in (None, ""):
            try:
                return int(raw)  # type: ignore[arg-type]
            except ValueError:
                logger.warning("otel-rl: ignoring %s=%r (not an integer)", name, raw)
    return None


def from_torch_distributed(environ: Mapping[str, str]) -> Placement | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return None
        rank, world = dist.get_rank(), dist.get_world_size()
    except Exception:  # a half-initialised group must not stop telemetry from starting
        return None
    local = _env_int(environ, "LOCAL_RANK")
    return Placement(rank, local if local is not None else rank, world, _env_int(environ, "NODE_RANK", "GROUP_RANK"), "torch.distributed")


def from_ray_train() -> Placement | None:
    if "ray" not in sys.modules or "ray.train" not in sys.modules:
        return None
    try:
        import ray.train

        ctx = ray.train.get_context()
        return Placement(ctx.get_world_rank(), ctx.get_local_rank(), ctx.get_world_size(), ctx.get_node_rank(), "ray.train")
    except Exception:  # not inside a Ray Train worker
        return None


def from_environment(environ: Mapping[str, str]) -> Placement | None:
    rank = _env_int(environ, "RANK")
    world = _env_int(environ, "WORLD_SIZE")
    if rank is None and world is None:
        return None
    return Placement(rank, _env_int(environ, "LOCAL_RANK"), world, _env_int(environ, "NODE_RANK", "GROUP_RANK"), "environment")


def detect_placement(environ: Mapping[str, str] | None = None) -> Placement:
    """The first of torch.distributed, Ray Train and the environment that knows the rank."""
    environ = os.environ if environ is None else environ
    for found in (from_torch_distributed(environ), from_ray_train(), from_environment(environ)):
        if found is not None:
            return found
    return Placement()


def with_placement(config: Any) -> Any:
    """A telemetry config (``TelemetryConfig``) with the rank, local rank, world size and node rank
    the caller left open filled from the job itself."""
    if None not in (config.rank, config.local_rank, config.world_size, config.node_rank):
        return config
    found = detect_placement()
    fill = {
        name: getattr(found, name)
        for name in ("rank", "local_rank", "world_size", "node_rank")
        if getattr(config, name) is None and getattr(found, name) is not None
    }
    return dataclasses.replace(config, **fill) if fill else config
