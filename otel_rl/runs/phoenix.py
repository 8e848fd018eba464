"""Read one step's trace back from a Phoenix trace store over its REST API (``/v1/projects/.../spans``).

Phoenix keeps spans per project (the resource attribute ``openinference.project.name`` picks it;
``default`` otherwise). Its span listing filters by name, trace id and ``key:value`` attributes,
so finding step N is two requests: the ``rl.step`` roots with ``rl.step == N``, then that trace.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from otel_rl.runs.folder import SpanEvent, SpanRecord
from otel_rl.semconv import attributes as A
from otel_rl.semconv import names as N

_STATUS = {"OK": "ok", "ERROR": "error"}


class PhoenixError(RuntimeError):
    """Phoenix could not be reached or answered something unexpected."""


@dataclass(frozen=True)
class RunChoice:
    """One run in a Phoenix project: its ``rl.run.id`` (or "" when its spans carry none), when and how many steps."""

    run_id: str
    first_ns: int
    last_ns: int
    steps: int


class AmbiguousRunError(PhoenixError):
    """Several runs in the project have the step and none was chosen; ``choices`` lists the runs."""

    def __init__(self, message: str, choices: list[RunChoice]) -> None:
        super().__init__(message)
        self.choices = choices


def _iso_ns(text: str | None) -> int:
    if not text:
        return 0
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def span_from_phoenix(raw: dict[str, Any], project: str) -> SpanRecord:
    """One span of Phoenix's /v1/projects/{p}/spans listing as a SpanRecord."""
    context = raw.get("context") or {}
    return SpanRecord(
        trace_id=str(context.get("trace_id", "")),
        span_id=str(context.get("span_id", "")),
        parent_span_id=raw.get("parent_id") or None,
        name=str(raw.get("name", "")),
        start_ns=_iso_ns(raw.get("start_time")),
        end_ns=_iso_ns(raw.get("end_time")),
        attributes=dict(raw.get("attributes") or {}),
        events=[
            SpanEvent(str(e.get("name", "")), _iso_ns(e.get("timestamp")), dict(e.get("attributes") or {})) for e in raw.get("events") or []
        ],
        resource={"openinference.project.name": project},
        status=_STATUS.get(str(raw.get("status_code", "")).upper(), "unset"),
        status_message=str(raw.get("status_message") or ""),
        kind=1,
        scope="",
    )


class PhoenixClient:
    """A small client for the parts of Phoenix's REST API otel-rl reads."""

    def __init__(self, base_url: str, project: str = "default", timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.project = project
        self.timeout_s = timeout_s

    def _get(self, path: str, params: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        url = f"{self.base_url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:  # noqa: S310 - a user-given http URL
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:200]
            raise PhoenixError(f"Phoenix answered {exc.code} for {url}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise PhoenixError(
                f"cannot reach Phoenix at {self.base_url} ({getattr(exc, 'reason', exc)}); is it running (`otel-rl stack status`)?"
            ) from None
        except json.JSONDecodeError:
            raise PhoenixError(f"Phoenix at {self.base_url} did not answer JSON for {url}") from None

    def project_id(self) -> str:
        for project in self._get("/v1/projects").get("data", []):
            if project.get("name") == self.project:
                return str(project["id"])
        raise PhoenixError(f"Phoenix at {self.base_url} has no project {self.project!r}")

    def spans(self, filters: list[tuple[str, str]], limit: int = 1000) -> list[SpanRecord]:
        """Every span matching ``filters`` (Phoenix query parameters), following the cursor."""
        out: list[SpanRecord] = []
        cursor = None
        path = f"/v1/projects/{urllib.parse.quote(self.project)}/spans"
        while True:
            params = [*filters, ("limit", str(limit))] + ([("cursor", cursor)] if cursor else [])
            page = self._get(path, params)
            out.extend(span_from_phoenix(raw, self.project) for raw in page.get("data", []))
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    def runs(self) -> list[RunChoice]:
        """The runs whose ``rl.step`` root spans are in the project, oldest first."""
        by_run: dict[str, list[SpanRecord]] = {}
        for root in self.spans([("name", N.RL_STEP_SPAN)]):
            if root.parent_span_id is None:
                by_run.setdefault(str(root.attributes.get(A.RL_RUN_ID, "")), []).append(root)
        choices = [
            RunChoice(
                run_id, min(r.start_ns for r in roots), max(r.start_ns for r in roots), len({r.attributes.get(A.RL_STEP) for r in roots})
            )
            for run_id, roots in by_run.items()
        ]
        return sorted(choices, key=lambda c: c.first_ns)

    def step_trace_spans(self, step: int, run_id: str | None = None) -> list[SpanRecord]:
        """The spans of step ``step``'s trace in run ``run_id`` (its ``rl.run.id``).

        Without ``run_id``, raises AmbiguousRunError when roots of several runs have the step.
        """
        roots = self.spans([("name", N.RL_STEP_SPAN), ("attribute", f"{A.RL_STEP}:{int(step)}")])
        roots = [r for r in roots if r.parent_span_id is None]
        if run_id is not None:
            roots = [r for r in roots if str(r.attributes.get(A.RL_RUN_ID, "")) == run_id]
        elif len({str(r.attributes.get(A.RL_RUN_ID, "")) for r in roots}) > 1:
            raise AmbiguousRunError(
                f"{len({str(r.attributes.get(A.RL_RUN_ID, '')) for r in roots})} runs in Phoenix project {self.project!r} have step {step}; "
                "choose one with --run-id ID",
                self.runs(),
            )
        if not roots:
            return []
        latest = max(roots, key=lambda r: r.start_ns)  # a run that logged the step twice (a restart): the latest
        return self.spans([("trace_id", latest.trace_id)])

    def trace_url(self, trace_id: str) -> str:
        return f"{self.base_url}/projects/{self.project_id()}/traces/{trace_id}"
