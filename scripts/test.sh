#!/usr/bin/env bash
# Set up (first run only) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/setup.sh"
cd "$root"
set +e
"${OTEL_RL_VENV:-$root/.venv}/bin/python" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "otel-rl: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
