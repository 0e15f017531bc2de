"""The service's own endpoints: health checks, the model list, the metrics and the page."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from s2core.http.metrics import CONTENT_TYPE_LATEST
from s2core.http.schemas import Model, ModelList

router = APIRouter()


def _health(request: Request) -> JSONResponse:
    engine = request.app.state.engine
    if not engine.ready or engine.closing:
        return JSONResponse({"status": "loading" if not engine.ready else "shutting down"},
                            status_code=503)
    return JSONResponse({"status": "ok"})


router.add_api_route("/health", _health, methods=["GET"])
router.add_api_route("/v1/health", _health, methods=["GET", "POST"])


@router.get("/v1/models", response_model=ModelList)
async def models(request: Request) -> ModelList:
    engine = request.app.state.engine
    return ModelList(data=[Model(id=engine.model_name), Model(id="s2-pro")])


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.text(), media_type=CONTENT_TYPE_LATEST)


def _static(name: str) -> str:
    return resources.files("s2core.http").joinpath("static", name).read_text(encoding="utf-8")


@router.get("/", response_class=HTMLResponse)
async def page() -> HTMLResponse:
    return HTMLResponse(_static("index.html"))


@router.get("/static/app.js")
async def script() -> Response:
    return Response(_static("app.js"), media_type="text/javascript")
