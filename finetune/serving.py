"""The public import path of serving (`from finetune.serving import chat_completions_router`); it lives in
finetune/ship/serving/."""

from finetune.ship.serving import (
    ChatCompletionRequest,
    Completion,
    Engine,
    GenerationParams,
    ModelLocation,
    ModelNotFound,
    chat_completions_router,
)

__all__ = [
    "ChatCompletionRequest",
    "Completion",
    "Engine",
    "GenerationParams",
    "ModelLocation",
    "ModelNotFound",
    "chat_completions_router",
]
