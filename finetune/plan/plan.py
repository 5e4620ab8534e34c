"""The Plan: a run's settings with every Auto value resolved, plus the numbers derived from them. No torch.

    plan = build_plan(config, prepared.summary, load_model_facts(config.model))   # plan/build.py
    plan.run.lr, plan.total_steps, plan.effective_batch, ...    # what the training loop obeys
    plan.learning_rate                                          # a setting by its plan.json name (= plan.run.lr)
    plan.to_dict()                                              # plan.json / `finetune plan --json`
    Plan.from_dict(json.loads(text))                            # the plan a trainer executes (`train --plan`)

The Plan holds the resolved RunConfig (`run`) rather than copies of its fields: a setting keeps the one
declaration it has in config.py, and plan.json names it by its declared `plan_key`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any

from finetune.data.types import DataSummary
from finetune.rules.billing import billing
from finetune.rules.cost import CostEstimate
from finetune.rules.memory import MemoryEstimate
from finetune.rules.model_facts import ModelFacts
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.settings.registry import settings
from finetune.settings.wording import Audience, rendered

PLAN_FORMAT = 2  # bump when plan.json's layout changes in a way `Plan.from_dict` must know


@dataclass
class Plan:
    """Everything the training loop obeys, and everything a user needs to decide whether to run.

    The type chain: RunConfig + DataSummary (+ ModelFacts) -> build_plan -> Plan -> the loop (reads the Plan)
    -> the report (takes the Plan). plan.json is `to_dict()`: the data's numbers, each setting under its
    plan.json name, the derived numbers, and the whole resolved config under "settings" (what `from_dict` reads).
    """

    run: RunConfig
    """The run's settings with every Auto value resolved (settings that do not apply keep their defaults)."""
    data: DataSummary
    """The data the run trains on (its fields are top-level keys of plan.json)."""
    effective_batch: int = field(metadata={"label": "Effective batch"})
    """batch_size x grad_accum x devices: records per optimizer step."""
    steps_per_epoch: int = field(metadata={"label": "Steps per epoch"})
    """ceil(examples / effective_batch), floor when the last partial batch is dropped."""
    total_steps: int = field(metadata={"label": "Total steps"})
    """Optimizer steps the loop takes (cut to max_steps when that is smaller)."""
    planned_steps: int = field(metadata={"label": "Planned steps"})
    """steps_per_epoch x epochs, before any max_steps cut."""
    tokens_processed: int | None = field(metadata={"label": "Tokens processed"})
    """Tokens billed (plan.json's `tokens_billed` too): the tenant's own tokens in the file (its training file's, and
    its general conversations' with general_data) x epochs, cut like the steps by a dropped last batch or max_steps;
    not the rows the base model answered for replay (tokens_trained counts them). rules/billing.py."""
    tokens_exact: bool
    """False when tokens are estimated (no tokenizer, a dropped last batch, or a max_steps cut)."""
    times_each_example_seen: float
    """Passes each record makes through the model (= epochs for a full run keeping the last batch)."""
    memory: MemoryEstimate
    """Peak memory per device, by part (an estimate)."""
    cost: CostEstimate
    """Cost by tokens, and time and its cost (estimates)."""
    auto: dict[str, str] = field(default_factory=dict)
    """plan.json name -> reason, for every value Auto chose."""
    warnings: list[dict] = field(default_factory=list)
    """Advice: {"code", "message"} (+ the message's "template", wording.py), codes stable (docs/auto.md)."""
    code_version: str = ""
    """The finetune code that made the plan (finetune/settings/version.py): a trainer refuses a plan of other code."""
    chat_template: str | None = None
    """The chat template the data is rendered with: "model" (its own), "chatml", or a Jinja file's path."""
    device: str | None = field(default=None, metadata={"label": "Device"})
    """Where every model of the run is placed: "cpu" or "cuda" (the plan's device; its precision is `dtype`)."""
    base_origin: dict | None = None
    """The GGUF file (and its sha256) the base was converted from; None for any other base."""
    tokens_trained: int | None = None
    """Tokens the loop reads: tokens_processed plus the rows the base model answered for replay (equal to it without
    them)."""
    replay_added: dict | None = None
    """Self-replay: the ratio, replay rows and their tokens, their source, and whether they are billed (the tenant's
    own general conversations) or not (the base model's answers: the product's own work)."""
    general_val_set: dict | None = None
    """The forgetting curve's set (general_val on): prompts, records, tokens, evaluations and their time (not billed)."""
    model_facts: ModelFacts | None = field(default=None, repr=False)
    """The model's numbers the plan used (not written to plan.json: they are re-read from the model)."""

    # ---- the run's nature, under the names plan.json has always used
    @property
    def method(self) -> str:
        """ "lora" or "full": the weights the run trains (for preference tuning, its base_method)."""
        return self.run.trained_weights

    @property
    def objective(self) -> str:
        """ "sft" (supervised: the team's answers) or "dpo" (preference: chosen over rejected answers)."""
        return self.run.objective

    def __getattr__(self, name: str) -> Any:
        """A setting by its plan.json name (plan.learning_rate is plan.run.lr); None where it does not apply."""
        spec = _by_plan_key().get(name)
        if spec is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        run = self.__dict__.get("run")
        if run is None:
            raise AttributeError(name)
        return getattr(run, spec.name) if spec.applies(run.objective, run.trained_weights) else None

    @property
    def tokens_billed(self) -> int | None:
        """The tokens the plan bills (tokens_processed under the name that says so)."""
        return self.tokens_processed

    @property
    def replay_billed(self) -> bool:
        """Rows mixed in by replay that are billed: the tenant's own general conversations (general_data)."""
        return bool((self.replay_added or {}).get("billed"))

    def billing(self) -> dict:
        """plan.json's `billing`: what is billed and why (rules/billing.py)."""
        return billing(self.tokens_processed, self.tokens_trained, self.replay_added, "planned")

    # ---- plan.json
    def settings_dict(self) -> dict[str, Any]:
        """Each setting recorded in plan.json, by its plan.json name (None where it does not apply)."""
        return {key: getattr(self, key) for key in _by_plan_key()}

    def to_dict(self, audience: Audience | None = None, method_type: str | None = None) -> dict[str, Any]:
        """The JSON of `finetune plan --json` and of plan.json, its messages in the reader's terms (wording.py)."""
        derived = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_DERIVED}
        document = dataclasses.asdict(self.data) | self.settings_dict() | derived
        document["method"], document["objective"] = self.method, self.objective
        document["dropped_lines"] = list(self.data.dropped_lines)
        document["memory"], document["cost"] = self.memory.to_dict(), self.cost.to_dict()
        document["auto"], document["warnings"] = dict(self.auto), [dict(w) for w in self.warnings]
        document["tokens_billed"], document["billing"] = self.tokens_billed, self.billing()
        document["settings"] = _jsonable(self.run.to_dict())
        document["plan_format"] = PLAN_FORMAT
        for warning in document["warnings"]:  # in memory a warning keeps its template; a document has one wording
            template = warning.pop("template", None)
            if template is not None:
                warning["message"] = template
        return rendered(document, audience, method_type)

    @classmethod
    def from_dict(cls, document: dict[str, Any], **overrides: Any) -> Plan:
        """A Plan from plan.json (made by this code); `overrides` replace settings of a run's own (out, resume)."""
        if document.get("plan_format") != PLAN_FORMAT or "settings" not in document:
            raise UserError(
                "this plan.json was written by another version of finetune (or is not a plan.json): plan again"
            )
        run = RunConfig.from_dict({**document["settings"], **overrides})
        data = DataSummary(**_known(DataSummary, document) | {"dropped_lines": tuple(document["dropped_lines"])})
        derived = _known(cls, document, exclude=_NOT_DERIVED)
        return cls(
            run=run,
            data=data,
            memory=MemoryEstimate(**_known(MemoryEstimate, document["memory"])),
            cost=CostEstimate(**_known(CostEstimate, document["cost"])),
            **derived,
        )


_NOT_DERIVED = frozenset({"run", "data", "memory", "cost", "model_facts"})


@cache
def _by_plan_key():
    return {s.plan_key: s for s in settings() if s.plan_key is not None}


def _known(cls: type, document: dict, exclude: frozenset[str] = frozenset()) -> dict:
    names = {f.name for f in fields(cls)} - exclude
    return {k: v for k, v in document.items() if k in names}


def _jsonable(values: dict) -> dict:
    return {k: (v.value if hasattr(v, "value") else v) for k, v in values.items()}


def derived_labels() -> dict[str, str]:
    """plan.json key -> label, for the numbers the plan derives (the settings' labels are in settings.py)."""
    return {f.name: f.metadata["label"] for f in fields(Plan) if "label" in f.metadata}
