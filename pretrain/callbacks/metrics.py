"""The metrics sinks (TensorBoard, JSONL, W&B, MLflow: pretrain/run/metrics.py) as a callback; its settings are the
`logging.*` keys that switch each on. It also sums the figures a model output carries (`OutputMetrics`: ELECTRA's
two losses) on the device and adds them to each logging row. Rank 0 writes; the other ranks' sinks are off."""

from __future__ import annotations

from typing import Any

from core.callbacks import Callback


class MetricsSinks(Callback):
    name = "metrics"
    section = "logging"

    def on_start(self, run: Any, progress: Any) -> None:
        from pretrain.run.metrics import MetricsLogger, OutputMetrics

        self.logger = MetricsLogger.from_config(run.cfg, run.layout.logs, run.rank == 0)
        self.outputs = OutputMetrics()

    def on_step_begin(self, step: int) -> None:
        self.outputs.new_step()

    def on_forward(self, output: Any) -> None:
        self.outputs.add(output)

    def metrics(self, step: int, loader_wait_s: float) -> dict[str, float]:
        return self.outputs.report()  # one all-reduce at logging steps (every rank logs at the same steps)

    def on_log(self, step: int, row: dict[str, Any], prefix: str) -> None:
        self.logger.log(step, row, prefix=prefix)

    def on_end(self, run: Any, progress: Any) -> None:
        self.logger.close()
