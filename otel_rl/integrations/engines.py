"""Inference engines (vLLM, SGLang): their Prometheus ``/metrics`` as the run's rollout metrics.

::

    import otel_rl
    from otel_rl.integrations.engines import scrape_engines

    tel = otel_rl.init(service_name="grpo")
    scraper = scrape_engines(tel, ["http://127.0.0.1:8000/metrics", "127.0.0.1:30000"])
    ...
    scraper.poke()        # optional: scrape now (as a generate stage ends), off the training thread

or, with no code: ``otel_rl.init(engine_endpoints=[...])`` / ``OTEL_RL_ENGINE_ENDPOINTS=
http://127.0.0.1:8000/metrics,http://127.0.0.1:30000/metrics``.

The scraper lives in the runtime (``otel_rl._sdk.sources.engine_scrape``, so that ``init()`` can start it);
this module is its public face. What it reads and how it maps each vLLM / SGLang sample to a
registry metric is documented there.
"""

from __future__ import annotations

from otel_rl._sdk.settings.parsers import endpoint_url
from otel_rl._sdk.sources.engine_scrape import (
    COUNTERS,
    DEFAULT_INTERVAL_S,
    DEFAULT_TIMEOUT_S,
    GAUGES,
    HISTOGRAMS,
    EngineScraper,
    Source,
    scrape_engines,
    scraper_of,
)
from otel_rl._sdk.sources.prom_text import Exposition, Sample, parse_exposition

__all__ = [
    "COUNTERS",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_TIMEOUT_S",
    "GAUGES",
    "HISTOGRAMS",
    "EngineScraper",
    "Exposition",
    "Sample",
    "Source",
    "endpoint_url",
    "parse_exposition",
    "scrape_engines",
    "scraper_of",
]
