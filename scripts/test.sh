#!/usr/bin/env bash
# Set up (first run only) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/setup.sh"
cd "$root"
venv="${OTEL_RL_VENV:-$root/.venv}"
# The local stack's servers, first run only: the collector and Jaeger are built from Go modules
# (minutes the first time, then cached in ~/.cache/otel-rl/stack), VictoriaMetrics and Prometheus
# come from Debian's archive. Done here, not inside a test, so that no test's deadline pays for a
# cold build. Without Go this says so and the tests that need those two skip, naming why; a failed
# install is not the end of the run: the tests that need the server say what is missing.
"$venv/bin/otel-rl" stack install --dir "$root/.stack" ||
  echo "otel-rl: the local stack is not fully installed (see above); the tests that need it will fail or skip, naming it" >&2
# Parallel workers (pytest-xdist), a file at a time; the tests that run a local stack or install its
# servers stay on one worker, in order (tests/conftest.py schedules them). OTEL_RL_TEST_WORKERS=0
# runs everything in this process. --durations: the slowest tests, for whoever wants the run shorter.
workers="${OTEL_RL_TEST_WORKERS:-auto}"
set +e
if [ "$workers" = "0" ]; then
  "$venv/bin/python" -m pytest --durations=15 "$@"
else
  "$venv/bin/python" -m pytest -n "$workers" --durations=15 "$@"
fi
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "otel-rl: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
