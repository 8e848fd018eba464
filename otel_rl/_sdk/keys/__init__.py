"""Key resolution: how a key a framework logs (``actor/pg_loss``, ``timing_s/gen``) becomes a
registry metric with attributes and a unit (``resolver``), from the framework mappings in
``semconv/mappings`` (``mappings``), the pattern rules (``rules``) and unit conversions
(``transforms``). Pure functions of the key: imports nothing else of ``_sdk``.
"""
