// The /ui page: pick a model, send an image or a text to :classify, show top-k, timing, truncation and how
// unlike the training data the input is (ood_score); for texts, :explain highlights the passages that decided.
// Plain browser JavaScript, no dependencies: everything it loads comes from this server.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { models: [], image: null };

function headers(extra) {
  const key = $("api-key").value.trim();
  sessionStorage.setItem("lara-api-key", key);
  return Object.assign(key ? { Authorization: "Bearer " + key } : {}, extra || {});
}

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function errorText(response) {
  try { return (await response.json()).error || response.statusText; } catch (e) { return response.statusText; }
}

async function loadModels() {
  const response = await fetch("/info", { headers: headers() });
  if (!response.ok) { setStatus("/info: HTTP " + response.status + ": " + (await errorText(response)), true); return; }
  const info = await response.json();
  state.models = info.models;
  const select = $("model");
  select.replaceChildren(...info.models.map((m) => new Option(m.name + " (" + m.task + ")", m.name)));
  const wanted = new URLSearchParams(location.search).get("model");
  if (wanted) select.value = wanted;
  showModel();
}

function currentModel() { return state.models.find((m) => m.name === $("model").value); }

function showModel() {
  const model = currentModel();
  if (!model) return;
  const acc = model.accuracy && model.accuracy.test_accuracy !== undefined
    ? "Test accuracy " + (100 * model.accuracy.test_accuracy).toFixed(1) + "% (n=" + model.accuracy.n_test + "). " : "";
  const limit = model.max_length ? "Takes up to " + model.max_length + " " + model.length_unit + ". " : "";
  const attention = model.attention ? "Attention: " + model.attention.kind + ". " : "";
  $("card").textContent = "Labels: " + model.labels.join(", ") + ". " + limit + acc + attention + "Suited inputs: " + model.suited_inputs + ".";
  $("image-input").hidden = model.task !== "image";
  $("text-input").hidden = model.task !== "text";
  $("latency").hidden = model.task !== "text";
  $("explain").hidden = model.task !== "text";
  $("result").hidden = true;
  $("explanation").hidden = true;
  updateButton();
  if (model.task === "text") drawLatency();
}

function updateButton() {
  const model = currentModel();
  const ready = model && (model.task === "image" ? state.image !== null : $("text").value.length > 0);
  $("classify").disabled = !ready;
  $("explain").disabled = !ready;
  const bytes = new TextEncoder().encode($("text").value).length;
  // A word-piece model's max_length counts pieces, which only the server's tokenizer knows: no byte comparison.
  const inBytes = model && model.length_unit === "UTF-8 bytes";
  $("text-length").textContent = model && model.task === "text"
    ? bytes + " bytes" + (inBytes && model.max_length && bytes > model.max_length ? " (over " + model.max_length + ")" : "") : "";
}

function takeImage(file) {
  if (!file) return;
  state.image = file;
  const preview = $("preview");
  preview.src = URL.createObjectURL(file);
  preview.hidden = false;
  updateButton();
}

async function classify() {
  $("explanation").hidden = true;
  const model = currentModel();
  const params = new URLSearchParams({ top_k: $("top-k").value });
  let body, type;
  if (model.task === "image") {
    body = state.image;
    type = state.image.type || "application/octet-stream";
  } else {
    body = $("text").value;
    type = "text/plain; charset=utf-8";
    params.set("truncate", $("truncate").value);
  }
  setStatus("classifying...");
  $("classify").disabled = true;
  try {
    const url = "/v1/models/" + encodeURIComponent(model.name) + ":classify?" + params;
    const response = await fetch(url, { method: "POST", body, headers: headers({ "Content-Type": type }) });
    if (!response.ok) { setStatus("HTTP " + response.status + ": " + (await errorText(response)), true); return; }
    showResult(await response.json(), response.headers);
    setStatus("done");
    if (model.task === "text") drawLatency();
  } catch (e) {
    setStatus("request failed: " + e, true);
  } finally {
    updateButton();
  }
}

function showResult(result, h) {
  $("top-label").textContent = result.label;
  $("scores").replaceChildren(...result.top_k.map((t) => {
    const li = document.createElement("li");
    li.dataset.label = t.label;
    li.dataset.score = String(t.score);
    const name = document.createElement("span"); name.className = "name"; name.textContent = t.label;
    const bar = document.createElement("span"); bar.className = "bar"; bar.style.width = (t.score * 300).toFixed(1) + "px";
    const value = document.createElement("span"); value.className = "value"; value.textContent = (100 * t.score).toFixed(1) + "%";
    li.append(name, bar, value);
    return li;
  }));
  const ms = (name) => (h.get(name) ? Number(h.get(name)).toFixed(2) + " ms" : "-");
  $("queue-ms").textContent = ms("x-queue-time-ms");
  $("inference-ms").textContent = ms("x-inference-time-ms");
  $("total-ms").textContent = ms("x-total-time-ms");
  $("batch-size").textContent = h.get("x-batch-size") || "-";
  const isText = currentModel().task === "text";
  $("truncated").textContent = !isText ? "- (image)" : result.truncated ? "yes (longer than the model takes)" : "no";
  const ood = result.ood_score;
  const verdict = result.in_distribution === true ? " (like the training data)"
    : result.in_distribution === false ? " (not like the training data)" : "";
  $("ood-score").textContent = ood === null || ood === undefined ? "- (the model has none)" : ood.toPrecision(4) + verdict;
  $("ood-badge").hidden = result.in_distribution !== false;
  $("result").hidden = false;
}

async function explain() {
  const model = currentModel();
  const body = { instances: [$("text").value], parameters: { top_k: Number($("top-k").value) } };
  const side = $("truncate").value;
  body.parameters.truncate = side === "false" ? false : side;
  setStatus("explaining (one model run per passage)...");
  $("explain").disabled = true;
  try {
    const url = "/v1/models/" + encodeURIComponent(model.name) + ":explain";
    const response = await fetch(url, { method: "POST", body: JSON.stringify(body),
      headers: headers({ "Content-Type": "application/json" }) });
    if (!response.ok) { setStatus("HTTP " + response.status + ": " + (await errorText(response)), true); return; }
    const explanation = (await response.json()).explanations[0];
    showResult(explanation, response.headers);
    showPassages(explanation);
    setStatus("done");
  } catch (e) {
    setStatus("request failed: " + e, true);
  } finally {
    updateButton();
  }
}

// The passages cover the text the model read, in order: each becomes a span coloured by its contribution in
// log-odds on an absolute scale (full colour at LOG_ODDS_FULL), so a confident answer's deciding passage still
// shows and a passage that barely matters stays pale, whatever the others do.
const LOG_ODDS_FULL = 3.0; // e^3: the passage multiplies the label's odds by about 20
function showPassages(explanation) {
  const passages = explanation.passages;
  const effect = (p) => (p.log_odds === undefined || p.log_odds === null ? p.contribution : p.log_odds) || 0;
  const top = passages.filter((p) => effect(p) > 0).sort((a, b) => effect(b) - effect(a)).slice(0, 3);
  $("explained-label").textContent = explanation.label;
  $("passages").replaceChildren(...passages.map((p) => {
    const span = document.createElement("span");
    span.className = "passage" + (top.includes(p) ? " top" : "");
    span.textContent = p.text;
    span.dataset.start = String(p.start);
    span.dataset.end = String(p.end);
    span.dataset.contribution = p.contribution === null ? "" : String(p.contribution);
    span.dataset.logOdds = p.log_odds === null || p.log_odds === undefined ? "" : String(p.log_odds);
    span.dataset.rank = top.includes(p) ? String(top.indexOf(p) + 1) : "";
    const c = effect(p);
    const alpha = (0.7 * Math.min(1, Math.abs(c) / LOG_ODDS_FULL)).toFixed(3);
    span.style.backgroundColor = c >= 0 ? "rgba(46, 160, 67, " + alpha + ")" : "rgba(207, 34, 46, " + alpha + ")";
    span.title = p.contribution === null ? "the whole text is one passage"
      : "bytes " + p.start + "-" + p.end + ": " + (c >= 0 ? "+" : "") + c.toFixed(2) + " log-odds ("
        + (p.contribution >= 0 ? "+" : "") + (100 * p.contribution).toFixed(2) + " points) of " + explanation.label;
    return span;
  }));
  $("explanation").hidden = false;
}

// Prometheus text -> {length: [sum, count]} of lara_item_seconds for one model.
function itemSeconds(text, model) {
  const out = {};
  const line = /^lara_item_seconds_(sum|count)\{([^}]*)\} (\S+)$/;
  for (const row of text.split("\n")) {
    const m = line.exec(row);
    if (!m) continue;
    const labels = Object.fromEntries([...m[2].matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    if (labels.model !== model) continue;
    const entry = out[labels.length] || (out[labels.length] = [0, 0]);
    entry[m[1] === "sum" ? 0 : 1] = Number(m[3]);
  }
  return out;
}

async function drawLatency() {
  const model = currentModel();
  const svg = $("chart");
  const response = await fetch("/metrics", { headers: headers() });
  if (!response.ok) { $("chart-note").textContent = "/metrics: HTTP " + response.status; svg.replaceChildren(); return; }
  const data = itemSeconds(await response.text(), model.name);
  const lengths = Object.keys(data).map(Number).filter((l) => data[l][1] > 0).sort((a, b) => a - b);
  const ns = "http://www.w3.org/2000/svg";
  const el = (tag, attrs, text) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  svg.replaceChildren();
  if (!lengths.length) { $("chart-note").textContent = "No text classified by this model yet."; return; }
  const means = lengths.map((l) => (1000 * data[l][0]) / data[l][1]);
  const top = Math.max(...means) * 1.15;
  const [left, bottom, width, height] = [50, 190, 490, 170];
  const step = Math.min(width / lengths.length, 80);
  svg.append(el("line", { x1: left, y1: bottom, x2: left + width, y2: bottom, class: "axis" }));
  svg.append(el("text", { x: 4, y: 14 }, "ms"));
  svg.append(el("text", { x: 4, y: bottom - height + 14 }, top.toFixed(1)));
  lengths.forEach((l, i) => {
    const h = (means[i] / top) * height;
    const x = left + i * step + step * 0.15;
    svg.append(el("rect", { x, y: bottom - h, width: step * 0.7, height: h, class: "bar", "data-length": l, "data-ms": means[i].toFixed(3) }));
    svg.append(el("text", { x, y: bottom - h - 3 }, means[i].toFixed(1)));
    svg.append(el("text", { x, y: bottom + 14 }, "\u2264" + (l >= 1024 ? l / 1024 + "K" : l)));
  });
  $("chart-note").textContent = "Bars: input length in " + (model.length_unit || "tokens") + " (up to the power of two shown); counts: "
    + lengths.map((l) => data[l][1]).join(", ") + ".";
}

function init() {
  $("api-key").value = sessionStorage.getItem("lara-api-key") || "";
  $("api-key").addEventListener("change", loadModels);
  $("model").addEventListener("change", showModel);
  $("text").addEventListener("input", updateButton);
  $("classify").addEventListener("click", classify);
  $("explain").addEventListener("click", explain);
  $("image-file").addEventListener("change", (e) => takeImage(e.target.files[0]));
  $("text-file").addEventListener("change", async (e) => {
    if (e.target.files[0]) { $("text").value = await e.target.files[0].text(); updateButton(); }
  });
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => { e.preventDefault(); drop.classList.remove("over"); takeImage(e.dataTransfer.files[0]); });
  loadModels();
}

init();
