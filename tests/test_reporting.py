"""ReportOnce: a key is said once, forgetting is explicit, and a full memory never silences."""

from __future__ import annotations

import logging

from otel_rl.reporting import LOGGER_NAME, ReportOnce


def test_each_key_is_logged_once_with_its_arguments(caplog):
    report = ReportOnce()
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        assert report(("k", "nan"), "bad value for %r: %s", "k", "nan")
        assert not report(("k", "nan"), "bad value for %r: %s", "k", "nan")
        assert report(("k", "inf"), "bad value for %r: %s", "k", "inf", level=logging.INFO)
    assert [r.getMessage() for r in caplog.records] == ["bad value for 'k': nan", "bad value for 'k': inf"]
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]
    assert ("k", "nan") in report
    report.forget()
    assert report.first(("k", "nan"))


def test_past_its_limit_new_keys_are_still_reported():
    report = ReportOnce(limit=2)
    assert report.first("a") and report.first("b")
    assert report.first("c") and report.first("c")  # not remembered, never silenced
    assert not report.first("a")
