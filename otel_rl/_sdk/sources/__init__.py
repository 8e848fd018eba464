"""Sources that sample the machine or other processes: GPU and process probes (``probes``), vLLM /
SGLang ``/metrics`` pages read on a daemon thread (``engine_scrape``, through the Prometheus text
reader ``prom_text``), and torch.profiler windows and memory snapshots (``profiling``). May import
``settings``.
"""
