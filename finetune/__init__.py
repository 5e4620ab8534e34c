"""finetune: teach a language model to answer the way your team answers.

import finetune
config = finetune.RunConfig(data="train.jsonl", model="path/to/model", out="runs/one")
result = finetune.train(config)          # a TrainResult: .report (report.json), .plan, .final_weights
"""

# The subpackage finetune.train is imported here, before the function of the same name is defined: a
# submodule import binds its name on the parent package only the first time, so importing
# finetune.train.* later (as every run does) can no longer replace the function `finetune.train`.
import finetune.train as _train_package  # noqa: F401
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.settings.version import __version__

__all__ = ["RunConfig", "UserError", "__version__", "train"]


def train(config: RunConfig, on_plan=None, on_step=None):
    """Plan and run one training job; returns a TrainResult (see finetune.run). Prints nothing:
    `on_plan(plan)` and `on_step(metrics_row)` report progress; notes go to the `finetune` logger."""
    from finetune.run import train as run  # torch: `import finetune` (and the command line) starts without it

    return run(config, on_plan=on_plan, on_step=on_step)
