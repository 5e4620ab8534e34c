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
    # the descriptions are the OpenAPI schema's (GET /v1/openapi.json, docs' HTTP reference); validation ignores them
    model: StrictStr = Field(description="A base model the server registered (finetune serve --model NAME=...).")
    training_file: StrictStr = Field(description="The id of a file you uploaded with purpose fine-tune.")
    validation_file: StrictStr | None = Field(None, description="An uploaded file to validate on (default: held out).")
    suffix: Suffix | None = Field(None, description="Up to 64 letters, digits, '.', '_' or '-' in the model's name.")
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = Field(None, description="Default: drawn at random.")
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)] | None = Field(
        None, description="Up to 16 string pairs of your own (keys up to 64 characters, values up to 512)."
    )
    method: Method | None = Field(
        None, description='{"type": "supervised" or "dpo", "<type>": {"hyperparameters": {...}}}: the settings.'
    )
    hyperparameters: dict[str, Any] | None = Field(None, description="OpenAI's deprecated top-level form: supervised.")

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


def openapi_body(model: type[BaseModel]) -> dict:
    """A route's `openapi_extra` when it reads its body itself (parse_body, for OpenAI's error codes): the model's JSON
    Schema as the request body, so the OpenAPI schema (and the HTTP reference generated from it) shows its fields.
    Its $defs are inlined: a $ref in an OpenAPI document resolves from the document's root, not the schema's."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _inlined(schema, defs)}}}}


def _inlined(node: Any, defs: dict) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return _inlined(defs[node["$ref"].rsplit("/", 1)[-1]], defs) | _inlined(rest, defs)
        return {key: _inlined(value, defs) for key, value in node.items()}
    if isinstance(node, list):
        return [_inlined(item, defs) for item in node]
    return node
