"""Experiment-tracker backends (TensorBoard, W&B, SwanLab, MLflow, stdout, jsonl), one per file,
behind the ``Tracker`` base class and its registry, and the fan-out that feeds them from the
runtime's step events."""
