"""Reading what a run left behind: its run folder (OTLP/JSON lines), one step's trace from
Jaeger or as Jaeger's JSON, and pushing its disk spool to a collector."""
