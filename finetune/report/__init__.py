"""The report layer of a run: metrics log, loss-curve plot, diagnosis, summary (see docs/report.md).

Importing this package is cheap: matplotlib and rich are imported only when a plot or a summary is made.
"""

from finetune.report.diagnosis import REMINDER, Diagnosis, diagnose
from finetune.report.metrics import MetricsLog, read_metrics
from finetune.report.plot import plot_loss_curve
from finetune.report.summary import build_report, print_summary, write_report

__all__ = [
    "REMINDER",
    "Diagnosis",
    "MetricsLog",
    "build_report",
    "diagnose",
    "plot_loss_curve",
    "print_summary",
    "read_metrics",
    "write_report",
]
