"""`captioner serve`'s API in-process (FastAPI's TestClient): the answers' shapes and JSON schema, the same
captions, maps and figure as `captioner caption` / `attend`, every bad upload a 4xx JSON error (never a 500),
concurrent requests, and the command itself on a live port."""

import io
import queue
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import unittest.mock
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image

from captioner.cli import main
from captioner.predictor import SHAPES_WARNING
from captioner.serve.app import MAX_BEAM, _run, create_app
from captioner.serve.checkpoints import load_served_models
from captioner.version import __version__
from captioner.visualisation.attention_figure import upsample_attention

UPLOAD_MB = 1
LOCAL = "http://localhost"      # a Host the server answers to (TestClient's own, testserver, it refuses)


@pytest.fixture(scope="module")
def served(served_checkpoints):
    return load_served_models(list(served_checkpoints.values()), torch.device("cpu"))


@pytest.fixture(scope="module")
def client(served):
    with TestClient(create_app(served, max_batch=8, max_wait_ms=5, max_upload_mb=UPLOAD_MB),
                    raise_server_exceptions=False, base_url=LOCAL) as client:
        yield client


@pytest.fixture(scope="module")
def images(tiny_coco):
    return sorted((tiny_coco / "images" / "test").glob("*.png"))


def post(client, path, checkpoint=None, beam=None, route="/api/caption"):
    data = {k: str(v) for k, v in (("checkpoint", checkpoint), ("beam", beam)) if v is not None}
    return client.post(route, files={"image": (path.name, path.read_bytes(), "image/png")}, data=data)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width x height`` pixels but holds no pixel data."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")


def jpeg_bytes(size=(64, 48)) -> bytes:
    buffer = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, "JPEG")
    return buffer.getvalue()


def assert_json_error(response, low=400, high=500) -> str:
    assert low <= response.status_code < high, (response.status_code, response.text)
    body = response.json()
    assert list(body) == ["error"] and isinstance(body["error"], str) and body["error"]
    assert "\n" not in body["error"] and "Traceback" not in body["error"]
    return body["error"]


def test_models_health_and_openapi_describe_the_server(client, served):
    models = client.get("/api/models").json()
    assert [m["name"] for m in models["models"]] == ["soft", "hard", "wide", "transformer"]
    by_name = {m["name"]: m for m in models["models"]}
    assert by_name["soft"]["grid"] == [2, 2] and by_name["wide"]["grid"] == [2, 4]
    assert by_name["hard"]["attention"] == "hard" and by_name["soft"]["attention"] == "soft"
    assert by_name["transformer"]["decoder"] == "transformer" and by_name["transformer"]["attention"] == "cross-attention"
    assert all(m["encoder"] == "mobilenet_v2" for m in models["models"]) and by_name["wide"]["decoder"] == "lstm"
    assert by_name["soft"]["vocab_size"] == len(served["soft"].vocab)
    assert models["max_beam"] == MAX_BEAM and models["max_upload_mb"] == UPLOAD_MB
    assert all(set(m) == {"name", "decoder", "attention", "encoder", "vocab_size", "grid", "image_size", "beam",
                          "max_length", "max_pixels", "trained_on", "warning"}
               for m in models["models"])     # no file paths
    assert all(m["trained_on"] == {"name": None, "kind": "photos"} and m["warning"] is None for m in models["models"])
    folder = str(Path(served["soft"].path).parent.parent)
    assert folder not in client.get("/api/models").text and folder not in client.get("/openapi.json").text
    assert client.get("/health").json() == {"status": "ok", "models": list(by_name), "queued": 0, "in_flight": 0}
    schema = client.get("/openapi.json").json()
    assert schema["info"]["version"] == __version__
    assert {"/api/caption", "/api/figure", "/api/models", "/api/overlay-operators", "/health"} <= set(schema["paths"])
    form = schema["paths"]["/api/caption"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    fields = schema["components"]["schemas"][form["$ref"].split("/")[-1]]["properties"]
    assert set(fields) == {"image", "beam", "checkpoint"}
    page = client.get("/")
    assert page.status_code == 200 and "<title>captioner</title>" in page.text
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)
    assert len(assets) == 2
    for text in [page.text] + [client.get(asset).text for asset in assets]:
        assert not re.search(r"https?://", text), "the page must load nothing from elsewhere"
    assert client.get("/docs").status_code == 404   # FastAPI's docs page loads its scripts from a CDN


@pytest.mark.parametrize("checkpoint, beam", [("soft", None), ("hard", 2), ("wide", 1), ("transformer", 3)])
def test_caption_matches_the_schema_and_the_command_line(client, served, images, checkpoint, beam):
    response = post(client, images[0], checkpoint, beam)
    assert response.status_code == 200, response.text
    body = response.json()
    schema = client.get("/openapi.json").json()
    jsonschema.validate(body, {"$ref": "#/components/schemas/CaptionResponse", **schema})

    model = served[checkpoint]
    gh, gw = model.grid
    assert body["checkpoint"] == checkpoint and body["grid"] == [gh, gw]
    assert body["image"] == {"width": 32, "height": 32}
    steps = len(body["tokens"])
    assert body["caption"] == " ".join(body["tokens"])
    assert np.array(body["attention"]).shape == (steps, gh, gw)
    assert np.allclose(np.array(body["attention"]).sum(axis=(1, 2)), 1.0, atol=1e-5)
    assert body["beams"][0] == {k: body[k] for k in ("caption", "tokens", "log_prob", "attention", "chosen")}
    if checkpoint == "hard":
        assert len(body["chosen"]) == steps and all(cell is None or (0 <= cell[0] < gh and 0 <= cell[1] < gw)
                                                    for cell in body["chosen"])
    else:
        assert body["chosen"] is None
    assert body["timings"]["batch_size"] >= 1 and body["timings"]["queue_ms"] >= 0 and body["timings"]["decode_ms"] > 0

    (expected,) = model.predictor.with_decoding(beam=beam).caption([images[0]])
    assert body["tokens"] == expected.words
    assert body["log_prob"] == pytest.approx(expected.generation.log_prob, abs=1e-4)
    assert np.allclose(body["attention"], expected.generation.attention["alpha"].reshape(-1, gh, gw).numpy(), atol=1e-5)


def test_default_checkpoint_is_the_first_and_beams_are_best_first(client, images):
    body = post(client, images[1], beam=3).json()
    assert body["checkpoint"] == "soft"
    scores = [beam["log_prob"] for beam in body["beams"]]
    assert 1 <= len(scores) <= 3 and scores == sorted(scores, reverse=True)


def test_figure_is_the_png_captioner_attend_writes(client, served, images, tmp_path):
    response = post(client, images[2], "hard", route="/api/figure")
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    model = served["hard"]
    model.predictor.attend(images[2], tmp_path / "attend.png")
    assert response.content == (tmp_path / "attend.png").read_bytes()


@pytest.mark.parametrize("grid, size", [((2, 2), (32, 32)), ((2, 4), (48, 160)), ((2, 2), (480, 320)), ((2, 4), (7, 5))])
@pytest.mark.parametrize("smooth", [True, False])
def test_overlay_operators_are_the_upsampling_of_captioner_attend(client, grid, size, smooth):
    query = {"grid_height": grid[0], "grid_width": grid[1], "height": size[0], "width": size[1], "smooth": smooth}
    operators = client.get("/api/overlay-operators", params=query).json()
    rows, columns = np.array(operators["rows"]), np.array(operators["columns"])
    assert rows.shape == (size[0], grid[0]) and columns.shape == (size[1], grid[1])
    attention_map = np.random.default_rng(1).dirichlet(np.ones(grid[0] * grid[1])).reshape(grid)
    page = rows @ attention_map @ columns.T
    expected = upsample_attention(attention_map, size, smooth)
    assert np.allclose(page / page.max(), expected / expected.max(), atol=1e-12)


def test_overlay_operators_answer_only_for_the_loaded_grids_and_the_pages_sizes(client):
    """The page draws at most 480 pixels a side with the grids of the loaded models: nothing else is computed
    (the issue's probe, 4096 x 4096 on a 4096 x 4096 grid, was a 134 MB answer)."""
    query = {"grid_height": 4096, "grid_width": 4096, "height": 4096, "width": 4096}
    for changes, words in [({}, "less than or equal to 480"), ({"grid_height": 40, "grid_width": 40, "height": 480, "width": 480}, "no checkpoint"),
                           ({"grid_height": 3, "grid_width": 5, "height": 480, "width": 480}, "2x2, 2x4"),
                           ({"grid_height": 2, "grid_width": 2, "height": 481, "width": 10}, "480")]:
        response = client.get("/api/overlay-operators", params={**query, **changes})
        assert response.status_code == 422 and len(response.content) < 1000 and words in assert_json_error(response)


def bad_requests():
    """(case, request arguments, status): every way an upload can be unusable."""
    image = lambda content, name="upload.png", kind="image/png": {"files": {"image": (name, content, kind)}}  # noqa: E731
    good = png_header_only(1, 1)
    oversize = b"\x89PNG" + bytes(UPLOAD_MB * 2**20 + 10)
    jpeg = jpeg_bytes()
    return [
        ("not an image", image(b"name,caption\nx,a cat\n", "notes.csv", "text/csv"), 422),
        ("truncated JPEG", image(jpeg[: len(jpeg) // 2], "photo.jpg", "image/jpeg"), 422),
        ("empty file", image(b""), 422),
        ("PNG header claiming 40000x40000", image(png_header_only(40000, 40000)), 422),
        ("over the upload size", image(oversize), 413),
        ("over the upload size, streamed", {"content": iter([b"--b\r\n", oversize]),
                                             "headers": {"content-type": "multipart/form-data; boundary=b"}}, 413),
        ("missing file field", {"data": {"beam": "2"}}, 422),
        ("file sent as a plain field", {"data": {"image": "a cat"}}, 422),
        ("unknown checkpoint", {**image(good), "data": {"checkpoint": "nonesuch"}}, 404),
        ("beam 0", {**image(good), "data": {"beam": "0"}}, 422),
        ("beam over the maximum", {**image(good), "data": {"beam": str(MAX_BEAM + 1)}}, 422),
        ("beam not a number", {**image(good), "data": {"beam": "three"}}, 422),
        ("JSON body", {"json": {"image": "aGVsbG8="}}, 422),
        ("broken multipart", {"content": b"--x\r\nnonsense", "headers": {"content-type": "multipart/form-data; boundary=x"}}, 422),
    ]


@pytest.mark.parametrize("case, arguments, status", bad_requests(), ids=[case for case, _, _ in bad_requests()])
def test_every_bad_upload_gets_a_one_line_4xx_json_error(client, case, arguments, status):
    response = client.post("/api/caption", **arguments)
    message = assert_json_error(response)
    assert response.status_code == status, message
    expected_words = {"not an image": "not an image", "truncated JPEG": "truncated", "empty file": "empty",
                      "PNG header claiming 40000x40000": "over the limit", "missing file field": "'image'",
                      "unknown checkpoint": "nonesuch", "over the upload size": f"{UPLOAD_MB} MB"}
    assert expected_words.get(case, "") in message


def test_pixel_limit_is_the_servers_and_refused_from_the_header(served_checkpoints, images):
    limited = load_served_models([served_checkpoints["soft"]], torch.device("cpu"), max_pixels=1000)
    with TestClient(create_app(limited), raise_server_exceptions=False, base_url=LOCAL) as small:
        message = assert_json_error(post(small, images[0]))
        assert "32x32 = 1024 pixels" in message and "limit of 1000" in message
        assert small.post("/api/caption", files={"image": ("a.png", png_header_only(5, 5), "image/png")}).status_code == 422


def test_other_routes_and_parameters_answer_json_errors(client):
    assert_json_error(client.get("/nowhere"), 404, 405)
    assert_json_error(client.get("/api/caption"), 405, 406)
    assert_json_error(client.get("/api/overlay-operators", params={"grid_height": 8, "grid_width": 8, "height": 4,
                                                                   "width": 4}), 422, 423)
    assert_json_error(client.get("/api/overlay-operators", params={"grid_height": 2, "grid_width": 2, "height": 10**6,
                                                                   "width": 4}), 422, 423)


def test_no_corrupted_upload_reaches_a_500(client, images):
    """Random cuts and byte flips of a PNG and a JPEG: every answer is a caption or a 4xx error."""
    rng = np.random.default_rng(0)
    statuses = []
    for original in (images[0].read_bytes(), jpeg_bytes((48, 40))):
        for _ in range(12):
            data = bytearray(original[: rng.integers(1, len(original) + 1)])
            for position in rng.integers(0, len(data), size=rng.integers(0, 4)):
                data[position] = rng.integers(0, 256)
            response = client.post("/api/caption", files={"image": ("fuzz", bytes(data), "image/png")})
            statuses.append(response.status_code)
            if response.status_code != 200:
                assert_json_error(response)
    assert 500 not in statuses and any(status != 200 for status in statuses)


def test_concurrent_requests_get_their_own_answers(client, images):
    jobs = [(images[k % len(images)], ("soft", "hard", "wide")[k % 3], 1 + k % 3) for k in range(12)]
    alone = [post(client, *job).json() for job in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        together = list(pool.map(lambda job: post(client, *job), jobs))
    assert all(response.status_code == 200 for response in together)
    for one, response in zip(alone, together):
        answer = response.json()
        assert (answer["checkpoint"], answer["tokens"]) == (one["checkpoint"], one["tokens"])
        assert answer["log_prob"] == pytest.approx(one["log_prob"], abs=1e-4)


def test_a_model_of_the_synthetic_shapes_says_so_to_the_api_the_page_and_the_log(shapes_checkpoint, images, caplog):
    served = load_served_models([shapes_checkpoint], torch.device("cpu"))
    with TestClient(create_app(served), base_url=LOCAL) as client:
        (model,) = client.get("/api/models").json()["models"]
        assert model["trained_on"] == {"name": "shapes", "kind": "synthetic shapes"}
        assert model["warning"] == SHAPES_WARNING
        assert 'id="models-warning"' in client.get("/").text and "model.warning" in client.get("/static/app.js").text
        assert post(client, images[0]).status_code == 200
        tiny = io.BytesIO()
        Image.new("RGB", (1, 1)).save(tiny, "PNG")
        response = client.post("/api/caption", files={"image": ("pixel.png", tiny.getvalue(), "image/png")})
        assert "pixel.png: 1x1 pixels is too small to caption" in assert_json_error(response)
    listening = socket.create_server(("127.0.0.1", 0))
    with caplog.at_level("WARNING", "captioner.serve.app"), unittest.mock.patch("uvicorn.Server.run"):
        _run(create_app(served), listening, None)     # what serve does once its models are loaded
    listening.close()
    assert [record.getMessage() for record in caplog.records] == [f"run: {SHAPES_WARNING}"]


def test_serve_command_user_errors_are_one_line(tmp_path, capsys, served_checkpoints):
    assert main(["serve", "--checkpoint", str(tmp_path / "missing.pt")]) == 1
    assert capsys.readouterr().err.strip() == f"captioner: error: {tmp_path / 'missing.pt'}: checkpoint not found"
    with socket.socket() as taken:      # the address is checked first, before any model loads
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--checkpoint", str(served_checkpoints["soft"]), "--port", str(port)]) == 1
    assert capsys.readouterr().err.strip() == f"captioner: error: 127.0.0.1:{port}: cannot listen there (Address already in use)"
    for option, value in (("--port", "99999"), ("--max-wait-ms", "-5"), ("--max-upload-mb", "0"), ("--max-pixels", "0"),
                          ("--max-queue", "0"), ("--timeout-s", "0"), ("--allow-host", "evil example"),
                          ("--cors-origin", "localhost:3000"), ("--cors-origin", "http://x.org/page")):
        with pytest.raises(SystemExit) as refused:
            main(["serve", "--checkpoint", str(served_checkpoints["soft"]), option, value])
        assert refused.value.code == 2 and f"argument {option}: must be" in capsys.readouterr().err
    assert main(["serve", "--checkpoint", str(served_checkpoints["soft"]), "--token", "two words"]) == 1
    assert "the token (--token or CAPTIONER_TOKEN) must be printable ASCII" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_command_serves_the_page_and_the_api_on_loopback(served_checkpoints, images):
    command = [sys.executable, "-m", "captioner", "serve", "--checkpoint", served_checkpoints["soft"],
               "--checkpoint", served_checkpoints["hard"],
               "--port", "0", "--max-batch", "4", "decode.max_length=6"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in server.stdout], daemon=True).start()
    try:
        url = None
        while url is None:
            line = lines.get(timeout=120)
            found = re.search(r"^captioner serve: .* at (http://127\.0\.0\.1:\d+)/", line)
            url = found and found.group(1)
        with httpx.Client(base_url=url, timeout=60) as http:
            assert "<title>captioner</title>" in http.get("/").text
            assert http.get("/api/models").json()["models"][1]["name"] == "hard"
            answer = http.post("/api/caption", files={"image": ("a.png", images[0].read_bytes())}).json()
            assert len(answer["tokens"]) <= 6 and answer["checkpoint"] == "soft"
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl-C
        server.wait(timeout=30)
    log = "".join(lines.queue)
    assert "Application shutdown complete" in log and server.returncode in (0, 130), log  # 130: Ctrl-C seen by the CLI
