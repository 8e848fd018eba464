"""verl's agent loop as otel-rl trajectories (``otel_rl.integrations.verl_agent_loop``), run on the
real verl 0.9.1: ``AgentLoopWorker.generate_sequences`` -> ``_run_agent_loop`` -> ``ToolAgentLoop``
(hermes tool parser, verl's tool registry loading ``BaseTool`` subclasses) -> ``LLMServerClient``
through verl's ``GlobalRequestLoadBalancer``, and verl's ``RewardLoopWorker`` scoring each rollout
with its gsm8k rule. The tokenizer is built in code (characters, a chat template): no download.

Stand-ins, for what cannot run here (no GPU, no vLLM, no Ray cluster in these tests):
``ScriptedRolloutServer`` in place of verl's vLLM server actor (``generate(prompt_ids,
sampling_params, request_id, ...) -> TokenOutput``, as vllm_async_server.py's), replying with a
scripted tool call and then an answer; ``ActorHandle``, Ray's handle as verl uses it
(``handle.method.remote(...)`` returns an awaitable, as an ObjectRef is), in front of the real
load balancer and reward worker and of that server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import string
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import otel_rl
from otel_rl.runs.folder import read_spans
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

try:  # the agent loop pulls hydra, ray, torch, transformers
    import numpy as np
    import transformers
    from omegaconf import OmegaConf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from verl.experimental.agent_loop import agent_loop as verl_agent_loop
    from verl.experimental.agent_loop import tool_agent_loop
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.protocol import DataProto
    from verl.workers.rollout import llm_server
    from verl.workers.rollout.replica import TokenOutput
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    MISSING = None
except Exception as exc:  # verl absent, or present without what its agent loop imports
    MISSING = f"{type(exc).__name__}: {exc}"

pytestmark = pytest.mark.skipif(
    MISSING is not None, reason=f"verl's agent loop cannot be imported here ({MISSING}); pip install 'otel-rl[verl]' hydra-core"
)

SERVER = "127.0.0.1:8000"
# question -> (the model's first reply: a tool call; its reply once the tool answered; gsm8k ground truth)
SCRIPT = {
    "What is 40+2?": ('<tool_call>{"name": "add", "arguments": {"a": 40, "b": 2}}</tool_call>', "40+2 is #### 42", "42"),
    "Who won?": ('<tool_call>{"name": "lookup", "arguments": {"q": "winner"}}</tool_call>', "I guess #### 5", "6"),
    "What is 2+2?": ('<tool_call>{"name": "search", "arguments": {"q": "2+2"}}</tool_call>', "It is #### 4", "4"),
}
# One batch as verl's trainer hands it to the workers: rollout.n rows per prompt, side by side.
ROWS = [(7, "What is 40+2?"), (7, "What is 40+2?"), (9, "Who won?"), (9, "Who won?"), (11, "What is 2+2?")]


# --------------------------------------------------------------------------------------------------
# Stand-ins (see the module docstring)


class ActorHandle:
    """Stand-in for a Ray actor handle: ``handle.method.remote(*args, **kwargs)`` runs the method of
    the object behind it as a task of the running loop and returns it (awaitable, as an ObjectRef)."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            return await result if asyncio.iscoroutine(result) else result

        class ActorMethod:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> asyncio.Future:
                return asyncio.ensure_future(call(*args, **kwargs))

        return ActorMethod()


class ScriptedRolloutServer:
    """Stand-in for verl's vLLM server actor (vLLMHttpServer.generate's signature and TokenOutput):
    a tool call first, the answer once the prompt holds the tool's reply."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.calls: list[tuple[int, int]] = []  # (prompt tokens, response tokens) of each generation

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: Any = None,
        priority: int = 0,
        kv_transfer_params: Any = None,
    ) -> Any:
        prompt = self.tokenizer.decode(prompt_ids)
        first, answer, _ = next(script for question, script in SCRIPT.items() if question in prompt)
        token_ids = self.tokenizer.encode(answer if "<tool>" in prompt else first)
        self.calls.append((len(prompt_ids), len(token_ids)))
        return TokenOutput(token_ids=token_ids, stop_reason="completed", extra_fields={"global_steps": 3})


# --------------------------------------------------------------------------------------------------
# verl, configured as its trainer configures it


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A model folder verl's HFModelConfig loads: a character tokenizer with a chat template and a
    tiny Llama config (no weights: the agent loop reads only the config and the tokenizer)."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for char in string.printable:
        vocab.setdefault(char, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    folder = tmp_path_factory.mktemp("verl-model")
    tokenizer.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        architectures=["LlamaForCausalLM"],
    )
    config.save_pretrained(folder)
    return str(folder)


def verl_config(model_dir: str, tmp_path: Path, *, response_length: int = 256, loggers: tuple[str, ...] = ("console",)) -> Any:
    """verl 0.9.1's full trainer config (its generated YAML) for a multi-turn tool agent."""
    import verl.trainer.config

    tools = tmp_path / "tools.yaml"
    from verl_tools import TOOL_CONFIG

    tools.write_text(TOOL_CONFIG)
    config = OmegaConf.load(Path(verl.trainer.config.__file__).parent / "_generated_ppo_trainer.yaml")
    config.actor_rollout_ref.model.path = model_dir
    rollout = config.actor_rollout_ref.rollout
    rollout.name = "vllm"
    rollout.prompt_length = 256
    rollout.response_length = response_length
    rollout.multi_turn.enable = True
    rollout.multi_turn.tool_config_path = str(tools)
    rollout.agent.default_agent_loop = "tool_agent"
    config.reward.reward_model.rollout.name = "vllm"
    config.trainer.logger = list(loggers)
    config.trainer.project_name = "verl-agent"
    config.trainer.experiment_name = "tools"
    return config


def batch(step: int = 3, validate: bool = False) -> Any:
    """The batch RayPPOTrainer hands to generate_sequences: raw prompts, dataset index, GRPO uid,
    the reward's data source and ground truth."""
    return DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([[{"role": "user", "content": question}] for _, question in ROWS], dtype=object),
            "index": np.array([index for index, _ in ROWS]),
            "uid": np.array([f"uid-{index}" for index, _ in ROWS], dtype=object),
            "data_source": np.array(["openai/gsm8k"] * len(ROWS), dtype=object),
            "reward_model": np.array([{"ground_truth": SCRIPT[q][2], "style": "rule"} for _, q in ROWS], dtype=object),
            "extra_info": np.array([{"index": index} for index, _ in ROWS], dtype=object),
        },
        meta_info={"global_steps": step, "validate": validate},
    )


async def make_worker(config: Any, server: ScriptedRolloutServer) -> Any:
    """verl's AgentLoopWorker with its LLM client, load balancer and reward worker (inside the
    running loop: verl binds each to the loop it is built in)."""
    balancer = GlobalRequestLoadBalancer(servers={SERVER: ActorHandle(server)})
    client = llm_server.LLMServerClient(config, load_balancer_handle=ActorHandle(balancer))
    rewards = RewardLoopWorker(config)
    return verl_agent_loop.AgentLoopWorker(config, client, reward_loop_worker_handles=[ActorHandle(rewards)])


@pytest.fixture
def instrumented() -> Any:
    from otel_rl.integrations.verl_agent_loop import VerlAgentLoopInstrumentor

    instrumentor = VerlAgentLoopInstrumentor()
    if instrumentor.is_instrumented:  # by verl's plugin import (integrations/verl.py): start from verl's own methods
        instrumentor.uninstrument()
    instrumentor.instrument()
    yield instrumentor
    if instrumentor.is_instrumented:
        instrumentor.uninstrument()


def trajectories(run_dir: Any) -> dict[str, tuple[Any, list[Any]]]:
    """sample id -> (the rl.trajectory span, its children in time order), from the run folder."""
    spans = read_spans(run_dir)
    assert not spans.problems
    roots = {s.span_id: s for s in spans if s.name == N.RL_TRAJECTORY_SPAN}
    children: dict[str, list[Any]] = {span_id: [] for span_id in roots}
    for span in spans:
        if span.name in (N.RL_TURN_SPAN, N.RL_TOOL_SPAN):
            children[span.parent_span_id].append(span)
    return {root.attributes[A.RL_SAMPLE_ID]: (root, sorted(children[sid], key=lambda s: s.start_ns)) for sid, root in roots.items()}


# --------------------------------------------------------------------------------------------------
# The rollouts of a training step


def test_each_rollout_is_a_trajectory_of_its_turns_tool_calls_and_reward(instrumented, make_telemetry, model_dir, tmp_path):
    tel = make_telemetry(trajectory_sample_ratio=1.0, log_samples=8)
    server = ScriptedRolloutServer(None)

    async def run() -> tuple[Any, list[tuple[int, int]], Any]:
        worker = await make_worker(verl_config(model_dir, tmp_path), server)
        server.tokenizer = worker.tokenizer
        trained = await worker.generate_sequences(batch(step=3))
        generations = list(server.calls)
        validated = await worker.generate_sequences(batch(step=3, validate=True))  # left out by default
        return trained, generations, validated

    trained, generations, validated = asyncio.run(run())
    tel.shutdown()

    # verl's own results, unchanged: gsm8k scored each rollout, four turns each (user, assistant, tool, assistant).
    assert trained.batch["rm_scores"].sum(-1).tolist() == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert trained.non_tensor_batch["__num_turns__"].tolist() == [4] * len(ROWS)
    assert validated.batch["rm_scores"].sum(-1).tolist() == [1.0, 1.0, 0.0, 0.0, 1.0]

    found = trajectories(tel.run_dir)
    assert sorted(found) == ["11-0", "7-0", "7-1", "9-0", "9-1"]  # one per row of the training batch only
    turns_seen = []
    for sample_id, (root, children) in found.items():
        index = int(sample_id.split("-")[0])
        attrs = root.attributes
        assert attrs[A.RL_STEP] == 3 and attrs[A.RL_SAMPLE_GROUP_ID] == f"uid-{index}"
        assert [c.name for c in children] == [N.RL_TURN_SPAN, N.RL_TOOL_SPAN, N.RL_TURN_SPAN]
        assert (attrs[A.RL_TRAJECTORY_TURN_COUNT], attrs[A.RL_TRAJECTORY_TOOL_CALL_COUNT]) == (2, 1)
        first, tool, answer = children
        for turn in (first, answer):
            assert (turn.attributes[A.SERVER_ADDRESS], turn.attributes[A.SERVER_PORT]) == ("127.0.0.1", 8000)
            turns_seen.append((turn.attributes[A.GEN_AI_USAGE_INPUT_TOKENS], turn.attributes[A.GEN_AI_USAGE_OUTPUT_TOKENS]))
        assert first.attributes[A.GEN_AI_RESPONSE_FINISH_REASONS] == ["tool_calls"]
        assert answer.attributes[A.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
        assert answer.attributes[A.RL_TURN_RESPONSE] == SCRIPT[dict(ROWS)[index]][1]  # samples are on
        expected_reward = {7: 1.0, 9: 0.0, 11: 1.0}[index]
        assert attrs[A.RL_TRAJECTORY_REWARD] == expected_reward
        assert attrs[f"{A.RL_TRAJECTORY_REWARDS}.acc"] == expected_reward  # verl's reward_extra_info
        assert attrs[A.RL_TRAJECTORY_TRUNCATED] is False
        name, error = {7: ("add", None), 9: ("lookup", "tool_error"), 11: ("search", "unknown_tool")}[index]
        assert tool.attributes[A.GEN_AI_TOOL_NAME] == name
        assert tool.attributes.get(A.ERROR_TYPE) == error
        assert tool.status == ("unset" if error is None else "error")
        assert attrs[A.RL_TRAJECTORY_FAILED] is (error is not None)
        assert json.loads(tool.attributes[A.GEN_AI_TOOL_CALL_ARGUMENTS]) == json.loads(SCRIPT[dict(ROWS)[index]][0][11:-12])["arguments"]
    assert found["7-0"][1][1].attributes[A.GEN_AI_TOOL_CALL_RESULT] == "42"
    assert Counter(turns_seen) == Counter(generations)  # each generation's token counts, as the server saw them
    traces = list(Path(tel.run_dir).glob("traces*.jsonl"))
    assert traces and any(f'"{N.RL_TRAJECTORY_SPAN}"' in path.read_text() for path in traces)


def test_a_response_cut_at_the_length_budget_is_a_truncated_turn(instrumented, make_telemetry, model_dir, tmp_path):
    tel = make_telemetry(trajectory_sample_ratio=1.0)
    server = ScriptedRolloutServer(None)

    async def run() -> Any:
        worker = await make_worker(verl_config(model_dir, tmp_path, response_length=32), server)
        server.tokenizer = worker.tokenizer
        return await worker.generate_sequences(batch(step=4))

    output = asyncio.run(run())
    tel.shutdown()

    assert output.non_tensor_batch["__num_turns__"].tolist() == [2] * len(ROWS)  # the first reply spent the budget
    found = trajectories(tel.run_dir)
    assert len(found) == len(ROWS)
    for root, children in found.values():
        assert [c.name for c in children] == [N.RL_TURN_SPAN]
        assert children[0].attributes[A.GEN_AI_RESPONSE_FINISH_REASONS] == ["length"]
        assert root.attributes[A.RL_TRAJECTORY_TRUNCATED] is True and root.attributes[A.RL_STEP] == 4


def test_a_worker_process_starts_its_telemetry_when_verl_names_the_otel_logger(instrumented, model_dir, tmp_path, monkeypatch):
    assert otel_rl.get_telemetry() is None
    run_dir = tmp_path / "worker-run"
    monkeypatch.setenv("OTEL_RL_RUN_DIR", str(run_dir))
    monkeypatch.setenv("OTEL_RL_TRAJECTORY_SAMPLE_RATIO", "1")
    monkeypatch.setenv("OTEL_RL_CONSOLE", "false")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RL_EXPERIMENT", raising=False)
    server = ScriptedRolloutServer(None)

    async def run() -> None:
        worker = await make_worker(verl_config(model_dir, tmp_path, loggers=("console", "otel")), server)
        server.tokenizer = worker.tokenizer
        await worker.generate_sequences(batch(step=5))

    asyncio.run(run())
    tel = otel_rl.get_telemetry()
    assert tel is not None
    try:
        assert (tel.config.framework, tel.config.experiment, tel.config.service_name) == ("verl", "tools", "verl-agent")
    finally:
        tel.shutdown()
    assert sorted(trajectories(run_dir)) == ["11-0", "7-0", "7-1", "9-0", "9-1"]


def test_without_telemetry_nothing_is_recorded_and_uninstrument_puts_verl_back(instrumented, model_dir, tmp_path):
    assert otel_rl.get_telemetry() is None  # and the config names no otel logger: verl runs as it would
    server = ScriptedRolloutServer(None)

    async def run() -> Any:
        worker = await make_worker(verl_config(model_dir, tmp_path), server)
        server.tokenizer = worker.tokenizer
        return await worker.generate_sequences(batch())

    assert asyncio.run(run()).batch["rm_scores"].sum(-1).tolist() == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert otel_rl.get_telemetry() is None

    wrapped = verl_agent_loop.AgentLoopWorker.__dict__["_run_agent_loop"]
    instrumented.uninstrument()
    for cls, name in (
        (verl_agent_loop.AgentLoopWorker, "_run_agent_loop"),
        (tool_agent_loop.ToolAgentLoop, "_handle_generating_state"),
        (tool_agent_loop.ToolAgentLoop, "_call_tool"),
        (llm_server.LLMServerClient, "generate"),
        (llm_server.LLMServerClient, "_acquire_server"),
        (llm_server.FullyAsyncLLMServerClient, "generate"),
    ):
        code = cls.__dict__[name].__code__  # ours (functools.wraps copies the rest) or verl's own
        assert "otel_rl" not in code.co_filename, f"{cls.__name__}.{name} is still wrapped"
    assert wrapped.__wrapped__ is verl_agent_loop.AgentLoopWorker.__dict__["_run_agent_loop"]


class BrokenIndex:
    """A sample index that cannot be written as text: recording the trajectory fails on it."""

    def __format__(self, spec: str) -> str:
        raise RuntimeError("no text for this index")

    def __eq__(self, other: object) -> bool:
        return other is self

    __hash__ = object.__hash__


def test_a_broken_value_never_raises_into_verl_and_is_said_once(instrumented, make_telemetry, model_dir, tmp_path, caplog):
    tel = make_telemetry(trajectory_sample_ratio=1.0)
    server = ScriptedRolloutServer(None)
    row = {key: values[0] for key, values in batch().non_tensor_batch.items()}

    async def run() -> list[Any]:
        worker = await make_worker(verl_config(model_dir, tmp_path), server)
        server.tokenizer = worker.tokenizer
        outputs = []
        for rollout_n in range(2):  # verl's own call, with the trajectory info get_trajectory_info builds
            info = {"step": 3, "sample_index": BrokenIndex(), "rollout_n": rollout_n, "validate": False}
            outputs.append(await worker._run_agent_loop({"temperature": 1.0}, info, agent_name="tool_agent", **row))
        return outputs

    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        outputs = asyncio.run(run())
    tel.shutdown()

    assert [o.reward_score for o in outputs] == [1.0, 1.0]  # verl's rollouts ran to the end
    said = [r for r in caplog.records if "recording verl's agent loop failed" in r.getMessage()]
    assert len(said) == 1 and "a trajectory's start" in said[0].getMessage()
    assert trajectories(tel.run_dir) == {}


# --------------------------------------------------------------------------------------------------
# Turned on by verl's plugin loader, in a process of its own


@pytest.mark.slow
def test_verls_plugin_import_instruments_the_agent_loop_when_verl_imports_it():
    code = textwrap.dedent(
        """
        import sys
        import verl  # loads otel-rl's verl.plugins entry point
        from otel_rl.integrations.verl_agent_loop import VerlAgentLoopInstrumentor
        assert "verl.experimental.agent_loop" not in sys.modules  # not imported on verl's import
        assert not VerlAgentLoopInstrumentor().is_instrumented
        from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
        from verl.workers.rollout.llm_server import LLMServerClient
        assert VerlAgentLoopInstrumentor().is_instrumented
        assert AgentLoopWorker._run_agent_loop.__wrapped__ and LLMServerClient.generate.__wrapped__
        print("instrumented on import")
        """
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "instrumented on import" in done.stdout
