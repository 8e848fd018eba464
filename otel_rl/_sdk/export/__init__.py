"""Exporting: the SDK providers every signal leaves through, built from the settings (``providers``:
run folder, OTLP, the spool, trackers), the run folder's spans and events queued for the worker
(``file_exports``) and shutdown within its timeout (``shutdown``). May import ``settings``,
``otlp``, ``spool`` and ``pipeline``.
"""
