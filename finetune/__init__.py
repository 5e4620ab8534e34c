"""finetune: teach a language model to answer the way your team answers.

import finetune
config = finetune.RunConfig(data="train.jsonl", model="path/to/model", out="runs/one")
result = finetune.train(config)
"""

from finetune.config import RunConfig
from finetune.errors import UserError

__all__ = ["RunConfig", "UserError", "train"]
__version__ = "0.1.0"


def train(config: RunConfig):
    """Plan and run one training job; returns the run's report (see finetune.train.loop)."""
    from finetune.train.run import run_training

    return run_training(config)
