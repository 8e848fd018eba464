"""Reading what a run left behind: its run folder (OTLP/JSON lines), one step's trace from a
Phoenix store or as Jaeger JSON, and pushing its disk spool to a collector."""
