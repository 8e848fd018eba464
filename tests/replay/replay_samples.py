"""Synthetic logs written the way each framework writes them (its own formatting code, restated).

Sources read for the exact formats:
- verl ``verl/utils/logger/aggregate_logger.py`` ``concat_dict_to_str``: ``step:{step}`` then
  `` - {k}:{v:.3f}`` (older verl) or `` - {k}:{pprint.pformat(v)}`` (newer), numbers only;
  ``verl/utils/tracking.py`` ``FileLogger``: ``orjson.dumps({"step": step, "data": data})``.
- transformers ``ProgressCallback.on_log``: floats as ``f"{v:.4g}"`` strings (newer) or as they
  are (older), ``total_flos`` dropped, ``self.training_bar.write(str(shallow_logs))`` (tqdm.write).
- ROLL ``roll/utils/tracking.py`` ``StdoutTracker``: ``logger.info(f"metrics_tag: {json.dumps(...)}")``.
- ms-swift ``logging.jsonl``: ``json.dumps`` of the logs plus its progress fields.
"""

from __future__ import annotations

import io
import json
import math
import pprint
import random
from typing import Any

Steps = list[tuple[int, dict[str, Any]]]


def steps(n: int = 30, seed: int = 0, every: int = 1) -> Steps:
    rng = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        s = i * every
        out.append(
            (
                s,
                {
                    "loss": round(rng.uniform(-0.01, 0.01), 6),
                    "grad_norm": round(rng.uniform(0.2, 2.0), 6),
                    "learning_rate": 1e-6,
                    "kl": round(rng.uniform(0.001, 0.05), 6),
                    "reward": round(rng.uniform(0, 2), 6),
                    "completions/mean_length": round(rng.uniform(100, 300), 3),
                    "completions/clipped_ratio": round(rng.uniform(0, 0.1), 6),
                },
            )
        )
    return out


def swift(data: Steps, max_steps: int = 100, speed_key: str = "train_speed(iter/s)") -> str:
    lines = []
    for step, values in data:
        row = dict(values)
        row.update(
            {
                "epoch": round(step / max_steps, 8),
                "global_step/max_steps": f"{step}/{max_steps}",
                "percentage": f"{step / max_steps * 100:.2f}%",
                "elapsed_time": f"{step * 75 // 60}m {step * 75 % 60}s",
                "remaining_time": "1h 0m 0s",
                "memory(GiB)": 55.3,
                speed_key: 0.0133,
            }
        )
        lines.append(json.dumps(row))
    return "\n".join(lines) + "\n"


def trainer_state(data: Steps, max_steps: int = 100, logging_steps: int = 1) -> str:
    history = [{**values, "step": step} for step, values in data]
    state = {
        "best_metric": None,
        "epoch": 1.0,
        "global_step": data[-1][0],
        "log_history": history,
        "logging_steps": logging_steps,
        "max_steps": max_steps,
        "save_steps": 50,
        "train_batch_size": 4,
    }
    return json.dumps(state, indent=2)


def hf_console(data: Steps, total: int, *, string_floats: bool = True) -> str:
    """Write what a Trainer prints to a non-terminal: tqdm bar refreshes (\\r) and tqdm.write lines."""
    from tqdm.auto import tqdm

    buf = io.StringIO()
    bar = tqdm(total=total, file=buf, mininterval=0, ascii=False, dynamic_ncols=False, ncols=100)
    done = 0
    for step, values in data:
        bar.update(step - done)
        done = step
        logs = {k: (f"{v:.4g}" if string_floats and isinstance(v, float) else v) for k, v in values.items()}
        logs["epoch"] = round(step / total, 2)
        bar.write(str(logs), file=buf)
    bar.close()
    return "Some warning printed before training\n" + buf.getvalue()


def verl_console(data: Steps, *, pformat: bool = True, ray_prefix: bool = True, colours: bool = True) -> str:
    lines = []
    for step, values in data:
        out = [f"step:{step}"]
        for k, v in values.items():
            out.append(f"{k}:{pprint.pformat(v)}" if pformat else f"{k}:{v:.3f}")
        text = " - ".join(out)
        if ray_prefix:
            prefix = "(TaskRunner pid=2748391) "
            if colours:
                prefix = "\x1b[36m(TaskRunner pid=2748391)\x1b[0m "
            text = prefix + text
        lines.append(text)
    return "\n".join(["(TaskRunner pid=2748391) Training from scratch", *lines]) + "\n"


def verl_jsonl(data: Steps) -> str:
    lines = []
    for step, values in data:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}
        lines.append(json.dumps({"step": step, "data": clean}, separators=(",", ":")))
    return "\n".join(lines) + "\n"


def roll_stdout(data: Steps, *, start: str = "2025-06-01 10:00:{:02d},123") -> str:
    lines = ["[2025-06-01 09:59:59,000] [pipeline.py (120)] [INFO] start training"]
    for i, (step, values) in enumerate(data):
        prefix = f"[{start.format(i % 60)}] [tracking.py (112)] [INFO] "
        lines.append(prefix + f"metrics_tag: {json.dumps({'step': step, 'metrics': values})}")
    return "\n".join(lines) + "\n"
