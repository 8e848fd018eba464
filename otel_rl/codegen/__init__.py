"""The semantic-convention registry (``semconv/registry/*.yaml``): loading and checking it, and
generating ``otel_rl/semconv/`` and the Markdown reference from it."""
