"""TRL tool-calling rollouts as agent trajectories: a real ``GRPOTrainer(tools=[...])`` on CPU.

The policy is conftest.py's tiny randomly initialised Qwen2, built here with a character tokenizer
wide enough for JSON and TRL's own Qwen2.5 chat template, so TRL renders the tools into the prompt and
parses tool calls with the response template it ships for Qwen. A random model calls no tool by
itself; the only stand-in is what it chooses to write: transformers' ``sequence_bias`` generation
option (``GRPOConfig.generation_kwargs``) steers its sampling to scripted replies, keyed on the
conversation so far. Everything else is real: ``model.generate``, TRL's parsing, its tool loop,
the Python tools it runs, the reward functions, the training steps, and the run folder otel-rl
writes, read back from traces.jsonl.
"""

from __future__ import annotations

import inspect
import logging
import math
import string
from collections import Counter
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
if "tools" not in inspect.signature(trl.GRPOTrainer).parameters or int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("TRL's tool calling needs a TRL with GRPOTrainer(tools=...) and transformers >= 5", allow_module_level=True)

from otel_rl.integrations.trl import OtelRLCallback  # noqa: E402
from otel_rl.integrations.trl_tools import TOOL_ERROR  # noqa: E402
from otel_rl.runs.folder import read_metrics, read_spans  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

EOS, PAD = "<|im_end|>", "<|endoftext|>"
SPECIAL = [PAD, "<|im_start|>", EOS]
TOOL_TAGS = ["<tool_call>", "</tool_call>"]  # added tokens Qwen's parser looks for, kept when decoding


def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def divide(a: int, b: int) -> float:
    """Divides one integer by another.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b  # b=0: ZeroDivisionError, which TRL hands back to the model as {"error": ...}


async def lookup(key: str) -> dict:
    """Looks a key up.

    Args:
        key: The key.
    """
    return {"error": f"no entry for {key}"}  # a failure the tool reports without raising; async: TRL's event loop runs it


TOOLS = [add, divide, lookup]


def _call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>{EOS}'


# The policy's first reply to each prompt (one of them, sampled, where there are several), and its
# reply after any tool result.
FIRST_REPLIES = {
    "1+1=": [_call("add", '{"a": 1, "b": 1}')],
    "1/0=": [_call("divide", '{"a": 1, "b": 0}')],
    "pi?": [_call("lookup", '{"key": "pi"}')],
    "2+2=": ["4" + EOS, "5" + EOS],  # right or wrong: a group whose completions differ, so GRPO learns
    "count": ["1 2 3 4 5 6 7 8 9 " * 30],  # longer than max_completion_length, no EOS: truncated
}
TOOL_OF = {"1+1=": "add", "1/0=": "divide", "pi?": "lookup"}
TOOL_RESULTS = {"add": 2, "divide": {"error": "division by zero"}, "lookup": {"error": "no entry for pi"}}  # as TRL hands them on
AFTER_TOOL = "done"
MAX_COMPLETION = 150  # the longest tool conversation (divide) takes 141
NUM_GENERATIONS = 2
BATCH = len(FIRST_REPLIES) * NUM_GENERATIONS  # every prompt in every step's batch
BIAS_CONTEXT = 32  # tokens of conversation each scripted token is keyed on


@pytest.fixture
def chat_lm(tmp_path: Path) -> tuple[str, object]:
    """conftest.py's random 2-layer Qwen2, with a character tokenizer for JSON, Qwen's chat tokens
    and TRL's Qwen2.5 chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    characters = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {token: i for i, token in enumerate([*SPECIAL, *TOOL_TAGS, "<unk>", *characters])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD, eos_token=EOS, unk_token="<unk>")
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,  # the tools' JSON schemas make ~800-token prompts
        pad_token_id=vocab[PAD],
        eos_token_id=vocab[EOS],
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    folder = tmp_path / "tiny-chat-lm"
    transformers.Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder), tokenizer


def _token_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _prompt_ids(tokenizer, prompt: str) -> list[int]:
    messages = [{"role": "user", "content": prompt}]
    return _token_ids(tokenizer, tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True))


def scripted_sampling(tokenizer) -> list[list]:
    """``sequence_bias`` entries that make sampling write one of FIRST_REPLIES after each prompt and
    AFTER_TOOL after a tool result: each script's next token, keyed on the BIAS_CONTEXT tokens before it."""
    scripts = [(_prompt_ids(tokenizer, p), _token_ids(tokenizer, r)) for p, replies in FIRST_REPLIES.items() for r in replies]
    scripts.append((_token_ids(tokenizer, f"</tool_response>{EOS}\n<|im_start|>assistant\n"), _token_ids(tokenizer, AFTER_TOOL + EOS)))
    entries: set[tuple[int, ...]] = set()
    for context, reply in scripts:
        for k, token in enumerate(reply):
            entries.add((*(context + reply[:k])[-BIAS_CONTEXT:], token))
    return [[list(entry), 100.0] for entry in sorted(entries)]


def finished(completions, **kwargs):
    """1 when the last reply is the answer after a tool result."""
    return [1.0 if messages[-1].get("content") == AFTER_TOOL else 0.0 for messages in completions]


def correct(prompts, completions, **kwargs):
    """Scores "2+2=" only (None, not scored, for the others), and gives "pi?" infinity: values TRL
    takes and the trajectories must cope with."""
    values: list[float | None] = []
    for prompt, messages in zip(prompts, completions):
        question = prompt[-1]["content"]
        if question == "2+2=":
            values.append(1.0 if messages[-1]["content"] == "4" else 0.0)
        else:
            values.append(math.inf if question == "pi?" else None)
    return values


def _train(model_dir: str, tokenizer, output_dir: Path, callbacks: list):
    config = trl.GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=BATCH,
        num_generations=NUM_GENERATIONS,
        max_completion_length=MAX_COMPLETION,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        seed=0,
        save_strategy="no",
        gradient_checkpointing=False,  # on, generation recomputes the whole prompt at every token
        generation_kwargs={"sequence_bias": scripted_sampling(tokenizer)},
    )
    trainer = trl.GRPOTrainer(
        model=model_dir,
        reward_funcs=[finished, correct],
        args=config,
        train_dataset=datasets.Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in FIRST_REPLIES]}),
        processing_class=tokenizer,
        tools=TOOLS,
        callbacks=callbacks,
    )
    trainer.train()
    return trainer


def _trajectories(run_dir: Path) -> dict[tuple[int, str], list]:
    """(step, sample id) -> [root span, children in time order], from the run folder."""
    spans = read_spans(run_dir)
    assert not spans.problems
    traces: dict[str, list] = {}
    for span in spans:
        if span.name in (N.RL_TRAJECTORY_SPAN, N.RL_TURN_SPAN, N.RL_TOOL_SPAN):
            traces.setdefault(span.trace_id, []).append(span)
    out = {}
    for members in traces.values():
        members.sort(key=lambda s: (s.parent_span_id is not None, s.start_ns))
        root = members[0]
        assert root.name == N.RL_TRAJECTORY_SPAN and root.parent_span_id is None
        out[(root.attributes[A.RL_STEP], root.attributes[A.RL_SAMPLE_ID])] = members
    return out


def _training_values(trainer) -> list[dict]:
    """What the run logged, without wall-clock timings; NaN as a string, so that equal runs compare equal."""
    timing = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")
    return [{k: "nan" if v != v else v for k, v in h.items() if k not in timing} for h in trainer.state.log_history]


@pytest.mark.slow
def test_tool_calling_rollouts_become_trajectories_and_training_is_unchanged(tmp_path, chat_lm, caplog):
    model_dir, tokenizer = chat_lm
    run_dir = tmp_path / "otel"
    callback = OtelRLCallback(run_dir=str(run_dir), console=False, trajectory_sample_ratio=1.0, log_samples=2)
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        trainer = _train(model_dir, tokenizer, tmp_path / "out", [callback])

    # -- uninstrumented cleanly: TRL's methods and per-rollout tools are its own again ------------
    assert callback.telemetry is None
    for name in ("_generate_and_score_completions", "_generate_single_turn", "_tool_call_loop"):
        assert name not in vars(trainer), name
    assert trainer._sync_tool_dicts == [{"add": add, "divide": divide}] * BATCH
    assert trainer._async_tool_dicts == [{"lookup": lookup}] * BATCH

    # -- one trajectory per completion of each step's batch ---------------------------------------
    trajectories = _trajectories(run_dir)
    assert sorted(trajectories) == sorted((step, str(i)) for step in (1, 2) for i in range(BATCH))
    prompt_lengths = {p: len(_prompt_ids(tokenizer, p)) for p in FIRST_REPLIES}
    after_tool_length = len(_token_ids(tokenizer, AFTER_TOOL + EOS))
    seen: Counter[tuple[str, str]] = Counter()
    for (step, sample), (root, *children) in trajectories.items():
        index = int(sample)
        turns = [c for c in children if c.name == N.RL_TURN_SPAN]
        first = turns[0]
        prompt = first.attributes[A.RL_TURN_PROMPT].removeprefix("user: ")  # text: log_samples is on
        reply = first.attributes[A.RL_TURN_RESPONSE]
        seen[(prompt, reply)] += 1
        assert root.attributes[A.RL_SAMPLE_GROUP_ID] == str(index // NUM_GENERATIONS)
        assert all(c.parent_span_id == root.span_id and root.start_ns <= c.start_ns <= c.end_ns <= root.end_ns for c in children)
        assert [t.attributes[A.RL_TURN_INDEX] for t in turns] == list(range(len(turns)))
        assert first.attributes[A.GEN_AI_USAGE_INPUT_TOKENS] == prompt_lengths[prompt]
        reasons = [t.attributes[A.GEN_AI_RESPONSE_FINISH_REASONS] for t in turns]
        shape = [(c.name, c.attributes.get(A.GEN_AI_TOOL_NAME)) for c in children]
        if prompt not in TOOL_OF:  # answered without tools
            assert shape == [(N.RL_TURN_SPAN, None)]
            script = reply + EOS if prompt == "2+2=" else FIRST_REPLIES[prompt][0]
            assert first.attributes[A.GEN_AI_USAGE_OUTPUT_TOKENS] == min(len(_token_ids(tokenizer, script)), MAX_COMPLETION)
            assert reasons == ([["stop"]] if prompt == "2+2=" else [["length"]])
            assert root.attributes[A.RL_TRAJECTORY_TRUNCATED] is (prompt == "count")
        else:
            tool = TOOL_OF[prompt]
            assert shape == [(N.RL_TURN_SPAN, None), (N.RL_TOOL_SPAN, tool), (N.RL_TURN_SPAN, None)]
            assert first.attributes[A.GEN_AI_USAGE_OUTPUT_TOKENS] == len(_token_ids(tokenizer, FIRST_REPLIES[prompt][0]))
            assert reasons == [["tool_calls"], ["stop"]]
            second, span = turns[1], children[1]
            assert second.attributes[A.RL_TURN_RESPONSE] == AFTER_TOOL
            assert second.attributes[A.GEN_AI_USAGE_OUTPUT_TOKENS] == after_tool_length
            # the second generation continues prompt + first reply + the tool result as TRL formats it
            tool_result = {"role": "tool", "name": tool, "content": str(TOOL_RESULTS[tool])}
            suffix = trainer._get_tool_suffix_ids([tool_result])
            assert second.attributes[A.GEN_AI_USAGE_INPUT_TOKENS] == prompt_lengths[prompt] + first.attributes[
                A.GEN_AI_USAGE_OUTPUT_TOKENS
            ] + len(suffix)
            assert first.end_ns <= span.start_ns <= span.end_ns <= second.start_ns
            assert span.attributes[A.GEN_AI_OPERATION_NAME] == A.GenAiOperationNameValues.EXECUTE_TOOL.value
            arguments = FIRST_REPLIES[prompt][0].split('"arguments": ')[1].split("}}")[0] + "}"
            assert span.attributes[A.GEN_AI_TOOL_CALL_ARGUMENTS] == arguments
            if tool == "divide":  # raised: ERROR (and TRL got the exception, as the tool count below shows)
                assert (span.status, span.status_message) == ("error", "ZeroDivisionError: division by zero")
                assert span.attributes[A.ERROR_TYPE] == "ZeroDivisionError"
            elif tool == "lookup":  # returned {"error": ...}
                assert (span.status, span.attributes[A.ERROR_TYPE]) == ("error", TOOL_ERROR)
                assert span.attributes[A.GEN_AI_TOOL_CALL_RESULT] == '{"error": "no entry for pi"}'
            else:
                assert span.status == "unset" and A.ERROR_TYPE not in span.attributes
                assert span.attributes[A.GEN_AI_TOOL_CALL_RESULT] == "2"
            assert root.attributes[A.RL_TRAJECTORY_FAILED] is (tool != "add")
        assert root.attributes[A.RL_TRAJECTORY_TURN_COUNT] == len(turns)
        assert root.attributes[A.RL_TRAJECTORY_TOOL_CALL_COUNT] == len(children) - len(turns)

        # -- the reward TRL computed: the sum of the functions that scored it ---------------------
        done = 1.0 if prompt in TOOL_OF else 0.0
        parts = {k.rsplit(".", 1)[1]: v for k, v in root.attributes.items() if k.startswith(A.RL_TRAJECTORY_REWARDS + ".")}
        if prompt == "2+2=":
            right = 1.0 if reply == "4" else 0.0
            assert (parts, root.attributes[A.RL_TRAJECTORY_REWARD]) == ({"finished": done, "correct": right}, done + right)
        elif prompt == "pi?":  # infinity: left out of the span, counted and said once
            assert parts == {"finished": done} and A.RL_TRAJECTORY_REWARD not in root.attributes
        else:  # correct returned None: not scored by it
            assert (parts, root.attributes[A.RL_TRAJECTORY_REWARD]) == ({"finished": done}, done)
    assert {prompt for prompt, _ in seen} == set(FIRST_REPLIES)
    assert seen[("2+2=", "4")] and seen[("2+2=", "5")], "both answers sampled: the groups differ"

    # -- the tool spans are TRL's own count of tool calls ------------------------------------------
    train_logs = [h for h in trainer.state.log_history if "tools/call_frequency" in h]
    assert len(train_logs) == 2
    for log in train_logs:
        assert log["tools/call_frequency"] == pytest.approx(len(TOOL_OF) * NUM_GENERATIONS / BATCH)
        assert log["tools/failure_frequency"] == pytest.approx(1 / len(TOOL_OF))  # TRL counts the raising divide only

    # -- the bad reward was counted and said once; nothing else went wrong -------------------------
    warnings = [r.getMessage() for r in caplog.records if r.name == "otel_rl"]
    assert not [w for w in warnings if "tool-calling rollouts" in w], warnings
    assert len([w for w in warnings if w.startswith("otel-rl: trajectory.reward() got inf")]) == 1, warnings
    rejected = [p for p in read_metrics(run_dir) if p.name == M.RL_TELEMETRY_REJECTED]
    assert any(p.attributes.get(A.RL_TELEMETRY_REASON) == "inf" for p in rejected)

    # -- TRL got each tool's own result (or its exception's message) --------------------------------
    for messages in trainer._logs["completion"]:
        for message in messages:
            if message["role"] == "tool":
                assert message["content"] == str(TOOL_RESULTS[message["name"]])

    # -- and training is what it is without otel-rl, to the last bit -----------------------------
    plain = _train(model_dir, tokenizer, tmp_path / "out-plain", [])
    assert any(h.get("grad_norm") for h in trainer.state.log_history), "the run learned, so a difference would show"
    assert _training_values(trainer) == _training_values(plain)
    for (name, weight), (_, plain_weight) in zip(trainer.model.named_parameters(), plain.model.named_parameters()):
        assert torch.equal(weight, plain_weight), name
