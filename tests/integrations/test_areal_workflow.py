"""AReaL 1.0.4's own WorkflowExecutor running its own RLVRWorkflow and MultiTurnWorkflow, with and
without otel-rl: each episode is one trajectory and the rollouts' results are unchanged.

The only stand-in is the inference server (``Engine`` below, marked): AReaL's executor, staleness
manager, task runner, workflows, reward wrapper and group wrapper are its own, on CPU.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("areal") is None:
    pytest.skip("areal is not installed (scripts/setup.sh installs it with --no-deps)", allow_module_level=True)

import otel_rl  # noqa: E402
from otel_rl.runs.folder import read_spans  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

# AReaL's loggers replace the logging module's root and manager: put back after each test.
pytestmark = pytest.mark.usefixtures("keep_logging")

VERSION = 7  # the policy version the stand-in engine serves


class Engine:
    """STAND-IN for AReaL's RemoteInfEngine (an SGLang / vLLM server behind it), with the two calls
    the executor and the workflows make: ``get_version()`` and ``await agenerate(ModelRequest)``,
    answering a ``ModelResponse`` as the real engine builds it. It answers wrong ("5"), and right
    ("8") once the prompt holds MultiTurnWorkflow's "your answer is either wrong" retry; a prompt
    holding "long" gets a wrong answer cut at the length limit."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def get_version(self) -> int:
        return VERSION

    async def agenerate(self, request: Any) -> Any:
        from areal.api.io_struct import ModelResponse

        await asyncio.sleep(0.001)
        prompt = tuple(request.input_ids)
        text = self.tokenizer.decode(list(prompt)).replace(" ", "")  # a character tokenizer decodes "l o n g"
        long = "long" in text
        answer = self.tokenizer.encode("9999999" if long else "8" if "wrong" in text else "5")
        stop = "length" if long else "stop"
        tokens = answer if long else answer + [self.tokenizer.eos_token_id]
        return ModelResponse(
            input_tokens=list(prompt), output_tokens=tokens, output_logprobs=[-0.5] * len(tokens),
            output_versions=[VERSION] * len(tokens), stop_reason=stop, tokenizer=self.tokenizer,
        )  # fmt: skip


def right_answer(prompt: str, completion: str, prompt_ids: Any, completion_ids: Any, **data: Any) -> float:
    return 1.0 if completion.replace(" ", "").startswith("8") else 0.0


def run_tasks(tokenizer: Any, kind: str, prompts: list[str], *, evaluation: bool = False, group: int = 1) -> list[dict]:
    """Submit one task per prompt to a real WorkflowExecutor and wait for them; the results sorted by prompt."""
    from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
    from areal.infra.remote_inf_engine import GroupedRolloutWorkflow
    from areal.infra.workflow_executor import WorkflowExecutor
    from areal.utils import logging as areal_logging
    from areal.workflow.multi_turn import MultiTurnWorkflow
    from areal.workflow.rlvr import RLVRWorkflow

    gconfig = GenerationHyperparameters(max_new_tokens=8)
    if kind == "rlvr":
        workflow: Any = RLVRWorkflow(right_answer, gconfig, tokenizer, get_input_ids_fn=lambda m, tk, _t: tk.encode(m[0]["content"]))
    else:
        workflow = MultiTurnWorkflow(right_answer, gconfig, tokenizer, max_turns=3, turn_discount=0.5)
    if group > 1:
        workflow = GroupedRolloutWorkflow(workflow, group, areal_logging.getLogger("test"))
    executor = WorkflowExecutor(
        InferenceEngineConfig(experiment_name="e", trial_name="t", max_concurrent_rollouts=4, consumer_batch_size=4), Engine(tokenizer)
    )
    executor.initialize(train_data_parallel_size=1)
    try:
        for prompt in prompts:
            executor.submit({"messages": [{"role": "user", "content": prompt}]}, workflow, is_eval=evaluation)
        results = executor.wait(len(prompts), timeout=60)
    finally:
        executor.destroy()
    return sorted(({k: v.tolist() for k, v in r.items()} for r in results), key=lambda r: r["input_ids"])


@pytest.fixture(autouse=True)
def _drain_areal_stats() -> Any:
    """The workflows record their rewards in AReaL's process-wide stats_tracker: drained after each
    test, so no other test's StatsLogger commits them."""
    yield
    from areal.utils import stats_tracker

    stats_tracker.export_all()


@pytest.fixture
def tokenizer(hf_tiny_lm: Any) -> Any:
    _, tok = hf_tiny_lm
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # MultiTurnWorkflow applies one
    return tok


@pytest.fixture
def recorded(tmp_path: Path) -> Any:
    """Runs ``work`` with otel-rl on AReaL's executor; the run folder's trajectory spans by sample id."""
    from otel_rl.integrations.areal_workflow import AReaLWorkflowInstrumentor

    def run(work: Any) -> tuple[Any, dict[str, Any], list[Any]]:
        run_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        telemetry = otel_rl.init(run_dir=str(run_dir), console=False, framework="areal", trajectory_sample_ratio=1.0)
        AReaLWorkflowInstrumentor().instrument()
        try:
            result = work()
        finally:
            AReaLWorkflowInstrumentor().uninstrument()
            telemetry.shutdown()
        spans = read_spans(run_dir)
        roots = {s.attributes[A.RL_SAMPLE_ID]: s for s in spans if s.name == N.RL_TRAJECTORY_SPAN}
        return result, roots, spans

    return run


def turns_of(root: Any, spans: list[Any]) -> list[Any]:
    return sorted((s for s in spans if s.parent_span_id == root.span_id and s.name == N.RL_TURN_SPAN), key=lambda s: s.start_ns)


def test_each_rlvr_episode_is_a_trajectory_of_its_task_at_the_engines_version(tokenizer: Any, recorded: Any) -> None:
    prompts = ["3+5=", "4+4=", "a long one"]
    plain = run_tasks(tokenizer, "rlvr", prompts)
    result, roots, spans = recorded(lambda: run_tasks(tokenizer, "rlvr", prompts))
    assert result == plain  # nothing of the rollout changes

    assert len(roots) == 3 and all(r.attributes[A.RL_STEP] == VERSION for r in roots.values())
    assert {r.attributes[A.RL_SAMPLE_ID] for r in roots.values()} == {f"{r.attributes[A.RL_SAMPLE_GROUP_ID]}-0" for r in roots.values()}
    # RLVR asks once: the stand-in's first answer ("5") is wrong, the long prompt is cut at the limit.
    assert sorted(r.attributes[A.RL_TRAJECTORY_REWARD] for r in roots.values()) == [0.0, 0.0, 0.0]
    assert sorted(bool(r.attributes.get(A.RL_TRAJECTORY_TRUNCATED)) for r in roots.values()) == [False, False, True]
    for root in roots.values():
        [turn] = turns_of(root, spans)
        assert turn.attributes[A.GEN_AI_USAGE_INPUT_TOKENS] > 0 and turn.attributes[A.GEN_AI_USAGE_OUTPUT_TOKENS] > 0


def test_a_multi_turn_episode_has_a_turn_per_attempt_and_its_discounted_reward(tokenizer: Any, recorded: Any) -> None:
    plain = run_tasks(tokenizer, "multi_turn", ["4+4="])
    result, roots, spans = recorded(lambda: run_tasks(tokenizer, "multi_turn", ["4+4="]))
    assert result == plain and plain[0]["rewards"] == [0.5]  # right at the second attempt, discounted once
    [root] = roots.values()
    assert root.attributes[A.RL_TRAJECTORY_REWARD] == 0.5
    turns = turns_of(root, spans)
    assert len(turns) == 2 and turns[1].attributes[A.GEN_AI_USAGE_INPUT_TOKENS] > turns[0].attributes[A.GEN_AI_USAGE_INPUT_TOKENS]


def test_a_group_is_one_trajectory_per_sample_and_evaluation_is_left_out(tokenizer: Any, recorded: Any) -> None:
    def work() -> list[dict]:
        return run_tasks(tokenizer, "rlvr", ["4+4="], group=3) + run_tasks(tokenizer, "rlvr", ["3+5="], evaluation=True)

    _, roots, _ = recorded(work)
    groups = {r.attributes[A.RL_SAMPLE_GROUP_ID] for r in roots.values()}
    assert len(roots) == 3 and len(groups) == 1  # the evaluation task is not recorded
    assert sorted(roots) == [f"{next(iter(groups))}-{n}" for n in range(3)]


def test_uninstrument_puts_the_executor_back() -> None:
    from areal.infra.workflow_executor import WorkflowExecutor

    from otel_rl.integrations.areal_workflow import AReaLWorkflowInstrumentor

    original = WorkflowExecutor._create_workflow_task
    AReaLWorkflowInstrumentor().instrument()
    assert WorkflowExecutor._create_workflow_task is not original
    AReaLWorkflowInstrumentor().uninstrument()
    assert WorkflowExecutor._create_workflow_task is original


def test_the_areal_import_instruments_the_executor_too() -> None:
    from areal.infra.workflow_executor import WorkflowExecutor

    from otel_rl.integrations import areal
    from otel_rl.integrations.areal_workflow import AReaLWorkflowInstrumentor

    if AReaLWorkflowInstrumentor().is_instrumented:  # by the import above, if it was the first
        AReaLWorkflowInstrumentor().uninstrument()
    original = WorkflowExecutor._create_workflow_task
    areal.install()  # what importing otel_rl.integrations.areal does
    try:
        assert AReaLWorkflowInstrumentor().is_instrumented and WorkflowExecutor._create_workflow_task is not original
    finally:
        AReaLWorkflowInstrumentor().uninstrument()
        areal.AReaLInstrumentor().uninstrument()


def test_the_reward_is_read_from_cpu_tensors_and_interactions_only() -> None:
    import torch
    from areal.experimental.openai.types import InteractionWithTokenLogpReward

    from otel_rl.integrations.areal_workflow import episode_reward

    assert episode_reward({"rewards": torch.tensor([0.5])}) == 0.5

    class CudaTensor:
        """STAND-IN for a torch tensor on a GPU (no GPU here): its device, and whether it was read."""

        device = SimpleNamespace(type="cuda")
        read = False

        def float(self) -> Any:
            CudaTensor.read = True  # a read would wait for the device
            return torch.tensor([0.5])

    assert episode_reward({"rewards": CudaTensor()}) is None and not CudaTensor.read
    assert episode_reward(None) is None and episode_reward({"input_ids": torch.ones(3)}) is None
    first, last = InteractionWithTokenLogpReward(), InteractionWithTokenLogpReward()
    first.reward, last.reward = 0.25, 1.0  # AReaL discounts the last reward backwards: the last is the episode's
    assert episode_reward({"a": first, "b": last}) == 1.0
