"""init()'s option groups: the same settings as the flat keywords, and never both at once."""

from __future__ import annotations

import dataclasses

import pytest

import otel_rl
from otel_rl import AlertOptions, ExportOptions, LimitOptions, TrackerOptions


def _effective(tel: otel_rl.Telemetry) -> dict:
    out = tel.config.public_dict()
    for volatile in ("run_id", "run_dir", "config_file"):
        out.pop(volatile)
    return out


def test_groups_give_the_same_config_as_the_flat_keywords(tmp_path):
    flat = otel_rl.Telemetry(
        otel_rl.resolve_config(
            dict(
                run_dir=str(tmp_path / "a"),
                console=False,
                exporters="file",
                metric_export_interval_s=5.0,
                spool_max_bytes="1MiB",
                track_with="jsonl",
                tracker_keys="registry",
                series_limit=50,
                max_queue=10,
                export_text=True,
                alert_rules="off",
            )
        )
    )
    flat.shutdown()
    grouped = otel_rl.init(
        run_dir=str(tmp_path / "b"),
        console=False,
        export=ExportOptions(exporters="file", metric_export_interval_s=5.0, spool_max_bytes="1MiB"),
        trackers=TrackerOptions(track_with="jsonl", tracker_keys="registry"),
        limits=LimitOptions(series_limit=50, max_queue=10, export_text=True),
        alerts=AlertOptions(alert_rules="off"),
    )
    try:
        assert _effective(grouped) == _effective(flat)
        assert grouped.config.series_limit == 50 and grouped.config.exporters == ("file",)
    finally:
        grouped.shutdown()


def test_an_option_given_flat_and_in_a_group_names_it(tmp_path):
    with pytest.raises(TypeError, match="max_queue twice"):
        otel_rl.init(run_dir=str(tmp_path), console=False, max_queue=5, limits=LimitOptions(max_queue=6))
    assert otel_rl.get_telemetry() is None or otel_rl.get_telemetry().run_dir != tmp_path


def test_every_group_field_is_an_init_keyword_and_secrets_stay_out_of_repr():
    keywords = set(otel_rl.init.__code__.co_varnames[: otel_rl.init.__code__.co_kwonlyargcount])
    for group in (ExportOptions, TrackerOptions, LimitOptions, AlertOptions):
        assert {f.name for f in dataclasses.fields(group)} <= keywords, group.__name__
    assert "sk-secret" not in repr(TrackerOptions(track_with="wandb", tracker_kwargs={"api_key": "sk-secret"}))
