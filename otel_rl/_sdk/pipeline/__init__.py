"""The telemetry worker and what it does with each step: the bounded queue and the thread that drains
it (``worker``), the items and what a drop costs (``backlog``), a key set's plan and packed steps
(``step_plan``), values as events carry them (``values``), latest values and histograms
(``aggregation``), the registry's gauges and counters read from them at each export (``direct_metrics``), what a rank other than 0 sends a metrics store (``series_budget``), rollout samples (``samples``), goodput (``goodput``), refused input said once
(``refusals``), text UTF-8 cannot encode made safe (``utf8``) and the exit summary (``summary``). May import ``settings`` and ``keys``.
"""
