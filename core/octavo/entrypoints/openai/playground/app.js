// Octavo's playground: chat and raw completions against this server's OpenAI endpoints,
// and a dashboard drawn from its /metrics. No framework and no build step.
//
// Safety rules this file keeps: model output and server text reach the page only through
// textContent and the title attribute, never innerHTML; the API key lives in `state` (this
// tab's memory) and travels only in the Authorization header; every request goes to this
// origin (the page's Content-Security-Policy allows nothing else).
"use strict";

const HISTORY_POINTS = 300; // five minutes of one-second polls
const POLL_MS = 1000;

const state = {
  apiKey: null,
  model: null,
  controller: null, // the AbortController of the generation in flight
  history: [], // the chat so far: {role, content}
  samples: [], // dashboard history: {t, requests, kv, genTps}
  last: null, // the previous /metrics poll's counters, for rates
};

const $ = (id) => document.getElementById(id);

// ---- talking to the server ------------------------------------------------------------

function headers(json) {
  const result = {};
  if (json) result["Content-Type"] = "application/json";
  if (state.apiKey) result["Authorization"] = "Bearer " + state.apiKey;
  return result;
}

class ApiError extends Error {
  constructor(status, message) {
    super(`${status}: ${message}`);
    this.status = status;
  }
}

async function apiError(response) {
  let message = response.statusText;
  try {
    const data = await response.json();
    message = (data.error && data.error.message) || JSON.stringify(data);
  } catch (ignored) {
    // not JSON: keep the status text
  }
  if (response.status === 401) askForKey(message);
  return new ApiError(response.status, message);
}

async function api(path, body, signal) {
  const response = await fetch(path, {
    method: body === undefined ? "GET" : "POST",
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    credentials: "omit",
    cache: "no-store",
  });
  if (!response.ok) throw await apiError(response);
  return response;
}

// The data of each server-sent event of a streamed answer, parsed; an error event throws.
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const parsed = JSON.parse(data);
        if (parsed.error) throw new ApiError(parsed.error.code || "error", parsed.error.message);
        yield parsed;
      }
    }
  }
}

// ---- messages to the user -------------------------------------------------------------

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

function askForKey(message) {
  $("auth-message").textContent =
    `This server needs an API key (401: ${message}). Enter it to go on.`;
  $("auth").hidden = false;
  $("api-key").focus();
}

async function useKey(event) {
  event.preventDefault();
  state.apiKey = $("api-key").value.trim() || null;
  $("api-key").value = "";
  $("auth").hidden = true;
  clearError();
  await loadModel();
}

async function loadModel() {
  try {
    const models = await (await api("/v1/models")).json();
    state.model = models.data[0].id;
    $("model").textContent = state.model;
  } catch (error) {
    if (error.status !== 401) showError("cannot list the models: " + error.message);
  }
}

// ---- sampling settings ----------------------------------------------------------------

function numberField(id, parse) {
  const text = $(id).value.trim();
  if (text === "") return null;
  const value = parse(text);
  if (Number.isNaN(value)) throw new Error(`${id} is not a number: ${text}`);
  return value;
}

// The request fields of the settings panel; throws an Error that names a bad field.
function samplingFields() {
  const fields = {};
  const floats = { temperature: "temperature", top_p: "top-p" };
  const ints = { top_k: "top-k", max_tokens: "max-tokens", seed: "seed" };
  for (const [key, id] of Object.entries(floats)) {
    const value = numberField(id, Number.parseFloat);
    if (value !== null) fields[key] = value;
  }
  for (const [key, id] of Object.entries(ints)) {
    const value = numberField(id, (text) => Number.parseInt(text, 10));
    if (value !== null) fields[key] = value;
  }
  const stop = $("stop-strings").value.split("\n").filter((line) => line.length > 0);
  if (stop.length) fields.stop = stop;
  const mode = $("guided-mode").value;
  const guided = $("guided").value.trim();
  if (mode === "json") {
    try {
      fields.guided_json = JSON.parse(guided);
    } catch (error) {
      throw new Error("the JSON schema is not valid JSON: " + error.message);
    }
  } else if (mode === "regex") {
    fields.guided_regex = guided;
  }
  return fields;
}

// The settings' request fields, or null once a bad field is shown to the user.
function settingsOrError() {
  try {
    return samplingFields();
  } catch (error) {
    showError(error.message);
    return null;
  }
}

// ---- one streamed generation ----------------------------------------------------------

function setBusy(busy, sendId, stopId) {
  $(sendId).disabled = busy;
  $(stopId).disabled = !busy;
}

// Streams `body` to `path`; `onChoice(choice)` shows each choice delta and returns how
// many tokens it held. Resolves to the figures shown under the message.
async function generate(path, body, onChoice, sendId, stopId) {
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true, sendId, stopId);
  clearError();
  const result = { start: performance.now(), first: null, end: null, finish: null,
                   usage: null, tokens: 0, error: null };
  try {
    const response = await api(path, body, controller.signal);
    for await (const chunk of events(response)) {
      if (chunk.usage) result.usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const tokens = onChoice(choice);
        if (tokens > 0 && result.first === null) result.first = performance.now();
        result.tokens += tokens;
        if (choice.finish_reason) result.finish = choice.finish_reason;
      }
    }
  } catch (error) {
    if (error.name === "AbortError") {
      result.finish = "stopped";
    } else {
      result.error = error.message;
      showError(error.message);
    }
  } finally {
    result.end = performance.now();
    state.controller = null;
    setBusy(false, sendId, stopId);
  }
  return result;
}

function stop() {
  if (state.controller) state.controller.abort();
}

function describe(result) {
  const parts = [];
  if (result.first !== null) parts.push(`TTFT ${Math.round(result.first - result.start)} ms`);
  const outputTokens = result.usage ? result.usage.completion_tokens : result.tokens;
  if (result.first !== null && outputTokens > 1 && result.end > result.first) {
    const perSecond = (outputTokens - 1) / ((result.end - result.first) / 1000);
    parts.push(`${perSecond.toFixed(1)} tok/s`);
  }
  parts.push(`finish: ${result.finish || (result.error ? "error" : "none")}`);
  if (result.usage) {
    parts.push(`prompt ${result.usage.prompt_tokens} / output ${result.usage.completion_tokens} tokens`);
  } else {
    parts.push(`output ${result.tokens} tokens`);
  }
  return parts.join(" · ");
}

// ---- chat -----------------------------------------------------------------------------

function addMessage(role, text) {
  const box = document.createElement("div");
  box.className = "message " + role;
  const label = document.createElement("div");
  label.className = "role";
  label.textContent = role;
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  const stats = document.createElement("p");
  stats.className = "stats";
  box.append(label, body, stats);
  $("messages").append(box);
  box.scrollIntoView({ block: "end" });
  return { body, stats };
}

async function sendChat(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || state.controller) return;
  const fields = settingsOrError();
  if (fields === null) return;
  $("prompt").value = "";
  addMessage("user", text);
  state.history.push({ role: "user", content: text });
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...state.history);
  const view = addMessage("assistant", "");
  view.body.classList.add("streaming");
  const result = await generate("/v1/chat/completions", {
    model: state.model, messages, stream: true, stream_options: { include_usage: true },
    ...fields,
  }, (choice) => {
    const delta = choice.delta && choice.delta.content;
    if (!delta) return 0;
    view.body.textContent += delta;
    return 1;
  }, "send", "stop");
  view.body.classList.remove("streaming");
  view.stats.textContent = describe(result);
  view.stats.dataset.finish = result.finish || "";
  state.history.push({ role: "assistant", content: view.body.textContent });
}

function newChat() {
  stop();
  state.history = [];
  $("messages").replaceChildren();
}

// ---- raw completions with logprobs ----------------------------------------------------

function tokenTitle(token, logprob, top) {
  const lines = [`${JSON.stringify(token)}  logprob ${logprob.toFixed(3)}  p ${Math.exp(logprob).toFixed(3)}`];
  const alternatives = Object.entries(top || {}).sort((a, b) => b[1] - a[1]);
  for (const [text, value] of alternatives) {
    lines.push(`  ${JSON.stringify(text)}  ${value.toFixed(3)}`);
  }
  return lines.join("\n");
}

async function sendCompletion() {
  const prompt = $("raw-prompt").value;
  if (!prompt || state.controller) return;
  const fields = settingsOrError();
  if (fields === null) return;
  const output = $("raw-output");
  output.replaceChildren();
  const promptSpan = document.createElement("span");
  promptSpan.className = "token prompt";
  promptSpan.textContent = prompt;
  output.append(promptSpan);
  $("raw-stats").textContent = "";
  const result = await generate("/v1/completions", {
    model: state.model, prompt, stream: true, logprobs: 5,
    stream_options: { include_usage: true }, ...fields,
  }, (choice) => {
    const logprobs = choice.logprobs;
    if (!logprobs || !logprobs.tokens || logprobs.tokens.length === 0) {
      if (!choice.text) return 0;
      const span = document.createElement("span");
      span.className = "token";
      span.textContent = choice.text;
      output.append(span);
      return 1;
    }
    logprobs.tokens.forEach((token, i) => {
      const span = document.createElement("span");
      span.className = "token";
      span.textContent = token;
      span.title = tokenTitle(token, logprobs.token_logprobs[i], logprobs.top_logprobs[i]);
      output.append(span);
    });
    return logprobs.tokens.length;
  }, "raw-send", "raw-stop");
  $("raw-stats").textContent = describe(result);
  $("raw-stats").dataset.finish = result.finish || "";
}

// ---- the dashboard --------------------------------------------------------------------

// Prometheus' text format -> [{name, labels, value}] (comments and blank lines skipped).
function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = line.match(/^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!match) continue;
    const labels = {};
    for (const label of (match[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) {
      labels[label[1]] = label[2];
    }
    samples.push({ name: match[1], labels, value: Number(match[3]) });
  }
  return samples;
}

// Per engine: gauges and counters of the samples; "all" sums the engines.
function byEngine(samples) {
  const engines = {};
  for (const { name, labels, value } of samples) {
    // vLLM's families are "vllm:*"; Octavo's own (the prefix-cache hit rate) "octavo:*".
    const prefix = ["vllm:", "octavo:"].find((p) => name.startsWith(p));
    if (!prefix) continue;
    const key = name.slice(prefix.length);
    const engine = labels.engine || "0";
    if (key.endsWith("_per_pos_total")) continue;
    engines[engine] = engines[engine] || {};
    engines[engine][key] = (engines[engine][key] || 0) + value;
  }
  return engines;
}

function rate(now, before, key, seconds) {
  if (!before || !(key in now) || !(key in before) || seconds <= 0) return null;
  return Math.max(0, now[key] - before[key]) / seconds;
}

function percent(value) {
  return value === undefined || value === null ? "-" : `${(100 * value).toFixed(1)}%`;
}

function fixed(value) {
  return value === null ? "-" : value.toFixed(1);
}

function drawPlot(canvas, values) {
  const context = canvas.getContext("2d");
  const { width, height } = canvas;
  context.clearRect(0, 0, width, height);
  if (values.length < 2) return;
  const top = Math.max(1, ...values);
  context.strokeStyle = "#3451b2";
  context.lineWidth = 1.5;
  context.beginPath();
  values.forEach((value, i) => { // the newest point at the right edge
    const x = width - ((values.length - 1 - i) / (HISTORY_POINTS - 1)) * width;
    const y = height - 2 - (value / top) * (height - 4);
    if (i === 0) context.moveTo(x, y);
    else context.lineTo(x, y);
  });
  context.stroke();
  context.fillStyle = "#6b7079";
  context.fillText(String(Math.round(top)), 2, 10);
}

function showEngines(engines, last, seconds) {
  const names = Object.keys(engines).sort();
  $("engines").hidden = names.length < 2;
  const rows = names.map((name) => {
    const now = engines[name];
    const before = last && last[name];
    const row = document.createElement("tr");
    for (const text of [name, now.num_requests_running, now.num_requests_waiting,
                        percent(now.kv_cache_usage_perc),
                        fixed(rate(now, before, "generation_tokens_total", seconds))]) {
      const cell = document.createElement("td");
      cell.textContent = String(text ?? "-");
      row.append(cell);
    }
    return row;
  });
  $("engines").tBodies[0].replaceChildren(...rows);
}

function sum(engines) {
  const total = {};
  for (const engine of Object.values(engines)) {
    for (const [key, value] of Object.entries(engine)) total[key] = (total[key] || 0) + value;
  }
  const count = Object.keys(engines).length || 1;
  // Usage and hit rates are fractions: show their mean over the engines, not their sum.
  for (const key of ["kv_cache_usage_perc", "prefix_cache_hit_rate"]) {
    if (key in total) total[key] /= count;
  }
  return total;
}

async function pollMetrics() {
  try {
    const response = await fetch("/metrics", { cache: "no-store", credentials: "omit" });
    if (!response.ok) throw new Error(`/metrics: ${response.status}`);
    const engines = byEngine(parseMetrics(await response.text()));
    const t = performance.now() / 1000;
    const total = sum(engines);
    const previous = state.last;
    const seconds = previous ? t - previous.t : 0;
    const before = previous && previous.total;
    const genTps = rate(total, before, "generation_tokens_total", seconds);
    const promptTps = rate(total, before, "prompt_tokens_total", seconds);
    $("m-running").textContent = String(total.num_requests_running ?? "-");
    $("m-waiting").textContent = String(total.num_requests_waiting ?? "-");
    $("m-kv").textContent = percent(total.kv_cache_usage_perc);
    const queries = total.prefix_cache_queries_total;
    $("m-prefix").textContent = queries ? percent(total.prefix_cache_hits_total / queries) : "-";
    $("m-prompt-tps").textContent = fixed(promptTps);
    $("m-gen-tps").textContent = fixed(genTps);
    const drafted = total.spec_decode_num_draft_tokens_total;
    $("spec-card").hidden = !drafted;
    if (drafted) $("m-spec").textContent = percent(total.spec_decode_num_accepted_tokens_total / drafted);
    showEngines(engines, previous && previous.engines, seconds);
    state.last = { t, total, engines };
    state.samples.push({
      requests: (total.num_requests_running || 0) + (total.num_requests_waiting || 0),
      kv: 100 * (total.kv_cache_usage_perc || 0),
      genTps: genTps || 0,
    });
    if (state.samples.length > HISTORY_POINTS) state.samples.shift();
    drawPlot($("plot-requests"), state.samples.map((s) => s.requests));
    drawPlot($("plot-kv"), state.samples.map((s) => s.kv));
    drawPlot($("plot-tps"), state.samples.map((s) => s.genTps));
    $("health").textContent = "";
  } catch (error) {
    $("health").textContent = "(metrics unavailable: " + error.message + ")";
  }
}

// ---- wiring ---------------------------------------------------------------------------

function showTab(name) {
  for (const button of document.querySelectorAll(".tab-button")) {
    button.classList.toggle("active", button.dataset.tab === name);
  }
  for (const tab of document.querySelectorAll(".tab")) tab.hidden = tab.id !== name;
}

function start() {
  $("auth").addEventListener("submit", useKey);
  $("chat-form").addEventListener("submit", sendChat);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("chat-form").requestSubmit();
    }
  });
  $("stop").addEventListener("click", stop);
  $("clear").addEventListener("click", newChat);
  $("raw-send").addEventListener("click", sendCompletion);
  $("raw-stop").addEventListener("click", stop);
  for (const button of document.querySelectorAll(".tab-button")) {
    button.addEventListener("click", () => showTab(button.dataset.tab));
  }
  loadModel();
  pollMetrics();
  setInterval(pollMetrics, POLL_MS);
}

document.addEventListener("DOMContentLoaded", start);
