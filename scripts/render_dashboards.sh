#!/usr/bin/env bash
# Redraw docs/dashboards/*.png from a real run: a demo through the local stack's collectors into
# VictoriaMetrics, then `otel-rl dashboards render` with each board's own queries. Run it after a
# board changes (tests/grafana/test_dashboard_pictures.py fails until the pictures match the boards).
# The stack runs in its own data folder and port range and is stopped at the end, whatever happens.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/setup.sh"
cd "$root"
bin="${OTEL_RL_VENV:-$root/.venv}/bin"
work="$(mktemp -d)"
export OTEL_RL_STACK_DIR="$work/stack"
# Installs come from the shared cache (~/.cache/otel-rl/stack); the ports move clear of a running stack.
offset="$("$bin/python" -c 'from otel_rl.stack import free_port_offset; print(free_port_offset())')"
export OTEL_RL_STACK_PORT_OFFSET="$offset"
trap '"$bin/otel-rl" stack down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
"$bin/otel-rl" stack up
vm_port=$((8428 + offset))
agent_port=$((4317 + offset))
ppo_run="render-ppo-$$" agent_run="render-agent-$$"
OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$agent_port" OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_METRIC_EXPORT_INTERVAL=2000 \
  OTEL_RL_RUN_ID="$ppo_run" "$bin/otel-rl" demo --steps 30 --algo ppo --ranks 2 --slow-rank 1 --out "$work/run" --quiet
sleep 5 # the last export interval and the gateway's batch reach VictoriaMetrics
"$bin/otel-rl" dashboards render --vm "http://127.0.0.1:$vm_port" --out docs/dashboards/ --run "$ppo_run"
# The E2E board's rollout-latency row is fed by agent loops: drawn again from the agent demo's run.
OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$agent_port" OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_METRIC_EXPORT_INTERVAL=2000 \
  OTEL_RL_RUN_ID="$agent_run" "$bin/otel-rl" demo --agent --steps 100 --out "$work/agent" --quiet
sleep 5
"$bin/otel-rl" dashboards render --vm "http://127.0.0.1:$vm_port" --run "$agent_run" --board e2e-timeline --out "$work/agent-boards"
cp "$work/agent-boards/e2e-timeline.png" docs/dashboards/e2e-timeline-agent.png
(cd grafana/dashboards && sha256sum -- *.json) >docs/dashboards/boards.sha256
echo "docs/dashboards/: redrawn from the boards in grafana/dashboards/ (stamp: docs/dashboards/boards.sha256)"
