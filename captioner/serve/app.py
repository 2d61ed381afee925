"""The FastAPI application of ``captioner serve``: the page, the JSON API and the dynamic batcher behind it.

Routes (``/openapi.json`` describes them): ``GET /`` the page; ``POST /api/caption`` an uploaded image's
caption, n best beams and per-word attention; ``POST /api/figure`` the PNG that ``captioner attend`` draws for
it; ``GET /api/models``; ``GET /api/overlay-operators`` the upsampling matrices of ``captioner attend`` for the
grids of the loaded models, with which the page draws its overlays; ``GET /health``.

A request passes :class:`~captioner.serve.access.Access`, the upload size limit and
:class:`~captioner.serve.limits.Admission` before its body is read. Uploads are then checked and decoded (as
``captioner caption`` does, no larger than needed) under a :class:`~captioner.serve.limits.DecodeBudget`, and
captioned in batches by a :class:`~captioner.serve.batching.DynamicBatcher`, in the models' own process
(:mod:`~captioner.serve.decoding_process`) or its own. :func:`serve` runs it under uvicorn with the connection
limits of :mod:`~captioner.serve.connections`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import logging
import socket
import tempfile
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
from starlette.middleware.cors import CORSMiddleware

from captioner.core.devices import resolve_device
from captioner.decoding.search import Generation
from captioner.errors import CaptionerError
from captioner.predictor import draw_generation_figure
from captioner.serve import schemas
from captioner.serve.access import TOKEN_VARIABLE, Access, check_token, is_ip_address
from captioner.serve.batching import Arrival, DynamicBatcher, Timing
from captioner.serve.checkpoints import ServedModel, load_served_models
from captioner.serve.connections import GuardedHttp
from captioner.serve.decoding_process import DecodingProcess, LoadSettings
from captioner.serve.errors import ApiError, UploadLimit, install_error_handlers
from captioner.serve.limits import ARRIVAL, Admission, DecodeBudget, InFlight, decode_cost, image_header
from captioner.version import __version__
from captioner.visualisation import attention_figure

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
MAX_BEAM = 10
BACKLOG = 2048      # connections waiting to be accepted: uvicorn's own default, which it sets again when it starts
"""Largest beam size a request may ask for."""
FORM_LIMITS = {"max_files": 1, "max_fields": 8, "max_part_size": 1024}
"""What a caption or figure request's form may hold besides the image: its short fields, no other file."""
_ERRORS = {status: {"model": schemas.Error} for status in (400, 401, 403, 404, 408, 413, 422, 503, 504)}
_FIGURES = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="captioner-figure")
"""Draws the figures, one at a time (matplotlib's figure code is not documented as thread-safe); the requests
waiting for it hold no thread."""

router = APIRouter()


@dataclass
class Decoded:
    """One upload, read and decoded: the checkpoint, the image, its n best captions and its timing."""

    served: ServedModel
    image: Image.Image              # decoded no larger than needed
    size: tuple[int, int]           # the file's own (width, height)
    beams: list[Generation]
    timing: Timing


def create_app(models: dict[str, ServedModel], *, max_batch: int = 16, max_wait_ms: float = 10.0,
               max_upload_mb: float = 20.0, decoding: DecodingProcess | None = None, max_queue: int = 64,
               timeout_s: float = 30.0, hosts: Sequence[str] = (), token: str | None = None,
               cors_origins: Sequence[str] = ()) -> FastAPI:
    """The application serving ``models`` (the first is the default); its batcher runs while the app does
    (ASGI lifespan: uvicorn, or ``with TestClient(app)``). ``decoding``: a started process holding the same
    models, which decodes every batch (else the batcher's thread decodes with ``models`` themselves).
    ``max_queue`` and ``timeout_s``: see :class:`~captioner.serve.limits.Admission`; ``hosts``, ``token`` and
    ``cors_origins``: see :class:`~captioner.serve.access.Access` (CORS headers only for ``cors_origins``)."""
    if not models:
        raise ValueError("serve at least one checkpoint")
    handler = decoding.caption if decoding is not None else _decode_group(models)
    batcher = DynamicBatcher(handler, max_batch=max_batch, max_wait_s=max_wait_ms / 1000)
    budget = DecodeBudget()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        batcher.close()
        budget.close()

    app = FastAPI(title="captioner", summary="Caption images and see where the model looked, word by word.",
                  version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)  # their pages load from a CDN
    app.state.models, app.state.batcher, app.state.max_upload_mb = models, batcher, max_upload_mb
    app.state.decoding, app.state.budget, app.state.in_flight = decoding, budget, InFlight(max_queue)
    install_error_handlers(app)
    app.add_middleware(Admission, batcher=batcher, in_flight=app.state.in_flight, timeout_s=timeout_s,
                       unavailable=lambda: _unavailable(decoding))
    app.add_middleware(UploadLimit, max_bytes=int(max_upload_mb * 2**20))
    app.add_middleware(Access, hosts=hosts, cors_origins=cors_origins, token=token)
    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization"], max_age=600)
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _unavailable(decoding: DecodingProcess | None) -> tuple[str, float] | None:
    """Why the models cannot decode now and how long that may last, None when they can."""
    if decoding is None or decoding.ready:
        return None
    return decoding.problem, decoding.load_seconds


def _decode_group(models: dict[str, ServedModel]):
    """The batcher's handler: ``(checkpoint name, beam)`` and its images -> their n best captions."""
    def decode_group(key: tuple[str, int], images) -> list[list[Generation]]:
        name, beam = key
        return models[name].caption(images, beam)
    return decode_group


async def _decode_upload(request: Request, upload: UploadFile, beam: int | None, checkpoint: str | None) -> Decoded:
    """Check and read ``upload`` (its header, then the image, each within the decoding budget), then wait for
    its batch; refusals raise :class:`ApiError` or ImageError."""
    models: dict[str, ServedModel] = request.app.state.models
    served = models.get(checkpoint or next(iter(models)))
    if served is None:
        raise ApiError(404, f"no checkpoint named {checkpoint!r}; this server has {', '.join(models)}")
    budget: DecodeBudget = request.app.state.budget
    name = " ".join((upload.filename or "upload").split())[:200]
    header = await budget.run(decode_cost(None, upload.size or 0), image_header, upload.file)
    read = await budget.run(decode_cost(header, upload.size or 0), served.read, upload.file, name,
                            attention_figure.DISPLAY_MAX_SIDE)
    arrival: Arrival = request.scope[ARRIVAL]
    beams, timing = await arrival.submit((served.name, beam or served.decode_config.beam), read.pixels)
    return Decoded(served, read.image, read.size, beams, timing)


ImageField = Annotated[UploadFile, File(description="the image: any format PIL reads (PNG, JPEG, WebP, ...)")]
BeamField = Annotated[int | None, Form(ge=1, le=MAX_BEAM, description="beam size (default: the checkpoint's)")]
CheckpointField = Annotated[str | None, Form(description="a name from /api/models (default: the first)")]


@router.post("/api/caption", response_model=schemas.CaptionResponse, responses=_ERRORS, form_limits=FORM_LIMITS)
async def caption(request: Request, image: ImageField, beam: BeamField = None,
                  checkpoint: CheckpointField = None) -> Response:
    """Caption an uploaded image: the best caption, the n best beams with their log-probabilities, each
    word's attention over the region grid, and how long the request queued and decoded."""
    decoded = await _decode_upload(request, image, beam, checkpoint)
    served = decoded.served
    # Written as JSON directly: FastAPI's check of the answer against the model (the tests make it) cost more
    # than the decoding itself per image under load, for thousands of attention weights per answer.
    body = await run_in_threadpool(lambda: to_json(schemas.caption_response(
        served.name, decoded.beams, served.vocab, served.grid, decoded.size, decoded.timing)))
    return Response(body, media_type="application/json")


@router.post("/api/figure", response_class=Response, responses={**_ERRORS, 200: {"content": {"image/png": {}}}},
             form_limits=FORM_LIMITS)
async def figure(request: Request, image: ImageField, beam: BeamField = None,
                 checkpoint: CheckpointField = None) -> Response:
    """The paper-style attention figure of the best caption: the PNG ``captioner attend`` writes."""
    decoded = await _decode_upload(request, image, beam, checkpoint)
    png = await asyncio.wrap_future(_FIGURES.submit(_figure_png, decoded))
    return Response(png, media_type="image/png",
                    headers={"Content-Disposition": f'attachment; filename="attention_{decoded.served.name}.png"'})


def _figure_png(decoded: Decoded) -> bytes:
    served, generation = decoded.served, decoded.beams[0]
    words = [served.vocab.words[index] for index in generation.tokens]
    with tempfile.TemporaryDirectory() as folder:
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


Side = Annotated[int, Query(ge=1, le=attention_figure.DISPLAY_MAX_SIDE)]


@router.get("/api/overlay-operators", response_model=schemas.OverlayOperators, responses=_ERRORS)
async def overlay_operators(request: Request, grid_height: Side, grid_width: Side, height: Side, width: Side,
                            smooth: bool = True) -> dict:
    """The matrices with which ``captioner attend`` upsamples a (grid_height, grid_width) map to
    (height, width) pixels; ``smooth=false``: the raw grid (each cell over its own pixels). Only for the grid of
    a loaded checkpoint, and sizes up to the page's (the longer side of its images)."""
    grids = sorted({served.grid for served in request.app.state.models.values()})
    if (grid_height, grid_width) not in grids:
        raise ApiError(422, f"no checkpoint of this server has a {grid_height}x{grid_width} grid (they have "
                            f"{', '.join(f'{gh}x{gw}' for gh, gw in grids)})")
    if grid_height > height or grid_width > width:
        raise ApiError(422, f"a {grid_height}x{grid_width} grid cannot be shown on {height}x{width} pixels")
    rows, columns = await run_in_threadpool(attention_figure.upsampling_operators, (grid_height, grid_width),
                                            (height, width), smooth)
    return {"rows": rows.tolist(), "columns": columns.tolist()}


@router.get("/health", response_model=schemas.Health)
async def health(request: Request) -> dict:
    """Whether the server is up and can decode, what it serves and how many requests wait for the decoder."""
    decoding: DecodingProcess | None = request.app.state.decoding
    status = "ok" if decoding is None or decoding.ready else decoding.problem
    return {"status": status, "models": list(request.app.state.models), "queued": request.app.state.batcher.queued,
            "in_flight": request.app.state.in_flight.count}


@router.get("/", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html")


def serve(checkpoints: Sequence[str], *, host: str = "127.0.0.1", port: int = 8000, device: str = "auto",
          overrides: Sequence[str] = (), beam: int | None = None, max_pixels: int | None = None, max_batch: int = 16,
          max_wait_ms: float = 10.0, max_upload_mb: float = 20.0, decode_in: str = "process", max_queue: int = 64,
          timeout_s: float = 30.0, allow_hosts: Sequence[str] = (), token: str | None = None,
          cors_origins: Sequence[str] = ()) -> None:
    """Load ``checkpoints`` once and serve them with uvicorn until interrupted (``captioner serve``).
    ``decode_in``: ``process``, the models load and decode in a child process
    (:mod:`~captioner.serve.decoding_process`), this one holding only their descriptions to read uploads and
    describe them; ``thread``, in this process's batcher thread. The other settings: see :func:`create_app`
    (``allow_hosts`` are its ``hosts``, to which a ``host`` given by name is added). Listening on an address
    other machines can reach without a ``token`` logs a warning."""
    if decode_in not in ("process", "thread"):
        raise ValueError(f"decode_in: expected process or thread, got {decode_in!r}")
    token = None if token is None else check_token(token)
    listening = _listening_socket(host, port)    # first: a taken port fails before any model loads
    address = listening.getsockname()[0]
    if token is None and not ipaddress.ip_address(address.split("%")[0]).is_loopback:
        log.warning("listening on %s, which other machines can reach, without a token: anyone who can reach it can "
                    "use this server (give it --token, or the %s environment variable)", address, TOKEN_VARIABLE)
    limits = {"max_batch": max_batch, "max_wait_ms": max_wait_ms, "max_upload_mb": max_upload_mb,
              "max_queue": max_queue, "timeout_s": timeout_s, "token": token, "cors_origins": cors_origins,
              "hosts": [*allow_hosts, *([] if is_ip_address(host) else [host])]}
    with listening:
        if decode_in == "process":
            with DecodingProcess(LoadSettings(list(map(str, checkpoints)), device, list(overrides), beam,
                                              max_pixels)) as decoding:
                _run(create_app(decoding.models, decoding=decoding, **limits), listening, token)
        else:
            models = load_served_models(checkpoints, resolve_device(device), overrides, beam=beam,
                                        max_pixels=max_pixels)
            _run(create_app(models, **limits), listening, token)


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one) and listening, so that a client who connects as soon as
    the address is announced waits in the backlog until uvicorn accepts, instead of being refused; raises
    :class:`~captioner.errors.CaptionerError` naming the address when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as err:      # taken, not this machine's address, an unknown name
        listening.close()
        raise CaptionerError(f"{host}:{port}: cannot listen there ({err.strerror or err})") from None
    listening.listen(BACKLOG)
    return listening


def _run(app: FastAPI, listening: socket.socket, token: str | None) -> None:
    host, port = listening.getsockname()[:2]
    url = f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
    needs = "; every request needs the token: open the page as ...#token=<token>" if token else ""
    for name, served in app.state.models.items():
        if served.warning:
            log.warning("%s: %s", name, served.warning)
    print(f"captioner serve: {', '.join(app.state.models)} at {url} (API schema: /openapi.json{needs})", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="info", http=GuardedHttp)).run(sockets=[listening])
