"""The FastAPI application of ``captioner serve``: the page, the JSON API and the dynamic batcher behind it.

Routes (``/openapi.json`` describes them): ``GET /`` the page; ``POST /api/caption`` an uploaded image's
caption, n best beams and per-word attention; ``POST /api/figure`` the PNG that ``captioner attend`` draws for
it; ``GET /api/models``; ``GET /api/overlay-operators`` the upsampling matrices of ``captioner attend``, with
which the page draws its overlays; ``GET /health``.

Uploads are read and checked in the request's thread (the checks of ``captioner caption``: empty, truncated,
not an image, over the pixel limit from the header), then decoded in batches by the one worker of a
:class:`~captioner.serve.batching.DynamicBatcher`, which hands each batch to the models' own process
(:mod:`~captioner.serve.decoding_process`) or decodes it itself.
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import uvicorn
from fastapi import APIRouter, FastAPI, File, Form, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from PIL import Image
from pydantic_core import to_json
from starlette.types import ASGIApp, Receive, Scope, Send

from captioner.decoding.search import Generation
from captioner.errors import CaptionerError
from captioner.inference import draw_generation_figure
from captioner.serve import schemas
from captioner.serve.batching import Arrival, DynamicBatcher, Timing
from captioner.serve.checkpoints import ServedModel, load_served_models
from captioner.serve.decoding_process import DecodingProcess, LoadSettings
from captioner.serve.errors import ApiError, UploadLimit, install_error_handlers
from captioner.utils import resolve_device
from captioner.visualisation import attention_figure

STATIC = Path(__file__).resolve().parent / "static"
MAX_BEAM = 10
"""Largest beam size a request may ask for."""
MAX_OVERLAY_SIDE = 4096
"""Largest height or width /api/overlay-operators answers for."""
_ERRORS = {status: {"model": schemas.Error} for status in (404, 413, 422)}
_FIGURE_LOCK = threading.Lock()  # matplotlib's figure code is not documented as thread-safe

router = APIRouter()


@dataclass
class Decoded:
    """One upload, read and decoded: the checkpoint, the image, its n best captions and its timing."""

    served: ServedModel
    image: Image.Image
    beams: list[Generation]
    timing: Timing


def create_app(models: dict[str, ServedModel], *, max_batch: int = 16, max_wait_ms: float = 10.0,
               max_upload_mb: float = 20.0, decoding: DecodingProcess | None = None) -> FastAPI:
    """The application serving ``models`` (the first is the default); its batcher runs while the app does
    (ASGI lifespan: uvicorn, or ``with TestClient(app)``). ``decoding``: a started process holding the same
    models, which decodes every batch (else the batcher's thread decodes with ``models`` themselves)."""
    if not models:
        raise ValueError("serve at least one checkpoint")
    handler = decoding.caption if decoding is not None else _decode_group(models)
    batcher = DynamicBatcher(handler, max_batch=max_batch, max_wait_s=max_wait_ms / 1000)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        batcher.close()

    app = FastAPI(title="captioner", summary="Caption images and see where the model looked, word by word.",
                  version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)  # their pages load from a CDN
    app.state.models, app.state.batcher, app.state.max_upload_mb = models, batcher, max_upload_mb
    app.state.decoding = decoding
    install_error_handlers(app)
    app.add_middleware(UploadLimit, max_bytes=int(max_upload_mb * 2**20))
    app.add_middleware(AnnounceDecoding, batcher=batcher)
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


ARRIVAL = "captioner.arrival"
"""The ASGI scope key of a decoding request's :class:`~captioner.serve.batching.Arrival`."""
DECODING_ROUTES = ("/api/caption", "/api/figure")


class AnnounceDecoding:
    """ASGI middleware announcing every request to a decoding route to the batcher as soon as its headers are
    in (:meth:`DynamicBatcher.arrival`), before its upload is received and parsed, so that a worker collecting
    a batch waits for the requests on their way and for no others."""

    def __init__(self, app: ASGIApp, batcher: DynamicBatcher):
        self.app, self.batcher = app, batcher

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in DECODING_ROUTES:
            return await self.app(scope, receive, send)
        with self.batcher.arrival() as arrival:
            await self.app({**scope, ARRIVAL: arrival}, receive, send)


def _decode_group(models: dict[str, ServedModel]):
    """The batcher's handler: ``(checkpoint name, beam)`` and its images -> their n best captions."""
    def decode_group(key: tuple[str, int], images) -> list[list[Generation]]:
        name, beam = key
        return models[name].caption(images, beam)
    return decode_group


async def _decode_upload(request: Request, upload: UploadFile, beam: int | None, checkpoint: str | None) -> Decoded:
    """Check and read ``upload``, then wait for its batch; refusals raise :class:`ApiError` or ImageError."""
    models: dict[str, ServedModel] = request.app.state.models
    served = models.get(checkpoint or next(iter(models)))
    if served is None:
        raise ApiError(404, f"no checkpoint named {checkpoint!r}; this server has {', '.join(models)}")
    data = await upload.read()
    name = " ".join((upload.filename or "upload").split())[:200]
    image, tensor = await run_in_threadpool(served.read, data, name)
    arrival: Arrival = request.scope[ARRIVAL]
    beams, timing = await arrival.submit((served.name, beam or served.settings.beam), tensor)
    return Decoded(served, image, beams, timing)


ImageField = Annotated[UploadFile, File(description="the image: any format PIL reads (PNG, JPEG, WebP, ...)")]
BeamField = Annotated[int | None, Form(ge=1, le=MAX_BEAM, description="beam size (default: the checkpoint's)")]
CheckpointField = Annotated[str | None, Form(description="a name from /api/models (default: the first)")]


@router.post("/api/caption", response_model=schemas.CaptionResponse, responses=_ERRORS)
async def caption(request: Request, image: ImageField, beam: BeamField = None,
                  checkpoint: CheckpointField = None) -> Response:
    """Caption an uploaded image: the best caption, the n best beams with their log-probabilities, each
    word's attention over the region grid, and how long the request queued and decoded."""
    decoded = await _decode_upload(request, image, beam, checkpoint)
    served = decoded.served
    # Written as JSON directly: FastAPI's check of the answer against the model (the tests make it) cost more
    # than the decoding itself per image under load, for thousands of attention weights per answer.
    body = await run_in_threadpool(lambda: to_json(schemas.caption_response(
        served.name, decoded.beams, served.vocab, served.grid, decoded.image.size, decoded.timing)))
    return Response(body, media_type="application/json")


@router.post("/api/figure", response_class=Response, responses={**_ERRORS, 200: {"content": {"image/png": {}}}})
async def figure(request: Request, image: ImageField, beam: BeamField = None,
                 checkpoint: CheckpointField = None) -> Response:
    """The paper-style attention figure of the best caption: the PNG ``captioner attend`` writes."""
    decoded = await _decode_upload(request, image, beam, checkpoint)
    png = await run_in_threadpool(_figure_png, decoded)
    return Response(png, media_type="image/png",
                    headers={"Content-Disposition": f'attachment; filename="attention_{decoded.served.name}.png"'})


def _figure_png(decoded: Decoded) -> bytes:
    served, generation = decoded.served, decoded.beams[0]
    words = [served.vocab.words[index] for index in generation.tokens]
    with tempfile.TemporaryDirectory() as folder, _FIGURE_LOCK:
        out = draw_generation_figure(decoded.image, words, generation, served.grid, Path(folder) / "figure.png",
                                     name=served.name, title=" ".join(words))
        return out.read_bytes()


@router.get("/api/models", response_model=schemas.ModelsResponse)
async def models(request: Request) -> dict:
    """The loaded checkpoints (runs, decoders, encoders, vocabulary sizes, grids) and the page's settings."""
    return {"models": [served.describe() for served in request.app.state.models.values()], "max_beam": MAX_BEAM,
            "max_upload_mb": request.app.state.max_upload_mb,
            "overlay": {"max_side": attention_figure.DISPLAY_MAX_SIDE,
                        "dimmed_brightness": attention_figure.DIMMED_BRIGHTNESS,
                        "chosen_color": attention_figure.CHOSEN_COLOR}}


Side = Annotated[int, Query(ge=1, le=MAX_OVERLAY_SIDE)]


@router.get("/api/overlay-operators", response_model=schemas.OverlayOperators, responses=_ERRORS)
async def overlay_operators(grid_height: Side, grid_width: Side, height: Side, width: Side,
                            smooth: bool = True) -> dict:
    """The matrices with which ``captioner attend`` upsamples a (grid_height, grid_width) map to
    (height, width) pixels; ``smooth=false``: the raw grid (each cell over its own pixels)."""
    if grid_height > height or grid_width > width:
        raise ApiError(422, f"a {grid_height}x{grid_width} grid cannot be shown on {height}x{width} pixels")
    rows, columns = await run_in_threadpool(attention_figure.upsampling_operators, (grid_height, grid_width),
                                            (height, width), smooth)
    return {"rows": rows.tolist(), "columns": columns.tolist()}


@router.get("/health", response_model=schemas.Health)
async def health(request: Request) -> dict:
    """Whether the server is up and can decode, what it serves and how many requests wait for the decoder."""
    decoding: DecodingProcess | None = request.app.state.decoding
    status = "ok" if decoding is None or decoding.alive else "decoding process ended"
    return {"status": status, "models": list(request.app.state.models), "queued": request.app.state.batcher.queued}


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html")


def serve(checkpoints: Sequence[str], *, host: str = "127.0.0.1", port: int = 8000, device: str = "auto",
          overrides: Sequence[str] = (), beam: int | None = None, max_pixels: int | None = None, max_batch: int = 16,
          max_wait_ms: float = 10.0, max_upload_mb: float = 20.0, decode_in: str = "process") -> None:
    """Load ``checkpoints`` once and serve them with uvicorn until interrupted (``captioner serve``).
    ``decode_in``: ``process``, the models load and decode in a child process
    (:mod:`~captioner.serve.decoding_process`), this one holding only their descriptions to read uploads and
    describe them; ``thread``, in this process's batcher thread."""
    if decode_in not in ("process", "thread"):
        raise ValueError(f"decode_in: expected process or thread, got {decode_in!r}")
    listening = _listening_socket(host, port)    # first: a taken port fails before any model loads
    with listening:
        if decode_in == "process":
            with DecodingProcess(LoadSettings(list(map(str, checkpoints)), device, list(overrides), beam,
                                              max_pixels)) as decoding:
                _run(create_app(decoding.models, max_batch=max_batch, max_wait_ms=max_wait_ms,
                                max_upload_mb=max_upload_mb, decoding=decoding), listening)
        else:
            models = load_served_models(checkpoints, resolve_device(device), overrides, beam=beam,
                                        max_pixels=max_pixels)
            _run(create_app(models, max_batch=max_batch, max_wait_ms=max_wait_ms, max_upload_mb=max_upload_mb),
                 listening)


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one); raises
    :class:`~captioner.errors.CaptionerError` naming the address when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as err:      # taken, not this machine's address, an unknown name
        listening.close()
        raise CaptionerError(f"{host}:{port}: cannot listen there ({err.strerror or err})") from None
    return listening


def _run(app: FastAPI, listening: socket.socket) -> None:
    host, port = listening.getsockname()[:2]
    url = f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
    print(f"captioner serve: {', '.join(app.state.models)} at {url} (API schema: /openapi.json)", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="info")).run(sockets=[listening])
