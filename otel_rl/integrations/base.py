"""One protocol for the framework integrations: ``XInstrumentor().instrument()`` / ``.uninstrument()``.

Modelled on opentelemetry-python-contrib's ``BaseInstrumentor``
(``opentelemetry.instrumentation.instrumentor``), so that it reads the same to anyone who has used
an OpenTelemetry instrumentation::

    from otel_rl.integrations.trl import TrlInstrumentor

    TrlInstrumentor().instrument()      # every Trainer built from now on sends its run to otel-rl
    ...
    TrlInstrumentor().uninstrument()    # and the ones built afterwards no longer do

* one instance per subclass (``TrlInstrumentor() is TrlInstrumentor()``);
* ``instrumentation_dependencies()`` names the supported framework versions as pip requirements
  (``"trl >= 0.16"``); ``instrument()`` refuses a framework that does not satisfy them, logging
  the version it found (``raise_exception_on_conflict=True`` raises instead,
  ``skip_dep_check=True`` skips the check);
* ``instrument()`` twice warns and does nothing; ``uninstrument()`` undoes what ``instrument()``
  changed (every change goes through :class:`Patches`), and warns when there is nothing to undo.

One addition: frameworks that load plugins by importing a module (verl's ``verl.plugins`` entry
points, ms-swift's ``--external_plugins``, ROLL's entry script) get instrumented by that import,
which calls :meth:`Instrumentor.instrument_on_import`. That skips the version check (those loaders
worked before there was one), and an explicit ``instrument()`` afterwards re-instruments with its
own options instead of warning.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, MutableMapping, MutableSequence
from dataclasses import dataclass
from typing import Any, ClassVar

from opentelemetry.sdk.environment_variables import OTEL_SERVICE_NAME

from otel_rl import environment_variables as ENV

logger = logging.getLogger("otel_rl")

_ABSENT = object()  # a mapping key or attribute that did not exist before a patch


# --------------------------------------------------------------------------------------------------
# Dependency check


@dataclass(frozen=True)
class DependencyConflict:
    """A framework that is missing or whose installed version an integration does not support."""

    required: str  # the requirement, as instrumentation_dependencies() gives it
    found: str | None  # "trl 0.9.6"; None when the distribution is not installed
    hint: str | None = None  # how to get a supported version

    def __str__(self) -> str:
        found = "it is not installed" if self.found is None else f'found "{self.found}"'
        hint = f" ({self.hint})" if self.hint else ""
        return f'DependencyConflict: requested "{self.required}" but {found}{hint}'


class DependencyConflictError(ImportError):
    """Raised by ``instrument(raise_exception_on_conflict=True)`` for a :class:`DependencyConflict`."""

    def __init__(self, conflict: DependencyConflict) -> None:
        super().__init__(str(conflict))
        self.conflict = conflict


def get_dependency_conflicts(requirements: Collection[str], hint: str | None = None) -> DependencyConflict | None:
    """The first requirement (``"trl >= 0.16"``) the installed distributions do not satisfy, or None."""
    for requirement in requirements:
        name, specifier = _split_requirement(requirement)
        try:
            # Looked up at call time so that tests can monkeypatch importlib.metadata.version.
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return DependencyConflict(requirement, None, hint)
        if not version_satisfies(version, specifier):
            return DependencyConflict(requirement, f"{name} {version}", hint)
    return None


def _split_requirement(requirement: str) -> tuple[str, str]:
    """(distribution name, version specifier) of a pip requirement string."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # packaging is not a dependency of otel-rl (every framework brings it)
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$", requirement)
        if match is None:
            raise ValueError(f"not a requirement: {requirement!r}") from None
        return match.group(1), match.group(2).strip()
    parsed = Requirement(requirement)
    return parsed.name, str(parsed.specifier)


def version_satisfies(version: str, specifier: str) -> bool:
    """Whether ``version`` is in ``specifier`` (``">=0.16,<2"``); pre-releases count as their release."""
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        return _simple_version_satisfies(version, specifier)
    return SpecifierSet(specifier).contains(version, prereleases=True)


_COMPARE: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def _simple_version_satisfies(version: str, specifier: str) -> bool:
    """``version_satisfies`` without packaging: comparisons of the release numbers only."""
    found = _release(version)
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        match = re.match(r"(>=|<=|==|!=|>|<)\s*(\S+)$", clause)
        if match is None:
            raise ValueError(f"unsupported version specifier {clause!r} (install packaging)")
        bound = _release(match.group(2))
        width = max(len(found), len(bound))
        padded = (found + (0,) * (width - len(found)), bound + (0,) * (width - len(bound)))
        if not _COMPARE[match.group(1)](*padded):
            return False
    return bool(found)


# --------------------------------------------------------------------------------------------------
# Patches


class Patches:
    """What an instrumentor changed in a framework, so that ``uninstrument()`` can put it back.

    Undone last-change-first. A change someone else has since overwritten is left alone (their
    patch may wrap ours; removing it would drop theirs too).
    """

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def replace(self, owner: Any, name: str, value: Any) -> None:
        """``setattr(owner, name, value)``; an attribute the owner inherited is deleted again on undo."""
        original = vars(owner).get(name, _ABSENT)
        setattr(owner, name, value)

        def undo() -> None:
            if vars(owner).get(name, _ABSENT) is not value:
                logger.debug("otel-rl: %r.%s was replaced again since; left as it is", owner, name)
            elif original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)

        self._undo.append(undo)

    def set_item(self, mapping: MutableMapping[Any, Any], key: Any, value: Any) -> None:
        """``mapping[key] = value`` (a framework's registry of backends, trackers, callbacks)."""
        original = mapping.get(key, _ABSENT)
        mapping[key] = value

        def undo() -> None:
            if mapping.get(key, _ABSENT) is not value:
                return
            if original is _ABSENT:
                del mapping[key]
            else:
                mapping[key] = original

        self._undo.append(undo)

    def append(self, sequence: MutableSequence[Any], item: Any) -> None:
        """``sequence.append(item)``; undo removes that very item."""
        sequence.append(item)

        def undo() -> None:
            for index, present in enumerate(sequence):
                if present is item:
                    del sequence[index]
                    return

        self._undo.append(undo)

    def on_restore(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` at restore time, in order with the other changes."""
        self._undo.append(undo)

    def restore(self) -> None:
        """Undo every change, the latest first."""
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:  # put back as much as possible
                logger.warning("otel-rl: could not undo a patch", exc_info=True)

    def __len__(self) -> int:
        return len(self._undo)


# --------------------------------------------------------------------------------------------------
# Instrumentor


class Instrumentor(ABC):
    """Base of the framework integrations' instrumentors (see the module docstring).

    A subclass declares ``instrumentation_dependencies()`` and ``pip_extra`` and implements
    ``_instrument(**kwargs)``, making every change to the framework through ``self.patches`` and
    raising ImportError (naming the pip extra) when the framework cannot be imported. It
    overrides ``_uninstrument()`` only for what ``self.patches`` cannot undo.
    """

    pip_extra: ClassVar[str | None] = None  # otel-rl's extra that installs a supported framework
    _instance: ClassVar[Instrumentor | None] = None
    _creation_lock: ClassVar[threading.Lock] = threading.Lock()

    _lock: threading.RLock
    _is_instrumented: bool
    _on_import: bool
    patches: Patches

    def __new__(cls, *args: Any, **kwargs: Any) -> Instrumentor:
        with Instrumentor._creation_lock:
            instance = cls.__dict__.get("_instance")  # this very class's, never a parent's
            if instance is None:
                instance = super().__new__(cls)
                instance._lock = threading.RLock()
                instance._is_instrumented = False
                instance._on_import = False
                instance.patches = Patches()
                cls._instance = instance
        return instance

    # -- what a subclass provides --------------------------------------------------------------
    @abstractmethod
    def instrumentation_dependencies(self) -> Collection[str]:
        """The supported framework versions, as pip requirements: ``("trl >= 0.16", ...)``."""

    @abstractmethod
    def _instrument(self, **kwargs: Any) -> None:
        """Hook otel-rl into the framework, every change through ``self.patches``."""

    def _uninstrument(self, **kwargs: Any) -> None:
        """Undo what ``self.patches`` does not hold (``uninstrument()`` restores the patches after)."""
        return None  # every integration so far changes its framework through self.patches only

    def _check_dependency_conflicts(self) -> DependencyConflict | None:
        hint = f"pip install 'otel-rl[{self.pip_extra}]'" if self.pip_extra else None
        return get_dependency_conflicts(self.instrumentation_dependencies(), hint)

    # -- the protocol ----------------------------------------------------------------------------
    @property
    def is_instrumented(self) -> bool:
        """Whether the framework is instrumented now (by ``instrument()`` or on import)."""
        return self._is_instrumented

    def instrument(self, **kwargs: Any) -> None:
        """Instrument the framework; keyword arguments are the subclass's options.

        ``skip_dep_check=True``: no version check. ``raise_exception_on_conflict=True``: raise
        :class:`DependencyConflictError` for an unsupported version instead of logging it.
        """
        skip_dep_check = bool(kwargs.pop("skip_dep_check", False))
        raise_on_conflict = bool(kwargs.pop("raise_exception_on_conflict", False))
        name = type(self).__name__
        with self._lock:
            if self._is_instrumented and not self._on_import:
                logger.warning(
                    "otel-rl: %s is already instrumented; instrument() does nothing "
                    "(call uninstrument() first to instrument with other options)",
                    name,
                )
                return
            if not skip_dep_check:
                conflict = self._check_dependency_conflicts()
                if conflict is not None:
                    if raise_on_conflict:
                        raise DependencyConflictError(conflict)
                    logger.error("otel-rl: %s did not instrument: %s", name, conflict)
                    return
            if self._is_instrumented:  # instrumented on import: this call's options win
                self._undo({})
            self._apply(kwargs)

    def instrument_on_import(self, **kwargs: Any) -> bool:
        """Instrument as the import of a plugin module does: no version check, nothing when
        already instrumented. Returns whether the framework is instrumented."""
        with self._lock:
            if not self._is_instrumented:
                self._apply(kwargs)
                self._on_import = True
            return True

    def uninstrument(self, **kwargs: Any) -> None:
        """Undo what ``instrument()`` changed; warns when not instrumented."""
        with self._lock:
            if not self._is_instrumented:
                logger.warning("otel-rl: %s is not instrumented; uninstrument() does nothing", type(self).__name__)
                return
            self._undo(kwargs)

    def _apply(self, kwargs: dict[str, Any]) -> None:
        try:
            self._instrument(**kwargs)
        except BaseException:
            self.patches.restore()  # leave the framework as it was
            raise
        self._is_instrumented = True

    def _undo(self, kwargs: dict[str, Any]) -> None:
        try:
            self._uninstrument(**kwargs)
        finally:
            self.patches.restore()
            self._is_instrumented = self._on_import = False


def framework_init_options(framework: str, project_name: Any, experiment_name: Any) -> dict[str, Any]:
    """``otel_rl.init()`` options for a framework's process: its project as ``service.name`` and its
    run or experiment as ``rl.experiment.name``, only as defaults (``OTEL_SERVICE_NAME`` and
    ``OTEL_RL_EXPERIMENT`` win)."""
    options: dict[str, Any] = {"framework": framework}
    if experiment_name and not os.environ.get(ENV.OTEL_RL_EXPERIMENT):
        options["experiment"] = str(experiment_name)
    if project_name and not os.environ.get(OTEL_SERVICE_NAME):
        options["service_name"] = str(project_name)
    return options


class TelemetryOnFirstUse:
    """The process's telemetry, or one started on first use with ``framework``'s options (from the
    environment); a failure to start is said once, naming ``work``, and that work goes unrecorded."""

    def __init__(self, framework: str, work: str) -> None:
        self.framework, self.work = framework, work
        self._tried = False

    def telemetry(self) -> Any:
        import otel_rl

        tel = otel_rl.get_telemetry()
        if tel is not None or self._tried:
            return tel
        self._tried = True
        try:
            return otel_rl.init(**framework_init_options(self.framework, None, None))
        except Exception:  # telemetry must never stop the framework's work
            logger.warning("otel-rl: could not start telemetry for %s; it goes unrecorded", self.work, exc_info=True)
            return None


class GuardedCalls:
    """Calls from a framework's hook into otel-rl that never raise into the framework: a failure is
    reported once per kind of call through the ``otel_rl`` logger, naming ``source`` (``"the verl
    'otel' backend"``); a ``ValueError`` is raised in strict mode, which asks for exactly that."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.reported: set[str] = set()

    def __call__(self, what: str, strict: bool, function: Callable[..., Any], *args: Any) -> None:
        try:
            function(*args)
        except ValueError:
            if strict:
                raise
            self.report(what)
        except Exception:
            self.report(what)

    def report(self, what: str) -> None:
        if what not in self.reported:
            self.reported.add(what)
            logger.warning("otel-rl: %s failed in %s; later calls go on (reported once)", self.source, what, exc_info=True)


__all__ = [
    "DependencyConflict",
    "DependencyConflictError",
    "GuardedCalls",
    "Instrumentor",
    "framework_init_options",
    "Patches",
    "get_dependency_conflicts",
    "version_satisfies",
]
