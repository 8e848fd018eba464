"""verl console and W&B ``output.log`` files that hold the traps real ones hold (see ``trap_logs``
for the shapes they restate and how); the config they dump is built in ``trap_verl_config``."""

from __future__ import annotations

import pprint
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from trap_logs import WANDB_LINE_LIMIT, Clock, Np, Truth, f32, format_meter, spread, write_text
from trap_verl_config import verl_config, verl_settings_truth

__all__ = ["verl_config", "write_verl_config_dump", "write_verl_numpy", "write_verl_resumed", "write_verl_truncated"]

# --------------------------------------------------------------------------------------------------
# verl pieces


_RAY_ANSI = "\x1b[36m({name} pid={pid})\x1b[0m "
_RAY_PLAIN = "({name} pid={pid}) "
_RAY_REPEATED = "\x1b[32m [repeated {n}x across cluster]\x1b[0m"


def _ray(name: str | None, pid: int, ansi: bool = True) -> Callable[[str], str]:
    """Ray's prefix for an actor's lines (``(pid=N)`` for a worker not yet named)."""
    prefix = (_RAY_ANSI if ansi else _RAY_PLAIN).format(name=name, pid=pid)
    if name is None:
        prefix = prefix.replace("(None pid=", "(pid=")
    return lambda line: prefix + line


# (key, kind) of a compact verl GRPO step, in the order verl's trainer fills its metrics dict
_VERL_COMPACT = [
    ("actor/entropy", "float"),
    ("actor/pg_loss", "np64"),
    ("actor/grad_norm", "np64"),
    ("actor/lr", "np64"),
    ("training/global_step", "int"),
    ("training/epoch", "int"),
    ("critic/score/mean", "float"),
    ("critic/score/max", "float"),
    ("response_length/mean", "float"),
    ("response_length/clip_ratio", "float"),
    ("timing_s/step", "float"),
    ("perf/throughput", "float"),
]
_VERL_ACTOR = [
    ("global_seqlen/min", "int"),
    ("global_seqlen/max", "int"),
    ("global_seqlen/minmax_diff", "int"),
    ("global_seqlen/mean", "float"),
    ("actor/entropy", "float"),
    ("actor/pg_loss", "np64"),
    ("actor/pg_clipfrac", "np64"),
    ("actor/ppo_kl", "np64"),
    ("actor/pg_clipfrac_lower", "np64"),
    ("actor/grad_norm", "np64"),
    ("perf/mfu/actor", "np64"),
    ("perf/max_memory_allocated_gb", "np64"),
    ("perf/max_memory_reserved_gb", "np64"),
    ("perf/cpu_memory_used_gb", "np64"),
    ("actor/lr", "np64"),
]
_VERL_DATA = [
    ("training/global_step", "int"),
    ("training/epoch", "int"),
    ("critic/score/mean", "float"),
    ("critic/score/max", "float"),
    ("critic/score/min", "float"),
    ("critic/rewards/mean", "float"),
    ("critic/advantages/mean", "float"),
    ("critic/advantages/max", "float"),
    ("critic/advantages/min", "float"),
    ("response_length/mean", "float"),
    ("response_length/max", "float"),
    ("response_length/min", "float"),
    ("response_length/clip_ratio", "float"),
    ("prompt_length/mean", "float"),
    ("prompt_length/max", "float"),
    ("num_turns/min", "np.int32"),
    ("num_turns/max", "np.int32"),
    ("num_turns/mean", "np64"),
    ("timing_s/gen", "float"),
    ("timing_s/reward", "float"),
    ("timing_s/old_log_prob", "float"),
    ("timing_s/ref", "float"),
    ("timing_s/adv", "float"),
    ("timing_s/update_actor", "float"),
    ("timing_s/step", "float"),
    ("perf/total_num_tokens", "int"),
    ("perf/time_per_step", "float"),
    ("perf/throughput", "float"),
]


def _verl_value(rng: random.Random, key: str, step: int, total: int, epoch_steps: int, max_len: int) -> float | int:
    p = step / max(total, 1)
    if key.startswith("global_seqlen/"):
        base = 250_000 + int(40_000 * p)
        return {
            "global_seqlen/min": base - rng.randint(5000, 30000),
            "global_seqlen/max": base + rng.randint(5000, 30000),
            "global_seqlen/minmax_diff": rng.randint(10000, 60000),
        }.get(key, base + rng.choice([0.0, 0.25, 0.5, 0.75]))
    if key == "training/global_step":
        return step
    if key == "training/epoch":
        return (step - 1) // epoch_steps
    if key == "actor/lr":
        return 1e-06
    if key in ("num_turns/min", "num_turns/max"):
        return 2 if key.endswith("min") else rng.randint(6, 16)
    if key == "perf/total_num_tokens":
        return rng.randint(600_000, 900_000)
    if key.startswith("critic/score/") or key == "critic/rewards/mean":
        mean = f32(min(1.0, max(-1.0, -0.4 + 1.1 * p + rng.gauss(0, 0.06))))
        return {"critic/score/max": 1.0, "critic/score/min": -1.0}.get(key, mean)
    if key.startswith("response_length/"):
        mean = float(round(max_len * (0.45 + 0.3 * p) + rng.gauss(0, 6), 3))
        return {
            "response_length/max": float(max_len),
            "response_length/min": float(rng.randint(8, 40)),
            "response_length/clip_ratio": round(rng.uniform(0, 0.08), 6),
        }.get(key, mean)
    if key.startswith("timing_s/") or key == "perf/time_per_step":
        return rng.uniform(20, 60) if key != "timing_s/step" and key != "perf/time_per_step" else rng.uniform(240, 320)
    if key == "perf/throughput":
        return rng.uniform(600, 900)
    if key.startswith("perf/"):
        return rng.uniform(0.1, 0.4) if "mfu" in key else rng.uniform(40, 80) if "gb" in key else rng.uniform(1, 2)
    if key == "actor/grad_norm":
        return f32(abs(rng.gauss(0.45, 0.1)))
    if key == "actor/entropy":
        return f32(0.6 - 0.3 * p + rng.gauss(0, 0.01))
    if key in ("actor/kl_loss",):
        return f32(abs(rng.gauss(0.001 + 0.01 * p, 0.001)))
    if key == "actor/kl_coef":
        return 0.001
    return f32(rng.gauss(0, 0.01)) if key == "actor/pg_loss" else f32(abs(rng.gauss(0.001, 0.0005)))


def _render(value: Any, kind: str, numpy2: bool) -> str:
    if kind == "int":
        return str(value)
    if kind == "float":
        return repr(float(value))
    np_kind = {"np64": "float64", "np32": "float32", "np.int32": "int32", "np.int64": "int64"}[kind]
    return Np(np_kind, value).text(numpy2)


def _step_line(step: int, items: list[tuple[str, Any, str]], numpy2: bool) -> str:
    """``concat_dict_to_str``: ``step:N - key:pformat(v) - ...``."""
    return " - ".join([f"step:{step}"] + [f"{k}:{_render(v, kind, numpy2)}" for k, v, kind in items])


def _verl_step(
    rng: random.Random, step: int, total: int, *, layout: list[tuple[str, str]], epoch_steps: int, max_len: int, kl_loss: bool = False
) -> list[tuple[str, Any, str]]:
    keys = list(layout)
    if kl_loss:
        at = next(i for i, (k, _) in enumerate(keys) if k == "actor/grad_norm")
        keys[at:at] = [("actor/kl_loss", "np64"), ("actor/kl_coef", "np64")]
    return [(k, _verl_value(rng, k, step, total, epoch_steps, max_len), kind) for k, kind in keys]


def _verl_startup(lines: list[str], cfg: dict[str, Any], *, pid: int, ansi: bool, resume_from: int | None = None) -> Callable[[str], str]:
    """The driver's lines before step 1: W&B login, Ray start, the config dump, worker start-up, checkpoint lookup."""
    task = _ray("TaskRunner", pid, ansi)
    lines += [
        "wandb: Currently logged in as: someone (team) to https://api.wandb.ai. Use `wandb login --relogin` to force relogin",
        "ray init kwargs: {'num_cpus': None, 'runtime_env': {'env_vars': {'TOKENIZERS_PARALLELISM': 'true', "
        "'NCCL_DEBUG': 'WARN', 'VLLM_LOGGING_LEVEL': 'WARN'}}}",
        "2025-11-19 18:59:13,674\tINFO worker.py:2003 -- Started a local Ray instance. View the dashboard at "
        + ("\x1b[1m\x1b[32mhttp://127.0.0.1:8265 \x1b[39m\x1b[22m" if ansi else "http://127.0.0.1:8265 "),
        _ray(None, pid, ansi)("wandb: Currently logged in as: someone (team) to https://api.wandb.ai."),
        task(f"TaskRunner hostname: node-{pid % 97:02d}, PID: {pid}"),
    ]
    lines += [task(line) for line in pprint.pformat(cfg).splitlines()]
    lines += [
        task(
            "WARNING: val_batch_size is deprecated. Validation datasets are sent to inference engines as a whole batch, "
            "which will schedule the memory themselves."
        ),
        task("[validate_config] All configuration checks passed successfully!"),
        task("Size of train dataloader: 233, Size of val dataloader: 1"),
        task(f"Total training steps: {cfg['trainer']['total_training_steps']}"),
    ]
    for rank in range(3):
        worker = _ray("WorkerDict", pid + 4 + rank, ansi)
        suffix = _RAY_REPEATED.format(n=7) if rank == 0 and ansi else ""
        lines.append(worker(f"[Gloo] Rank {rank} is connected to 7 peer ranks. Expected number of connected peer ranks is : 7{suffix}"))
        lines.append(worker("Model config after override: Qwen2Config { ... }"))
    folder = cfg["trainer"]["default_local_dir"]
    if resume_from is None:
        lines.append(task(f"Checkpoint tracker file does not exist: /work/{folder}/latest_checkpointed_iteration.txt"))
        lines.append(task("Training from scratch"))
    else:
        lines.append(task(f"Load from checkpoint folder: /work/{folder}/global_step_{resume_from}"))
        lines.append(task(f"Setting global step to {resume_from}"))
        lines.append(task(f"Resuming from /work/{folder}/global_step_{resume_from}"))
    return task


def _verl_training(
    lines: list[str],
    task: Callable[[str], str],
    rng: random.Random,
    clock: Clock,
    *,
    first: int,
    last: int,
    total: int,
    layout: list[tuple[str, str]],
    numpy2: bool,
    kl_loss: bool,
    max_len: int,
    save_freq: int,
    folder: str,
    pid: int,
    ansi: bool,
) -> dict[int, dict[str, Any]]:
    """Steps ``first``..``last``: the bar line Ray flushes before each step line, dynamic-sampling
    prints, checkpoint saves. Returns step -> key -> value."""
    bar_start = clock.now
    initial = first - 1
    lines.append(task("\r" + format_meter(initial, total, 0.0, prefix="Training Progress", initial=initial)))
    written: dict[int, dict[str, Any]] = {}
    for step in range(first, last + 1):
        items = _verl_step(rng, step, total, layout=layout, epoch_steps=23, max_len=max_len, kl_loss=kl_loss)
        seconds = next(v for k, v, _ in items if k == "timing_s/step")
        clock.advance(seconds)
        if step % 4 == 1:
            lines.append(task(f"trial 1: filter out {rng.randint(4, 20)} samples from 32 samples"))
            lines.append(
                _ray("WorkerDict", pid + 4, ansi)("INFO: vLLM sleep mode freed 41.2 GiB" + (_RAY_REPEATED.format(n=7) if ansi else ""))
            )
        lines.append(task("\r" + format_meter(step, total, clock.now - bar_start, prefix="Training Progress", initial=initial)))
        lines.append(task(_step_line(step, items, numpy2)))
        written[step] = {k: v for k, v, _ in items}
        if save_freq > 0 and step % save_freq == 0:
            lines.append(task(f"local_global_step_folder: {folder}/global_step_{step}"))
    return written


def _pick(written: dict[int, dict[str, Any]], steps: Iterable[int], keys: Iterable[str]) -> dict[int, dict[str, Any]]:
    keys = list(keys)
    return {s: {k: written[s][k] for k in keys if k in written[s]} for s in steps}


# --------------------------------------------------------------------------------------------------
# verl traps


def write_verl_config_dump(
    path: Path, *, steps: int = 335, use_kl_loss: bool = False, ansi: bool = True, numpy2: bool = True, seed: int = 1
) -> Truth:
    """A verl GRPO console captured with ``tee`` from the Ray driver: every TaskRunner line behind
    ``\\x1b[36m(TaskRunner pid=N)\\x1b[0m ``, the resolved Hydra config pretty-printed over ~300
    lines by ``main_ppo``'s ``pprint(OmegaConf.to_container(config, resolve=True))`` (nested
    ``'data': {... 'max_response_length': 128 ...}``, ``'actor_rollout_ref': {'actor': {...}}``,
    ``'algorithm': {'kl_ctrl': {'kl_coef': 0.001}}``, ``'trainer': {'total_training_steps': 335}``),
    WorkerDict lines with Ray's dedup suffix, then ``steps`` LocalLogger lines
    (``step:N - key:np.float64(x) - ...``), each after a ``\\rTraining Progress`` bar line.

    Truth: steps 1..N; the settings are the config's (the actor's lr, not the critic's; rollout n,
    not val_kwargs n; KL in effect 0 when neither use_kl_loss nor use_kl_in_reward).
    """
    rng = random.Random(seed)
    cfg = verl_config(total_training_steps=steps, use_kl_loss=use_kl_loss)
    lines: list[str] = []
    pid = 2021996
    task = _verl_startup(lines, cfg, pid=pid, ansi=ansi)
    written = _verl_training(
        lines,
        task,
        rng,
        Clock(),
        first=1,
        last=steps,
        total=steps,
        layout=_VERL_COMPACT,
        numpy2=numpy2,
        kl_loss=use_kl_loss,
        max_len=cfg["data"]["max_response_length"],
        save_freq=cfg["trainer"]["save_freq"],
        folder=cfg["trainer"]["default_local_dir"],
        pid=pid,
        ansi=ansi,
    )
    write_text(path, "\n".join(lines) + "\n")
    keys = ["actor/grad_norm", "critic/score/mean", "response_length/mean", "actor/entropy"]
    if use_kl_loss:
        keys.append("actor/kl_loss")
    all_steps = list(range(1, steps + 1))
    return Truth(path, "verl-console", all_steps, values=_pick(written, spread(all_steps, 5), keys), settings=verl_settings_truth(cfg))


def write_verl_resumed(
    path: Path, *, total: int = 100, crash_after: int = 60, resume_from: int = 50, ansi: bool = True, numpy2: bool = True, seed: int = 4
) -> Truth:
    """Two verl processes in one ``tee -a`` log: the first logs steps 1..``crash_after``, saves
    ``global_step_<resume_from>`` (save_freq) and dies (a RayTaskError); the second prints its
    config again (another pid), ``Load from checkpoint folder: .../global_step_50``, ``Setting
    global step to 50``, ``Resuming from ...`` and logs ``resume_from+1``..``total``.

    Truth: one record per step 1..total; steps resume_from+1..crash_after keep the later values.
    """
    rng = random.Random(seed)
    cfg = verl_config(total_training_steps=total, save_freq=resume_from, total_epochs=5)
    lines: list[str] = []
    written: dict[int, dict[str, Any]] = {}
    clock = Clock()
    folder = cfg["trainer"]["default_local_dir"]
    for attempt, pid in ((1, 1843121), (2, 1907764)):
        task = _verl_startup(lines, cfg, pid=pid, ansi=ansi, resume_from=None if attempt == 1 else resume_from)
        first, last = (1, crash_after) if attempt == 1 else (resume_from + 1, total)
        written.update(
            _verl_training(
                lines,
                task,
                rng,
                clock,
                first=first,
                last=last,
                total=total,
                layout=_VERL_COMPACT,
                numpy2=numpy2,
                kl_loss=False,
                max_len=cfg["data"]["max_response_length"],
                save_freq=resume_from,
                folder=folder,
                pid=pid,
                ansi=ansi,
            )
        )
        if attempt == 1:
            lines += [
                "Traceback (most recent call last):",
                '  File "/work/verl/verl/trainer/main_ppo.py", line 42, in main',
                "    run_ppo(config)",
                "ray.exceptions.RayTaskError(RuntimeError): \x1b[36mray::TaskRunner.run()\x1b[39m (pid=%d, ip=10.0.0.7)" % pid,
                "RuntimeError: NCCL communicator was aborted on rank 3.",
                "",
            ]
    write_text(path, "\n".join(lines) + "\n")
    steps = list(range(1, total + 1))
    picks = sorted({1, resume_from, resume_from + 1, (resume_from + crash_after) // 2, crash_after, crash_after + 1, total})
    return Truth(
        path,
        "verl-console",
        steps,
        values=_pick(written, picks, ["actor/grad_norm", "critic/score/mean", "actor/entropy", "timing_s/step"]),
        settings=verl_settings_truth(cfg),
    )


def write_verl_numpy(path: Path, *, steps: int = 30, ansi: bool = True, seed: int = 7) -> Truth:
    """verl console lines under numpy 2 with every kind of value ``pprint.pformat`` prints: bare
    ints (``global_seqlen/min:238933``), bare floats (``actor/entropy:0.2120...``),
    ``np.float64(x)``, ``np.int32(2)`` (``num_turns/min``), plus the Ray prefix. No config dump.

    Truth: the numbers inside the wrappers, steps 1..N.
    """
    rng = random.Random(seed)
    lines: list[str] = ["Training from scratch"]
    task = _ray("TaskRunner", 733412, ansi)
    clock = Clock()
    written = _verl_training(
        lines,
        task,
        rng,
        clock,
        first=1,
        last=steps,
        total=steps,
        layout=_VERL_ACTOR + _VERL_DATA,
        numpy2=True,
        kl_loss=True,
        max_len=1024,
        save_freq=0,
        folder="checkpoints/x",
        pid=733412,
        ansi=ansi,
    )
    write_text(path, "\n".join(lines) + "\n")
    all_steps = list(range(1, steps + 1))
    return Truth(
        path,
        "verl-console",
        all_steps,
        values=_pick(
            written,
            spread(all_steps, 5),
            [
                "actor/grad_norm",
                "actor/kl_loss",
                "num_turns/min",
                "num_turns/max",
                "global_seqlen/min",
                "actor/entropy",
                "critic/score/mean",
                "perf/total_num_tokens",
            ],
        ),
    )


def _val_block(rng: random.Random, dataset: str, n: int, score: float) -> list[tuple[str, Any, str]]:
    """``_val_metrics_update``: ``val-aux/<ds>/<var>/{mean@n,std@n,best@k/mean,...}`` then ``val-core/<ds>/acc/mean@n``."""
    items: list[tuple[str, Any, str]] = []
    for var in ("reward", "score", "acc"):
        items.append((f"val-aux/{dataset}/{var}/mean@{n}", score + rng.uniform(-0.05, 0.05), "np64"))
        items.append((f"val-aux/{dataset}/{var}/std@{n}", rng.uniform(0.2, 0.5), "np64"))
        k = 2
        while k <= n:
            for agg in ("best", "worst", "maj"):
                items.append((f"val-aux/{dataset}/{var}/{agg}@{k}/mean", score + rng.uniform(-0.3, 0.3), "np64"))
                items.append((f"val-aux/{dataset}/{var}/{agg}@{k}/std", rng.uniform(0.0, 0.4), "np64"))
            k *= 2
    items.append((f"val-core/{dataset}/acc/mean@{n}", score, "np64"))
    return items


def _straddling(step: int, items: list[tuple[str, Any, str]], numpy2: bool) -> tuple[int | None, str]:
    """Which ``key:value`` part the W&B cut falls in, and what of it is left (None: the cut falls
    between parts)."""
    end = len(f"step:{step}")
    for index, (key, value, kind) in enumerate(items):
        start = end + len(" - ")
        part = f"{key}:{_render(value, kind, numpy2)}"
        end = start + len(part)
        if end > WANDB_LINE_LIMIT:
            return (index, part[: WANDB_LINE_LIMIT - start]) if start < WANDB_LINE_LIMIT else (None, "")
    return None, ""


def _cut_kind(part: str, whole_value: str, numpy2: bool) -> str:
    """``value``: the cut leaves ``key:`` and a piece of the value that still looks like one
    (``-0.``, ``0.43``, ``np.float64(0.43``); ``key``: the cut falls inside the key."""
    key, sep, value = part.partition(":")
    if not sep:
        return "key" if len(key) >= 5 and "/" in key else ""
    if value == whole_value:
        return ""
    if numpy2:
        return "value" if value.startswith("np.float64(") and len(value) >= len("np.float64(") + 3 else ""
    try:
        float(value)
    except ValueError:
        return ""
    return "value" if len(value) >= 3 and "." in value else ""


def write_verl_truncated(
    path: Path, *, steps: int = 40, test_freq: int = 10, numpy2: bool = True, val_before_train: bool = True, seed: int = 9
) -> Truth:
    """A verl W&B ``files/output.log`` (the driver's stdout, no Ray prefix): ``Training from
    scratch``, the ``pprint``-ed ``Initial validation metrics`` string (a parenthesised multi-line
    repr), a validation-only ``step:0`` line, then ``step:N`` lines where every ``test_freq``-th
    carries the validation block after the actor keys. W&B keeps 4096 characters of a line: those
    lines end mid-token (a fragment such as ``val-aux/gsm8k/score/best@4/mean:0.43`` that still
    reads as a number when numpy 1 printed bare floats, ``...:np.float64(0.43`` under numpy 2, or a
    key cut in half), and the ``training/``, ``critic/``, ``response_length/`` and ``timing_s/``
    keys after the cut are gone. A stale ``Training Progress`` bar sits mid-file.

    Truth: steps 0..N (0 only when ``val_before_train``); the cut key and the keys after it are
    absent at the cut steps, not zero.
    """
    rng = random.Random(seed)
    lines = [
        "wandb: Detected [openai] in use.",
        "Checkpoint tracker file does not exist: /data/ckpt/qwen2_3b_grpo/latest_checkpointed_iteration.txt",
        "Training from scratch",
    ]
    dataset, n_val = "gsm8k", 16
    written: dict[int, dict[str, Any]] = {}
    absent: dict[int, list[str]] = {}
    cut_steps: list[int] = []
    after_cut = ["training/global_step", "critic/score/mean", "response_length/mean", "timing_s/step"]

    def emit(step: int, items: list[tuple[str, Any, str]], adjustable: list[int], want: str) -> None:
        """Write one step line as W&B keeps it; for a long line, round early values until the cut
        lands where ``want`` says (inside a value, or inside a key)."""
        digits = {i: 17 for i in adjustable}
        order = list(adjustable)
        turn = 0
        while True:
            line = _step_line(step, items, numpy2)
            if len(line) <= WANDB_LINE_LIMIT:
                break
            at, part = _straddling(step, items, numpy2)
            if at is not None and _cut_kind(part, _render(items[at][1], items[at][2], numpy2), numpy2) == want:
                break
            if not order:
                raise ValueError(f"step {step}: no rounding puts the {WANDB_LINE_LIMIT}-character cut inside a {want}")
            i = order[turn % len(order)]
            turn += 1
            if digits[i] <= 3:
                order.remove(i)
                continue
            digits[i] -= 1
            k, v, kind = items[i]
            items[i] = (k, float(f"{v:.{digits[i]}g}"), kind)
        values = {k: v for k, v, _ in items}
        if len(line) <= WANDB_LINE_LIMIT:
            written[step] = values
            lines.append(line)
            return
        at, part = _straddling(step, items, numpy2)
        assert at is not None
        cut_key = items[at][0]
        written[step] = {k: v for k, v, _ in items[:at]}
        lost = [k for k, _, _ in items[at + 1 :]]
        absent[step] = [cut_key] + [k for k in after_cut if k in lost] + lost[-1:]
        if ":" not in part:
            absent[step].append(part)  # the half key itself
        cut_steps.append(step)
        lines.append(line[:WANDB_LINE_LIMIT])

    meta = (
        "test_gen_batch meta info: {'eos_token_id': 151645, 'pad_token_id': 151643, 'recompute_log_prob': False, "
        "'do_sample': False, 'validate': True, 'global_steps': %d}"
    )

    def validation_prints(step: int) -> None:
        lines.append(meta % step)
        lines.append("validation generation end")
        for var in ("reward", "score", "acc"):
            lines.append(f"len reward_extra_infos_dict['{var}']: 1319")

    want_cycle = ["value", "key"]
    if val_before_train:
        validation_prints(0)
        block = _val_block(rng, dataset, n_val, -0.75)
        text = "Initial validation metrics: {" + ", ".join(f"'{k}': {_render(v, kind, numpy2)}" for k, v, kind in block) + "}"
        lines += pprint.pformat(text).splitlines()
        emit(0, block, list(range(0, 12)), want_cycle[0])
    clock_total = 0.0
    for step in range(1, steps + 1):
        items = _verl_step(rng, step, steps, layout=_VERL_ACTOR + _VERL_DATA, epoch_steps=29, max_len=2048)
        clock_total += next(v for k, v, _ in items if k == "timing_s/step")
        if step == steps // 2:
            lines.append(format_meter(19, 27995, clock_total, prefix="Training Progress"))
        if step % test_freq == 0:
            validation_prints(step)
            at = next(i for i, (k, _, _) in enumerate(items) if k == "training/global_step")
            block = _val_block(rng, dataset, n_val, -0.75 + step / steps * 0.2)
            items[at:at] = block
            adjustable = [i for i, (k, _, kind) in enumerate(items[:at]) if kind in ("np64", "float") and k != "actor/lr"]
            emit(step, items, adjustable, want_cycle[len(cut_steps) % 2])
        else:
            emit(step, items, [], "")
        if step % 20 == 0:
            lines.append(f"local_global_step_folder: /data/ckpt/qwen2_3b_grpo/global_step_{step}")
    write_text(path, "\n".join(lines) + "\n")
    all_steps = ([0] if val_before_train else []) + list(range(1, steps + 1))
    values = _pick(
        written, spread(list(range(1, steps + 1)), 5), ["actor/grad_norm", "critic/score/mean", "response_length/mean", "timing_s/step"]
    )
    for step in cut_steps:
        kept_keys = [k for k in (f"val-aux/{dataset}/reward/mean@{n_val}", "actor/grad_norm", "actor/entropy") if k in written[step]]
        values.setdefault(step, {}).update({k: written[step][k] for k in kept_keys})
    return Truth(path, "verl-console", all_steps, values=values, absent=absent, truncated_steps=cut_steps)
