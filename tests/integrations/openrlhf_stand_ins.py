"""OpenRLHF 0.11.2 on CPU: its trainer module imported with STAND-INS for the GPU-only packages, and
STAND-INS for its Ray model actors. Imported by the OpenRLHF tests and, by the actors' class
names, by the Ray workers that run those actors (so it must stay importable from this folder).

Every stand-in mirrors the interface read from OpenRLHF's source:
- ``vllm`` and ``flash_attn``: only the names OpenRLHF imports at module top; they leave
  ``sys.modules`` again once OpenRLHF is imported, so later tests find both as absent as they are;
- the model actors: subclasses of OpenRLHF's own ``PolicyModelActor`` (openrlhf/trainer/ray/ppo_actor.py),
  ``ReferenceModelActor`` and ``RewardModelActor`` (openrlhf/trainer/ray/launcher.py), keeping their
  ``__init__`` and ``execute_batch`` and replacing what needs a DeepSpeed model on a GPU
  (``forward``, ``fit``, ``append``, ``broadcast_to_vllm``, ``empty_cache``) with arithmetic on the
  tensors they get, with the signatures of the real methods.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from types import SimpleNamespace
from typing import Any

import ray
import torch

import otel_rl


def _stand_in_module(name: str, **names: Any) -> None:
    """STAND-IN (GPU-only package): a module holding the names OpenRLHF imports from it."""
    module = types.ModuleType(name)
    module.__dict__.update(names)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []
    sys.modules[name] = module


class SamplingParams:  # STAND-IN: vllm.SamplingParams takes keyword arguments
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def _import_openrlhf() -> Any:
    before = set(sys.modules)
    if importlib.util.find_spec("vllm") is None:
        _stand_in_module("vllm", SamplingParams=SamplingParams)
        _stand_in_module("vllm.inputs", TokensPrompt=dict)
        _stand_in_module("vllm.utils", random_uuid=lambda: "0")
    if importlib.util.find_spec("flash_attn") is None:
        _stand_in_module("flash_attn")
        _stand_in_module("flash_attn.bert_padding", index_first_axis=None, pad_input=None, rearrange=None, unpad_input=None)
        _stand_in_module("flash_attn.utils")
        _stand_in_module("flash_attn.utils.distributed", all_gather=None)
    try:
        from openrlhf.trainer import ppo_trainer
        from openrlhf.trainer.ray import launcher, ppo_actor  # noqa: F401 - imported while the stand-ins are there
        from openrlhf.utils import agent  # noqa: F401
    finally:
        for name in [n for n in sys.modules if n not in before and n.split(".")[0] in ("vllm", "flash_attn")]:
            del sys.modules[name]
    return ppo_trainer


ppo_trainer = _import_openrlhf()
from openrlhf.trainer.ray import launcher, ppo_actor  # noqa: E402


class _CpuModel:
    """What the stand-in actors share: a rank-0 strategy (``execute_batch`` asks it) and no GPU."""

    def _cpu(self) -> None:
        self.strategy = SimpleNamespace(is_rank_0=lambda: True)
        self._task_names: set[str] = set()

    def _seen(self) -> None:
        self._task_names.add(ray.get_runtime_context().get_task_name())

    def empty_cache(self) -> None:  # torch.cuda.empty_cache() in BaseModelActor
        return None

    def task_names(self) -> list[str]:
        """Not OpenRLHF's: the names of the Ray tasks the model's work ran in, as Ray's tools show them."""
        return sorted(self._task_names)

    def close(self) -> None:
        """Not OpenRLHF's: flushes this worker's telemetry before the test reads it (Ray kills actors
        without running their exit handlers)."""
        otel_rl.shutdown()


class CpuPolicyModelActor(_CpuModel, ppo_actor.PolicyModelActor.__ray_actor_class__):
    """STAND-IN for the actor model: log-probs from the token ids; ``fit`` answers as
    PolicyModelActor.fit does (training_step's metrics and the mean of each experience.info entry)."""

    def __init__(self, world_size: int, rank: int, master_addr: Any, master_port: Any) -> None:
        super().__init__(world_size, rank, master_addr, master_port)
        self._cpu()
        self.experiences: list[Any] = []

    def forward(self, sequences, action_mask=None, attention_mask=None, packed_seq_lens=None, mm_train_inputs_list=None):  # noqa: ANN001, ANN201
        self._seen()
        return -0.01 * sequences[:, 1:].float() * action_mask

    def append(self, experience: Any) -> None:
        self.experiences.append(experience)

    def fit(self, kl_ctl: float = 0) -> dict[str, float]:
        self._seen()
        done, self.experiences = self.experiences, []
        info = {k: torch.cat([e.info[k].reshape(-1) for e in done]).float().mean().item() for k in done[0].info}
        x = info["reward"]
        return {
            "policy_loss": 0.1 * x,
            "actor_lr": 1e-6,
            "actor_grad_norm": 0.5 + x,
            "ppo_clip_ratio": 0.01 * x,
            "ppo_kl": 1e-4 * x + kl_ctl,
            **info,
            "response_length": torch.cat([e.response_length for e in done]).float().mean().item(),
            "truncated": torch.cat([e.truncated for e in done]).float().mean().item(),
        }

    def broadcast_to_vllm(self) -> None:
        self._seen()


class CpuReferenceModelActor(_CpuModel, launcher.ReferenceModelActor.__ray_actor_class__):
    """STAND-IN for the reference model: log-probs a little below the actor's."""

    def __init__(self, world_size: int, rank: int, master_addr: Any, master_port: Any) -> None:
        super().__init__(world_size, rank, master_addr, master_port)
        self._cpu()

    def forward(
        self, sequences, action_mask=None, attention_mask=None, return_output=False, packed_seq_lens=None, mm_train_inputs_list=None
    ):  # noqa: ANN001, ANN201
        self._seen()
        return -0.02 * sequences[:, 1:].float() * action_mask


class CpuRewardModelActor(_CpuModel, launcher.RewardModelActor.__ray_actor_class__):
    """STAND-IN for the reward model: one reward per sequence, from its token ids."""

    def __init__(self, world_size: int, rank: int, master_addr: Any, master_port: Any) -> None:
        super().__init__(world_size, rank, master_addr, master_port)
        self._cpu()

    def forward(self, sequences, attention_mask=None, packed_seq_lens=None, pad_sequence=False):  # noqa: ANN001, ANN201
        self._seen()
        return (sequences * attention_mask).sum(-1).float().remainder(7) / 7
