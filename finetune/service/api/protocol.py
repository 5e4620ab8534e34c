"""The bodies our POST routes take, as pydantic models mirroring OpenAI's field for field (openapi
CreateFineTuningJobRequest and FineTuneMethod; SDK types/fine_tuning/job_create_params.py). Our own
POST /v1/fine_tuning/plan takes the same body as a job.

    body = parse_body(JobCreate, {"model": "toy", "training_file": "file-..."})   # or BodyError(param)

A body that does not fit raises BodyError naming the first OpenAI parameter at fault (`method.type`,
`hyperparameters`, `seed`, ...); routes/jobs.py turns it into OpenAI's error envelope with the
codes and messages callers rely on. Hyperparameters stay a free object here: their keys and values are
RunConfig's to check (core.settings_from_hyperparameters).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, StringConstraints, ValidationError

MAX_SEED = 2147483647
Suffix = Annotated[StrictStr, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,64}$")]
MetadataKey = Annotated[StrictStr, StringConstraints(max_length=64)]
MetadataValue = Annotated[StrictStr, StringConstraints(max_length=512)]


class MethodParams(BaseModel):
    """`method.supervised` / `method.dpo`: their hyperparameters ("auto" or a number each, plus RunConfig keys)."""

    model_config = ConfigDict(extra="ignore")
    hyperparameters: dict[str, Any] | None = None


class Method(BaseModel):
    model_config = ConfigDict(extra="ignore")  # "reinforcement" and what later SDKs add are refused by `type`
    type: Literal["supervised", "dpo"]
    supervised: MethodParams | None = None
    dpo: MethodParams | None = None

    def hyperparameters(self) -> dict[str, Any]:
        params = getattr(self, self.type)
        return dict(params.hyperparameters or {}) if params is not None else {}


class JobCreate(BaseModel):
    """POST /v1/fine_tuning/jobs (and POST /v1/fine_tuning/plan)."""

    model_config = ConfigDict(extra="ignore")  # e.g. `integrations`: accepted, not used
    model: StrictStr
    training_file: StrictStr
    validation_file: StrictStr | None = None
    suffix: Suffix | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)] | None = None
    method: Method | None = None
    hyperparameters: dict[str, Any] | None = None  # OpenAI's deprecated top-level form: supervised

    def method_and_hyperparameters(self) -> tuple[str, dict[str, Any]]:
        """(method type, its hyperparameters), from `method` or the deprecated top-level `hyperparameters`."""
        if self.method is None:
            return "supervised", dict(self.hyperparameters or {})
        return self.method.type, self.method.hyperparameters()


class BodyError(ValueError):
    """The first parameter of a body that does not fit its model: `param` in OpenAI's dotted form."""

    def __init__(self, param: str) -> None:
        super().__init__(param)
        self.param = param


def parse_body(model: type[BaseModel], body: dict) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise BodyError(_param(exc.errors()[0]["loc"])) from None


def _param(loc: tuple) -> str:
    """OpenAI's name for where an error is: a method's hyperparameters are `hyperparameters`, anything else in
    `method` is its type; a metadata key or value is `metadata`."""
    if "hyperparameters" in loc:
        return "hyperparameters"
    if loc and loc[0] == "method":
        return "method.type"
    return str(loc[0]) if loc else "body"
