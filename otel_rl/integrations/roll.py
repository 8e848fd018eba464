"""ROLL: ``track_with: otel`` in a pipeline's YAML sends every metric ROLL logs through otel-rl.

ROLL (alibaba/ROLL) builds its tracker by name from ``roll.utils.tracking.tracker_registry``
(``create_tracker(track_with, config, **tracker_kwargs)`` in ``BasePipeline.__init__``).
Importing this module adds :class:`OtelTracker` there as ``"otel"`` when ROLL is installed
(:class:`RollInstrumentor` instrumented on import; ``RollInstrumentor().instrument()`` does the
same with a version check, ``uninstrument()`` takes it out again), so the pipeline's entry script
needs one line, ``import otel_rl.integrations.roll``, and its YAML::

    track_with: otel
    tracker_kwargs:              # optional: any otel_rl.init() option
      endpoint: http://collector:4318
      service_name: rlvr-qwen

Keys arrive with ROLL's reducer tags stripped (``actor/pg_loss@sum`` -> ``actor/pg_loss``),
exactly as ROLL's own trackers strip them; ``time/*`` and ``memory/*`` keys resolve through
otel-rl's ROLL mapping. When ROLL's own tracing is on (``ROLL_OTEL_ENABLED=1``: it installs an
SDK TracerProvider as the global one), otel-rl adds its span processors to that provider instead
of creating a second one, so ROLL's spans land next to otel-rl's. ROLL then points
``OTEL_EXPORTER_OTLP_ENDPOINT`` at its private traces-only collector, so unless
``tracker_kwargs`` names an ``endpoint`` or ``exporters``, otel-rl writes its run folder.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import threading
from collections.abc import Collection, Mapping, MutableMapping
from typing import Any

import otel_rl
from otel_rl.integrations.base import DependencyConflict, Instrumentor, get_dependency_conflicts
from otel_rl.semconv import attributes as A

logger = logging.getLogger("otel_rl")

TRACKER_NAME = "otel"
FRAMEWORK = A.RlFrameworkValues.ROLL.value
ROLL_REQUIREMENT = "roll >= 0.1"
ROLL_HINT = "ROLL is not on PyPI: install it from https://github.com/alibaba/ROLL"
ROLL_TRACING_ENV = "ROLL_OTEL_ENABLED"  # roll/utils/telemetry.py: "1" turns ROLL's tracing on
# otel_rl.init() options a ROLL YAML may set in tracker_kwargs.
OPTIONS = frozenset(inspect.signature(otel_rl.init).parameters) - {"framework", "tracer_provider"}


def strip_metric_tags(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with ROLL's reducer tags removed from the keys, as ROLL's trackers do
    (roll/utils/tracking.py ``_strip_metric_tag``): the last ``@tag`` goes, nested dicts too."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = key.rsplit("@", 1)[0] if isinstance(key, str) and "@" in key else key
        out[name] = strip_metric_tags(value) if isinstance(value, dict) else value
    return out


def _global_sdk_tracer_provider() -> Any:
    """The global TracerProvider when a program installed an SDK one (ROLL's tracing), else None."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    provider = trace.get_tracer_provider()
    return provider if isinstance(provider, TracerProvider) else None


class OtelTracker:
    """A ROLL tracker (``roll.utils.tracking.BaseTracker``'s ``log(values, step)``, ``finish()``).

    ``config`` is the pipeline config dict ROLL passes (logged once as hyperparameters; its
    ``exp_name`` becomes ``rl.experiment.name``); ``tracker_kwargs`` are ``otel_rl.init()``
    options. Telemetry starts at the first ``log()``: ROLL builds its tracker before it installs
    its own TracerProvider. The telemetry of an earlier ``otel_rl.init()`` is reused as is.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **tracker_kwargs: Any) -> None:
        unknown = sorted(set(tracker_kwargs) - OPTIONS)
        if unknown:
            raise TypeError(
                f"unknown tracker_kwargs for the {TRACKER_NAME!r} tracker: {', '.join(unknown)}; "
                f"accepted: the keyword options of otel_rl.init() ({', '.join(sorted(OPTIONS))})"
            )
        self.config = config
        self.options = dict(tracker_kwargs)
        self._telemetry: otel_rl.Telemetry | None = None
        self._owned = False
        self._closed = False
        self._lock = threading.Lock()  # ROLL may log from its resume thread while the loop runs
        self._reported: set[str] = set()

    @property
    def telemetry(self) -> otel_rl.Telemetry:
        """The telemetry this tracker logs into (started on first use)."""
        if self._telemetry is None:
            with self._lock:
                if self._telemetry is None:
                    self._telemetry = self._start()
        return self._telemetry

    def _start(self) -> otel_rl.Telemetry:
        current = otel_rl.get_telemetry()
        if current is not None:
            return current
        options: dict[str, Any] = {"framework": FRAMEWORK, **self.options}
        experiment = self.config.get("exp_name") if isinstance(self.config, Mapping) else None
        if experiment and "experiment" not in options and not os.environ.get("OTEL_RL_EXPERIMENT"):
            options["experiment"] = str(experiment)
        provider = _global_sdk_tracer_provider()
        if provider is not None:
            options["tracer_provider"] = provider
            if os.environ.get(ROLL_TRACING_ENV) == "1" and not {"endpoint", "exporters"} & set(self.options):
                options["exporters"] = "file"
        telemetry = otel_rl.init(**options)
        self._owned = True
        if isinstance(self.config, Mapping) and self.config:
            self._guard("log_hparams", telemetry.log_hparams, self.config)
        return telemetry

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """One step's metrics; ``kwargs`` (TensorBoard's walltime and the like) are ignored."""
        if self._closed:
            return
        if not isinstance(values, Mapping):
            self._report("log", f"values must be a dict, got {type(values).__name__}")
            return
        self._guard("log", lambda: self.telemetry.log(strip_metric_tags(values), step=step))

    def finish(self) -> None:
        """Flush; shut the telemetry down if this tracker started it. Safe to call twice."""
        if self._closed or self._telemetry is None:
            self._closed = True
            return
        self._closed = True
        self._guard("finish", self._telemetry.shutdown if self._owned else self._telemetry.flush)

    def _guard(self, what: str, function: Any, *args: Any) -> None:
        try:
            function(*args)
        except ValueError:
            if self._telemetry is not None and self._telemetry.config.strict:
                raise
            self._report(what)
        except Exception:
            self._report(what)

    def _report(self, what: str, why: str | None = None) -> None:
        if what not in self._reported:
            self._reported.add(what)
            logger.warning(
                "otel-rl: the ROLL %r tracker failed in %s%s; later calls go on (reported once)",
                TRACKER_NAME,
                what,
                f": {why}" if why else "",
                exc_info=why is None,
            )


def register() -> bool:
    """Add :class:`OtelTracker` to ROLL's ``tracker_registry`` as ``"otel"`` (what importing this
    module does: :class:`RollInstrumentor` instrumented on import). Returns False when ROLL is not
    installed (the PyPI package ``roll`` is another project)."""
    if not _roll_installed():
        return False
    try:
        _tracker_registry()
    except ImportError as exc:
        logger.warning("otel-rl: %s; track_with: %s is not available", exc, TRACKER_NAME)
        return False
    return RollInstrumentor().instrument_on_import()


def _tracker_registry() -> MutableMapping[str, Any]:
    """ROLL's ``roll.utils.tracking.tracker_registry``; ImportError when it cannot be had."""
    try:
        tracking = importlib.import_module("roll.utils.tracking")
    except Exception as exc:  # ROLL's import pulls torch and its own dependencies
        raise ImportError(f"ROLL is installed but roll.utils.tracking could not be imported ({type(exc).__name__}: {exc})") from exc
    registry = getattr(tracking, "tracker_registry", None)
    if not isinstance(registry, dict):
        raise ImportError("roll.utils.tracking has no tracker_registry dict: not a ROLL version otel-rl knows")
    return registry


class RollInstrumentor(Instrumentor):
    """``track_with: otel`` builds an :class:`OtelTracker` (ROLL's ``tracker_registry["otel"]``).

    ``instrument()`` takes no options (the tracker takes them from ``tracker_kwargs``);
    ``uninstrument()`` takes ``"otel"`` out of the registry again.

    ROLL is not on PyPI and often runs from its git checkout: it is recognised by its
    ``roll.utils.tracking`` module, and its version is checked when it was pip-installed
    (distribution ``roll``, a name it shares with an unrelated PyPI project).
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        # alibaba/ROLL's pyproject.toml version; the tracker interface is that of commit 8eb27cc2.
        return (ROLL_REQUIREMENT,)

    def _check_dependency_conflicts(self) -> DependencyConflict | None:
        if not _roll_installed():
            try:
                found: str | None = f"roll {importlib.metadata.version('roll')} without roll.utils.tracking"
            except importlib.metadata.PackageNotFoundError:
                found = None
            return DependencyConflict(ROLL_REQUIREMENT, found, ROLL_HINT)
        try:
            importlib.metadata.version("roll")
        except importlib.metadata.PackageNotFoundError:
            return None  # a checkout on sys.path: no version to check
        return get_dependency_conflicts(self.instrumentation_dependencies(), ROLL_HINT)

    def _instrument(self) -> None:
        if not _roll_installed():
            raise ImportError(f"otel_rl.integrations.roll found no ROLL (roll.utils.tracking); {ROLL_HINT}")
        self.patches.set_item(_tracker_registry(), TRACKER_NAME, OtelTracker)


def _roll_installed() -> bool:
    try:
        return importlib.util.find_spec("roll.utils.tracking") is not None
    except (ImportError, ValueError):  # no roll, or a `roll` package without roll.utils
        return False


# Imported from a ROLL entry script: register now, before the pipeline builds its tracker.
register()
