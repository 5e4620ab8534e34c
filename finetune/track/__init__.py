"""Trackers: a run's steps, plan and outputs sent to TensorBoard, MLflow or Weights & Biases (--report-to).

    trackers = start_trackers(config, plan)   # rank 0, once plan.json is written
    on_step = trackers.chain(on_step)          # each metrics row also goes to every tracker
    trackers.finish(out, report)               # after report.json, loss_curve.png and the model card

No tracker can stop or slow the run (base.py says how); each one's library is imported on its own thread, only
when --report-to names it. See docs/trackers.md.
"""

from finetune.settings.tracker_options import TRACKERS, check_installed, parse_report_to, parse_tracker_options
from finetune.track.base import Trackers, start_trackers

__all__ = ["TRACKERS", "Trackers", "check_installed", "parse_report_to", "parse_tracker_options", "start_trackers"]
