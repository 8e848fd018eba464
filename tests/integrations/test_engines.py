"""The inference-engine scraper against real HTTP servers on 127.0.0.1 serving vLLM's and SGLang's
``/metrics`` text.

The pages are written the way ``prometheus_client`` renders the engines' instruments (HELP, TYPE,
``_total`` and ``_created`` for counters, ``_bucket``/``_count``/``_sum``/``_created`` for
histograms, labels in the instrument's label order, ``le`` last), with the names, label sets and
bucket bounds of:

* vLLM ``vllm/v1/metrics/loggers.py`` at commit 005a810bc40faa25b8870fbc8559c3462581eee3
  (labels ``model_name``, ``engine``; ``vllm:inter_token_latency_seconds`` and
  ``vllm:request_time_per_output_token_seconds`` as later releases add them);
* SGLang ``python/sglang/srt/metrics/collector.py`` at commit 00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538
  (scheduler labels ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank`` from
  ``managers/scheduler_metrics_mixin.py``; tokenizer labels ``model_name``).
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

import otel_rl
from otel_rl.integrations.engines import EngineScraper, endpoint_url, parse_exposition, scrape_engines, scraper_of
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.testing import Capture, capture

CREATED = 1.7190e9
VLLM_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
VLLM_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)


# --------------------------------------------------------------------------- exposition text


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"


def _num(value: float) -> str:
    return "+Inf" if value == math.inf else repr(float(value))


def gauge(name: str, doc: str, series: list[tuple[dict[str, str], float]]) -> str:
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
    lines += [f"{name}{_labels(labels)} {_num(value)}" for labels, value in series]
    return "\n".join(lines)


def counter(name: str, doc: str, series: list[tuple[dict[str, str], float]]) -> str:
    lines = [f"# HELP {name}_total {doc}", f"# TYPE {name}_total counter"]
    for labels, value in series:
        lines += [f"{name}_total{_labels(labels)} {_num(value)}", f"{name}_created{_labels(labels)} {CREATED!r}"]
    return "\n".join(lines)


def histogram(name: str, doc: str, bounds: tuple[float, ...], series: list[tuple[dict[str, str], list[float]]]) -> str:
    """``series``: (labels, observations) -> the cumulative buckets prometheus_client writes."""
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
    for labels, observed in series:
        values = np.asarray(observed, dtype=float)
        for bound in (*bounds, math.inf):
            lines.append(f"{name}_bucket{_labels({**labels, 'le': _num(bound)})} {float((values <= bound).sum())!r}")
        lines.append(f"{name}_count{_labels(labels)} {float(values.size)!r}")
        lines.append(f"{name}_sum{_labels(labels)} {float(values.sum())!r}")
        lines.append(f"{name}_created{_labels(labels)} {CREATED!r}")
    return "\n".join(lines)


class VllmState:
    """What a vLLM server with two data-parallel engines has counted so far."""

    def __init__(self) -> None:
        self.running = [3.0, 2.0]
        self.waiting = [1.0, 0.0]
        self.kv = [0.25, 0.5]
        self.prompt = [1000.0, 500.0]
        self.generation = [4000.0, 2500.0]
        self.preemptions = [0.0, 1.0]
        self.ttft: list[list[float]] = [[0.05, 0.3], [0.07]]
        self.tpot: list[list[float]] = [[0.02], [0.03]]

    def text(self) -> str:
        engines = [{"model_name": "Qwen/Qwen2.5-7B", "engine": str(i)} for i in range(2)]
        per = lambda values: list(zip(engines, values, strict=True))  # noqa: E731
        return (
            "\n".join(
                [
                    gauge("vllm:num_requests_running", "Number of requests in model execution batches.", per(self.running)),
                    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", per(self.waiting)),
                    gauge(
                        "vllm:gpu_cache_usage_perc",
                        "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
                        per(self.kv),
                    ),
                    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", per(self.kv)),
                    counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", per(self.preemptions)),
                    counter("vllm:prompt_tokens", "Number of prefill tokens processed.", per(self.prompt)),
                    counter("vllm:generation_tokens", "Number of generation tokens processed.", per(self.generation)),
                    histogram(
                        "vllm:time_to_first_token_seconds",
                        "Histogram of time to first token in seconds.",
                        VLLM_TTFT_BUCKETS,
                        per(self.ttft),
                    ),
                    # served twice by vLLM 0.10 (old and new name, same data): counted once
                    histogram(
                        "vllm:time_per_output_token_seconds",
                        "Histogram of time per output token in seconds.",
                        VLLM_TPOT_BUCKETS,
                        per(self.tpot),
                    ),
                    histogram(
                        "vllm:inter_token_latency_seconds",
                        "Histogram of inter-token latency in seconds.",
                        VLLM_TPOT_BUCKETS,
                        per(self.tpot),
                    ),
                ]
            )
            + "\n"
        )


class SglangState:
    """An SGLang server with tensor parallelism 2 and every scheduler reporting."""

    def __init__(self) -> None:
        self.running = 7.0
        self.queue = 3.0
        self.token_usage = 0.66
        self.prompt = 8.128902e06
        self.generation = 7.557572e06
        self.retracted = 2.0
        self.ttft: list[float] = [0.15, 0.5, 3.0]

    def text(self) -> str:
        ranks = [{"model_name": "qwen3", "engine_type": "unified", "tp_rank": str(r), "pp_rank": "0"} for r in (0, 1)]
        # rank 1 repeats rank 0's scheduler state; a scraper that added it would count double
        both = lambda value: [(ranks[0], value), (ranks[1], value)]  # noqa: E731
        tokenizer = [{"model_name": "qwen3"}]
        return (
            "\n".join(
                [
                    gauge("sglang:num_running_reqs", "The number of running requests.", both(self.running)),
                    gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", both(self.queue)),
                    gauge("sglang:token_usage", "The token usage.", both(self.token_usage)),
                    gauge("sglang:gen_throughput", "The generation throughput (token/s).", both(294.5)),
                    counter("sglang:num_retracted_requests", "Total number of retracted requests.", both(self.retracted)),
                    counter("sglang:prompt_tokens", "Number of prefill tokens processed.", [(tokenizer[0], self.prompt)]),
                    counter("sglang:generation_tokens", "Number of generation tokens processed.", [(tokenizer[0], self.generation)]),
                    histogram(
                        "sglang:time_to_first_token_seconds",
                        "Histogram of time to first token in seconds.",
                        SGLANG_TTFT_BUCKETS,
                        [(tokenizer[0], self.ttft)],
                    ),
                ]
            )
            + "\n"
        )


# --------------------------------------------------------------------------- a real server


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        server: Any = self.server
        server.hits += 1
        if self.path != "/metrics":
            self.send_error(404)
            return
        body = server.page().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class MetricsServer:
    def __init__(self, page: Callable[[], str]) -> None:
        self.httpd: Any = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.page = page
        self.httpd.hits = 0
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def hits(self) -> int:
        return self.httpd.hits

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[], str]], MetricsServer]]:
    servers: list[MetricsServer] = []

    def start(page: Callable[[], str]) -> MetricsServer:
        servers.append(MetricsServer(page))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def cap(tmp_path: Any) -> Iterator[Capture]:
    with capture(tmp_path / "run") as c:
        yield c


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def where(server: MetricsServer, **more: Any) -> dict[str, Any]:
    return {A.SERVER_ADDRESS: "127.0.0.1", A.SERVER_PORT: server.port, **more}


def running(server: MetricsServer) -> dict[str, Any]:
    return where(server, **{A.RL_ROLLOUT_REQUEST_STATE: A.RlRolloutRequestStateValues.RUNNING.value})


def waiting(server: MetricsServer) -> dict[str, Any]:
    return where(server, **{A.RL_ROLLOUT_REQUEST_STATE: A.RlRolloutRequestStateValues.WAITING.value})


def tokens(server: MetricsServer, kind: A.GenAiTokenTypeValues) -> dict[str, Any]:
    return where(server, **{A.GEN_AI_TOKEN_TYPE: kind.value})


# --------------------------------------------------------------------------- the parser


def test_the_parser_reads_the_exposition_format_and_lists_what_it_skips() -> None:
    text = (
        "# HELP vllm:x_total a counter\n"
        "# TYPE vllm:x_total counter\n"
        'vllm:x_total{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",} 8.128902e+06 1712000000000\n'
        "# a plain comment\n"
        "\n"
        "bare 3\n"
        "nan{} NaN\n"
        'h_bucket{le="+Inf"} 4.0 # {trace_id="abc"} 0.5 1712000000.0\n'
        "neg -Inf\n"
        "junk here now\n"
        'unterminated{a="x} 1\n'
        "under 1_000\n"
        "# EOF\n"
    )
    parsed = parse_exposition(text)
    by_name = {s.name: s for s in parsed.samples}
    x = by_name["vllm:x_total"]
    assert x.value == 8.128902e06
    assert dict(x.labels) == {"path": "C:\\dir", "quote": 'say "hi"', "nl": "a\nb"}
    assert by_name["bare"].value == 3.0 and by_name["bare"].labels == ()
    assert math.isnan(by_name["nan"].value)
    assert by_name["h_bucket"].value == 4.0 and by_name["h_bucket"].label("le") == "+Inf"
    assert by_name["neg"].value == -math.inf
    assert parsed.types == {"vllm:x_total": "counter"}
    assert [number for number, _, _ in parsed.bad_lines] == [10, 11, 12]
    assert "unterminated" in parsed.bad_lines[1][2]


def test_endpoints_are_normalised_to_their_metrics_page() -> None:
    assert endpoint_url("127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert endpoint_url("http://gpu-3:30000/") == "http://gpu-3:30000/metrics"
    assert endpoint_url("https://h/prom/metrics") == "https://h/prom/metrics"
    for bad in ("ftp://h:1", "http://:8000", "http://h:notaport"):
        with pytest.raises(ValueError):
            endpoint_url(bad)


# --------------------------------------------------------------------------- vLLM


def test_vllm_metrics_become_the_rollout_metrics_step_by_step(cap: Capture, serve: Callable[..., MetricsServer]) -> None:
    state = VllmState()
    server = serve(state.text)
    tel = cap.telemetry
    scraper = EngineScraper(tel, [server.url])

    with tel.step(0):
        assert scraper.scrape_once() == 1  # gauges now; counters and histograms: the baseline
    tel.flush()
    assert tel.latest(M.RL_ROLLOUT_REQUESTS, running(server)) == 5.0  # two DP engines, summed
    assert tel.latest(M.RL_ROLLOUT_REQUESTS, waiting(server)) == 1.0
    assert tel.latest(M.RL_ROLLOUT_KV_CACHE_UTILIZATION, where(server)) == 0.5  # the fullest engine
    assert tel.latest(M.RL_ROLLOUT_TOKENS, tokens(server, A.GenAiTokenTypeValues.INPUT)) is None
    assert cap.histogram(M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, where(server)) is None

    # step 1: the engines served 300 + 200 prompt tokens, 900 + 100 generated, 2 preemptions, 3 requests
    state.running, state.waiting, state.kv = [8.0, 8.0], [4.0, 6.0], [0.9, 0.97]
    state.prompt = [1300.0, 700.0]
    state.generation = [4900.0, 2600.0]
    state.preemptions = [2.0, 1.0]
    state.ttft = [[0.05, 0.3, 0.045, 1.2], [0.07, 30.0]]
    state.tpot = [[0.02, 0.04, 0.06], [0.03]]
    with tel.step(1):
        scraper.scrape_once()
    tel.flush()
    assert tel.latest(M.RL_ROLLOUT_REQUESTS, running(server)) == 16.0
    assert tel.latest(M.RL_ROLLOUT_REQUESTS, waiting(server)) == 10.0
    assert tel.latest(M.RL_ROLLOUT_KV_CACHE_UTILIZATION, where(server)) == 0.97
    assert tel.latest(M.RL_ROLLOUT_TOKENS, tokens(server, A.GenAiTokenTypeValues.INPUT)) == 500.0
    assert tel.latest(M.RL_ROLLOUT_TOKENS, tokens(server, A.GenAiTokenTypeValues.OUTPUT)) == 1000.0
    assert tel.latest(M.RL_ROLLOUT_ENGINE_PREEMPTIONS, where(server)) == 2.0
    count, total = cap.histogram(M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, where(server)) or (0, 0.0)
    assert count == 3  # 0.045, 1.2 and 30.0: the new observations only
    # each sits inside its engine bucket: (0.04, 0.06], (1.0, 2.5], (20, 40]
    assert 0.04 + 1.0 + 20.0 < total <= 0.06 + 2.5 + 40.0
    count, _ = cap.histogram(M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, where(server)) or (0, 0.0)
    assert count == 2  # inter_token_latency and its deprecated twin: counted once

    # step 2: nothing new -> counters and histograms do not move
    with tel.step(2):
        scraper.scrape_once()
    tel.flush()
    assert tel.latest(M.RL_ROLLOUT_TOKENS, tokens(server, A.GenAiTokenTypeValues.INPUT)) == 500.0
    assert (cap.histogram(M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, where(server)) or (0, 0.0))[0] == 3
    # every series carries the engine's address and nothing of the engine's own labels
    for metric in (M.RL_ROLLOUT_REQUESTS, M.RL_ROLLOUT_TOKENS, M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN):
        for attributes in cap.series(metric):
            assert attributes[A.SERVER_ADDRESS] == "127.0.0.1" and attributes[A.SERVER_PORT] == server.port
            assert not {"model_name", "engine", "le"} & set(attributes)


def test_a_restarted_engine_counts_from_zero_again(cap: Capture, serve: Callable[..., MetricsServer]) -> None:
    state = VllmState()
    server = serve(state.text)
    scraper = EngineScraper(cap.telemetry, [server.url])
    scraper.scrape_once()
    state.prompt, state.ttft = [40.0, 10.0], [[0.05], []]  # below the baseline: a fresh engine process
    scraper.scrape_once()
    cap.telemetry.flush()
    assert cap.telemetry.latest(M.RL_ROLLOUT_TOKENS, tokens(server, A.GenAiTokenTypeValues.INPUT)) == 50.0
    assert (cap.histogram(M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, where(server)) or (0, 0.0))[0] == 1


def test_the_per_request_tpot_wins_over_the_per_token_interval(cap: Capture, serve: Callable[..., MetricsServer]) -> None:
    per_request: list[float] = []

    def page() -> str:
        labels = {"model_name": "m", "engine": "0"}
        return "\n".join(
            [
                histogram("vllm:inter_token_latency_seconds", "ITL", VLLM_TPOT_BUCKETS, [(labels, [0.02] * 10 * len(per_request))]),
                histogram("vllm:request_time_per_output_token_seconds", "TPOT", VLLM_TPOT_BUCKETS, [(labels, per_request)]),
            ]
        )

    server = serve(page)
    scraper = EngineScraper(cap.telemetry, [server.url])
    scraper.scrape_once()
    per_request.extend([0.02, 0.3])
    scraper.scrape_once()
    count, total = cap.histogram(M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, where(server)) or (0, 0.0)
    assert count == 2 and 0.01 + 0.2 < total <= 0.025 + 0.3


# --------------------------------------------------------------------------- SGLang


def test_sglang_metrics_with_tensor_parallel_ranks_count_once(cap: Capture, serve: Callable[..., MetricsServer]) -> None:
    state = SglangState()
    server = serve(state.text)
    tel = cap.telemetry
    scraper = EngineScraper(tel, [f"127.0.0.1:{server.port}"])
    with tel.step(0):
        scraper.scrape_once()
    state.retracted, state.prompt, state.generation = 5.0, state.prompt + 123, state.generation + 4567
    state.ttft = [*state.ttft, 0.11, 450.0]
    with tel.step(1):
        scraper.scrape_once()
    tel.flush()
    assert tel.latest(M.RL_ROLLOUT_REQUESTS, running(server)) == 7.0  # not 14: tp_rank 1 repeats rank 0
    assert tel.latest(M.RL_ROLLOUT_REQUESTS, waiting(server)) == 3.0
    assert tel.latest(M.RL_ROLLOUT_KV_CACHE_UTILIZATION, where(server)) == 0.66
    assert tel.latest(M.RL_ROLLOUT_ENGINE_PREEMPTIONS, where(server)) == 3.0
    assert tel.latest(M.RL_ROLLOUT_TOKENS, tokens(server, A.GenAiTokenTypeValues.INPUT)) == pytest.approx(123.0)
    assert tel.latest(M.RL_ROLLOUT_TOKENS, tokens(server, A.GenAiTokenTypeValues.OUTPUT)) == pytest.approx(4567.0)
    count, total = cap.histogram(M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, where(server)) or (0, 0.0)
    # 0.11 in (0.1, 0.2]; 450 past the last bound (400) sits at the mean the sum leaves: exact here
    assert count == 2 and total == pytest.approx(0.15 + 450.0, abs=0.05)


# --------------------------------------------------------------------------- failures


def test_an_engine_that_does_not_answer_is_reported_once_and_the_others_still_scraped(
    cap: Capture, serve: Callable[..., MetricsServer], caplog: pytest.LogCaptureFixture
) -> None:
    state = VllmState()
    server = serve(state.text)
    dead = f"http://127.0.0.1:{closed_port()}/metrics"
    missing = f"http://127.0.0.1:{server.port}/no-such-page"
    scraper = EngineScraper(cap.telemetry, [dead, missing, server.url], timeout_s=1.0)
    caplog.set_level(logging.INFO, logger="otel_rl")
    started = time.monotonic()
    answered = [scraper.scrape_once() for _ in range(3)]
    assert time.monotonic() - started < 5.0
    assert answered == [1, 1, 1]
    down = [r for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(down) == 2, [r.getMessage() for r in down]  # one per silent endpoint, whatever the scrapes
    assert any("HTTP 404" in r.getMessage() for r in down)
    cap.telemetry.flush()
    assert cap.telemetry.latest(M.RL_ROLLOUT_REQUESTS, running(server)) == 5.0


def test_an_engine_that_comes_back_is_read_again(
    cap: Capture, serve: Callable[..., MetricsServer], caplog: pytest.LogCaptureFixture
) -> None:
    up = {"now": False}

    def page() -> str:
        if not up["now"]:
            raise ConnectionResetError  # the handler dies: the client sees a broken answer
        return gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", [({"model_name": "m", "engine": "0"}, 4.0)]
        )

    server = serve(page)
    scraper = EngineScraper(cap.telemetry, [server.url], timeout_s=1.0)
    caplog.set_level(logging.INFO, logger="otel_rl")
    assert scraper.scrape_once() == 0
    up["now"] = True
    assert scraper.scrape_once() == 1
    assert any("answers again" in r.getMessage() for r in caplog.records)
    cap.telemetry.flush()
    assert cap.telemetry.latest(M.RL_ROLLOUT_REQUESTS, running(server)) == 4.0


def test_lines_that_are_not_the_format_are_skipped_and_said_once(
    cap: Capture, serve: Callable[..., MetricsServer], caplog: pytest.LogCaptureFixture
) -> None:
    def page() -> str:
        return (
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="m",engine="0"} 6.0\n'
            "<html>this is not a metrics page</html>\n"
            'vllm:num_requests_waiting{model_name="m",engine="0" 2.0\n'
            'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.4\n'
        )

    server = serve(page)
    scraper = EngineScraper(cap.telemetry, [server.url])
    caplog.set_level(logging.WARNING, logger="otel_rl")
    for _ in range(3):
        scraper.scrape_once()
    said = [r.getMessage() for r in caplog.records if "not in the Prometheus text format" in r.getMessage()]
    assert len(said) == 1 and "2 line(s)" in said[0] and "line 3" in said[0], said
    cap.telemetry.flush()
    assert cap.telemetry.latest(M.RL_ROLLOUT_REQUESTS, running(server)) == 6.0
    assert cap.telemetry.latest(M.RL_ROLLOUT_REQUESTS, waiting(server)) is None
    assert cap.telemetry.latest(M.RL_ROLLOUT_KV_CACHE_UTILIZATION, where(server)) == 0.4


def test_credentials_in_an_endpoint_never_reach_the_log(cap: Capture, caplog: pytest.LogCaptureFixture) -> None:
    scraper = EngineScraper(cap.telemetry, [f"http://user:s3cret@127.0.0.1:{closed_port()}/metrics?token=t0ken"], timeout_s=1.0)
    caplog.set_level(logging.INFO, logger="otel_rl")
    scraper.scrape_once()
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "did not answer" in text and "s3cret" not in text and "t0ken" not in text


# --------------------------------------------------------------------------- the thread and init()


def test_the_daemon_thread_scrapes_on_its_interval_and_stops_with_the_telemetry(tmp_path: Any, serve: Callable[..., MetricsServer]) -> None:
    state = VllmState()
    server = serve(state.text)
    with capture(tmp_path / "run") as c:
        tel = c.telemetry
        scraper = scrape_engines(tel, [server.url], interval_s=0.05)
        assert scraper_of(tel) is scraper
        deadline = time.monotonic() + 10
        while server.hits < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.hits >= 3
        again = scrape_engines(tel, [server.url], interval_s=0.05)  # replaces the first: no double counting
        assert scraper_of(tel) is again and not scraper._thread.is_alive()  # type: ignore[union-attr]
    # shut down: the thread sees it and ends
    deadline = time.monotonic() + 5
    while again._thread.is_alive() and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.02)
    assert not again._thread.is_alive()  # type: ignore[union-attr]


def test_init_reads_the_engines_named_in_the_environment(
    tmp_path: Any, serve: Callable[..., MetricsServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve(VllmState().text)
    monkeypatch.setenv("OTEL_RL_ENGINE_ENDPOINTS", f"127.0.0.1:{server.port}, http://127.0.0.1:{closed_port()}")
    tel = otel_rl.init(run_dir=str(tmp_path / "run"), exporters="file", console=False)
    try:
        scraper = scraper_of(tel)
        assert scraper is not None and scraper.endpoints[0] == server.url and len(scraper.endpoints) == 2
        deadline = time.monotonic() + 10
        while server.hits < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        tel.flush()
        deadline = time.monotonic() + 10
        while tel.latest(M.RL_ROLLOUT_REQUESTS, running(server)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
            tel.flush()
        assert tel.latest(M.RL_ROLLOUT_REQUESTS, running(server)) == 5.0
    finally:
        otel_rl.shutdown()


def test_spread_keeps_counts_exact_and_values_inside_their_buckets() -> None:
    from otel_rl._sdk.sources.engine_scrape import spread

    values = spread([0.1, 0.5, 1.0, math.inf], [2, 0, 3, 1], total_sum=2 * 0.05 + 3 * 0.75 + 9.0)
    assert values.size == 6
    assert np.all((values[:2] > 0) & (values[:2] <= 0.1))
    assert np.all((values[2:5] > 0.5) & (values[2:5] <= 1.0))
    assert values[5] == pytest.approx(9.0)
    assert spread([0.1, math.inf], [0, 2], total_sum=0.0).tolist() == [0.1, 0.1]  # never below the last bound
