"""Every ``OTEL_RL_*`` environment variable otel-rl reads, one documented constant each.

Explicit ``init()`` arguments beat these, they beat the config file, the file beats the defaults;
an invalid value warns once (naming the variable) and falls back. otel-rl also reads the standard
OpenTelemetry variables (``OTEL_SERVICE_NAME``, ``OTEL_EXPORTER_OTLP_*``,
``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``) and the launchers' ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``NODE_RANK``, as ``opentelemetry.sdk.environment_variables`` and
torchrun define them.
"""

# -- the run ------------------------------------------------------------------------------------
OTEL_RL_RUN_ID = "OTEL_RL_RUN_ID"
"""The run's id (``init(run_id=...)``); default: the start time and 6 random hex digits."""

OTEL_RL_EXPERIMENT = "OTEL_RL_EXPERIMENT"
"""The experiment a run belongs to (a tracker's project name)."""

OTEL_RL_FRAMEWORK = "OTEL_RL_FRAMEWORK"
"""Whose metric keys ``log()`` reads: ``roll``, ``verl``, ``trl``, ``swift`` (``semconv/mappings/``)."""

OTEL_RL_RUN_DIR = "OTEL_RL_RUN_DIR"
"""The run folder (OTLP/JSON files, spool, reports); default ``otel-rl-runs/<run id>``."""

OTEL_RL_CONFIG = "OTEL_RL_CONFIG"
"""A YAML file of ``init()`` settings, read between the environment and the defaults."""

# -- exporting ----------------------------------------------------------------------------------
OTEL_RL_EXPORTERS = "OTEL_RL_EXPORTERS"
"""Where telemetry goes: a comma-separated subset of ``auto``, ``file``, ``otlp``, ``none``."""

OTEL_RL_FILE_FLUSH_INTERVAL = "OTEL_RL_FILE_FLUSH_INTERVAL"
"""Milliseconds within which spans and events reach the run folder (and the spool): what a killed
process can lose of them. Default 20."""

OTEL_RL_SPOOL_DIR = "OTEL_RL_SPOOL_DIR"
"""Where OTLP exports wait while the collector is unreachable; default ``<run dir>/spool``."""

OTEL_RL_SPOOL_MAX_BYTES = "OTEL_RL_SPOOL_MAX_BYTES"
"""The spool's size cap per process (``256MiB``, ``1GB``); 0 turns the spool off."""

OTEL_RL_METRICS_AT_LOG_TIME = "OTEL_RL_METRICS_AT_LOG_TIME"
"""``true``: each ``log()`` value becomes a data point at its own time (backfilling an old log)."""

OTEL_RL_ENGINE_ENDPOINTS = "OTEL_RL_ENGINE_ENDPOINTS"
"""Inference engines whose Prometheus ``/metrics`` become the rollout metrics (vLLM, SGLang):
comma-separated, ``http://127.0.0.1:8000/metrics`` or ``host:port``. Unset: none are read."""

# -- the hot path and its limits ----------------------------------------------------------------
OTEL_RL_CONSOLE = "OTEL_RL_CONSOLE"
"""``false`` turns off the one-line step summary on stderr."""

OTEL_RL_STRICT = "OTEL_RL_STRICT"
"""``true``: bad values raise in ``log()`` instead of being counted and reported once (for tests)."""

OTEL_RL_UNMAPPED_KEY_LIMIT = "OTEL_RL_UNMAPPED_KEY_LIMIT"
"""How many unmapped keys get series of their own before the rest are only counted. Default 256."""

OTEL_RL_SERIES_LIMIT = "OTEL_RL_SERIES_LIMIT"
"""Attribute sets per metric and process (0: no cap). Default 2000."""

OTEL_RL_PER_RANK_METRICS = "OTEL_RL_PER_RANK_METRICS"
"""Metrics a rank other than rank 0 sends whole to the metrics store, beyond the series budget:
``all``, or registry metric names separated by commas. Default: none (docs/overhead.md, "The
series budget")."""

OTEL_RL_MAX_QUEUE = "OTEL_RL_MAX_QUEUE"
"""Items the worker may lag behind the loop before ``log()`` / ``record()`` drop (counted). Default 1000."""

OTEL_RL_EXPORT_TEXT = "OTEL_RL_EXPORT_TEXT"
"""``true`` lets text (prompts, completions) into the exported events."""

OTEL_RL_LOG_SAMPLES = "OTEL_RL_LOG_SAMPLES"
"""Rollout samples (prompt, response, rewards) kept per step by ``Telemetry.log_samples``: 0 (the
default) turns them off; samples carry text, so they are opt-in."""

OTEL_RL_SAMPLE_TEXT_LIMIT = "OTEL_RL_SAMPLE_TEXT_LIMIT"
"""Bytes of a sample's prompt or response kept (cut on a UTF-8 boundary, with a marker). Default 2048."""

OTEL_RL_TRAJECTORY_SAMPLE_RATIO = "OTEL_RL_TRAJECTORY_SAMPLE_RATIO"
"""Share of agent trajectories (``Telemetry.trajectory``) exported as traces by the head ratio, 0 to 1;
the step's tail rule keeps the slowest, failed and extreme-reward ones besides. Default 0.01."""

OTEL_RL_TRAJECTORY_KEEP_SLOWEST = "OTEL_RL_TRAJECTORY_KEEP_SLOWEST"
"""The slowest agent trajectories of each step always exported as traces. Default 3."""

OTEL_RL_TRAJECTORY_LIMIT = "OTEL_RL_TRAJECTORY_LIMIT"
"""Agent trajectories a process holds at once (open, or finished and awaiting their step's sampling
decision); past it new ones are counted, not recorded. Default 16384."""

OTEL_RL_ALERT_RULES = "OTEL_RL_ALERT_RULES"
"""Online alert rules: ``default``, ``off`` or a YAML rules file."""

OTEL_RL_PEAK_FLOPS = "OTEL_RL_PEAK_FLOPS"
"""The device's peak FLOP/s, for MFU when the GPU model is not in the built-in table."""

OTEL_RL_PROFILE_STEPS = "OTEL_RL_PROFILE_STEPS"
"""Steps to run torch.profiler over: ``10-12``, ``5`` or ``5,9-11`` (one window per range); each
window's trace goes to ``<run_dir>/profiles/``. Unset: no profiling, no cost."""

OTEL_RL_MEMORY_SNAPSHOT_ON_ALERT = "OTEL_RL_MEMORY_SNAPSHOT_ON_ALERT"
"""``true``: record the CUDA allocator's history and dump a memory snapshot into
``<run_dir>/profiles/`` when the ``memory_risk`` alert fires (CUDA only)."""

# -- trackers -----------------------------------------------------------------------------------
OTEL_RL_TRACK_WITH = "OTEL_RL_TRACK_WITH"
"""Trackers fed with each step's values: ``tensorboard``, ``wandb``, ``swanlab``, ``mlflow``,
``stdout``, ``jsonl`` (comma-separated)."""

OTEL_RL_TRACKER_KEYS = "OTEL_RL_TRACKER_KEYS"
"""The keys trackers show: ``original`` (as logged) or ``registry`` (registry metric names)."""

OTEL_RL_TRACKER_ALL_RANKS = "OTEL_RL_TRACKER_ALL_RANKS"
"""``true``: every rank feeds the trackers, not only rank 0."""

OTEL_RL_BRIDGE_ENDPOINT = "OTEL_RL_BRIDGE_ENDPOINT"
"""Where a collector's trackers bridge listens (``http://HOST:4319``); it takes OTLP logs."""

OTEL_RL_BRIDGE_CONFIG_SHA256 = "OTEL_RL_BRIDGE_CONFIG_SHA256"
"""Set by ``otel-rl stack`` on the bridge it starts: the digest of the config it was given."""

OTEL_RL_BRIDGE_TOKEN = "OTEL_RL_BRIDGE_TOKEN"
"""A bearer token the tracker bridge requires on every POST (``Authorization: Bearer <token>``); unset: none."""

# -- the local stack ----------------------------------------------------------------------------
OTEL_RL_STACK_DIR = "OTEL_RL_STACK_DIR"
"""The local stack's data folder; default ``otel-rl/stack`` in ``$XDG_DATA_HOME`` (``~/.local/share``), whatever the working directory."""

OTEL_RL_STACK_CACHE = "OTEL_RL_STACK_CACHE"
"""Where the stack's downloaded servers and Go builds are kept; default ``~/.cache/otel-rl/stack``."""

OTEL_RL_GO = "OTEL_RL_GO"
"""The ``go`` command the stack builds the collector and Jaeger with; default ``go`` on PATH, else ``/usr/local/go/bin/go``."""

OTEL_RL_STACK_PORT_OFFSET = "OTEL_RL_STACK_PORT_OFFSET"
"""Added to every default port of the local stack (two stacks on one machine). Default 0."""

OTEL_RL_STACK_CONFIG_SHA256 = "OTEL_RL_STACK_CONFIG_SHA256"
"""Set by ``otel-rl stack`` on the collectors, Jaeger and Prometheus it starts: the digest of their config files
(recorded with the launch, so that a changed file restarts the server)."""

# -- the project's own tooling (its tests, benchmarks and scripts; the package does not read these) --
OTEL_RL_VENV = "OTEL_RL_VENV"
"""scripts/setup.sh and test.sh: the virtual environment to create and use (default ``.venv``)."""

OTEL_RL_REQUIRE_SHARED = "OTEL_RL_REQUIRE_SHARED"
"""Tests: ``1`` turns the skip of tests that read ``../shared`` (real logs, reference files) into a failure (CI sets it)."""

OTEL_RL_LOOPBACK_NETNS = "OTEL_RL_LOOPBACK_NETNS"
"""Tests: set inside the loopback-only network namespace the Ray tests re-run in."""

OTEL_RL_E2E_STACK_DIR = "OTEL_RL_E2E_STACK_DIR"
"""End-to-end tests: the data folder of the local stack they start."""

OTEL_RL_E2E_PORT_OFFSET = "OTEL_RL_E2E_PORT_OFFSET"
"""End-to-end tests: the port offset of the local stack they start."""

OTEL_RL_REQUIRE_BROWSER = "OTEL_RL_REQUIRE_BROWSER"
"""Tests: ``1`` turns the skip of the test that renders an analyze report in headless Chromium, without Chromium, into a failure (CI sets it)."""

OTEL_RL_REQUIRE_GO = "OTEL_RL_REQUIRE_GO"
"""Tests: ``1`` turns the skip of tests that run the collector or Jaeger built with Go, on a machine without Go, into a failure (CI sets it)."""

OTEL_RL_ALERT_TOOLS_DIR = "OTEL_RL_ALERT_TOOLS_DIR"
"""Tests: where promtool and vmalert are kept for the alert-rule checks."""

OTEL_RL_GRAFANA_SCHEMA_DIR = "OTEL_RL_GRAFANA_SCHEMA_DIR"
"""Tests: where Grafana's dashboard schema is kept for the board checks."""

OTEL_RL_FAULTS_FIGURES = "OTEL_RL_FAULTS_FIGURES"
"""Tests: a file the fault-injection tests write their measured figures to."""
