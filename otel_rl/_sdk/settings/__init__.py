"""Settings: what ``init()`` resolves (``config``: arguments over ``OTEL_*`` / ``OTEL_RL_*``
variables over a config file, every value parsed and checked, a bad one named), the option
groups of the public API (``options``), the parsers of values other parts read (``parsers``),
unknown variable names (``env_names``) and the one redaction of secrets from URLs, headers and
library logs (``redaction``). The bottom of the runtime: imports nothing else of ``_sdk``.
"""
