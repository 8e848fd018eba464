"""Reading what a run left behind: its run folder (OTLP/JSON lines), one step's trace from
Jaeger or as Jaeger's JSON, and pushing its disk spool to a collector; and where the commands
that read it may write their output (``out_path``: never over the run's own files)."""
