"""Detection on metric series: the robust baseline, offline findings (``otel-rl analyze``) and the
online alert detectors the runtime feeds. Pure computation: no I/O, no SDK."""
