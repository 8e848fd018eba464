"""Find one step's trace in Jaeger through its query API (``/api/services``, ``/api/traces``).

Jaeger searches one service at a time, by operation and tags, over a time window, and answers
whole traces. Step N of a run is the trace whose ``rl.step`` root span has the tags
``rl.step=N`` (and ``rl.run.id=ID`` when the run is named); without a service, every service
Jaeger lists is searched.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from otel_rl.runs.jaeger_json import spans_from_jaeger
from otel_rl.runs.records import SpanRecord
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

__all__ = ["DEFAULT_JAEGER_URL", "AmbiguousRunError", "JaegerClient", "JaegerError", "RunChoice", "parse_lookback"]

DEFAULT_JAEGER_URL = "http://127.0.0.1:16686"  # the local stack's Jaeger (and the Docker stack's, published on localhost)
_UNITS = {"m": 60, "h": 3600, "d": 86400}
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback or a user's own Jaeger: no proxy from the env


class JaegerError(RuntimeError):
    """Jaeger could not be reached or answered something unexpected; ``status`` is its HTTP status, if it answered."""

    def __init__(self, message: str, status: int | None = None, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.unreachable = unreachable  # nothing answered at the URL (no Jaeger there)


@dataclass(frozen=True)
class RunChoice:
    """One run with ``rl.step`` traces in Jaeger: its service, ``rl.run.id`` ("" when its spans carry none), when, how many steps."""

    service: str
    run_id: str
    first_ns: int
    last_ns: int
    steps: int


class AmbiguousRunError(JaegerError):
    """Several runs have the step and none was chosen; ``choices`` lists the runs."""

    def __init__(self, message: str, choices: list[RunChoice]) -> None:
        super().__init__(message)
        self.choices = choices


def parse_lookback(text: str) -> float:
    """``30d``, ``12h``, ``90m`` in seconds; a ValueError names the text."""
    text = text.strip()
    try:
        value, unit = float(text[:-1]), text[-1:]
        if unit in _UNITS and value > 0:
            return value * _UNITS[unit]
    except ValueError:
        pass
    raise ValueError(f"not a lookback: {text!r} (a number with m, h or d: 90m, 12h, 30d)")


class JaegerClient:
    """The parts of Jaeger's HTTP query API that ``otel-rl trace`` reads."""

    def __init__(self, base_url: str = DEFAULT_JAEGER_URL, *, lookback_s: float = 30 * 86400, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.lookback_s = lookback_s
        self.timeout_s = timeout_s

    def _get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        url = f"{self.base_url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with _OPENER.open(url, timeout=self.timeout_s) as response:  # noqa: S310 - a user-given http URL
                body = json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            raise JaegerError(f"Jaeger answered {exc.code} for {url}: {detail}", exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise JaegerError(
                f"cannot reach Jaeger's query API at {self.base_url} ({getattr(exc, 'reason', exc)}); "
                "is it running (`otel-rl stack status`), or give its URL with --jaeger URL",
                unreachable=True,
            ) from None
        except json.JSONDecodeError:
            raise JaegerError(f"{self.base_url} did not answer JSON for {url}: is it Jaeger's query service (port 16686)?") from None
        if not isinstance(body, dict) or body.get("errors"):
            raise JaegerError(f"Jaeger answered errors for {url}: {str(body.get('errors') if isinstance(body, dict) else body)[:300]}")
        return body

    def services(self) -> list[str]:
        return sorted(str(s) for s in self._get("/api/services").get("data") or [])

    def search(self, service: str, tags: dict[str, str], *, operation: str = N.RL_STEP_SPAN, limit: int = 100) -> list[dict[str, Any]]:
        """Jaeger's traces (its JSON) of ``service`` with a span ``operation`` carrying ``tags``, within the lookback."""
        end_us = int(time.time() * 1e6)
        params = {
            "service": service,
            "operation": operation,
            "tags": json.dumps(tags),
            "start": str(end_us - int(self.lookback_s * 1e6)),
            "end": str(end_us),
            "limit": str(limit),
        }
        return list(self._get("/api/traces", params).get("data") or [])

    def trace(self, trace_id: str) -> list[SpanRecord]:
        """Every span of trace ``trace_id`` ([] when Jaeger does not have it)."""
        try:
            data = self._get(f"/api/traces/{urllib.parse.quote(trace_id)}").get("data") or []
        except JaegerError as exc:
            if exc.status == 404:
                return []
            raise
        return [span for trace in data for span in spans_from_jaeger(trace)]

    def step_trace_spans(self, step: int, *, service: str | None = None, run_id: str | None = None) -> list[SpanRecord]:
        """The spans of step ``step``'s trace: in ``service`` (default: every service) and run ``run_id``.

        Without ``run_id``, raises AmbiguousRunError when ``rl.step`` roots of several runs have the step.
        """
        tags = {A.RL_STEP: str(int(step))}
        if run_id is not None:
            tags[A.RL_RUN_ID] = run_id
        found: list[tuple[SpanRecord, list[SpanRecord]]] = []  # (root, the trace's spans)
        for name in [service] if service else self.services():
            for trace in self.search(name, tags):
                spans = spans_from_jaeger(trace)
                roots = [s for s in spans if s.parent_span_id is None and s.name == N.RL_STEP_SPAN and s.attributes.get(A.RL_STEP) == step]
                found += [(root, spans) for root in roots]
        runs = {(str(r.resource.get(A.SERVICE_NAME, "")), str(r.attributes.get(A.RL_RUN_ID, ""))) for r, _ in found}
        if run_id is None and len(runs) > 1:
            raise AmbiguousRunError(f"{len(runs)} runs have step {step}; choose one with --run-id ID", self.runs(service))
        if not found:
            return []
        root, spans = max(found, key=lambda item: item[0].start_ns)  # a run that logged the step twice (a restart): the latest
        return spans

    def runs(self, service: str | None = None, limit: int = 1000) -> list[RunChoice]:
        """The runs whose ``rl.step`` root spans Jaeger has (up to ``limit`` traces a service), oldest first."""
        by_run: dict[tuple[str, str], list[SpanRecord]] = {}
        for name in [service] if service else self.services():
            for trace in self.search(name, {}, limit=limit):
                for span in spans_from_jaeger(trace):
                    if span.parent_span_id is None and span.name == N.RL_STEP_SPAN:
                        by_run.setdefault((name, str(span.attributes.get(A.RL_RUN_ID, ""))), []).append(span)
        choices = [
            RunChoice(
                svc, run, min(r.start_ns for r in roots), max(r.start_ns for r in roots), len({r.attributes.get(A.RL_STEP) for r in roots})
            )
            for (svc, run), roots in by_run.items()
        ]
        return sorted(choices, key=lambda c: c.first_ns)

    def trace_url(self, trace_id: str) -> str:
        """The trace's page in Jaeger's UI."""
        return f"{self.base_url}/trace/{trace_id}"
