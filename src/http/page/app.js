// vramgate's live page: polls /v1/admission (and /metrics for the 429
// counter) every 500 ms and draws each device's memory against its capacity,
// the queue and the refusal counters; sends completions from a small form and
// shows a streamed answer as it arrives. Same-origin requests only. Every
// element that shows a number carries the raw number in data-value.
"use strict";

const POLL_MS = 500;
const BARS = [
  ["capacity_bytes", "capacity"],
  ["budget_bytes", "budget"],
  ["effective_budget_bytes", "effective budget"],
  ["reserved_bytes", "reserved"],
  ["peak_reserved_bytes", "peak reserved"],
  ["used_bytes", "used"],
  ["peak_bytes", "peak"],
  ["foreign_bytes", "held by others"],
];
const DEVICE_COUNTS = [["running", "running"], ["completed", "completed"], ["out_of_memory", "out of memory"],
                       ["preemptions", "preemptions"]];
// The paged KV cache of a device (/v1/admission devices[].kv_blocks), when it has one.
const KV_BLOCKS = [
  ['used', 'used'], ['cached', 'cached'], ['free', 'free'], ['total', 'of'],
  ['prefix_hit_tokens', 'prefix hits (tokens)'], ['prompt_tokens', 'of prompt tokens'], ['evicted', 'evicted']
];
const COUNTERS = {
  "queue-depth": "queue_depth", "running": "running", "admitted": "admitted", "completed": "completed",
  "failed": "failed", "cancelled": "cancelled", "rejected-never-fits": "rejected_never_fits",
  "rejected-queue-full": "rejected_queue_full", "queue-timeouts": "queue_timeouts",
  "out-of-memory": "out_of_memory", "preemptions": "preemptions", "oom-budget-cuts": "oom_budget_cuts",
};

const $ = (id) => document.getElementById(id);

function headers() {
  const h = {};
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n, i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? String(v) : v.toFixed(v < 10 ? 2 : 1)) + " " + units[i];
}

function setNumber(el, value, text) {
  el.dataset.value = String(value);
  el.textContent = text === undefined ? String(value) : text;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function deviceSection(name) {
  const sec = el("section", "device");
  sec.dataset.device = name;
  const title = el("h3");
  title.append(el("span", "name", name), " ");
  const state = el("span", "state");
  state.dataset.field = "state";
  title.append(state);
  sec.append(title);
  for (const [field, label] of BARS) {
    const row = el("div", "bar");
    row.dataset.field = field;
    const track = el("div", "track");
    track.append(el("div", "fill"));
    row.append(el("span", "label", label), track, el("span", "num"));
    sec.append(row);
  }
  const counts = el("div", "device-counts");
  for (const [field, label] of DEVICE_COUNTS) {
    const c = el("span");
    const b = el("b");
    b.dataset.field = field;
    c.append(label + " ", b);
    counts.append(c);
  }
  sec.append(counts);
  const kv = el('div', 'kv-blocks');
  kv.hidden = true;
  kv.append('KV blocks ');
  for (const [field, label] of KV_BLOCKS) {
    const c = el('span');
    const b = el('b');
    b.dataset.kv = field;
    c.append(label + ' ', b);
    kv.append(c);
  }
  sec.append(kv);
  return sec;
}

function renderDevice(sec, d) {
  const cap = d.capacity_bytes > 0 ? d.capacity_bytes : 1;
  for (const [field] of BARS) {
    const row = sec.querySelector(`.bar[data-field="${field}"]`);
    const v = d[field] ?? 0;
    row.dataset.value = String(v);
    row.querySelector(".fill").style.width = Math.min(100, (100 * v) / cap).toFixed(2) + "%";
    row.querySelector(".num").textContent = bytes(v);
    row.title = `${field}: ${v} bytes (${((100 * v) / cap).toFixed(1)}% of capacity)`;
  }
  for (const [field] of DEVICE_COUNTS) setNumber(sec.querySelector(`b[data-field="${field}"]`), d[field] ?? 0);
  const kv = sec.querySelector('.kv-blocks');
  kv.hidden = !d.kv_blocks;
  if (d.kv_blocks) {
    for (const [field] of KV_BLOCKS) setNumber(kv.querySelector(`b[data-kv="${field}"]`), d.kv_blocks[field] ?? 0);
    kv.title = `${d.kv_blocks.reservation} reservation, ${d.kv_blocks.block_tokens} tokens ` +
        `(${bytes(d.kv_blocks.block_bytes)}) a block`;
  }
  const state = sec.querySelector('[data-field="state"]');
  state.dataset.value = d.state;
  state.className = "state state-" + d.state;
  state.textContent = d.state + (d.reason ? ` (${d.reason})` : "");
}

function render(state) {
  setNumber($("policy"), state.policy, "policy " + state.policy + (state.draining ? ", draining" : ""));
  $("policy").dataset.value = state.policy;
  const box = $("devices");
  const seen = new Set();
  for (const d of state.devices) {
    seen.add(d.name);
    let sec = [...box.children].find((s) => s.dataset.device === d.name);
    if (!sec) { sec = deviceSection(d.name); box.append(sec); }
    renderDevice(sec, d);
  }
  for (const sec of [...box.children]) if (!seen.has(sec.dataset.device)) sec.remove();
  for (const [id, key] of Object.entries(COUNTERS)) setNumber($(id), state[key] ?? 0);
  const rows = $("waiting").tBodies[0];
  rows.replaceChildren(...(state.waiting ?? []).map((w) => {
    const tr = el("tr");
    tr.dataset.position = String(w.position);
    const size = el("td", "num");
    setNumber(size, w.cost_bytes, bytes(w.cost_bytes));
    const waited = el("td", "num");
    setNumber(waited, w.waited_s, w.waited_s.toFixed(1) + " s");
    tr.append(el("td", "num", String(w.position)), size, waited, el("td", "", w.priority));
    return tr;
  }));
}

/// The sum of a counter over its labels in a Prometheus text exposition, or null.
function metricSum(text, name) {
  let sum = null;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (rest[0] !== " " && rest[0] !== "{") continue;
    const v = Number(line.slice(line.lastIndexOf(" ") + 1));
    if (Number.isFinite(v)) sum = (sum ?? 0) + v;
  }
  return sum;
}

async function pollMetrics() {
  try {
    const r = await fetch("/metrics", { headers: headers(), cache: "no-store" });
    if (!r.ok) return;
    const n = metricSum(await r.text(), "vramgate_rate_limited_total");
    if (n !== null) setNumber($("rate-limited"), n);
  } catch (e) { /* the admission poll reports connection problems */ }
}

async function poll() {
  const status = $("poll-status");
  try {
    const [r] = await Promise.all([fetch("/v1/admission", { headers: headers(), cache: "no-store" }), pollMetrics()]);
    if (!r.ok) {
      const body = await r.json().catch(() => null);
      throw new Error(`HTTP ${r.status}` + (body && body.error ? `: ${body.error.message}` : ""));
    }
    render(await r.json());
    status.className = "status";
    status.textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.polls = String(Number(document.body.dataset.polls) + 1);
    document.body.dataset.loaded = "1";
  } catch (e) {
    status.className = "status error";
    status.textContent = "cannot read /v1/admission: " + e.message;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

/// Calls `onEvent` with the data of each SSE event and `onComment` with each comment line.
async function readSse(response, onEvent, onComment) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let end;
    while ((end = buf.search(/\r?\n/)) >= 0) {
      const line = buf.slice(0, end);
      buf = buf.slice(end + (buf[end] === "\r" ? 2 : 1));
      if (line.startsWith("data: ")) onEvent(line.slice(6));
      else if (line.startsWith(":")) onComment(line.slice(1).trim());
    }
  }
}

async function sendCompletion(ev) {
  ev.preventDefault();
  const out = $("completion-output"), status = $("completion-status"), button = $("send");
  const stream = $("stream").checked;
  const body = { prompt: $("prompt").value, max_tokens: Number($("max-tokens").value),
                 temperature: Number($("temperature").value), stream };
  out.textContent = "";
  out.dataset.state = "sending";
  delete out.dataset.finishReason;
  status.className = "status";
  status.textContent = "sending…";
  button.disabled = true;
  const started = performance.now();
  try {
    const r = await fetch("/v1/completions", { method: "POST", body: JSON.stringify(body),
                                               headers: { ...headers(), "Content-Type": "application/json" } });
    const id = r.headers.get("X-Request-Id");
    if (!r.ok) {
      const err = await r.json().catch(() => ({ error: { type: "unknown", message: r.statusText } }));
      const retry = r.headers.get("Retry-After");
      status.className = "status error";
      status.textContent = `HTTP ${r.status} ${err.error.type}: ${err.error.message}` +
                           (retry ? ` — retry after ${retry} s` : "") + ` (request ${id})`;
      out.dataset.state = "error";
      return;
    }
    if (!stream) {
      const j = await r.json();
      out.textContent = j.choices[0].text;
      out.dataset.state = "done";
      out.dataset.finishReason = j.choices[0].finish_reason;
      status.textContent = `HTTP 200, ${j.usage.completion_tokens} tokens, finish_reason ${j.choices[0].finish_reason}, ` +
                           `queued ${r.headers.get("X-Queue-Wait-Ms")} ms (request ${id})`;
      return;
    }
    let tokens = 0, finish = "";
    await readSse(r, (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) {
        status.className = "status error";
        status.textContent = `${chunk.error.type}: ${chunk.error.message}`;
        out.dataset.state = "error";
        return;
      }
      const choice = chunk.choices[0];
      out.textContent += choice.text;
      out.dataset.state = "streaming";
      tokens += 1;
      if (choice.finish_reason) finish = choice.finish_reason;
      status.textContent = `streaming… ${tokens} chunks`;
    }, (comment) => { status.textContent = comment; });
    if (!status.classList.contains("error")) {
      out.dataset.state = "done";
      out.dataset.finishReason = finish;
      status.textContent = `done in ${Math.round(performance.now() - started)} ms, finish_reason ${finish} (request ${id})`;
    }
  } catch (e) {
    status.className = "status error";
    status.textContent = "request failed: " + e.message;
    out.dataset.state = "error";
  } finally {
    button.disabled = false;
  }
}

/// A link may prefill the form (?prompt=...&max_tokens=...&temperature=...&stream=0|1)
/// and, with &send, send it at once.
function prefill() {
  const q = new URLSearchParams(location.search);
  if (q.has("prompt")) $("prompt").value = q.get("prompt");
  if (q.has("max_tokens")) $("max-tokens").value = q.get("max_tokens");
  if (q.has("temperature")) $("temperature").value = q.get("temperature");
  if (q.has("stream")) $("stream").checked = q.get("stream") !== "0";
  return q.has("send");
}

document.addEventListener("DOMContentLoaded", () => {
  $("completion-form").addEventListener("submit", sendCompletion);
  if (prefill()) $("completion-form").requestSubmit();
  poll();
});
