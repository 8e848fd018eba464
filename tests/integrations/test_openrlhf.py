"""OpenRLHF 0.11.2's own PPO trainer loop (``PPOTrainer.fit``: ``train_step``, ``ppo_train``,
``_compute_rollout_stats``, ``save_logs_and_checkpoints``, ``evaluate``, ``compute_eval_metrics``,
its ``TensorboardLogger``), run on CPU with and without otel-rl.

Stand-ins, each marked as such, mirror the interfaces read from OpenRLHF's source:
- the ``vllm`` and ``flash_attn`` modules (GPU only; only the names OpenRLHF imports at module top;
  ``openrlhf_stand_ins.py``);
- the vLLM engines' generation (``SamplesGenerator.generate_samples`` / ``generate_eval_samples``);
- the Ray actor groups of the actor, reference and critic models (``async_run_method(_batch)``,
  answered with real Ray object refs from a local Ray) and the remote experience maker, whose work
  is those groups' forward passes. The actor's ``fit`` answers with the keys
  ``PolicyModelActor.training_step`` and ``experience.info`` give it (openrlhf/trainer/ray/ppo_actor.py).
``PPOTrainer.__init__`` is skipped (it loads a pretrained tokenizer and datasets by path): the test
sets what it would and calls the real ``BasePPOTrainer.__init__``, which otel-rl wraps.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray")
if importlib.util.find_spec("openrlhf") is None:
    pytest.skip("openrlhf is not installed (scripts/setup.sh installs it with --no-deps)", allow_module_level=True)

import torch  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl.integrations.openrlhf import OpenRLHFInstrumentor, OtelLogger  # noqa: E402
from otel_rl.replay import parse_file  # noqa: E402
from otel_rl.runs.folder import read_log_records, read_metrics, read_spans  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

STEPS = 3
N_SAMPLES = 4  # per prompt
PROMPTS = ["1+1=", "2+2=", "3+3=", "4+4="]


@pytest.fixture(scope="module")
def ppo_trainer_module() -> Any:
    from openrlhf_stand_ins import ppo_trainer  # imported with stand-ins for vLLM and flash-attn

    return ppo_trainer


@pytest.fixture(scope="module")
def local_ray() -> Any:
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


class ActorGroup:
    """STAND-IN for a RayActorGroup: answers its methods with real object refs of a local Ray.
    ``fit`` answers as PolicyModelActor.fit does: the mean over the appended experiences of the
    training step's metrics and of each ``experience.info`` entry."""

    def __init__(self, ray: Any, step_values: list[float]) -> None:
        self.ray = ray
        self.experiences: list[Any] = []
        self.step_values = step_values

    def async_run_method_batch(self, method_name: str, **kwargs: Any) -> list[Any]:
        if method_name == "append":
            self.experiences = list(kwargs["experience"])
        return [self.ray.put(None)]

    def async_run_method(self, method_name: str, **kwargs: Any) -> list[Any]:
        if method_name != "fit":
            return [self.ray.put(None)]
        info = {k: torch.cat([e.info[k] for e in self.experiences]).float().mean().item() for k in self.experiences[0].info}
        x = self.step_values.pop(0)
        status = {
            "policy_loss": 0.1 * x,
            "actor_lr": 1e-6,
            "actor_grad_norm": 0.5 + x,
            "ppo_clip_ratio": 0.01 * x,
            "ppo_kl": 1e-4 * x,
            "vllm_kl": 2e-3 * x,
            "is_filter_ratio": 0.0,
            **info,
            "response_length": torch.cat([e.response_length for e in self.experiences]).float().mean().item(),
            "truncated": torch.cat([e.truncated for e in self.experiences]).float().mean().item(),
            "total_length": torch.cat([e.total_length for e in self.experiences]).float().mean().item(),
        }
        return [self.ray.put(status)]


class ExperienceMaker:
    """STAND-IN for RemoteExperienceMaker: the forward passes of the Ray model groups, as the real
    one fills ``Experience.info`` (reward, score, response_clip_ratio, kl, return)."""

    def make_experience_batch(self, samples: list[Any]) -> list[Any]:
        for e in samples:
            e.info = {
                "reward": e.rewards,
                "score": e.scores,
                "response_clip_ratio": e.truncated.float(),
                "kl": torch.full_like(e.rewards, 0.01),
                "return": e.rewards - 0.01,
            }
        return samples


class SamplesGenerator:
    """STAND-IN for the vLLM engines' generation: each call one batch of N_SAMPLES responses per
    prompt, the reward rising with the step; exhausted after STEPS batches."""

    def __init__(self, experience_cls: Any, tokenizer: Any) -> None:
        self.experience_cls, self.tokenizer, self.calls = experience_cls, tokenizer, 0

    def _batch(self, prompts: list[str], reward: float) -> list[Any]:
        out = []
        for i, prompt in enumerate(p for p in prompts for _ in range(N_SAMPLES)):
            ids = torch.tensor([self.tokenizer.encode(prompt + str(i % 10))])
            r = torch.tensor([reward + 0.1 * (i % N_SAMPLES)])
            out.append(
                self.experience_cls(
                    sequences=ids,
                    attention_mask=torch.ones_like(ids),
                    rewards=r,
                    scores=(r > 0.5).float(),
                    response_length=torch.tensor([1.0 + i % 3]),
                    truncated=torch.tensor([i % 4 == 0]),
                    total_length=torch.tensor([float(ids.shape[1])]),
                    prompts=[prompt],
                )
            )
        return out

    def generate_samples(self, **kwargs: Any) -> tuple[list[Any], float, int, bool]:
        self.calls += 1
        return self._batch(PROMPTS, 0.1 * self.calls), 1.0, len(PROMPTS), self.calls >= STEPS

    def generate_eval_samples(self, **kwargs: Any) -> list[Any]:
        return self._batch(PROMPTS[:2], 0.3)


def _args(tensorboard_dir: Path) -> Any:
    ns = SimpleNamespace
    return ns(
        algo=ns(kl=ns(target=None, init_coef=0.01), dynamic_filtering_enable=False, advantage=ns(estimator="group_norm")),
        logger=ns(wandb=ns(key=None, run_name="grpo-run", project="openrlhf-test"), tensorboard_dir=str(tensorboard_dir), logging_steps=1),
        train=ns(num_episodes=1, dynamic_batch_enable=False),
        critic=ns(freezing_steps=-1),
        ds=ns(enable_sleep=False),
        vllm=ns(enable_sleep=False),
        rollout=ns(batch_size=len(PROMPTS), n_samples_per_prompt=N_SAMPLES),
        ckpt=ns(save_steps=math.inf, path="", load_enable=False, best_metric_key="none"),
        eval=ns(steps=2, temperature=1.0, n_samples_per_prompt=N_SAMPLES),
    )


def run_fit(ppo_trainer: Any, ray: Any, tokenizer: Any, tensorboard_dir: Path) -> Any:
    """OpenRLHF's PPOTrainer.fit, STEPS steps, evaluating at step 2."""
    from openrlhf.trainer.ppo_utils.experience import Experience
    from torchdata.stateful_dataloader import StatefulDataLoader

    cls = ppo_trainer.PPOTrainer.__ray_actor_class__  # the class under @ray.remote: run here, not as an actor
    trainer = cls.__new__(cls)
    trainer.prompts_dataloader = StatefulDataLoader(PROMPTS, batch_size=len(PROMPTS))
    eval_rows = [(["math"] * 2, PROMPTS[:2], ["2", "4"], [None, None])]
    trainer.eval_dataloader = eval_rows
    trainer.max_steps = STEPS
    trainer.generate_kwargs = {"n_samples_per_prompt": N_SAMPLES}
    trainer.samples_generator = SamplesGenerator(Experience, tokenizer)
    strategy = SimpleNamespace(args=_args(tensorboard_dir))
    actor = ActorGroup(ray, [1.0, 2.0, 3.0])
    ppo_trainer.BasePPOTrainer.__init__(trainer, strategy, actor, None, None, None, vllm_engines=[object()], tokenizer=tokenizer)
    trainer.experience_maker = ExperienceMaker()
    trainer.init_checkpoint_states = lambda: {"episode": 0, "global_step": 0, "total_consumed_prompts": 0, "data_loader_state_dict": {}}
    trainer.fit()
    return trainer


def tensorboard_scalars(folder: Path) -> dict[tuple[str, int], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = [p for p in folder.iterdir() if p.is_dir()]
    acc = EventAccumulator(str(run))
    acc.Reload()
    return {(tag, e.step): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}


def test_fit_logs_the_same_values_with_otel_rl_and_every_key_arrives_resolved(
    ppo_trainer_module: Any, local_ray: Any, hf_tiny_lm: Any, tmp_path: Path
) -> None:
    _, tokenizer = hf_tiny_lm
    run_fit(ppo_trainer_module, local_ray, tokenizer, tmp_path / "tb-plain")
    run_dir = tmp_path / "run"
    telemetry = otel_rl.init(run_dir=str(run_dir), console=False, framework="openrlhf", log_samples=4)
    OpenRLHFInstrumentor().instrument()
    console = logging.FileHandler(tmp_path / "console.log")  # what OpenRLHF prints, as it prints it
    console.setFormatter(logging.getLogger("openrlhf").handlers[0].formatter)
    logging.getLogger(ppo_trainer_module.__name__).addHandler(console)
    try:
        trainer = run_fit(ppo_trainer_module, local_ray, tokenizer, tmp_path / "tb-otel")
        assert isinstance(trainer.tensorboard_logger, OtelLogger)
    finally:
        logging.getLogger(ppo_trainer_module.__name__).removeHandler(console)
        console.close()
        OpenRLHFInstrumentor().uninstrument()
        telemetry.shutdown()
    plain, with_otel = tensorboard_scalars(tmp_path / "tb-plain"), tensorboard_scalars(tmp_path / "tb-otel")
    timing = {k for k in plain if k[0].startswith("train/timing/")}  # wall time differs run to run
    assert {k: v for k, v in with_otel.items() if k not in timing} == {k: v for k, v in plain.items() if k not in timing}
    assert set(with_otel) == set(plain)

    # every value the trainer logged is in its step's rl.log event, under the key it was logged as
    events = [r for r in read_log_records(run_dir) if r["event_name"] == N.RL_LOG_EVENT]
    logged = {(k, e["attributes"][A.RL_STEP]): v for e in events for k, v in e["body"].items()}
    for (tag, step), value in with_otel.items():
        key = tag.removeprefix("train/") if tag.startswith("train/") else tag
        assert logged[(key, step)] == pytest.approx(value, rel=1e-6), (key, step)

    # its console, replayed: the same values at the same steps (the generated sample is not printed)
    parsed = parse_file(tmp_path / "console.log")
    assert (parsed.format, parsed.framework, parsed.problems) == ("openrlhf-console", "openrlhf", [])
    replayed = {(k, r.step): v for r in parsed.records for k, v in r.values.items()}
    assert replayed == {k: v for k, v in logged.items() if k[0] != "generated_samples"}

    # the keys as metrics: the registry's where it has a meaning, the rest under their own name
    points = read_metrics(run_dir)
    by_metric = {(p.name, tuple(sorted(p.attributes.items()))) for p in points}
    unmapped = {dict(attrs)[A.RL_KEY] for name, attrs in by_metric if name == M.RL_UNMAPPED}
    assert unmapped == {"rollout/reward_mean", "rollout/response_length_mean", "rollout/truncated_rate", "total_length",
                        "is_filter_ratio", "response_clip_ratio", "eval/eval_num_samples", "eval/eval_math_response_length_mean",
                        "eval/eval_math_truncated_rate", "eval/eval_response_length_mean", "eval/eval_truncated_rate"}  # fmt: skip
    names = {name for name, _ in by_metric}
    for metric in (M.RL_LOSS, M.RL_GRAD_NORM, M.RL_LEARNING_RATE, M.RL_CLIP_FRACTION, M.RL_POLICY_KL, M.RL_TRAIN_INFER_KL,
                   M.RL_REWARD, M.RL_SCORE, M.RL_RETURN, M.RL_RESPONSE_LENGTH, M.RL_RESPONSE_CLIPPED_RATIO,
                   M.RL_BATCH_SAMPLES, M.RL_STAGE_DURATION, M.RL_STEP_DURATION, M.RL_VALIDATION_SCORE):  # fmt: skip
        assert metric in names, metric
    best = [p for p in points if p.name == M.RL_VALIDATION_SCORE and p.attributes.get(A.RL_STATISTIC) == "best"]
    assert best and best[0].attributes[A.RL_DATA_SOURCE] == "math" and best[0].attributes[A.RL_VALIDATION_N] == str(N_SAMPLES)

    # each step is one trace: rl.step with the four timed phases in the order the trainer runs them,
    # traced live around its calls (with the model workers' spans: test_openrlhf_trace.py)
    spans = read_spans(run_dir)
    steps = [s for s in spans if s.name == N.RL_STEP_SPAN]
    assert sorted(s.attributes[A.RL_STEP] for s in steps) == [1, 2, 3]
    for step in steps:
        children = sorted((s for s in spans if s.parent_span_id == step.span_id), key=lambda s: s.start_ns)
        assert [s.attributes[A.RL_STAGE] for s in children] == ["generate", "make_experience", "train_step", "model_update"]
        assert not any(s.attributes.get(A.RL_SPAN_RECONSTRUCTED) for s in [step, *children])


def test_a_failing_telemetry_never_reaches_the_trainer(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    class Broken:
        config = SimpleNamespace(strict=False, log_samples=0)

        def log(self, *args: Any) -> None:
            raise RuntimeError("collector gone")

        trace_finished_step = flush = log

    received: list[Any] = []
    inner = SimpleNamespace(
        log_train=lambda s, d: received.append((s, d)), log_eval=lambda s, d: received.append((s, d)), close=lambda: None
    )
    otel = OtelLogger(None, inner, telemetry=Broken())  # type: ignore[arg-type]
    for step in (1, 2):
        otel.log_train(step, {"policy_loss": 0.1, "timing/ppo_train": 1.0})
    otel.log_eval(2, {"eval_math_pass1": 0.5})
    otel.close()
    assert [s for s, _ in received] == [1, 2, 2]  # the trainer's own tracker got every call
    failures = [r for r in caplog.records if "OpenRLHF logger failed" in r.getMessage()]
    assert sorted(r.args[1] for r in failures) == ["close", "log_eval", "log_train", "trace"]  # each once


def test_the_ray_setup_hook_instruments_the_trainer_module_when_it_is_imported(ppo_trainer_module: Any) -> None:
    from otel_rl.integrations.openrlhf import SETUP_HOOK, install

    assert SETUP_HOOK == "otel_rl.integrations.openrlhf.install"  # the name a runtime_env gives Ray
    instrumentor = OpenRLHFInstrumentor()
    assert not instrumentor.is_instrumented
    original = ppo_trainer_module.BasePPOTrainer.__init__
    install()  # the trainer module is imported already: instruments now
    try:
        assert instrumentor.is_instrumented and ppo_trainer_module.BasePPOTrainer.__init__ is not original
    finally:
        instrumentor.uninstrument()
    assert ppo_trainer_module.BasePPOTrainer.__init__ is original


class RequestOutput(SimpleNamespace):
    """STAND-IN for vLLM's RequestOutput: ``outputs[0]`` with token_ids, text, finish_reason, logprobs."""


class Engine:
    """STAND-IN for the vLLM engine an agent executor generates with: answers "7" and then "8", as
    OpenRLHF's RolloutRayActor hands it to ``execute`` (``await llm_engine.generate(tokens, params)``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.answers = tokenizer, iter(["7", "8"])

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None) -> Any:
        text = next(self.answers)
        ids = self.tokenizer.encode(text)
        logprobs = [{t: SimpleNamespace(logprob=-0.5)} for t in ids]
        return RequestOutput(outputs=[SimpleNamespace(token_ids=ids, text=text, finish_reason="stop", logprobs=logprobs)])


def test_an_agent_rollout_is_one_trajectory_and_its_result_is_unchanged(ppo_trainer_module: Any, hf_tiny_lm: Any, tmp_path: Path) -> None:
    """OpenRLHF's own MultiTurnAgentExecutor with an AgentInstance written as its examples write
    them: a wrong answer gets feedback and a second turn, the right one ends the episode."""
    import asyncio

    from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

    from otel_rl.integrations.openrlhf_agent import OpenRLHFAgentInstrumentor

    class AgentInstance(AgentInstanceBase):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.turns = 0

        async def step(self, state_dict: dict, **kwargs: Any) -> dict:
            self.turns += 1
            right = state_dict["action_text"].strip() == state_dict["label"]
            return {"rewards": torch.tensor(1.0 if right else 0.0), "scores": torch.tensor(1.0 if right else 0.0),
                    "environment_feedback": "" if right else " wrong, again:", "done": right, "extra_logs": {"turns": self.turns}}  # fmt: skip

    _, tokenizer = hf_tiny_lm

    def rollout() -> dict:
        from openrlhf_stand_ins import SamplingParams

        params = SamplingParams(max_tokens=8, logprobs=1)
        return asyncio.run(MultiTurnAgentExecutor(AgentInstance).execute("4+4=", "8", params, 48, tokenizer, Engine(tokenizer)))

    plain = rollout()
    run_dir = tmp_path / "run"
    telemetry = otel_rl.init(run_dir=str(run_dir), console=False, framework="openrlhf", trajectory_sample_ratio=1.0)
    OpenRLHFAgentInstrumentor().instrument()
    try:
        recorded = rollout()
    finally:
        OpenRLHFAgentInstrumentor().uninstrument()
        telemetry.shutdown()
    assert recorded == plain and plain["reward"] == 1.0 and len(plain["action_ranges"]) == 2

    spans = read_spans(run_dir)
    (root,) = [s for s in spans if s.name == N.RL_TRAJECTORY_SPAN]
    children = sorted((s for s in spans if s.parent_span_id == root.span_id), key=lambda s: s.start_ns)
    assert [s.name for s in children] == [N.RL_TURN_SPAN, N.RL_TOOL_SPAN, N.RL_TURN_SPAN, N.RL_TOOL_SPAN]
    assert root.attributes[A.RL_TRAJECTORY_REWARD] == 1.0
    assert {s.attributes[A.GEN_AI_TOOL_NAME] for s in children if s.name == N.RL_TOOL_SPAN} == {"environment"}
