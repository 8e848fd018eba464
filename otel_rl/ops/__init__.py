"""Operations artefacts generated from the registry: Grafana dashboards (and rendering their panels
without Grafana) and the alert rules for Prometheus / vmalert and Grafana."""
