"""Hugging Face Trainer / TRL / unsloth console logs that hold the traps real ones hold (see
``trap_logs`` for the shapes they restate and how)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trap_logs import Bar, Clock, Console, NpRepr, Tensor, Truth, f32, format_interval, g4, plain, spread, write_text

__all__ = [
    "write_hf_ambiguous",
    "write_hf_buffered",
    "write_hf_checkpoint_shards",
    "write_hf_eval",
    "write_hf_numpy",
    "write_hf_resumed",
    "write_two_runs",
]

# --------------------------------------------------------------------------------------------------
# Hugging Face Trainer / TRL pieces


def _on_log_text(logs: dict[str, Any], strings: bool) -> tuple[str, dict[str, Any]]:
    """``ProgressCallback.on_log``: the printed text and the numbers it shows.

    ``strings``: transformers 5.x (floats as ``f"{v:.4g}"``); else 4.x (values as they are, the
    epoch rounded to 2 decimals)."""
    shown: dict[str, Any] = {}
    shown_numbers: dict[str, Any] = {}
    for k, v in logs.items():
        if k == "total_flos":
            continue
        if strings and isinstance(v, float):
            shown[k] = g4(v)
            shown_numbers[k] = float(shown[k])
        elif not strings and k == "epoch" and isinstance(v, float):
            shown[k] = round(v, 2)
            shown_numbers[k] = shown[k]
        else:
            shown[k] = v
            shown_numbers[k] = plain(v)
    return str(shown), shown_numbers


def _hf_preamble(
    con: Console, clock: Clock, *, shards: int = 2, model: str = "Qwen/Qwen2.5-7B-Instruct", vllm: bool = False, map_examples: int = 0
) -> None:
    """What comes before training: warnings, the checkpoint-shard bar, vLLM's own shard lines, a Map bar."""
    con.err(
        "/opt/venv/lib/python3.11/site-packages/trl/__init__.py:22: UserWarning: TRL currently supports vLLM "
        "versions from 0.10.2 to 0.17.1. You have version 0.19.0 installed.\n  if is_vllm_available():\n"
    )
    con.log(f"[INFO] train_grpo: Loading model: {model} (bf16, attn=sdpa)")
    con.err("`torch_dtype` is deprecated! Use `dtype` instead!\n")
    bar = Bar(con, clock, total=shards, desc="Loading checkpoint shards")
    for _ in range(shards):
        clock.advance(1.52)
        bar.update(1)
    bar.close()
    if vllm:
        # vLLM's loader: bar_format "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [...]\n"
        start = clock.now
        for i in range(shards + 1):
            elapsed = clock.now - start
            rate = f"{i / elapsed:5.2f}it/s" if elapsed else "?it/s"
            remaining = format_interval((shards - i) * elapsed / i) if i and elapsed else "?"
            con.err(
                f"\rLoading safetensors checkpoint shards: {i / shards * 100:3.0f}% Completed | {i}/{shards} "
                f"[{format_interval(elapsed)}<{remaining}, {rate}]\n"
            )
            clock.advance(0.6)
        con.err("\n")
    if map_examples:
        bar = Bar(con, clock, total=map_examples, desc="Map", unit=" examples")
        done = 0
        while done < map_examples:
            step = min(1000, map_examples - done)
            clock.advance(step / 5234.0)
            bar.update(step)
            done += step
        bar.close()
    con.log("max_steps is given, it will override any value given in num_train_epochs")
    con.log("Using auto half precision backend")


def _hf_header(
    con: Console,
    *,
    style: str,
    num_examples: int,
    num_epochs: int,
    per_device: int,
    accumulation: int,
    max_steps: int,
    steps_per_epoch: int,
    trainable: int = 161_480_704,
    world: int = 1,
    resumed_at: int | None = None,
) -> None:
    """``Trainer._inner_training_loop``'s header (``hf5``: transformers 5.x, ``hf4``: 4.x) or unsloth's banner."""
    total = per_device * accumulation * world
    if style == "unsloth":
        lines = [
            f"==((====))==  Unsloth - 2x faster free finetuning | Num GPUs used = {world}",
            f"   \\\\   /|    Num examples = {num_examples:,} | Num Epochs = {num_epochs:,} | Total steps = {max_steps:,}",
            f"O^O/ \\_/ \\    Batch size per device = {per_device:,} | Gradient accumulation steps = {accumulation}",
            f"\\        /    Data Parallel GPUs = {world} | Total batch size ({per_device} x {accumulation} x {world}) = {total:,}",
            f' "-____-"     Trainable parameters = {trainable:,} of 511,629,184 ({trainable / 511_629_184:.2%} trained)',
        ]
    else:
        lines = ["***** Running training *****", f"  Num examples = {num_examples:,}", f"  Num Epochs = {num_epochs:,}"]
        if style == "hf5":
            lines.append(f"  Num update steps per epoch = {steps_per_epoch:,}")
        lines += [
            f"  Instantaneous batch size per device = {per_device:,}",
            f"  Total train batch size (w. parallel, distributed & accumulation) = {total:,}",
            f"  Gradient Accumulation steps = {accumulation}",
            f"  Total optimization steps = {max_steps:,}",
            f"  Number of trainable parameters = {trainable:,}",
        ]
        if resumed_at is not None:
            epochs_trained = resumed_at // steps_per_epoch
            lines.append(f"  Resuming training from checkpoint with epoch {epochs_trained} and global step {resumed_at}")
            lines.append(
                f"  Fast-forwarding the dataloader past {epochs_trained} epochs and "
                f"{(resumed_at % steps_per_epoch) * accumulation} batches to resume from the exact training state."
            )
    for line in lines:
        con.log(line)


def _grpo_logs(
    rng: random.Random,
    step: int,
    max_steps: int,
    *,
    keys: str,
    beta: float,
    lr: float,
    num_tokens: list[float],
    reward_fn: str = "accuracy_reward",
    warmup: int = 10,
) -> dict[str, Any]:
    """One GRPO log as TRL's ``GRPOTrainer.log`` merges it: loss, grad_norm, learning_rate first
    (``_maybe_log_save_evaluate``), then the averaged metrics in the order they were recorded."""
    progress = step / max_steps
    k = min(8, max(0, round(rng.gauss(2 + 4 * progress, 1.2))))
    reward = k / 8
    reward_std = f32(math.sqrt(reward * (1 - reward) * 8 / 7)) if 0 < k < 8 else 0.0
    kl = f32(abs(rng.gauss(0.002 + 0.05 * progress, 0.004))) if beta else 0.0
    length = round(rng.uniform(180, 260) + 120 * progress, 3)
    learning_rate = lr * min(1.0, step / warmup) * (1 - (step - 1) / max_steps) if step > 1 else lr * step / warmup
    logs: dict[str, Any] = {
        "loss": round(beta * kl + rng.gauss(0, 0.01), 4),
        "grad_norm": f32(abs(rng.gauss(0.3, 0.12))),
        "learning_rate": learning_rate,
    }
    if keys == "old":
        logs.update({"completion_length": length, f"rewards/{reward_fn}": reward, "reward": reward, "reward_std": reward_std, "kl": kl})
        return logs
    num_tokens[0] += round(length * 16 + 1200.0)
    clipped = round(max(0.0, rng.gauss(0.02 + 0.1 * progress, 0.02)), 4)
    logs.update(
        {
            "num_tokens": float(num_tokens[0]),
            "completions/mean_length": length,
            "completions/min_length": round(length * 0.6, 1),
            "completions/max_length": round(min(512.0, length * 1.5), 1),
            "completions/clipped_ratio": clipped,
            "completions/mean_terminated_length": round(length * 0.97, 3),
            "completions/min_terminated_length": round(length * 0.6, 1),
            "completions/max_terminated_length": round(min(512.0, length * 1.4), 1),
            f"rewards/{reward_fn}/mean": reward,
            f"rewards/{reward_fn}/std": reward_std,
            "reward": reward,
            "reward_std": reward_std,
            "frac_reward_zero_std": round(rng.choice([0.0, 0.125, 0.25, 0.375, 0.5]), 3),
        }
    )
    if beta:
        logs["kl"] = kl
    logs.update(
        {
            "entropy": f32(abs(rng.gauss(0.4 + 0.2 * progress, 0.05))),
            "clip_ratio/low_mean": 0.0,
            "clip_ratio/low_min": 0.0,
            "clip_ratio/high_mean": 0.0,
            "clip_ratio/high_max": 0.0,
            "clip_ratio/region_mean": 0.0,
        }
    )
    return logs


def _sft_logs(rng: random.Random, step: int, max_steps: int, lr: float) -> dict[str, Any]:
    progress = step / max_steps
    return {
        "loss": round(max(0.03, 2.0 * math.exp(-8 * progress) + rng.gauss(0.04, 0.004)), 4),
        "grad_norm": f32(abs(rng.gauss(0.2 + 2 * math.exp(-10 * progress), 0.05))),
        "learning_rate": lr * (1 - (step - 1) / max_steps),
    }


def _summary_logs(rng: random.Random, steps_run: int, seconds: float, samples: float, epoch: float) -> dict[str, Any]:
    """``_finalize_training``'s ``speed_metrics`` + ``train_loss`` (``total_flos`` is dropped by on_log)."""
    return {
        "train_runtime": round(seconds, 4),
        "train_samples_per_second": round(samples / seconds, 3),
        "train_steps_per_second": round(steps_run / seconds, 3),
        "total_flos": 0.0,
        "train_loss": rng.uniform(0.001, 0.05),
        "epoch": epoch,
    }


@dataclass
class _HfRun:
    """One Trainer run printed on a console; collects the truth as it prints."""

    con: Console
    clock: Clock
    rng: random.Random
    max_steps: int
    logging_steps: int
    steps_per_epoch: int
    strings: bool
    seconds_per_step: float = 4.6
    save_steps: int = 0
    output_dir: str = "outputs/grpo"
    printed: dict[int, dict[str, Any]] = field(default_factory=dict)  # step -> numbers shown
    texts: dict[int, str] = field(default_factory=dict)  # step -> the dict's text
    evals: dict[int, dict[str, Any]] = field(default_factory=dict)  # step -> numbers of the eval dict after it
    summary: dict[str, Any] | None = None

    def train(
        self,
        logs_for: Callable[[int], dict[str, Any]],
        *,
        start: int = 0,
        stop: int | None = None,
        finish: bool = True,
        on_step: Callable[[int], None] | None = None,
        eval_every: int = 0,
        eval_for: Callable[[int], tuple[int, dict[str, Any]]] | None = None,
    ) -> None:
        con, clock = self.con, self.clock
        bar = Bar(con, clock, total=self.max_steps)  # on_train_begin
        current = 0
        stop = self.max_steps if stop is None else stop
        for step in range(start + 1, stop + 1):
            clock.advance(self.rng.uniform(0.85, 1.15) * self.seconds_per_step)
            if on_step is not None:
                on_step(step)
            bar.update(step - current)  # on_step_end
            current = step
            if step % self.logging_steps == 0:
                logs = logs_for(step)
                logs["epoch"] = step / self.steps_per_epoch
                text, shown = _on_log_text(logs, self.strings)
                con.tqdm_write(text)
                self.printed[step] = shown
                self.texts[step] = text
            if eval_every and eval_for is not None and step % eval_every == 0:
                self._evaluate(step, eval_for)
            if self.save_steps and step % self.save_steps == 0:
                con.err(f"Saving model checkpoint to {self.output_dir}/checkpoint-{step}\n")
        if not finish:
            return
        con.log("\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n")
        clock.advance(3.0)
        summary = _summary_logs(self.rng, stop - start, clock.now, (stop - start) * 8.0, stop / self.steps_per_epoch)
        text, shown = _on_log_text(summary, self.strings)
        con.tqdm_write(text)
        self.summary = shown
        bar.close()  # on_train_end

    def _evaluate(self, step: int, eval_for: Callable[[int], tuple[int, dict[str, Any]]]) -> None:
        batches, metrics = eval_for(step)
        pred = Bar(self.con, self.clock, total=batches, pos=1, leave=False)  # on_prediction_step
        for _ in range(batches):
            self.clock.advance(0.37)
            pred.update(1)
        metrics = dict(metrics)
        metrics["epoch"] = step / self.steps_per_epoch
        text, shown = _on_log_text(metrics, self.strings)
        self.con.tqdm_write(text)  # Trainer.evaluate logs before on_evaluate closes the bar
        self.evals[step] = shown
        pred.close()


def _hf_values(printed: dict[int, dict[str, Any]], steps: Iterable[int], keys: Iterable[str]) -> dict[int, dict[str, Any]]:
    keys = list(keys)
    return {s: {k: printed[s][k] for k in keys if k in printed[s]} for s in steps}


# --------------------------------------------------------------------------------------------------
# HF traps


def write_hf_checkpoint_shards(
    path: Path, *, max_steps: int = 120, logging_steps: int = 10, shards: int = 2, strings: bool = True, seed: int = 2
) -> Truth:
    """A TRL GRPO console (transformers 5.x ``ProgressCallback``, stdout line-buffered as under
    ``python -u``): ``Loading checkpoint shards`` bars (total = ``shards``), vLLM's
    ``Loading safetensors checkpoint shards ... Completed`` lines and a ``Map`` bar before the
    ``***** Running training *****`` header, then the training bar's ``\\r`` refreshes with each
    dict written between tqdm's clear and redraw, and the ``train_runtime`` summary.

    The other bars' totals (2, 7473) are not the run's steps; the dicts carry no step: step k*logging_steps.
    """
    rng = random.Random(seed)
    con, clock = Console(stdout_block=0), Clock()
    con.err("=== grpo_qwen2.5-7b seed=%d START ===\n" % seed)
    _hf_preamble(con, clock, shards=shards, vllm=True, map_examples=7473)
    per_device, accumulation, examples = 2, 4, 7473
    steps_per_epoch = math.ceil(math.ceil(examples / per_device) / accumulation)
    _hf_header(
        con,
        style="hf5" if strings else "hf4",
        num_examples=examples,
        num_epochs=1,
        per_device=per_device,
        accumulation=accumulation,
        max_steps=max_steps,
        steps_per_epoch=steps_per_epoch,
    )
    run = _HfRun(con, clock, rng, max_steps, logging_steps, steps_per_epoch, strings, save_steps=max_steps // 2)
    tokens = [0.0]
    run.train(lambda s: _grpo_logs(rng, s, max_steps, keys="new", beta=0.04, lr=1e-5, num_tokens=tokens))
    con.exit()
    write_text(path, con.text())
    steps = list(range(logging_steps, max_steps + 1, logging_steps))
    return Truth(
        path,
        "hf-console",
        steps,
        values=_hf_values(run.printed, spread(steps), ("loss", "reward", "kl", "grad_norm", "completions/mean_length")),
        settings={"max_steps": max_steps, "logging_steps": logging_steps, "num_epochs": 1, "train_batch_size": per_device * accumulation},
    )


def write_hf_buffered(
    path: Path, *, max_steps: int = 200, logging_steps: int = 5, strings: bool = False, burst_bytes: int | None = 8192, seed: int = 3
) -> Truth:
    """A TRL GRPO run under ``nohup ... > log 2>&1``: tqdm's stderr lands at once, the dicts
    (``tqdm.write`` -> stdout) only when stdout's block buffer fills (``burst_bytes``; bursts of a
    few dicts glued after a bar's ``\\r``) or, with ``burst_bytes=None``, all after
    ``Training completed.``. ``strings``: transformers 5.x (``'0.1234'`` values, the old TRL key set
    as in the Qwen3.5-9B log); else 4.x numbers (the newer TRL key set).

    The dicts carry no ``step``; their text position says nothing: true steps are 5, 10, ..., 200.
    """
    rng = random.Random(seed)
    con, clock = Console(stdout_block=burst_bytes), Clock()
    _hf_preamble(con, clock, shards=4)
    per_device, accumulation, examples = 2, 4 if not strings else 2, 7473
    steps_per_epoch = math.ceil(math.ceil(examples / per_device) / accumulation)
    _hf_header(
        con,
        style="hf5" if strings else "hf4",
        num_examples=examples,
        num_epochs=1,
        per_device=per_device,
        accumulation=accumulation,
        max_steps=max_steps,
        steps_per_epoch=steps_per_epoch,
    )
    con.err("Could not estimate the number of tokens of the input, floating-point operations will not be computed\n")
    run = _HfRun(
        con, clock, rng, max_steps, logging_steps, steps_per_epoch, strings, save_steps=max_steps, seconds_per_step=32.0 if strings else 4.6
    )
    tokens = [0.0]
    keys = "old" if strings else "new"
    run.train(
        lambda s: _grpo_logs(
            rng, s, max_steps, keys=keys, beta=0.04, lr=1e-4 if not strings else 1e-5, num_tokens=tokens, reward_fn="reward_fn"
        )
    )
    con.exit()
    con.err(
        "[rank0]:[W404 19:39:51.664925646 ProcessGroupNCCL.cpp:1553] Warning: WARNING: destroy_process_group() "
        "was not called before program exit, which can leak resources.\n"
    )
    write_text(path, con.text())
    steps = list(range(logging_steps, max_steps + 1, logging_steps))
    return Truth(
        path,
        "hf-console",
        steps,
        values=_hf_values(run.printed, spread(steps, 6), ("loss", "reward", "kl", "grad_norm", "learning_rate")),
        settings={"max_steps": max_steps, "logging_steps": logging_steps, "num_epochs": 1},
    )


def write_hf_resumed(path: Path, *, max_steps: int = 100, crash_after: int = 60, resume_from: int = 50, seed: int = 5) -> Truth:
    """Two processes appended to one console log (``>>``), transformers 5.x, logging every step,
    stdout line-buffered: the first run logs steps 1..``crash_after`` (checkpoint at
    ``resume_from``) and dies with a CUDA OOM traceback; the second resumes from
    ``checkpoint-<resume_from>`` (header line ``Resuming training from checkpoint with epoch 0 and
    global step 50``; the bar jumps from 0 to 51) and logs 51..``max_steps``.

    Truth: one record per step 1..max_steps; steps resume_from+1..crash_after keep the later run's values.
    """
    rng = random.Random(seed)
    parts: list[str] = []
    clock = Clock()
    per_device, accumulation, examples = 2, 4, 8 * max_steps
    steps_per_epoch = max_steps
    printed: dict[int, dict[str, Any]] = {}
    for attempt in (1, 2):
        con = Console(stdout_block=0, parts=parts)
        _hf_preamble(con, clock, shards=2)
        start = 0 if attempt == 1 else resume_from
        _hf_header(
            con,
            style="hf5",
            num_examples=examples,
            num_epochs=1,
            per_device=per_device,
            accumulation=accumulation,
            max_steps=max_steps,
            steps_per_epoch=steps_per_epoch,
            resumed_at=start or None,
        )
        run = _HfRun(con, clock, rng, max_steps, 1, steps_per_epoch, True, save_steps=resume_from, output_dir="outputs/grpo-resume")
        tokens = [1000.0 * start]
        run.train(
            lambda s: _grpo_logs(rng, s, max_steps, keys="new", beta=0.04, lr=1e-5, num_tokens=tokens),
            start=start,
            stop=crash_after if attempt == 1 else max_steps,
            finish=attempt == 2,
        )
        if attempt == 1:
            con.err(
                '\nTraceback (most recent call last):\n  File "/work/train_grpo.py", line 212, in <module>\n'
                "    trainer.train()\n"
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.31 GiB. GPU 0 has a total capacity "
                "of 79.19 GiB of which 1.02 GiB is free.\n"
            )
            con.kill()
        else:
            con.exit()
        printed.update(run.printed)
    write_text(path, "".join(parts))
    steps = list(range(1, max_steps + 1))
    picks = sorted({1, resume_from, resume_from + 1, (resume_from + crash_after) // 2, crash_after, crash_after + 1, max_steps})
    return Truth(
        path,
        "hf-console",
        steps,
        values=_hf_values(printed, picks, ("loss", "reward", "kl", "grad_norm")),
        settings={"max_steps": max_steps, "num_epochs": 1},
    )


def write_two_runs(
    path: Path,
    *,
    banner: str = "unsloth",
    sft_examples: int = 100,
    sft_epochs: int = 2,
    grpo_examples: int = 937,
    grpo_epochs: int = 3,
    grpo_cut_at: int = 123,
    logging_steps: int = 5,
    seed: int = 6,
) -> Truth:
    """A pipeline log: an SFT run (dicts with loss, grad_norm, learning_rate, epoch 0.05..2.0, and
    its ``train_runtime`` summary), then in a second process a GRPO run (reward, kl,
    completion keys; epoch starting over at 0.01) killed at step ``grpo_cut_at`` of its plan.
    ``banner="unsloth"``: unsloth's banner before each run and transformers 4.x numbers (as in the
    unsloth Qwen2.5-0.5B log); ``"hf"``: the transformers 5.x header and ``'0.1234'`` strings.
    Both processes print to a block-buffered stdout; the killed one loses its last buffer, so the
    last dicts present may lag the bar. Between GRPO steps the reward function prints ``[DEBUG]``
    lines and a ``Reward Statistics`` block.

    Truth: two runs; the RL run's records are steps 5, 10, ... of its own run.
    """
    rng = random.Random(seed)
    parts: list[str] = []
    clock = Clock()
    strings = banner == "hf"
    style = "unsloth" if banner == "unsloth" else "hf5"

    # SFT process
    con = Console(stdout_block=8192, parts=parts)
    con.err("\x1b[0;34m[Step 3/5]\x1b[0m SFT training...\n")
    if banner == "unsloth":
        con.print("\U0001f9a5 Unsloth: Will patch your computer to enable 2x faster free finetuning.")
    sft_per_epoch = sft_examples
    sft_steps = sft_per_epoch * sft_epochs
    _hf_header(
        con,
        style=style,
        num_examples=sft_examples,
        num_epochs=sft_epochs,
        per_device=1,
        accumulation=1,
        max_steps=sft_steps,
        steps_per_epoch=sft_per_epoch,
        trainable=17_596_416,
    )
    con.print("Starting SFT...")
    sft = _HfRun(con, clock, rng, sft_steps, logging_steps, sft_per_epoch, strings, seconds_per_step=0.14)
    sft.train(lambda s: _sft_logs(rng, s, sft_steps, 2e-4))
    con.print("Saving model to model/sft_model...")
    con.exit()

    # GRPO process
    con = Console(stdout_block=8192, parts=parts)
    con.err("\x1b[0;34m[Step 4/5]\x1b[0m GRPO training...\n")
    per_device, accumulation = 2, 4
    grpo_per_epoch = grpo_examples // per_device  # 937 -> 468: unsloth's "Total steps = 1,404" over 3 epochs
    grpo_steps = grpo_per_epoch * grpo_epochs
    _hf_header(
        con,
        style=style,
        num_examples=grpo_examples,
        num_epochs=grpo_epochs,
        per_device=per_device,
        accumulation=accumulation,
        max_steps=grpo_steps,
        steps_per_epoch=grpo_per_epoch,
        trainable=17_596_416,
    )
    con.print("Loaded %d GRPO examples" % grpo_examples)
    con.print("Starting GRPO...")

    def reward_prints(step: int) -> None:
        choice = rng.choice(["yes", "no"])
        con.print("[DEBUG] completions type: <class 'list'>")
        con.print("[DEBUG] completions length: 8")
        con.print(f"[DEBUG] completions[0] value: [{{'role': 'assistant', 'content': '{{\"extend\": \"{choice}\"}}'}}]")
        if step % 3 == 0:
            con.print("\n" + "=" * 50 + "\nReward Statistics:\n  Avg TSC reward: 0.000\n  Avg final reward: 0.500\n" + "=" * 50 + "\n")

    tokens = [0.0]
    grpo = _HfRun(con, clock, rng, grpo_steps, logging_steps, grpo_per_epoch, strings, seconds_per_step=31.7)
    grpo.train(
        lambda s: _grpo_logs(rng, s, grpo_steps, keys="new", beta=0.05, lr=1e-5, num_tokens=tokens, reward_fn="reward_fn"),
        stop=grpo_cut_at,
        finish=False,
        on_step=reward_prints,
    )
    con.kill()  # the dicts still in stdout's buffer when the process died never reach the file
    text = "".join(parts)
    write_text(path, text)
    steps = sorted(s for s, printed in grpo.texts.items() if printed in text)
    assert steps == list(range(logging_steps, logging_steps * len(steps) + 1, logging_steps))
    return Truth(
        path,
        "hf-console",
        steps,
        segments=2,
        values=_hf_values(grpo.printed, spread(steps), ("loss", "reward", "kl", "grad_norm")),
        settings={
            "max_steps": grpo_steps,
            "num_epochs": grpo_epochs,
            "logging_steps": logging_steps,
            "train_batch_size": per_device * accumulation,
        },
    )


def write_hf_eval(
    path: Path,
    *,
    max_steps: int = 100,
    logging_steps: int = 5,
    eval_steps: int = 25,
    eval_batches: int = 13,
    strings: bool = True,
    seed: int = 8,
) -> Truth:
    """A TRL GRPO run with evaluation (transformers 5.x, stdout line-buffered): every
    ``eval_steps`` the eval bar (``total=eval_batches``, position 1: ``\\n...\\x1b[A``) runs, then
    ``{'eval_loss': ..., 'eval_runtime': ..., 'eval_samples_per_second': ...,
    'eval_steps_per_second': ..., 'eval_reward': ..., 'eval_kl': ..., 'epoch': ...}`` is written
    right after the train dict of the same step.

    Truth: eval dicts add no steps; their values belong to the step of the train dict before them.
    """
    rng = random.Random(seed)
    con, clock = Console(stdout_block=0), Clock()
    _hf_preamble(con, clock, shards=2)
    per_device, accumulation, examples = 4, 2, 1600
    steps_per_epoch = math.ceil(math.ceil(examples / per_device) / accumulation)
    _hf_header(
        con,
        style="hf5" if strings else "hf4",
        num_examples=examples,
        num_epochs=1,
        per_device=per_device,
        accumulation=accumulation,
        max_steps=max_steps,
        steps_per_epoch=steps_per_epoch,
    )
    run = _HfRun(con, clock, rng, max_steps, logging_steps, steps_per_epoch, strings)
    tokens = [0.0]

    def eval_for(step: int) -> tuple[int, dict[str, Any]]:
        reward = rng.randint(0, 8 * eval_batches) / (8 * eval_batches)
        seconds = eval_batches * 0.37
        return eval_batches, {
            "eval_loss": round(rng.uniform(0.0, 0.02), 6),
            "eval_runtime": round(seconds, 4),
            "eval_samples_per_second": round(eval_batches * 4 / seconds, 3),
            "eval_steps_per_second": round(1 / 0.37, 3),
            "eval_reward": reward,
            "eval_reward_std": f32(rng.uniform(0.2, 0.45)),
            "eval_kl": f32(rng.uniform(0.001, 0.02)),
        }

    run.train(
        lambda s: _grpo_logs(rng, s, max_steps, keys="new", beta=0.04, lr=1e-5, num_tokens=tokens), eval_every=eval_steps, eval_for=eval_for
    )
    con.exit()
    write_text(path, con.text())
    steps = list(range(logging_steps, max_steps + 1, logging_steps))
    values = _hf_values(run.printed, spread(steps), ("loss", "reward", "kl"))
    for step in range(eval_steps, max_steps + 1, eval_steps):
        shown = run.evals[step]
        values.setdefault(step, {}).update({k: shown[k] for k in ("eval_loss", "eval_reward", "eval_kl")})
        values[step].update({k: run.printed[step][k] for k in ("reward", "loss")})
    return Truth(
        path, "hf-console", steps, values=values, settings={"max_steps": max_steps, "logging_steps": logging_steps, "num_epochs": 1}
    )


def write_hf_numpy(path: Path, *, max_steps: int = 60, logging_steps: int = 2, seed: int = 12) -> Truth:
    """A transformers 4.x console (values printed as they are, so non-float objects keep their
    repr): ``grad_norm`` as ``tensor(0.4321, device='cuda:0')`` (Trainers of early 2024 logged the
    clip's tensor), rewards as ``np.float32(0.625)`` and ``kl`` as ``np.float64(...)`` (a reward
    function returning numpy scalars, numpy 2). Stdout line-buffered; finished.

    Truth: the numbers inside the wrappers, at steps 2, 4, ..., 60.
    """
    rng = random.Random(seed)
    con, clock = Console(stdout_block=0), Clock()
    _hf_preamble(con, clock, shards=2)
    per_device, accumulation, examples = 4, 2, 4000
    steps_per_epoch = math.ceil(math.ceil(examples / per_device) / accumulation)
    _hf_header(
        con,
        style="hf4",
        num_examples=examples,
        num_epochs=1,
        per_device=per_device,
        accumulation=accumulation,
        max_steps=max_steps,
        steps_per_epoch=steps_per_epoch,
    )
    run = _HfRun(con, clock, rng, max_steps, logging_steps, steps_per_epoch, False)

    def logs_for(step: int) -> dict[str, Any]:
        base = _grpo_logs(rng, step, max_steps, keys="old", beta=0.04, lr=1e-6, num_tokens=[0.0])
        return {
            "loss": base["loss"],
            "grad_norm": Tensor(base["grad_norm"]),
            "learning_rate": base["learning_rate"],
            "completion_length": base["completion_length"],
            "rewards/accuracy_reward": NpRepr("float32", base["reward"]),
            "reward": NpRepr("float32", base["reward"]),
            "reward_std": base["reward_std"],
            "kl": NpRepr("float64", base["kl"]),
        }

    run.train(logs_for)
    con.exit()
    write_text(path, con.text())
    steps = list(range(logging_steps, max_steps + 1, logging_steps))
    return Truth(
        path,
        "hf-console",
        steps,
        values=_hf_values(run.printed, spread(steps, 6), ("grad_norm", "reward", "rewards/accuracy_reward", "kl", "loss")),
        settings={"max_steps": max_steps, "logging_steps": logging_steps},
    )


def write_hf_ambiguous(path: Path, *, dicts: int = 7, seed: int = 10) -> Truth:
    """A console a script printed itself: transformers 5.x ``PrinterCallback`` shape
    (``print({k: f"{v:.4g}"})``, ``disable_tqdm=True``, so no bar) with the epoch left out, no
    Trainer header, no ``step`` key, and no ``train_runtime`` (the run was stopped). Seven dicts
    could be steps 1..7, 10..70, or anything else: the log cannot say.
    """
    rng = random.Random(seed)
    con = Console(stdout_block=0)
    con.print("loading dataset gsm8k (main) ... 7473 rows")
    con.print("model: Qwen/Qwen2.5-1.5B-Instruct, lora r=16")
    for i in range(1, dicts + 1):
        logs = _grpo_logs(rng, i, 50, keys="old", beta=0.04, lr=5e-6, num_tokens=[0.0])
        con.print(str({k: g4(v) if isinstance(v, float) else v for k, v in logs.items()}))
        if i == 4:
            con.print("saving adapter to out/adapter-tmp")
    con.exit()
    write_text(path, con.text())
    return Truth(path, "hf-console", None, ambiguous=True, records=dicts)
