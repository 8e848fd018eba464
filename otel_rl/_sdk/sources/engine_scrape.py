"""Inference-engine metrics: read vLLM's and SGLang's Prometheus ``/metrics`` into the rollout metrics.

A rollout's time is mostly the inference engine's: its queue, its KV cache, its preemptions, its
TTFT and TPOT. vLLM and SGLang publish these on a Prometheus endpoint; :class:`EngineScraper`
reads those endpoints from a daemon thread (stdlib ``urllib``, a short timeout, never on the
training thread) and records what it read through the public ``Telemetry`` API, so the values
land on the step that was running, with the engine's address as ``server.address`` /
``server.port``:

============================================  =========================================================
registry metric                               vLLM / SGLang sample
============================================  =========================================================
``rl.rollout.requests`` (state running)       ``vllm:num_requests_running`` / ``sglang:num_running_reqs``
``rl.rollout.requests`` (state waiting)       ``vllm:num_requests_waiting`` / ``sglang:num_queue_reqs``
``rl.rollout.kv_cache.utilization``           ``vllm:kv_cache_usage_perc`` (``gpu_cache_usage_perc``) / ``sglang:token_usage``
``rl.rollout.tokens`` (input / output)        ``vllm:prompt_tokens_total``, ``generation_tokens_total`` / ``sglang:`` same
``rl.rollout.engine.preemptions``             ``vllm:num_preemptions_total`` / ``sglang:num_retracted_requests_total``
``gen_ai.server.time_to_first_token``         ``vllm:time_to_first_token_seconds`` / ``sglang:`` same
``gen_ai.server.time_per_output_token``       ``vllm:request_time_per_output_token_seconds`` (else ITL) / ``sglang:inter_token_latency_seconds``
``gen_ai.server.request.duration``            ``vllm:e2e_request_latency_seconds`` / ``sglang:`` same
============================================  =========================================================

Gauges take the latest value. Counters and histograms are cumulative on the engine: the first
scrape of an engine is the baseline, and each later scrape records the increase since the one
before (an engine restart, a counter that went down, counts from zero again). A histogram's
increase is a count per bucket; it becomes that many observations spread evenly inside the
engine's bucket bounds (observations past the last bound sit at the mean the bucket's sum
implies), so counts are exact and values are as precise as the engine's buckets.

Several engines behind one endpoint (vLLM data parallel: label ``engine``; SGLang ``dp_rank``)
are summed, except the KV cache, which reports the fullest. SGLang tensor-parallel ranks other
than 0 repeat rank 0's scheduler state and are left out.
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from otel_rl._sdk.settings.parsers import parse_endpoints
from otel_rl._sdk.settings.redaction import redact_url
from otel_rl._sdk.sources.prom_text import Exposition, Labels, parse_exposition, parse_number
from otel_rl.reporting import ReportOnce
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M

logger = logging.getLogger("otel_rl")

DEFAULT_INTERVAL_S = 5.0
DEFAULT_TIMEOUT_S = 2.0
MAX_BODY_BYTES = 16 * 2**20  # a vLLM /metrics with every histogram is ~100 KiB; more is not an engine
MAX_OBSERVATIONS = 200_000  # per histogram and scrape: more are thinned (counts then approximate)

_RUNNING, _WAITING = A.RlRolloutRequestStateValues.RUNNING.value, A.RlRolloutRequestStateValues.WAITING.value
_INPUT, _OUTPUT = A.GenAiTokenTypeValues.INPUT.value, A.GenAiTokenTypeValues.OUTPUT.value


@dataclass(frozen=True)
class Source:
    """Where one registry series comes from: the first of ``names`` the engine serves wins (new
    names before the deprecated ones they replaced, never both: vLLM serves some twice)."""

    names: tuple[str, ...]
    metric: str
    attributes: tuple[tuple[str, str], ...] = ()
    reduce: str = "sum"  # gauges: how the engines behind one endpoint combine ("sum" or "max")


GAUGES = (
    Source(("vllm:num_requests_running",), M.RL_ROLLOUT_REQUESTS, ((A.RL_ROLLOUT_REQUEST_STATE, _RUNNING),)),
    Source(("vllm:num_requests_waiting",), M.RL_ROLLOUT_REQUESTS, ((A.RL_ROLLOUT_REQUEST_STATE, _WAITING),)),
    Source(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), M.RL_ROLLOUT_KV_CACHE_UTILIZATION, reduce="max"),
    Source(("sglang:num_running_reqs",), M.RL_ROLLOUT_REQUESTS, ((A.RL_ROLLOUT_REQUEST_STATE, _RUNNING),)),
    Source(("sglang:num_queue_reqs",), M.RL_ROLLOUT_REQUESTS, ((A.RL_ROLLOUT_REQUEST_STATE, _WAITING),)),
    Source(("sglang:token_usage",), M.RL_ROLLOUT_KV_CACHE_UTILIZATION, reduce="max"),
)
COUNTERS = (
    Source(("vllm:prompt_tokens_total",), M.RL_ROLLOUT_TOKENS, ((A.GEN_AI_TOKEN_TYPE, _INPUT),)),
    Source(("vllm:generation_tokens_total",), M.RL_ROLLOUT_TOKENS, ((A.GEN_AI_TOKEN_TYPE, _OUTPUT),)),
    Source(("vllm:num_preemptions_total",), M.RL_ROLLOUT_ENGINE_PREEMPTIONS),
    Source(("sglang:prompt_tokens_total",), M.RL_ROLLOUT_TOKENS, ((A.GEN_AI_TOKEN_TYPE, _INPUT),)),
    Source(("sglang:generation_tokens_total",), M.RL_ROLLOUT_TOKENS, ((A.GEN_AI_TOKEN_TYPE, _OUTPUT),)),
    Source(("sglang:num_retracted_requests_total",), M.RL_ROLLOUT_ENGINE_PREEMPTIONS),
)
HISTOGRAMS = (
    Source(("vllm:time_to_first_token_seconds",), M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN),
    # Per-request TPOT (vLLM >= 0.11) before the per-token interval under its new and old names.
    Source(
        ("vllm:request_time_per_output_token_seconds", "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
    ),
    Source(("vllm:e2e_request_latency_seconds",), M.GEN_AI_SERVER_REQUEST_DURATION),
    Source(("sglang:time_to_first_token_seconds",), M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN),
    Source(("sglang:inter_token_latency_seconds",), M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN),
    Source(("sglang:e2e_request_latency_seconds",), M.GEN_AI_SERVER_REQUEST_DURATION),
)


def spread(bounds: Sequence[float], counts: Sequence[int], total_sum: float) -> np.ndarray:
    """``counts[i]`` observations per bucket ``(bounds[i-1], bounds[i]]`` (the last bound +Inf),
    spread evenly inside each bucket; those past the last finite bound sit at the mean that
    ``total_sum`` leaves for them (at least that bound)."""
    n = np.asarray(counts, dtype=np.int64)
    if n.sum() <= 0:
        return np.empty(0)
    upper = np.asarray(bounds, dtype=float)
    finite = np.isfinite(upper)
    lower = np.empty_like(upper)
    lower[1:] = upper[:-1]
    lower[0] = min(0.0, upper[0]) if finite[0] else 0.0
    upper = np.where(finite, upper, lower)  # the +Inf bucket: placed below, at one value
    index = np.repeat(np.arange(len(n)), n)
    k = np.arange(index.size) - np.repeat(np.cumsum(n) - n, n)
    values = lower[index] + (upper[index] - lower[index]) * (k + 0.5) / n[index]
    overflow = ~finite[index]
    if overflow.any():
        rest = (total_sum - values[~overflow].sum()) / overflow.sum()
        values[overflow] = max(rest, float(lower[~finite][0])) if np.isfinite(rest) else lower[~finite][0]
    return values


@dataclass
class _Engine:
    """One endpoint and what its previous scrape left: counter and histogram totals per series."""

    url: str
    attributes: dict[str, Any]
    counters: dict[tuple[str, Labels], float] = field(default_factory=dict)
    histograms: dict[tuple[str, Labels], tuple[dict[float, float], float]] = field(default_factory=dict)
    up: bool | None = None


def _series_labels(labels: Labels) -> Labels:
    return tuple(sorted((k, v) for k, v in labels if k != "le"))


def _kept(labels: Labels) -> bool:
    # SGLang (enable_metrics_for_all_schedulers) repeats the scheduler's gauges on every
    # tensor-parallel rank: rank 0 speaks for the group.
    return all(v == "0" for k, v in labels if k == "tp_rank")


class EngineScraper:
    """Scrapes inference engines' ``/metrics`` every ``interval_s`` on a daemon thread and records
    them on ``tel`` (see the module's docstring). ``scrape_once()`` reads them now, on the calling
    thread (tests, or a loop that wants exact step boundaries); ``poke()`` wakes the thread."""

    def __init__(
        self, tel: Any, endpoints: Iterable[str], *, interval_s: float = DEFAULT_INTERVAL_S, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        if not interval_s > 0 or not timeout_s > 0:
            raise ValueError(f"interval_s and timeout_s must be positive, got {interval_s!r}, {timeout_s!r}")
        self._tel = tel
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self._engines = []
        for url in parse_endpoints(list(endpoints)):
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            self._engines.append(_Engine(url, {A.SERVER_ADDRESS: parts.hostname, A.SERVER_PORT: port}))
        self._report = ReportOnce(logger)
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()  # one scrape at a time: the thread's and scrape_once()'s
        self._thread: threading.Thread | None = None

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(e.url for e in self._engines)

    def start(self) -> EngineScraper:
        if self._thread is None and self._engines:
            self._thread = threading.Thread(target=self._run, name="otel-rl-engine-scrape", daemon=True)
            self._thread.start()
        return self

    def poke(self) -> None:
        """Scrape now on the scraper's thread (e.g. as a generate stage ends); returns at once."""
        self._wake.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stopped.is_set() and not getattr(self._tel, "closed", False):
            try:
                self.scrape_once()
            except Exception as exc:  # a scraper bug must not end the thread silently, nor reach training
                self._report(("<scraper>", type(exc).__name__), "otel-rl: engine scrape failed: %s: %s", type(exc).__name__, exc)
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def scrape_once(self) -> int:
        """Read every endpoint once and record what it served; returns how many answered."""
        with self._lock:
            answered = 0
            for engine in self._engines:
                if getattr(self._tel, "closed", False):
                    break
                text = self._fetch(engine)
                if text is None:
                    continue
                answered += 1
                exposition = parse_exposition(text)
                if exposition.bad_lines:
                    number, raw, why = exposition.bad_lines[0]
                    self._report(
                        (engine.url, "bad-lines"),
                        "otel-rl: %s: %d line(s) not in the Prometheus text format skipped, first line %d (%s): %r",
                        _redact(engine.url),
                        len(exposition.bad_lines),
                        number,
                        why,
                        raw[:120],
                    )
                self._record(engine, exposition)
            return answered

    def _fetch(self, engine: _Engine) -> str | None:
        try:
            request = urllib.request.Request(engine.url, headers={"Accept": "text/plain;version=0.0.4"})
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 (http(s) only, checked)
                body = response.read(MAX_BODY_BYTES + 1)
        except (OSError, ValueError) as exc:  # URLError, HTTPError, timeouts, refused connections
            if engine.up is not False:
                self._report(
                    (engine.url, "down"),
                    "otel-rl: inference engine %s did not answer (%s); skipped until it does",
                    _redact(engine.url),
                    _why(exc),
                )
            engine.up = False
            return None
        if engine.up is False:
            logger.info("otel-rl: inference engine %s answers again", _redact(engine.url))
        engine.up = True
        if len(body) > MAX_BODY_BYTES:
            self._report((engine.url, "too-big"), "otel-rl: %s served more than %d bytes; skipped", _redact(engine.url), MAX_BODY_BYTES)
            return None
        return body.decode("utf-8", errors="replace")

    def _record(self, engine: _Engine, exposition: Exposition) -> None:
        by_name: dict[str, list[Any]] = {}
        for sample in exposition.samples:
            if _kept(sample.labels):
                by_name.setdefault(sample.name, []).append(sample)
        tel, base = self._tel, engine.attributes
        for source in GAUGES:
            name = next((n for n in source.names if n in by_name), None)
            if name is None:
                continue
            values = [s.value for s in by_name[name] if s.value == s.value]  # NaN: the engine has no value yet
            if values:
                tel.record(source.metric, max(values) if source.reduce == "max" else sum(values), {**base, **dict(source.attributes)})
        for source in COUNTERS:
            name = next((n for n in source.names if n in by_name), None)
            if name is None:
                continue
            increase = sum(self._increase(engine, name, s.labels, s.value) for s in by_name[name])
            if increase > 0:
                tel.add(source.metric, increase, {**base, **dict(source.attributes)})
        for source in HISTOGRAMS:
            name = next((n for n in source.names if n + "_count" in by_name), None)
            if name is not None:
                values = self._histogram_increase(engine, name, by_name)
                if values.size:
                    tel.record(source.metric, values, dict(base))

    def _increase(self, engine: _Engine, name: str, labels: Labels, value: float) -> float:
        if value != value:  # NaN: no value this time
            return 0.0
        key = (name, _series_labels(labels))
        before = engine.counters.get(key)
        engine.counters[key] = value
        if before is None:  # the baseline
            return 0.0
        return value - before if value >= before else value  # went down: the engine restarted

    def _histogram_increase(self, engine: _Engine, name: str, by_name: dict[str, list[Any]]) -> np.ndarray:
        series: dict[Labels, dict[float, float]] = {}
        for sample in by_name.get(name + "_bucket", ()):
            bound = sample.label("le")
            try:
                series.setdefault(_series_labels(sample.labels), {})[parse_number(bound or "")] = sample.value
            except ValueError:
                self._report((engine.url, name, "le"), "otel-rl: %s: %s_bucket has a bad le=%r; skipped", _redact(engine.url), name, bound)
        sums = {_series_labels(s.labels): s.value for s in by_name.get(name + "_sum", ())}
        merged: dict[float, int] = {}
        total_sum = 0.0
        for labels, buckets in series.items():
            key = (name, labels)
            before = engine.histograms.get(key)
            current_sum = sums.get(labels, 0.0)
            engine.histograms[key] = (buckets, current_sum)
            if before is None:
                continue  # the baseline
            old, old_sum = before
            reset = any(buckets.get(b, 0.0) < c for b, c in old.items())
            previous_cumulative = 0.0
            for bound in sorted(buckets):
                cumulative = buckets[bound] - (0.0 if reset else old.get(bound, 0.0))
                merged[bound] = merged.get(bound, 0) + max(0, round(cumulative - previous_cumulative))
                previous_cumulative = cumulative
            total_sum += current_sum - (0.0 if reset else old_sum)
        if not merged:
            return np.empty(0)
        bounds = sorted(merged)
        counts = [merged[b] for b in bounds]
        total = sum(counts)
        if total > MAX_OBSERVATIONS:
            self._report(
                (engine.url, name, "thinned"),
                "otel-rl: %s: %d %s observations in one scrape; recording %d of them (scrape more often)",
                _redact(engine.url),
                total,
                name,
                MAX_OBSERVATIONS,
            )
            scale = MAX_OBSERVATIONS / total
            counts = [int(c * scale) for c in counts]
            total_sum *= sum(counts) / total
        return spread(bounds, counts, total_sum)


def _redact(url: str) -> str:
    """The URL without user:password, query values or fragment (any may hold a token), for messages."""
    return str(redact_url(url))


def _why(exc: BaseException) -> str:
    """What went wrong, without the URL (which may carry credentials) and without a traceback."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    reason = getattr(exc, "reason", None)
    return f"{type(exc).__name__}: {reason if reason is not None else exc}"


_SCRAPERS: weakref.WeakKeyDictionary[Any, EngineScraper] = weakref.WeakKeyDictionary()
_SCRAPERS_LOCK = threading.Lock()


def scrape_engines(
    tel: Any, endpoints: Iterable[str], *, interval_s: float = DEFAULT_INTERVAL_S, timeout_s: float = DEFAULT_TIMEOUT_S
) -> EngineScraper:
    """Start scraping ``endpoints`` into ``tel``; one scraper per telemetry (a second call replaces
    the first, so no engine is counted twice). It stops when ``tel`` shuts down."""
    scraper = EngineScraper(tel, endpoints, interval_s=interval_s, timeout_s=timeout_s)
    with _SCRAPERS_LOCK:
        previous = _SCRAPERS.get(tel)
        _SCRAPERS[tel] = scraper
    if previous is not None:
        previous.stop()
    return scraper.start()


def scraper_of(tel: Any) -> EngineScraper | None:
    """The scraper ``scrape_engines`` (or ``init(engine_endpoints=...)``) started for ``tel``."""
    return _SCRAPERS.get(tel)
