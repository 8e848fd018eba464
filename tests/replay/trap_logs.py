"""Synthetic training logs that hold the traps real logs hold, each with the truth it was written from:
the pieces every framework's console shares (this module), the Hugging Face / TRL / unsloth traps
(``trap_hf``) and the verl traps (``trap_verl``).

Every ``write_<trap>(path, **knobs) -> Truth`` writes one small file in a framework's exact output
shape and returns what a careful engineer knows about it: the format, the true optimizer steps,
some true values, the settings the log states. The shapes are restated from the code that prints
them (versions as installed here: transformers 5.23, trl 1.16, verl 0.9.1, tqdm 4.70, ray 2.60):

- transformers ``ProgressCallback`` (trainer_callback.py): ``on_train_begin`` opens
  ``tqdm(total=state.max_steps, dynamic_ncols=True)``; ``on_step_end`` calls
  ``training_bar.update(global_step - current_step)``; ``on_log`` writes
  ``self.training_bar.write(str(shallow_logs))``, floats as ``f"{v:.4g}"`` strings in 5.x, as they
  are in 4.x (whose console showed ``epoch`` rounded to 2 decimals), ``total_flos`` dropped.
  ``on_prediction_step`` opens the eval bar ``tqdm(total=len(eval_dataloader), leave=False)``
  at position 1.
- transformers ``Trainer._inner_training_loop`` / ``_finalize_training`` (trainer.py): the
  ``***** Running training *****`` header through ``logger.info`` (stderr), ``Training completed.``,
  then ``self.log(metrics)`` of the ``train_runtime`` summary before ``on_train_end`` closes the bar.
- tqdm ``std.tqdm``: ``format_meter`` (the default bar, 10 cells when not on a terminal), the
  status printer (``"\\r" + text + padding``), ``clear`` / ``refresh`` around ``tqdm.write`` and
  ``moveto`` (``"\\n"`` down, ``"\\x1b[A"`` up) for bars at position > 0. Bars go to stderr,
  unbuffered; ``tqdm.write`` goes to stdout, which is block-buffered when stdout is a file
  (``nohup``, ``> log 2>&1``): that is why dicts come in bursts, or all after training.
- unsloth's trainer banner (``==((====))==  Unsloth - 2x faster free finetuning``).
- verl ``utils/logger/aggregate_logger.py`` ``concat_dict_to_str``: ``step:N`` then
  `` - key:pprint.pformat(v)`` for each number (numpy 2 prints ``np.float64(x)``, numpy 1 ``x``);
  ``trainer/main_ppo.py`` ``pprint(OmegaConf.to_container(config, resolve=True))`` (width 80,
  sorted keys); ``trainer/ppo/ray_trainer.py`` (``Training from scratch``, ``Load from checkpoint
  folder``, ``Setting global step to``, ``Resuming from``, ``local_global_step_folder:``,
  ``pprint(f"Initial validation metrics: {val_metrics}")``, the ``Training Progress`` bar); the
  metric order of a step (actor, validation, training/*, data, timing, throughput).
- Ray's log monitor: ``\\x1b[36m(TaskRunner pid=N)\\x1b[0m `` before each line of an actor, and the
  ``\\x1b[32m [repeated 7x across cluster]\\x1b[0m`` dedup suffix.
- W&B's ``files/output.log``: lines longer than 4096 characters are cut there, the rest dropped.

All content is generated from seeded random numbers: the same knobs give the same bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "WANDB_LINE_LIMIT",
    "Bar",
    "Clock",
    "Console",
    "Np",
    "NpRepr",
    "Tensor",
    "Truth",
    "f32",
    "format_interval",
    "format_meter",
    "g4",
    "plain",
    "spread",
    "write_text",
]

WANDB_LINE_LIMIT = 4096


@dataclass
class Truth:
    """What the file holds, as the code that wrote it knows.

    ``values``: step -> key -> the number the log shows for it (the parser must give that number
    for that step). ``absent``: step -> keys the parser must not give at that step (a key cut off
    by a line limit, keys lost after the cut). ``settings``: canonical setting -> value.
    ``steps`` is None when the log itself cannot tell the steps (``ambiguous``).
    """

    path: Path
    format: str
    steps: list[int] | None
    values: dict[int, dict[str, Any]] = field(default_factory=dict)
    absent: dict[int, list[str]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    segments: int = 1
    truncated_steps: list[int] = field(default_factory=list)
    ambiguous: bool = False
    records: int | None = None  # records in the file, when the steps themselves are unknown


# --------------------------------------------------------------------------------------------------
# Numbers as the frameworks print them


def f32(x: float) -> float:
    """``x`` through a float32, as ``tensor.item()`` returns it (long reprs like 0.21201248466968536)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def g4(v: float) -> str:
    """transformers 5.x ``ProgressCallback.on_log``: ``f"{v:.4g}"``."""
    return f"{v:.4g}"


class Np:
    """A numpy scalar as ``pprint.pformat`` / ``repr`` prints it: ``np.float64(x)`` under numpy 2, ``x`` under 1."""

    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: float | int):
        self.kind = kind
        self.value = value

    def text(self, numpy2: bool) -> str:
        return f"np.{self.kind}({self.value!r})" if numpy2 else repr(self.value)


class Tensor:
    """A 0-d torch tensor in a dict's repr: ``tensor(0.4321, device='cuda:0')`` (4 decimals)."""

    __slots__ = ("value", "device")

    def __init__(self, value: float, device: str | None = "cuda:0"):
        self.value = round(value, 4)
        self.device = device

    def __repr__(self) -> str:
        return f"tensor({self.value:.4f}, device='{self.device}')" if self.device else f"tensor({self.value:.4f})"


class NpRepr:
    """A numpy scalar inside a printed dict (numpy 2 repr)."""

    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: float):
        self.kind = kind
        self.value = value

    def __repr__(self) -> str:
        return f"np.{self.kind}({self.value!r})"


def plain(v: Any) -> Any:
    """The number a printed value stands for."""
    if isinstance(v, (Np, NpRepr, Tensor)):
        return v.value
    return v


# --------------------------------------------------------------------------------------------------
# One process's console in one file: stderr unbuffered, stdout buffered


class Clock:
    def __init__(self, start: float = 0.0):
        self.now = start

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Console:
    """``python train.py > log 2>&1``: stderr (tqdm bars, logging) lands at once; stdout (print,
    ``tqdm.write``) in blocks of ``stdout_block`` bytes (0: line-buffered, as ``python -u``; None:
    only at exit). A killed process loses what its stdout still held."""

    def __init__(self, stdout_block: int | None = 8192, parts: list[str] | None = None):
        self.block = stdout_block
        self.parts: list[str] = parts if parts is not None else []
        self._pending: list[str] = []
        self._pending_bytes = 0
        self.bars: list[Bar] = []

    def err(self, text: str) -> None:
        self.parts.append(text)

    def log(self, line: str) -> None:
        """``logging`` to stderr (transformers' handler has no formatter: the message and a newline)."""
        self.err(line + "\n")

    def out(self, text: str) -> None:
        if self.block == 0:
            self.parts.append(text)
            return
        size = len(text.encode("utf-8"))
        if self.block is not None and self._pending_bytes + size > self.block:
            self.flush()
        self._pending.append(text)
        self._pending_bytes += size

    def print(self, line: str) -> None:
        self.out(line + "\n")

    def flush(self) -> None:
        self.parts.extend(self._pending)
        self._pending.clear()
        self._pending_bytes = 0

    def exit(self) -> None:
        """Normal exit: the interpreter flushes stdout."""
        self.flush()

    def kill(self) -> None:
        """Killed (OOM, preemption): stdout's buffer is lost."""
        self._pending.clear()
        self._pending_bytes = 0
        self.bars.clear()

    def tqdm_write(self, text: str) -> None:
        """``tqdm.write(text)``: clear every bar, print to stdout, redraw the bars."""
        bars = list(self.bars)
        for bar in bars:
            bar.clear()
        self.out(text + "\n")
        for bar in bars:
            bar.display()

    def text(self) -> str:
        self.flush()
        return "".join(self.parts)


def format_interval(t: float) -> str:
    mins, s = divmod(abs(int(t)), 60)
    h, m = divmod(mins, 60)
    sign = "-" if t < 0 else ""
    return f"{sign}{h:d}:{m:02d}:{s:02d}" if h else f"{sign}{m:02d}:{s:02d}"


_BAR_CHARS = " " + "".join(map(chr, range(0x258F, 0x2587, -1)))  # " ▏▎▍▌▋▊▉█"


def format_meter(n: int, total: int, elapsed: float, prefix: str = "", unit: str = "it", initial: int = 0) -> str:
    """tqdm's ``format_meter`` for the default bar format and no terminal width (10 bar cells)."""
    elapsed_str = format_interval(elapsed)
    rate = (n - initial) / elapsed if elapsed else None
    inv_rate = 1 / rate if rate else None
    rate_noinv_fmt = (f"{rate:5.2f}" if rate else "?") + unit + "/s"
    rate_inv_fmt = (f"{inv_rate:5.2f}" if inv_rate else "?") + "s/" + unit
    rate_fmt = rate_inv_fmt if inv_rate and inv_rate > 1 else rate_noinv_fmt
    remaining = (total - n) / rate if rate and total else 0
    remaining_str = format_interval(remaining) if rate else "?"
    l_bar = (prefix if prefix[-2:] == ": " else prefix + ": ") if prefix else ""
    frac = n / total
    l_bar += f"{frac * 100:3.0f}%|"
    nsyms = len(_BAR_CHARS) - 1
    full, part = divmod(int(frac * 10 * nsyms), nsyms)
    bar = _BAR_CHARS[-1] * full
    if full < 10:
        bar += _BAR_CHARS[part] + _BAR_CHARS[0] * (10 - full - 1)
    return f"{l_bar}{bar}| {n}/{total} [{elapsed_str}<{remaining_str}, {rate_fmt}]"


class Bar:
    """A tqdm bar on the console's stderr, drawn as ``std.tqdm`` draws it."""

    def __init__(
        self, con: Console, clock: Clock, total: int, desc: str = "", pos: int = 0, leave: bool = True, unit: str = "it", initial: int = 0
    ):
        self.con, self.clock, self.total, self.desc = con, clock, total, desc
        self.pos, self.leave, self.unit, self.initial = pos, leave, unit, initial
        self.n = initial
        self.last_len = 0
        self.start: float | None = None
        con.bars.append(self)
        self.display()  # tqdm refreshes once at creation (delay=0), before its clock starts
        self.start = clock.now

    def text(self) -> str:
        elapsed = self.clock.now - self.start if self.start is not None else 0.0
        return format_meter(self.n, self.total, elapsed, prefix=self.desc, unit=self.unit, initial=self.initial)

    def _sp(self, s: str) -> None:
        self.con.err("\r" + s + " " * max(self.last_len - len(s), 0))
        self.last_len = len(s)

    def _moveto(self, n: int) -> None:
        self.con.err("\n" * n + "\x1b[A" * -n)

    def display(self, msg: str | None = None) -> None:
        if self.pos:
            self._moveto(self.pos)
        self._sp(self.text() if msg is None else msg)
        if self.pos:
            self._moveto(-self.pos)

    def update(self, k: int = 1) -> None:
        if k:
            self.n += k
            self.display()

    def clear(self) -> None:
        self._moveto(self.pos)
        self._sp("")
        self.con.err("\r")
        self._moveto(-self.pos)

    def close(self) -> None:
        if self in self.con.bars:
            self.con.bars.remove(self)
        if self.leave:
            self.display()
            self.con.err("\n")
        else:
            self.display(msg="")
            if not self.pos:
                self.con.err("\r")


def spread(steps: list[int], count: int = 4) -> list[int]:
    """First, last and a few in between."""
    if len(steps) <= count:
        return list(steps)
    picks = {steps[0], steps[-1]}
    for i in range(1, count - 1):
        picks.add(steps[i * (len(steps) - 1) // (count - 1)])
    return sorted(picks)


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
