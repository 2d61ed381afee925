"""The page of `captioner serve` in a real browser: Playwright for Python drives Debian's Chromium against a
live server on 127.0.0.1. It uploads a shapes image, waits for every checkpoint's caption, moves over a
word and checks the overlay pixel for pixel against `captioner attend`'s (smooth and raw grid), hard
attention's chosen cell, the keyboard, the play button, the figure download, a phone-width layout, drop and
paste, and that the console stayed clean; it saves a screenshot. A second test opens the page of a server
that wants a token, without it and then with it in the page's address.

Skipped, saying why, without Chromium or Playwright; CAPTIONER_REQUIRE_BROWSER=1 (set by .ci/run) makes that
a failure. CAPTIONER_CHROMIUM names the browser (default: chromium on the PATH). The docs' screenshot (docs/serve.png):

    CAPTIONER_SERVE_CHECKPOINTS="runs/demo/soft/best.pt runs/demo/hard/best.pt" \\
    CAPTIONER_SCREENSHOT=docs/serve.png pytest tests/test_serve_browser.py
"""

import base64
import contextlib
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import uvicorn

from captioner.data.images import load_image
from captioner.data.shapes import generate_shapes
from captioner.serve.app import create_app
from captioner.serve.checkpoints import load_served_models
from captioner.visualisation.attention_figure import CHOSEN_COLOR, attention_overlay

CHROMIUM = os.environ.get("CAPTIONER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
TIMEOUT_MS = 60_000


def playwright_or_skip():
    """Playwright's sync API, or a skip (a failure under CAPTIONER_REQUIRE_BROWSER=1) saying what is missing."""
    try:
        from playwright import sync_api
    except ImportError:
        sync_api, problem = None, "Playwright for Python is not installed (pip install -e '.[dev]')"
    else:
        problem = None if CHROMIUM else "no Chromium on this machine (apt-get install chromium, or set CAPTIONER_CHROMIUM)"
    if problem and os.environ.get("CAPTIONER_REQUIRE_BROWSER") == "1":
        pytest.fail(f"the browser test is required here (CAPTIONER_REQUIRE_BROWSER=1) but {problem}")
    if problem:
        pytest.skip(f"browser test skipped: {problem}")
    return sync_api


@contextlib.contextmanager
def live_server(app):
    """``app`` served by uvicorn on 127.0.0.1 (a free port) in a thread; yields its URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class Page:
    """The page under test, through Playwright, with what its console and network reported."""

    def __init__(self, page):
        self.page, self.problems = page, []
        page.on("console", lambda message: message.type in ("error", "warning")
                and self.problems.append(f"console {message.type}: {message.text}"))
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        page.on("requestfailed", lambda request: self.problems.append(f"request failed: {request.url}"))
        page.on("response", lambda response: response.status >= 400
                and self.problems.append(f"HTTP {response.status}: {response.url}"))

    def card(self, index: int):
        return self.page.locator(".result").nth(index)

    def pixels(self, index: int) -> np.ndarray:
        """The RGB pixels of card ``index``'s canvas, (H, W, 3) uint8."""
        width, height, data = self.page.evaluate("""(index) => {
            const canvas = document.querySelectorAll("canvas.overlay")[index];
            const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            return [canvas.width, canvas.height, Array.from(data)];
        }""", index)
        return np.array(data, dtype=np.uint8).reshape(height, width, 4)[..., :3]

    def result(self, index: int) -> dict:
        return self.page.evaluate("(index) => window.captionerPage.cards[index].result", index)

    def wait_for_word(self, index: int, word: int | None) -> None:
        """Until card ``index`` shows word ``word``'s overlay (None: the plain image)."""
        text = "Move over a word" if word is None else f"word {word + 1} of"
        self.page.wait_for_function("([index, text]) => document.querySelectorAll('.result .word-info')[index]"
                                    ".textContent.includes(text)", arg=[index, text], timeout=TIMEOUT_MS)


def expected_overlay(image: np.ndarray, attention_map, smooth: bool) -> np.ndarray:
    return np.rint(attention_overlay(image / 255.0, np.array(attention_map), smooth) * 255)


def assert_pixels_close(actual: np.ndarray, expected: np.ndarray) -> None:
    difference = np.abs(actual.astype(float) - expected)
    assert difference.max() <= 1, f"{(difference > 1).sum()} pixels differ by up to {difference.max()}"


@pytest.fixture(scope="module")
def shapes_image(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    generate_shapes(root, seed=3, num_images=10)
    return sorted((root / "images" / "test").glob("*.png"))[0]


@pytest.fixture(scope="session")
def sync_api():
    """Playwright's sync API (or the skip, before any checkpoint is trained)."""
    return playwright_or_skip()


@pytest.fixture(scope="module")
def served(sync_api, request):
    """The demo's checkpoints for the docs' screenshot, else the tiny soft and hard ones, their attention
    sharpened (seconds of training leave it almost uniform, and a uniform map hardly changes the image)."""
    shown = os.environ.get("CAPTIONER_SERVE_CHECKPOINTS")
    if shown:
        return load_served_models(shown.split(), torch.device("cpu"))
    checkpoints = request.getfixturevalue("served_checkpoints")
    served = load_served_models([checkpoints["soft"], checkpoints["hard"]], torch.device("cpu"))
    with torch.no_grad():
        for model in served.values():
            model.predictor.model.decoder.attention.energy.weight.mul_(50)
    return served


def test_the_page_captions_an_upload_and_overlays_attention_word_by_word(sync_api, served, shapes_image, tmp_path):
    image = np.asarray(load_image(shapes_image))
    screenshot = Path(os.environ.get("CAPTIONER_SCREENSHOT") or tmp_path / "serve.png")
    with live_server(create_app(served)) as url, sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = Page(browser.new_page(viewport={"width": 1024, "height": 900}))
            page.page.goto(url, timeout=TIMEOUT_MS)
            page.page.wait_for_selector("#beam option", state="attached", timeout=TIMEOUT_MS)
            page.page.set_input_files("#file-input", str(shapes_image))
            for index in range(len(served)):
                page.card(index).locator(".word").first.wait_for(timeout=TIMEOUT_MS)
            check_overlays(page, image)
            check_hard_attention(page, served)
            check_keyboard_and_play(page, image)
            check_download(page, served, shapes_image, tmp_path)
            take_screenshot(page, screenshot)
            check_phone_width(page)
            check_drop_and_paste(page, shapes_image)
            assert not page.problems, page.problems
        finally:
            browser.close()
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def check_overlays(page: Page, image: np.ndarray) -> None:
    """The plain image first; over a word, its overlay as `captioner attend` draws it, smooth and raw."""
    assert_pixels_close(page.pixels(0), image)
    result = page.result(0)
    assert page.card(0).locator(".word").all_inner_texts() == result["tokens"]
    assert page.card(0).locator(".beam").count() == len(result["beams"])
    page.card(0).locator(".word").first.hover()
    page.wait_for_word(0, 0)
    shown = page.pixels(0)
    assert np.abs(shown.astype(int) - image).max() > 10, "the overlay did not change the image"
    assert_pixels_close(shown, expected_overlay(image, result["attention"][0], smooth=True))
    page.page.check("#raw-grid")             # the pointer leaves the word for the box: the plain image
    page.wait_for_word(0, None)
    page.card(0).locator(".word").first.hover()
    page.wait_for_word(0, 0)
    assert page.card(0).locator("canvas.raw").count() == 1
    assert_pixels_close(page.pixels(0), expected_overlay(image, result["attention"][0], smooth=False))
    page.page.uncheck("#raw-grid")
    page.wait_for_word(0, None)


def check_hard_attention(page: Page, served) -> None:
    """On a hard-attention card, a word's chosen cell is outlined in the figure's colour."""
    hard = [index for index, model in enumerate(served.values()) if model.describe()["attention"] == "hard"]
    if not hard:
        return
    result = page.result(hard[0])
    steps = [t for t, cell in enumerate(result["chosen"]) if cell is not None]
    assert steps, "hard attention chose no cell"
    page.card(hard[0]).locator(".word").nth(steps[0]).hover()
    page.wait_for_word(hard[0], steps[0])
    assert "chose the cell" in page.card(hard[0]).locator(".word-info").inner_text()
    pixels = page.pixels(hard[0])
    (row, column), (gh, gw) = result["chosen"][steps[0]], result["grid"]
    height, width = pixels.shape[0] / gh, pixels.shape[1] / gw
    edge = pixels[int((row + 0.5) * height), int(column * width) + 1]
    assert tuple(edge) == tuple(int(CHOSEN_COLOR[k:k + 2], 16) for k in (1, 3, 5))
    page.page.mouse.move(0, 0)


def check_keyboard_and_play(page: Page, image: np.ndarray) -> None:
    """Tab reaches the drop zone; arrow keys, End and Esc move over the words; play steps through them."""
    page.page.click("h1")                   # start from the top of the page
    page.page.keyboard.press("Tab")
    assert page.page.evaluate("document.activeElement.id") == "drop-zone"
    words = page.card(0).locator(".word")
    words.first.focus()
    page.page.keyboard.press("ArrowRight")
    page.wait_for_word(0, 1)
    assert page.page.evaluate("document.activeElement.textContent") == words.nth(1).inner_text()
    page.page.keyboard.press("End")
    page.wait_for_word(0, words.count() - 1)
    page.page.keyboard.press("Escape")
    page.wait_for_word(0, None)
    assert_pixels_close(page.pixels(0), image)
    if words.count() > 1:
        page.card(0).locator(".play").click()
        page.wait_for_word(0, 1)      # it moves on by itself
        page.card(0).locator(".play").click()


def check_download(page: Page, served, image_path: Path, tmp_path: Path) -> None:
    """The download is the PNG `captioner attend` writes for the same image and checkpoint."""
    with page.page.expect_download(timeout=TIMEOUT_MS) as download:
        page.card(0).locator(".download").click()
    model = next(iter(served.values()))
    model.predictor.attend(image_path, tmp_path / "attend.png")
    assert Path(download.value.path()).read_bytes() == (tmp_path / "attend.png").read_bytes()


def take_screenshot(page: Page, path: Path) -> None:
    """The top of the page, every card showing the attention of its fifth word ("there is a red circle ...")."""
    page.page.evaluate("window.scrollTo(0, 0)")
    for index in reversed(range(page.page.locator(".result").count())):
        words = page.card(index).locator(".word")
        word = min(4, words.count() - 1)
        words.nth(word).focus() if index else words.nth(word).hover()   # focus keeps a card's word shown
        page.wait_for_word(index, word)
    path.parent.mkdir(parents=True, exist_ok=True)
    page.page.screenshot(path=str(path))


def check_phone_width(page: Page) -> None:
    page.page.set_viewport_size({"width": 390, "height": 844})
    assert page.page.evaluate("document.documentElement.scrollWidth") <= 390
    boxes = [page.card(index).bounding_box() for index in range(page.page.locator(".result").count())]
    assert all(box["x"] >= 0 and box["x"] + box["width"] <= 390 for box in boxes)


def check_drop_and_paste(page: Page, image_path: Path) -> None:
    """An image dropped on the page, then one pasted, is captioned like a picked one."""
    data = base64.b64encode(image_path.read_bytes()).decode()
    for kind in ("drop", "paste"):
        run = page.page.evaluate("window.captionerPage.run")
        page.page.evaluate("""([data, kind]) => {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            const transfer = new DataTransfer();
            transfer.items.add(new File([bytes], `${kind}.png`, {type: "image/png"}));
            const event = kind === "drop" ? new DragEvent("drop", {dataTransfer: transfer, bubbles: true, cancelable: true})
                : new ClipboardEvent("paste", {clipboardData: transfer, bubbles: true});
            document.querySelector("#drop-zone").dispatchEvent(event);
        }""", [data, kind])
        page.page.wait_for_function("(run) => window.captionerPage.run > run", arg=run, timeout=TIMEOUT_MS)
        page.page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Captioned by')",
                                    timeout=TIMEOUT_MS)
        assert page.card(0).locator(".word").count() > 0


def test_the_page_reads_the_servers_token_from_its_address(sync_api, served, shapes_image):
    """Served with a token: without it the page says so (the server's 401 message); opened as .../#token=T it
    keeps the token for the tab, takes it out of the address bar and captions as without one."""
    with live_server(create_app(served, token="page-token")) as url, sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(url, timeout=TIMEOUT_MS)
            page.wait_for_function("() => document.querySelector('#status').textContent.includes('needs its token')",
                                   timeout=TIMEOUT_MS)
            page = browser.new_page()           # a new tab: a changed fragment alone loads nothing
            page.goto(f"{url}/#token=page-token", timeout=TIMEOUT_MS)
            page.wait_for_selector("#beam option", state="attached", timeout=TIMEOUT_MS)
            assert page.evaluate("location.hash") == "" and page.evaluate("sessionStorage.getItem('captioner-token')") == "page-token"
            page.set_input_files("#file-input", str(shapes_image))
            page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('Captioned by')",
                                   timeout=TIMEOUT_MS)
        finally:
            browser.close()
