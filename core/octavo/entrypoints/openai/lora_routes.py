"""LoRA adapters over HTTP: the names ``model`` may take besides the base model's, and
vLLM's routes to load and unload adapters while serving.

``--lora-modules name=path`` adapters are checked at start (a bad one stops the server
with its problem). ``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``
exist only when ``OCTAVO_ALLOW_RUNTIME_LORA_UPDATING`` is set to 1/true (vLLM's
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``; off by default: whoever holds the API key could
otherwise make the server read any folder it can see), behind the API key like every
other route. Loading a name that is served replaces it: requests from then on run with
the new weights (the prefix cache keys adapters by content, so nothing computed with the
old weights is reused); requests already running keep the weights they started with.
Unloading an adapter that requests in flight use fails with 409, naming how many: the
client retries once they finish.
"""

from __future__ import annotations

import itertools
import os

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from octavo.engine.async_llm import AsyncLLM
from octavo.engine.errors import EngineStartError, InvalidRequestError
from octavo.engine.lora_requests import lora_ref
from octavo.entrypoints.openai.errors import OpenAIError
from octavo.entrypoints.openai.openapi_doc import BODY_ROUTE, errors, ok_text
from octavo.entrypoints.openai.settings import ServerSettings
from octavo.lora_request import LoRARequest

RUNTIME_UPDATING_ENV = "OCTAVO_ALLOW_RUNTIME_LORA_UPDATING"
_ids = itertools.count(1)


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None  # vLLM's field; the name decides


def runtime_updating_allowed() -> bool:
    return os.environ.get(RUNTIME_UPDATING_ENV, "").strip().lower() in ("1", "true", "yes")


def serve_lora_modules(engine: AsyncLLM, settings: ServerSettings) -> None:
    """Check and serve the ``--lora-modules`` adapters (``EngineStartError`` naming a bad
    one)."""
    if settings.lora_modules and not engine.config.lora.enable_lora:
        raise EngineStartError("--lora-modules needs --enable-lora")
    for name, path in settings.lora_modules:
        try:
            _serve(engine, settings, name, path)
        except (InvalidRequestError, OpenAIError) as exc:
            raise EngineStartError(f"--lora-modules {name}={path}: {exc}") from None


def _serve(engine: AsyncLLM, settings: ServerSettings, name: str, path: str) -> None:
    if name == settings.served_model_name:
        raise OpenAIError(400, f"{name!r} is the base model's name", param="lora_name")
    request = LoRARequest(name, next(_ids), path)
    lora_ref(engine.lora_adapters, request)
    engine.served_loras[name] = request


def lora_router(engine: AsyncLLM, settings: ServerSettings,
                dependencies: list[Depends]) -> APIRouter:  # type: ignore[valid-type]
    router = APIRouter(dependencies=dependencies)

    @router.post("/v1/load_lora_adapter", response_class=PlainTextResponse,
                 responses={**ok_text("The adapter is served"), **errors(*BODY_ROUTE)})
    async def load_lora_adapter(request: LoadLoRAAdapterRequest) -> PlainTextResponse:
        if not engine.config.lora.enable_lora:
            raise OpenAIError(400, "this server runs without --enable-lora")
        try:
            await engine.run_in_pool(_serve, engine, settings, request.lora_name,
                                     request.lora_path)
        except InvalidRequestError as exc:
            raise OpenAIError(400, str(exc), param="lora_path") from None
        return PlainTextResponse(f"Success: LoRA adapter '{request.lora_name}' added "
                                 f"successfully.")

    @router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse,
                 responses={**ok_text("The adapter is no longer served"),
                            **errors(*BODY_ROUTE, 404, 409)})
    async def unload_lora_adapter(request: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        name = request.lora_name
        if name not in engine.served_loras:
            raise OpenAIError(404, f"no LoRA adapter {name!r} is served", param="lora_name")
        in_use = engine.num_requests_with_lora(name)
        if in_use:
            raise OpenAIError(409, f"LoRA adapter {name!r} is in use by {in_use} request(s) "
                                   f"in flight; unload it once they finish",
                              param="lora_name")
        del engine.served_loras[name]
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    return router
