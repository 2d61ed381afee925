"use strict";
// The page of `captioner serve`: pick, drop or paste an image; every loaded checkpoint captions it
// (POST /api/caption) and shows its beams; moving over a word overlays that word's attention on the image.
//
// Overlays are drawn the way `captioner attend` draws its panels, with the server's own upsampling matrices
// (GET /api/overlay-operators, the ones captioner.visualisation.attention_figure.upsample_attention applies):
//   up = rows · map · columnsᵀ          (H × W, from the gh × gw map)
//   pixel × (dimmed + (1 − dimmed) · up / max(up))
// so the page holds no copy of the smoothing itself; tests/test_serve_browser.py checks the pixels against
// attention_overlay.

const page = {
  info: null,            // GET /api/models
  file: null,            // the image file being shown
  bitmap: null,          // that image decoded by the browser (null when it cannot display the format)
  cards: [],
  run: 0,                // increases with every new image or beam size; late answers of older runs are dropped
  operators: new Map(),  // "gh x gw : H x W : smooth" -> promise of {rows, columns}
};
window.captionerPage = page;  // for the browser test and the curious

const $ = (selector, root = document) => root.querySelector(selector);

// A server started with a token (captioner serve --token) wants it on every API request: the page takes it
// from its address (…/#token=TOKEN), keeps it for this tab and takes it out of the address bar.
const token = (() => {
  const given = new URLSearchParams(location.hash.slice(1)).get("token");
  if (given) {
    sessionStorage.setItem("captioner-token", given);
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("captioner-token");
})();

function api(path, options = {}) {
  const headers = new Headers(options.headers);
  if (token) headers.set("Authorization", `Bearer ${token}`);
  return fetch(path, {...options, headers});
}

function setStatus(text, isError = false) {
  const status = $("#status");
  status.textContent = text;
  status.classList.toggle("error", isError);
}

async function errorText(response) {
  try {
    return (await response.json()).error || `${response.status} ${response.statusText}`;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

function attentionWords(model) {
  if (model.attention === "none") return "no attention";
  return model.attention.endsWith("attention") ? model.attention : `${model.attention} attention`;
}

function describe(model) {
  const data = model.trained_on ? ` · trained on ${model.trained_on.name || model.trained_on.kind}` : "";
  return `${model.decoder} · ${attentionWords(model)} · ${model.encoder} · ${model.grid[0]}×${model.grid[1]} grid · ` +
    `${model.vocab_size} words${data}`;
}

// ---- overlays ------------------------------------------------------------------------------------------

function displaySize(image, maxSide) {
  const scale = Math.min(1, maxSide / Math.max(image.width, image.height));
  return [Math.max(1, Math.round(image.height * scale)), Math.max(1, Math.round(image.width * scale))];
}

function overlayOperators(grid, height, width, smooth) {
  const key = `${grid[0]}x${grid[1]}:${height}x${width}:${smooth}`;
  if (!page.operators.has(key)) {
    const query = new URLSearchParams({grid_height: grid[0], grid_width: grid[1], height, width, smooth});
    page.operators.set(key, api(`/api/overlay-operators?${query}`).then(async (response) => {
      if (!response.ok) throw new Error(await errorText(response));
      return response.json();
    }));
  }
  return page.operators.get(key);
}

// base: ImageData (H × W) of the image; map: gh × gw weights; operators: {rows: H × gh, columns: W × gw}.
function overlayPixels(base, map, operators, dimmed) {
  const height = base.height, width = base.width, gh = map.length, gw = map[0].length;
  const partial = new Float64Array(gh * width);               // map · columnsᵀ  (gh × W)
  for (let i = 0; i < gh; i++) {
    for (let x = 0; x < width; x++) {
      const column = operators.columns[x];
      let sum = 0;
      for (let j = 0; j < gw; j++) sum += Math.max(map[i][j], 0) * column[j];
      partial[i * width + x] = sum;
    }
  }
  const upsampled = new Float64Array(height * width);          // rows · partial  (H × W)
  let peak = 0;
  for (let y = 0; y < height; y++) {
    const row = operators.rows[y];
    for (let x = 0; x < width; x++) {
      let sum = 0;
      for (let i = 0; i < gh; i++) sum += row[i] * partial[i * width + x];
      const value = Math.max(sum, 0);
      upsampled[y * width + x] = value;
      if (value > peak) peak = value;
    }
  }
  const out = new ImageData(width, height);
  for (let p = 0; p < height * width; p++) {
    const factor = dimmed + (1 - dimmed) * (peak > 0 ? upsampled[p] / peak : 0);
    for (let c = 0; c < 3; c++) out.data[4 * p + c] = base.data[4 * p + c] * factor;
    out.data[4 * p + 3] = 255;
  }
  return out;
}

// ---- one checkpoint's card -----------------------------------------------------------------------------

class Card {
  constructor(model) {
    this.model = model;
    this.element = $("#result-template").content.firstElementChild.cloneNode(true);
    this.canvas = $("canvas", this.element);
    this.words = $(".words", this.element);
    this.playButton = $(".play", this.element);
    this.downloadButton = $(".download", this.element);
    this.result = null;     // POST /api/caption's answer
    this.beamArgument = ""; // the beam size asked for ("": the checkpoint's own)
    this.base = null;       // ImageData of the image at the canvas's size
    this.beam = 0;          // which of the n best is shown
    this.selected = null;   // the word clicked, focused or played (null: the plain image)
    this.shown = null;      // the word drawn
    this.timer = null;
    $(".name", this.element).textContent = model.name;
    $(".about", this.element).textContent = describe(model);
    this.element.setAttribute("aria-label", `Caption by ${model.name}`);
    this.canvas.setAttribute("aria-label", `The image, as ${model.name} saw it`);
    this.playButton.addEventListener("click", () => this.togglePlay());
    this.downloadButton.addEventListener("click", () => this.download());
    this.words.addEventListener("keydown", (event) => this.onKey(event));
    this.words.addEventListener("mouseleave", () => this.show(this.selected));
    $("#results").append(this.element);
    this.setMessage("Captioning…");
  }

  setMessage(text, isError = false) {
    const info = $(".word-info", this.element);
    info.textContent = text;
    info.classList.toggle("error", isError);
  }

  fail(text) {
    this.element.classList.add("failed");
    this.setMessage(text, true);
    return false;
  }

  form(file, beam) {
    const form = new FormData();
    form.append("image", file);
    form.append("checkpoint", this.model.name);
    if (beam) form.append("beam", beam);
    return form;
  }

  async caption(file, beam, run) {
    let response;
    try {
      response = await api("/api/caption", {method: "POST", body: this.form(file, beam)});
    } catch (error) {
      return this.fail(`The server did not answer (${error.message}).`);
    }
    if (run !== page.run) return false;
    if (!response.ok) return this.fail(await errorText(response));
    this.result = await response.json();
    if (run !== page.run) return false;
    this.beamArgument = beam;
    this.prepareCanvas();
    this.renderBeams();
    this.selectBeam(0);
    const t = this.result.timings;
    $(".timings", this.element).textContent = `Decoded in ${t.decode_ms.toFixed(0)} ms in a batch of ${t.batch_size}` +
      ` image${t.batch_size === 1 ? "" : "s"}, after ${t.queue_ms.toFixed(0)} ms in the queue.`;
    this.downloadButton.disabled = !this.result.attention;
    return true;
  }

  prepareCanvas() {
    const [height, width] = displaySize(this.result.image, page.info.overlay.max_side);
    const scratch = document.createElement("canvas");
    scratch.width = width;
    scratch.height = height;
    const context = scratch.getContext("2d", {willReadFrequently: true});
    context.fillStyle = "#808080";  // a format the browser cannot show: the maps on grey
    context.fillRect(0, 0, width, height);
    if (page.bitmap) {
      context.imageSmoothingQuality = "high";
      context.drawImage(page.bitmap, 0, 0, width, height);
    }
    this.base = context.getImageData(0, 0, width, height);
    this.canvas.width = width;
    this.canvas.height = height;
  }

  renderBeams() {
    const list = $(".beams", this.element);
    list.replaceChildren(...this.result.beams.map((beam, index) => {
      const item = document.createElement("li");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "beam";
      button.textContent = beam.caption || "(empty caption)";
      button.addEventListener("click", () => this.selectBeam(index));
      const score = document.createElement("span");
      score.className = "log-prob";
      score.textContent = ` log p = ${beam.log_prob.toFixed(2)}`;
      item.append(button, score);
      return item;
    }));
  }

  get current() {
    return this.result.beams[this.beam];
  }

  selectBeam(index) {
    this.stop();
    this.beam = index;
    this.element.querySelectorAll(".beam").forEach((button, i) => {
      button.setAttribute("aria-pressed", String(i === index));
    });
    const beam = this.current;
    this.words.replaceChildren(...beam.tokens.map((token, t) => {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "word";
      button.textContent = token;
      button.tabIndex = t === 0 ? 0 : -1;
      button.addEventListener("mouseenter", () => this.show(t));
      button.addEventListener("focus", () => this.select(t));
      button.addEventListener("click", () => this.select(t));
      return button;
    }));
    this.playButton.disabled = !beam.attention || beam.tokens.length === 0;
    this.selected = null;
    this.show(null);
  }

  select(t) {
    this.selected = t;
    this.words.querySelectorAll(".word").forEach((button, i) => { button.tabIndex = i === (t ?? 0) ? 0 : -1; });
    this.show(t);
  }

  onKey(event) {
    const count = this.current.tokens.length;
    const at = this.selected ?? -1;
    const moves = {ArrowRight: at + 1, ArrowDown: at + 1, ArrowLeft: at - 1, ArrowUp: at - 1, Home: 0, End: count - 1};
    if (event.key === "Escape") {
      this.stop();
      this.select(null);
    } else if (event.key in moves) {
      event.preventDefault();
      const t = Math.min(count - 1, Math.max(0, moves[event.key]));
      this.words.children[t].focus();
      this.select(t);
    }
  }

  // Draw word t's attention over the image (t = null: the plain image).
  async show(t) {
    this.shown = t;
    this.words.querySelectorAll(".word").forEach((button, i) => button.classList.toggle("active", i === t));
    const context = this.canvas.getContext("2d", {willReadFrequently: true});
    const beam = this.current, raw = $("#raw-grid").checked;
    this.canvas.classList.toggle("raw", raw && t !== null);
    if (t === null || !beam.attention) {
      context.putImageData(this.base, 0, 0);
      this.setMessage(beam.attention ? "Move over a word to see where the model looked."
        : "This decoder reports no attention maps.");
      return;
    }
    let operators;
    try {
      operators = await overlayOperators(this.result.grid, this.base.height, this.base.width, !raw);
    } catch (error) {
      this.setMessage(error.message, true);
      return;
    }
    if (this.shown !== t || beam !== this.current) return;   // the pointer moved on meanwhile
    const dimmed = page.info.overlay.dimmed_brightness;
    context.putImageData(overlayPixels(this.base, beam.attention[t], operators, dimmed), 0, 0);
    const chosen = beam.chosen && beam.chosen[t];
    if (chosen) this.outlineCell(context, chosen);
    this.setMessage(this.describeWord(t, chosen));
  }

  outlineCell(context, [row, column]) {
    const [gh, gw] = this.result.grid, width = this.canvas.width / gw, height = this.canvas.height / gh;
    context.strokeStyle = page.info.overlay.chosen_color;
    context.lineWidth = 2;
    context.strokeRect(column * width + 1, row * height + 1, width - 2, height - 2);
  }

  describeWord(t, chosen) {
    const beam = this.current, map = beam.attention[t];
    let best = [0, 0];
    map.forEach((row, i) => row.forEach((value, j) => { if (value > map[best[0]][best[1]]) best = [i, j]; }));
    const peak = map[best[0]][best[1]];
    const where = chosen ? `chose the cell at row ${chosen[0] + 1}, column ${chosen[1] + 1} (red)`
      : `looked most at row ${best[0] + 1}, column ${best[1] + 1} (weight ${peak.toFixed(2)})`;
    return `“${beam.tokens[t]}”, word ${t + 1} of ${beam.tokens.length}: ${where}.`;
  }

  togglePlay() {
    if (this.timer) {
      this.stop();
      return;
    }
    const count = this.current.tokens.length;
    let t = this.selected === null || this.selected >= count - 1 ? 0 : this.selected + 1;
    this.select(t);
    this.playButton.textContent = "❚❚";
    this.playButton.setAttribute("aria-label", "Pause");
    this.timer = setInterval(() => {
      t += 1;
      if (t >= count) {
        this.stop();
        return;
      }
      this.select(t);
    }, 800);
  }

  stop() {
    clearInterval(this.timer);
    this.timer = null;
    this.playButton.textContent = "▶";
    this.playButton.setAttribute("aria-label", "Play the words one by one");
  }

  redraw() {
    if (this.result) this.show(this.shown ?? null);
  }

  async download() {
    this.downloadButton.disabled = true;
    try {
      const response = await api("/api/figure", {method: "POST", body: this.form(page.file, this.beamArgument)});
      if (!response.ok) {
        this.setMessage(await errorText(response), true);
        return;
      }
      const link = document.createElement("a");
      link.href = URL.createObjectURL(await response.blob());
      link.download = `attention_${this.model.name}.png`;
      link.click();
      setTimeout(() => URL.revokeObjectURL(link.href), 10000);
    } catch (error) {
      this.setMessage(`The figure could not be made (${error.message}).`, true);
    } finally {
      this.downloadButton.disabled = false;
    }
  }
}

// ---- the image ------------------------------------------------------------------------------------------

async function useFile(file) {
  if (!file) return;
  page.file = file;
  try {
    page.bitmap = await createImageBitmap(file);
  } catch {
    page.bitmap = null;   // the server may still read it; the maps are then drawn on grey
  }
  await captionAll();
}

async function captionAll() {
  if (!page.file || !page.info) return;
  const run = ++page.run;
  page.cards.forEach((card) => card.stop());
  $("#results").replaceChildren();
  page.cards = page.info.models.map((model) => new Card(model));
  setStatus(`Captioning ${page.file.name || "the pasted image"}…`);
  const beam = $("#beam").value;
  const done = await Promise.all(page.cards.map((card) => card.caption(page.file, beam, run)));
  if (run !== page.run) return;
  const failed = done.filter((ok) => !ok).length;
  setStatus(failed ? `${failed} of ${done.length} checkpoints could not caption this image.`
    : `Captioned by ${done.length} checkpoint${done.length === 1 ? "" : "s"}.`, failed > 0);
}

function bindInput() {
  const dropZone = $("#drop-zone"), fileInput = $("#file-input");
  dropZone.addEventListener("click", () => fileInput.click());
  dropZone.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      fileInput.click();
    }
  });
  fileInput.addEventListener("change", () => useFile(fileInput.files[0]));
  document.addEventListener("dragover", (event) => {
    event.preventDefault();
    dropZone.classList.add("dragging");
  });
  document.addEventListener("dragleave", () => dropZone.classList.remove("dragging"));
  document.addEventListener("drop", (event) => {
    event.preventDefault();
    dropZone.classList.remove("dragging");
    useFile(event.dataTransfer.files[0]);
  });
  document.addEventListener("paste", (event) => {
    const file = [...event.clipboardData.files].find((item) => item.type.startsWith("image/"));
    if (file) useFile(file);
  });
  $("#beam").addEventListener("change", captionAll);
  $("#raw-grid").addEventListener("change", () => page.cards.forEach((card) => card.redraw()));
}

async function start() {
  bindInput();
  const response = await api("/api/models").catch(() => null);
  if (!response || !response.ok) {
    setStatus(response && response.status === 401 ? await errorText(response)
      : "The server's model list could not be read; is `captioner serve` running?", true);
    return;
  }
  page.info = await response.json();
  const models = page.info.models;
  $("#models-summary").textContent = `${models.length} checkpoint${models.length === 1 ? "" : "s"}: ` +
    models.map((model) => `${model.name} (${model.decoder}, ${attentionWords(model)})`).join(", ");
  const warned = models.filter((model) => model.warning);   // a model of the synthetic shapes: it knows no photos
  $("#models-warning").textContent = warned.map((model) => `${model.name}: ${model.warning}`).join(" ");
  $("#models-warning").hidden = warned.length === 0;
  const defaults = [...new Set(models.map((model) => model.beam))];
  const beam = $("#beam");
  beam.append(new Option(defaults.length === 1 ? `default (${defaults[0]})` : "each checkpoint's default", ""));
  for (let k = 1; k <= page.info.max_beam; k++) beam.append(new Option(String(k), String(k)));
}

start();
