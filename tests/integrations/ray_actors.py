"""An actor class as a framework writes one (its module is imported by the Ray workers)."""

from __future__ import annotations

import os
import time

import otel_rl
from otel_rl.integrations import ray as otel_ray


class RolloutWorker:
    """An actor as a framework writes one: its methods are stages of the caller's step."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    @otel_ray.stage("generate", cluster="actor_infer")
    def generate(self, prompts: list[int]) -> list[int]:
        time.sleep(self.delay_s)
        tel = otel_rl.get_telemetry()
        tel.log({"actor/generate_samples": float(len(prompts))})  # lands on the driver's step
        return [p * 2 for p in prompts]

    @otel_ray.stage()
    def fail(self) -> None:
        raise RuntimeError("worker failure")

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        otel_ray.shutdown()
