"""Serving: answer `POST /v1/chat/completions` (OpenAI's shape) with tuned models, base models and checkpoints.

from finetune.ship.serving import Engine, ModelLocation, chat_completions_router
app.include_router(chat_completions_router(resolver, Engine(max_models=4), tenant=auth))
"""

from finetune.ship.serving.engine import Completion, Engine, GenerationParams, ModelLocation
from finetune.ship.serving.router import ChatCompletionRequest, ModelNotFound, chat_completions_router

__all__ = [
    "ChatCompletionRequest",
    "Completion",
    "Engine",
    "GenerationParams",
    "ModelLocation",
    "ModelNotFound",
    "chat_completions_router",
]
