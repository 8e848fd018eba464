"""Experiment-tracker backends: the base class, the registry and the factory.

A tracker receives each step's exact ``key -> value`` map (the payload of an ``rl.log`` event)
and writes it to one experiment tracker. Backends are configured exactly as ROLL configures its
trackers in YAML::

    track_with: wandb                 # one name: tracker_kwargs are that tracker's kwargs
    tracker_kwargs:
      api_key: ...
      project: my-project

    track_with: [tensorboard, wandb]  # a list: tracker_kwargs maps tracker name -> its kwargs
    tracker_kwargs:
      tensorboard: {log_dir: /logs/tb}
      wandb: {project: my-project}

Built-in names: ``tensorboard``, ``wandb``, ``swanlab``, ``stdout``, ``jsonl``, ``mlflow``.
Third parties add theirs with :func:`register_tracker`. Built-ins are registered as
``"module:Class"`` strings, so importing otel_rl imports no tracker library; each backend
imports its library in :meth:`Tracker.start`.

Lifecycle: ``__init__`` validates and stores settings (no I/O, so every tracker of a list is
checked before any is opened), ``start()`` opens the backend, then ``log()`` per step, ``flush()``
when asked and ``finish()`` once. One tracker instance is driven by one thread at a time (the
caller serialises); backend errors are raised to the caller, never swallowed here.

Secrets (API keys, login settings) are named by each backend's ``secret_keys``: they are masked
in ``repr()`` and :func:`redact`, scrubbed from exceptions raised by the backend library and
from hparams, and never handed to a library call that stores them (no ``wandb.login``, no
``.netrc``; no login at all in offline modes).
"""

from __future__ import annotations

import abc
import functools
import importlib
import importlib.util
import inspect
import logging
import math
import numbers
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from otel_rl.reporting import LOGGER_NAME, ReportOnce

__all__ = ["REDACTED", "Tracker", "TrackerError", "create_trackers", "known_trackers", "redact", "register_tracker"]

_logger = logging.getLogger(LOGGER_NAME)
T = TypeVar("T")

REDACTED = "***"
# Key -> name rewrites a tracker or the fan-out keeps (tags, sanitized names): far above a run's key
# count; past it (a step or a sample id inside every key) names are rewritten each time, not kept.
NAME_CACHE_LIMIT = 1 << 14
# A key with this name is treated as a secret at any depth, whatever the backend declares:
# it is the one name every tracker library uses for its credential.
_ALWAYS_SECRET_NAMES = frozenset({"api_key"})
# Secret values shorter than this are still masked by path, but not searched for in free text
# (replacing every "ab" in an error message would garble it and protect nothing).
_MIN_SCRUB_LENGTH = 4

_BUILTINS: dict[str, str] = {
    "tensorboard": "otel_rl.trackers.tensorboard:TensorBoardTracker",
    "wandb": "otel_rl.trackers.wandb:WandbTracker",
    "swanlab": "otel_rl.trackers.swanlab:SwanlabTracker",
    "stdout": "otel_rl.trackers.stdout:StdoutTracker",
    "jsonl": "otel_rl.trackers.jsonl:JsonlTracker",
    "mlflow": "otel_rl.trackers.mlflow:MlflowTracker",
}
_registry: dict[str, type[Tracker] | str] = dict(_BUILTINS)


def _takes_step_first(log: Callable[..., Any]) -> bool:
    """A ``log(self, step, values)`` written before trackers took ``Telemetry.log``'s order."""
    try:
        params = list(inspect.signature(log).parameters)
    except (TypeError, ValueError):
        return False
    return params[1:3] == ["step", "values"]


def _values_first(log: Callable[..., Any], class_name: str) -> Callable[..., Any]:
    warnings.warn(
        f"otel-rl: tracker {class_name}.log(self, step, values) is the old argument order; "
        "write log(self, values, step=None) (it is adapted for now)",
        DeprecationWarning,
        stacklevel=3,
    )

    @functools.wraps(log)
    def adapted(self: Any, values: Mapping[str, Any], step: int | None = None) -> None:
        log(self, step, values)

    return adapted


class TrackerError(RuntimeError):
    """A backend failure whose original message or traceback contained a secret (now scrubbed)."""


class Tracker(abc.ABC):
    """One experiment-tracker backend.

    Subclasses set ``name`` (the ``track_with`` name), ``extra`` (the otel-rl pip extra that
    installs the library; also the module checked for, unless :meth:`library_available` is
    overridden), ``options`` (accepted ``tracker_kwargs`` and their defaults; ``None`` accepts
    anything) and ``secret_keys`` (dotted paths into the kwargs that hold secrets).
    """

    name: ClassVar[str]
    extra: ClassVar[str | None] = None
    secret_keys: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[Mapping[str, Any] | None] = None

    def __init__(self, *, run_name: str, run_dir: Path | None, **tracker_kwargs: Any) -> None:
        if self.options is not None:
            unknown = sorted(set(tracker_kwargs) - set(self.options))
            if unknown:
                raise TypeError(
                    f"unknown tracker_kwargs for the {self.name!r} tracker: {', '.join(unknown)};"
                    f" accepted keys: {', '.join(sorted(self.options))}"
                )
        if not self.library_available():
            raise ImportError(f"the {self.name!r} tracker needs the {self.extra} library: pip install 'otel-rl[{self.extra}]'")
        self.run_name = run_name
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.kwargs: dict[str, Any] = dict(tracker_kwargs)
        # The settings backends read: defaults overlaid with what was given.
        self.settings: dict[str, Any] = {**(self.options or {}), **tracker_kwargs}
        self._secrets = _secret_values(self.kwargs, self.secret_keys)
        self._report = ReportOnce(_logger)

    @classmethod
    def library_available(cls) -> bool:
        """Whether the backend library can be imported (checked without importing it)."""
        return cls.extra is None or importlib.util.find_spec(cls.extra) is not None

    def start(self, hparams: Mapping[str, Any] | None = None) -> None:
        """Open the backend (import its library here). The default only logs ``hparams``."""
        if hparams:
            self.log_hparams(hparams)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        log = cls.__dict__.get("log")
        if callable(log) and _takes_step_first(log):
            cls.log = _values_first(log, cls.__name__)  # type: ignore[method-assign]

    @abc.abstractmethod
    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        """Write one step: numbers as scalars, strings where the backend takes text. The argument
        order is ``Telemetry.log``'s: values, then step."""

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Record the run's configuration. Default: nothing."""

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int | None) -> None:
        """Show one step's rollout samples (``rl.sample`` bodies: prompt, response, reward,
        ``rewards/<part>``, ...; see :mod:`otel_rl.trackers.samples`) as the backend's users expect
        them: a table. A step's samples usually come in one call, rarely in two. Default: nothing."""

    def flush(self) -> None:
        """Push buffered data to the backend's storage. Default: nothing."""

    @abc.abstractmethod
    def finish(self) -> None:
        """Flush and close the backend. Called once."""

    def __repr__(self) -> str:
        kwargs = redact(self.kwargs, self.secret_keys)
        return f"{type(self).__name__}(run_name={self.run_name!r}, run_dir={self.run_dir!r}, kwargs={kwargs!r})"

    # ---- helpers for backends ------------------------------------------------------------

    def scrub(self, text: str) -> str:
        """``text`` with every secret of this tracker's kwargs replaced by ``***``."""
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text

    def scrub_hparams(self, hparams: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``hparams`` safe to store: ``api_key`` entries and secret values masked.

        Training configs often embed the tracker kwargs themselves (ROLL's does), so the key
        would otherwise land in the tracker's own config panel.
        """
        return _scrub_tree(redact(hparams, ()), self.scrub)

    def backend_call(self, what: str, function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``function(*args, **kwargs)``, a backend library call, with its errors made key-safe.

        When this tracker holds secrets, any error becomes a :class:`TrackerError` whose message
        is the original's (and its causes'), scrubbed, with no reference to the original: a
        library may echo the key in a message, in exception args, or in the local variables of
        its frames, which debuggers and error reporters print. Without secrets, errors propagate
        unchanged. Pass the key inside ``function`` (a closure), not in ``args``/``kwargs``.
        (A function, not a ``with`` block: an exception raised from ``__exit__`` would carry the
        original as its ``__context__``.)
        """
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            if not self._secrets:
                raise
            message = self.scrub(_describe(exc))
        del function, args, kwargs  # this frame is in the new traceback: keep nothing secret in it
        raise TrackerError(f"{self.name} tracker: {what} failed: {message}")

    def report_once(self, key: str, why: str) -> None:
        """Say once per (key, reason) that a value was left out, so a skip is never silent."""
        self._report((key, why), "%s tracker: %r %s", self.name, key, why, level=logging.INFO)

    def default_dir(self, setting: str, subdir: str) -> Path:
        """``settings[setting]`` if given, else ``run_dir/subdir``; an error if neither exists."""
        given = self.settings.get(setting)
        if given:
            return Path(given)
        if self.run_dir is None:
            raise ValueError(f"the {self.name!r} tracker needs {setting!r} in tracker_kwargs or a run_dir")
        return self.run_dir / subdir


# ---- value conversion shared by the backends --------------------------------------------


def to_scalar(value: Any) -> int | float | None:
    """A number as a Python int or float (bools as 0/1); ``None`` for anything else."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return None


def is_finite(value: int | float) -> bool:
    return isinstance(value, int) or math.isfinite(value)


def flatten(mapping: Mapping[str, Any], sep: str = "/", prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level: ``{"a": {"b": 1}}`` -> ``{"a/b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, sep, name))
        else:
            flat[name] = value
    return flat


# ---- secrets ------------------------------------------------------------------------------


def redact(kwargs: Mapping[str, Any], secret_paths: Iterable[str]) -> dict[str, Any]:
    """A deep copy of ``kwargs`` with secrets replaced by ``"***"``, for printing.

    ``secret_paths`` are dotted paths (``"api_key"``, ``"login_kwargs.api_key"``); a path that
    names a mapping masks all of it. Keys named ``api_key`` are masked at any depth.
    """
    paths = {tuple(path.split(".")) for path in secret_paths}
    return _redact(kwargs, (), paths)


def _redact(mapping: Mapping[str, Any], prefix: tuple[str, ...], paths: set[tuple[str, ...]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        path = (*prefix, str(key))
        if path in paths or key in _ALWAYS_SECRET_NAMES:
            out[key] = REDACTED if value is not None else None
        elif isinstance(value, Mapping):
            out[key] = _redact(value, path, paths)
        elif isinstance(value, (list, tuple)):
            out[key] = [_redact(v, path, paths) if isinstance(v, Mapping) else v for v in value]
        else:
            out[key] = value
    return out


def _secret_values(kwargs: Mapping[str, Any], secret_paths: Iterable[str]) -> tuple[str, ...]:
    """Every string at a secret path (or under it), longest first so overlaps scrub fully."""
    paths = {tuple(path.split(".")) for path in secret_paths}
    found: set[str] = set()

    def leaves(value: Any) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, Mapping):
            for v in value.values():
                yield from leaves(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from leaves(v)

    def walk(mapping: Mapping[str, Any], prefix: tuple[str, ...]) -> None:
        for key, value in mapping.items():
            path = (*prefix, str(key))
            if path in paths or key in _ALWAYS_SECRET_NAMES:
                found.update(leaves(value))
            elif isinstance(value, Mapping):
                walk(value, path)

    walk(kwargs, ())
    # Libraries often echo a key stripped of surrounding whitespace (while complaining about it).
    found |= {s.strip() for s in found}
    return tuple(sorted((s for s in found if len(s) >= _MIN_SCRUB_LENGTH), key=len, reverse=True))


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an exception and of each cause or context it chains to."""
    parts, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append("".join(traceback.format_exception_only(type(current), current)).strip())
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return "; caused by ".join(parts)


def _scrub_tree(value: Any, scrub: Any) -> Any:
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, Mapping):
        return {k: _scrub_tree(v, scrub) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub_tree(v, scrub) for v in value]
    return value


# ---- registry and factory -------------------------------------------------------------------


def register_tracker(name: str, cls: type[Tracker] | str) -> None:
    """Make ``track_with: name`` create ``cls``.

    ``cls`` is a :class:`Tracker` subclass or a ``"module:Class"`` string imported on first
    use. Registering an existing name replaces it (a third party may override a built-in).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tracker name must be a non-empty string, not {name!r}")
    if isinstance(cls, str):
        if cls.count(":") != 1 or not all(cls.split(":")):
            raise ValueError(f"a lazily registered tracker is 'module:Class', not {cls!r}")
    elif not (isinstance(cls, type) and issubclass(cls, Tracker)):
        raise TypeError(f"tracker {name!r}: {cls!r} is not a Tracker subclass")
    _registry[name] = cls


def known_trackers() -> list[str]:
    """The registered tracker names, sorted."""
    return sorted(_registry)


def _resolve(name: str) -> type[Tracker]:
    try:
        entry = _registry[name]
    except KeyError:
        raise ValueError(f"unknown tracker {name!r}; known trackers: {', '.join(known_trackers())}") from None
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        try:
            entry = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ImportError(f"tracker {name!r}: cannot import {module_name}:{attr}: {exc}") from exc
        if not (isinstance(entry, type) and issubclass(entry, Tracker)):
            raise TypeError(f"tracker {name!r}: {module_name}:{attr} is not a Tracker subclass")
        _registry[name] = entry
    return entry


def create_trackers(
    track_with: str | Sequence[str] | None, tracker_kwargs: Mapping[str, Any] | None, *, run_name: str, run_dir: Path | None
) -> list[Tracker]:
    """The trackers that ``track_with`` names, configured but not started.

    ``track_with`` is one name (then ``tracker_kwargs`` are that tracker's kwargs, exactly as in
    ROLL's YAML) or a list of names (then ``tracker_kwargs`` maps each name to its kwargs; a
    name without an entry gets none). ``None`` or empty means no tracker.

    Raises ``ValueError`` for an unknown or repeated name (listing the known ones) or for a
    ``tracker_kwargs`` entry that names no listed tracker; ``ImportError`` naming the pip extra
    for a missing library; ``TypeError`` naming the accepted keys for an unknown kwarg.
    Nothing is opened, so an error leaves nothing behind.
    """
    if not track_with:
        return []
    tracker_kwargs = dict(tracker_kwargs or {})
    if isinstance(track_with, str):
        per_tracker = {track_with: tracker_kwargs}
        names = [track_with]
    else:
        names = list(track_with)
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"track_with names a tracker more than once: {', '.join(repeated)}")
        stray = sorted(set(tracker_kwargs) - set(names))
        if stray:
            raise ValueError(
                "with a list track_with, tracker_kwargs maps tracker name -> its kwargs;"
                f" {', '.join(map(repr, stray))} is not in track_with {names}"
            )
        per_tracker = {n: tracker_kwargs.get(n) or {} for n in names}
    trackers = []
    for name in names:
        cls = _resolve(name)
        kwargs = per_tracker[name]
        if not isinstance(kwargs, Mapping):
            raise TypeError(f"tracker_kwargs for {name!r} must be a mapping, not {type(kwargs).__name__}")
        trackers.append(cls(run_name=run_name, run_dir=run_dir, **kwargs))
    return trackers
