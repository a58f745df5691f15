// ingot's page: a playground over /v1/chat/completions and a dashboard
// over /ui/live, served by `ingot serve` and `ingot route` alike. Plain
// browser JavaScript, no build step and no dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const HISTORY_SECONDS = 120;
const POLL_MS = 1000;

// ---------------------------------------------------------------- API

let apiKey = sessionStorage.getItem("ingot-key") || "";

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (apiKey) h["Authorization"] = "Bearer " + apiKey;
  return h;
}

/** fetch() with the key; on 401 asks for one and tries once more. */
async function api(path, init = {}) {
  const send = () => fetch(path, { ...init, headers: { ...headers(init.body !== undefined), ...(init.headers || {}) } });
  let r = await send();
  if (r.status === 401 && await askKey()) r = await send();
  return r;
}

async function errorText(r) {
  try {
    const body = await r.json();
    const e = body.error || body;
    return (e.message || JSON.stringify(e)) + " (HTTP " + r.status + ")";
  } catch {
    return "HTTP " + r.status;
  }
}

let keyAsked = null; // the open key dialog's answer: one dialog for every 401

function askKey() {
  if (keyAsked) return keyAsked;
  const dialog = $("key-dialog");
  $("key-input").value = apiKey;
  dialog.showModal();
  keyAsked = new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      keyAsked = null;
      if (dialog.returnValue !== "ok") return resolve(false);
      apiKey = $("key-input").value.trim();
      sessionStorage.setItem("ingot-key", apiKey);
      resolve(true);
    }, { once: true });
  });
  return keyAsked;
}

function status(text, isError = false) {
  const s = $("status");
  s.textContent = text;
  s.classList.toggle("error", isError);
}

// ---------------------------------------------------------------- tabs

const tabs = [["tab-chat", "view-chat"], ["tab-dash", "view-dash"]];

function showTab(tabId) {
  for (const [t, v] of tabs) {
    const on = t === tabId;
    $(t).setAttribute("aria-selected", String(on));
    $(t).tabIndex = on ? 0 : -1;
    $(v).hidden = !on;
  }
  location.hash = tabId === "tab-dash" ? "#dashboard" : "";
  if (tabId === "tab-dash") poll(); else refreshModels();
}

for (const [t] of tabs) {
  $(t).addEventListener("click", () => showTab(t));
  $(t).addEventListener("keydown", (e) => {
    if (e.key !== "ArrowRight" && e.key !== "ArrowLeft") return;
    const i = tabs.findIndex(([id]) => id === t);
    const next = tabs[(i + (e.key === "ArrowRight" ? 1 : tabs.length - 1)) % tabs.length][0];
    $(next).focus();
    showTab(next);
  });
}

// ---------------------------------------------------------------- models

let live = null; // the last /ui/live snapshot

async function refreshModels() {
  const select = $("model");
  const r = await api("/v1/models");
  if (!r.ok) return status("Cannot list models: " + await errorText(r), true);
  const ids = (await r.json()).data.map((m) => m.id);
  const states = {};
  try {
    const l = await api("/ui/live");
    if (l.ok) {
      live = await l.json();
      for (const m of live.models || []) states[m.id] = m;
      // On the router: how many of the healthy workers serve each model.
      const up = (live.workers || []).filter((w) => w.healthy && !w.draining);
      for (const id of ids) {
        if (live.kind === "router") states[id] = { state: `${up.filter((w) => (w.models || []).includes(id)).length} of ${up.length} workers` };
      }
    }
  } catch { /* the picker works without states */ }
  const chosen = select.value;
  select.replaceChildren(...ids.map((id) => {
    const m = states[id];
    const o = new Option(m ? `${id} (${m.state}${m.kind === "embedding" ? ", embeddings" : ""})` : id, id);
    o.disabled = !!m && m.kind === "embedding";
    return o;
  }));
  if (ids.includes(chosen)) select.value = chosen;
  else { const first = [...select.options].find((o) => !o.disabled); if (first) select.value = first.value; }
}

$("model").addEventListener("focus", refreshModels);

// ---------------------------------------------------------------- playground

const conversation = []; // {role, content} as sent to the API
let running = null;      // the AbortController of the answer being streamed
let pendingCalls = [];   // tool calls of the last answer still without a result

/** The message the composer's text becomes: a tool call's result while
 *  the last answer's calls wait for theirs, else the user's turn. */
function nextMessage(text) {
  const call = pendingCalls[0];
  return call ? { role: "tool", tool_call_id: call.id, content: text } : { role: "user", content: text };
}

function promptHint() {
  const call = pendingCalls[0];
  $("prompt").placeholder = call
    ? `The result of ${call.function.name}(${call.function.arguments}) (sent as a tool message)`
    : "Send a message (Enter sends, Shift+Enter: new line, Esc stops)";
}

$("format").addEventListener("change", () => { $("schema-label").hidden = $("format").value !== "json_schema"; });

function numberField(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

/** The request body for `messages` from the settings; throws on bad JSON. */
function requestBody(messages, stream) {
  const body = { model: $("model").value, messages };
  const system = $("system").value.trim();
  if (system) body.messages = [{ role: "system", content: system }, ...messages];
  for (const f of ["temperature", "top_p", "max_tokens", "seed"]) {
    const v = numberField(f);
    if (v !== undefined) body[f] = v;
  }
  const stop = $("stop").value.split(",").map((s) => s.trim()).filter(Boolean);
  if (stop.length) body.stop = stop;
  if ($("logprobs").checked) {
    body.logprobs = true;
    body.top_logprobs = numberField("top_logprobs") ?? 0;
  }
  const format = $("format").value;
  if (format === "json_object") body.response_format = { type: "json_object" };
  if (format === "json_schema") {
    body.response_format = { type: "json_schema", json_schema: { name: "answer", strict: true, schema: JSON.parse($("schema").value) } };
  }
  const tools = $("tools").value.trim();
  if (tools) {
    body.tools = JSON.parse(tools);
    body.tool_choice = $("tool_choice").value;
  }
  if (stream) {
    body.stream = true;
    body.stream_options = { include_usage: true };
  }
  return body;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function addMessage(role, text) {
  const li = el("li", "msg " + role);
  li.append(el("div", "role", role), el("div", "content", text));
  $("messages").append(li);
  li.scrollIntoView({ block: "end" });
  return li;
}

/** Reads an SSE body, calling `onData` with each `data:` payload. */
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (data && data !== "[DONE]") onData(JSON.parse(data));
    }
  }
}

/** One answer as it streams in: text, reasoning, tool calls, logprobs. */
class Answer {
  constructor() {
    this.li = addMessage("assistant", "");
    this.text = "";
    this.reasoning = "";
    this.toolCalls = [];
    this.tokens = [];
    this.started = performance.now();
    this.firstToken = null;
    this.usage = null;
    this.finish = null;
  }

  add(chunk) {
    if (chunk.usage) this.usage = chunk.usage;
    const choice = (chunk.choices || [])[0];
    if (!choice) return;
    const d = choice.delta || {};
    if ((d.content || d.reasoning_content || d.tool_calls) && this.firstToken === null) this.firstToken = performance.now();
    if (d.content) this.text += d.content;
    if (d.reasoning_content) this.reasoning += d.reasoning_content;
    for (const call of d.tool_calls || []) {
      const slot = this.toolCalls[call.index ?? 0] ||= { id: "", name: "", arguments: "" };
      if (call.id) slot.id = call.id;
      if (call.function?.name) slot.name += call.function.name;
      if (call.function?.arguments) slot.arguments += call.function.arguments;
    }
    if (choice.logprobs?.content) this.tokens.push(...choice.logprobs.content);
    if (choice.finish_reason) this.finish = choice.finish_reason;
    this.render();
  }

  render() {
    const parts = [el("div", "role", "assistant")];
    if (this.reasoning) parts.push(el("div", "reasoning", this.reasoning));
    parts.push(this.tokens.length ? tokenView(this.tokens) : el("div", "content", this.text));
    for (const c of this.toolCalls) parts.push(el("div", "tool-call", `${c.name}(${c.arguments})`));
    this.stats = this.stats || el("div", "stats");
    parts.push(this.stats);
    this.li.replaceChildren(...parts);
  }

  done(note) {
    const end = performance.now();
    const out = this.usage?.completion_tokens;
    const bits = [];
    if (this.usage) bits.push(`${this.usage.prompt_tokens} prompt + ${out} completion tokens`);
    if (this.firstToken !== null) bits.push(`TTFT ${Math.round(this.firstToken - this.started)} ms`);
    if (out > 1 && this.firstToken !== null && end > this.firstToken) {
      bits.push(`${((out - 1) / ((end - this.firstToken) / 1000)).toFixed(1)} tok/s`);
    }
    if (this.finish) bits.push("finish: " + this.finish);
    if (note) bits.push(note);
    this.render();
    this.stats.textContent = bits.join(" · ");
    const message = { role: "assistant", content: this.text };
    if (this.toolCalls.length) {
      message.tool_calls = this.toolCalls.map((c, i) => ({
        id: c.id || "call_" + i, type: "function", function: { name: c.name, arguments: c.arguments },
      }));
    }
    return message;
  }
}

/** Tokens coloured by probability; the alternatives in each title. */
function tokenView(tokens) {
  const box = el("div", "content tokens");
  for (const t of tokens) {
    const p = Math.exp(t.logprob);
    const span = el("span", "tok", t.token);
    span.style.background = `hsl(${Math.round(120 * p)} 70% 50% / .25)`;
    const alts = (t.top_logprobs || []).map((a) => `${JSON.stringify(a.token)} ${(100 * Math.exp(a.logprob)).toFixed(1)}%`);
    span.title = `${(100 * p).toFixed(1)}%` + (alts.length ? "\n" + alts.join("\n") : "");
    box.append(span);
  }
  return box;
}

async function send(e) {
  e?.preventDefault();
  if (running) return;
  const text = $("prompt").value;
  if (!text.trim()) return;
  const message = nextMessage(text);
  let body;
  try {
    body = requestBody([...conversation, message], true);
  } catch (err) {
    return status("Settings: " + err.message, true);
  }
  conversation.push(message);
  addMessage(message.role, text);
  $("prompt").value = "";
  if (message.role === "tool") {
    pendingCalls.shift();
    // Every call needs its result before the model answers again.
    if (pendingCalls.length) return promptHint();
  }
  running = new AbortController();
  $("send").disabled = true;
  $("stop-button").disabled = false;
  status("Answering…");
  const answer = new Answer();
  let note = "";
  try {
    const r = await api("/v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal: running.signal });
    if (!r.ok) throw new Error(await errorText(r));
    await readEvents(r, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
      answer.add(chunk);
    });
    status("");
  } catch (err) {
    if (err.name === "AbortError") { note = "stopped"; status("Stopped."); }
    else { note = "error"; status(err.message, true); addMessage("error", err.message); }
  } finally {
    const reply = answer.done(note);
    conversation.push(reply);
    pendingCalls = note ? [] : [...(reply.tool_calls || [])];
    promptHint();
    running = null;
    $("send").disabled = false;
    $("stop-button").disabled = true;
    $("prompt").focus();
  }
}

function stop() {
  if (running) running.abort();
}

$("composer").addEventListener("submit", send);
$("stop-button").addEventListener("click", stop);
$("clear").addEventListener("click", () => {
  conversation.length = 0;
  pendingCalls = [];
  promptHint();
  $("messages").replaceChildren();
  status("");
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) send(e);
  if (e.key === "Escape") stop();
});

// Copy as curl / Python: the request the next Send would make.
function nextRequest() {
  return requestBody([...conversation, nextMessage($("prompt").value || "Hello!")], false);
}

function curlOf(body) {
  const auth = apiKey ? ` \\\n  -H 'Authorization: Bearer ${apiKey}'` : "";
  const json = JSON.stringify(body, null, 2).replaceAll("'", "'\\''");
  return `curl ${location.origin}/v1/chat/completions \\\n  -H 'Content-Type: application/json'${auth} \\\n  -d '${json}'`;
}

function pythonOf(body) {
  const { model, messages, ...rest } = body;
  const extra = Object.entries(rest).map(([k, v]) => `    ${k}=${pyLiteral(v)},\n`).join("");
  return `from openai import OpenAI\n\nclient = OpenAI(base_url="${location.origin}/v1", api_key=${JSON.stringify(apiKey || "none")})\n` +
    `answer = client.chat.completions.create(\n    model=${JSON.stringify(model)},\n    messages=${pyLiteral(messages)},\n${extra})\n` +
    `print(answer.choices[0].message)\n`;
}

/** JSON as a Python literal (true/false/null spelled the Python way). */
function pyLiteral(v) {
  return JSON.stringify(v, null, 1).replace(/\n\s*/g, " ")
    .replace(/("(?:[^"\\]|\\.)*")|\b(true|false|null)\b/g, (m, s, w) => s || { true: "True", false: "False", null: "None" }[w]);
}

async function copy(render) {
  let text;
  try { text = render(nextRequest()); } catch (err) { return status("Settings: " + err.message, true); }
  $("copy-text").value = text;
  try {
    await navigator.clipboard.writeText(text);
    status("Copied to the clipboard.");
  } catch {
    status("Select and copy the request below.");
  }
  $("copy-dialog").showModal();
}

$("copy-curl").addEventListener("click", () => copy(curlOf));
$("copy-python").addEventListener("click", () => copy(pythonOf));

// ---------------------------------------------------------------- dashboard

const samples = []; // {time_ms, snapshot}
let pollTimer = null;

async function poll() {
  clearTimeout(pollTimer);
  if ($("view-dash").hidden) return;
  try {
    const r = await api("/ui/live");
    if (!r.ok) throw new Error(await errorText(r));
    live = await r.json();
    samples.push(live);
    while (samples.length && samples[0].time_ms < live.time_ms - HISTORY_SECONDS * 1000) samples.shift();
    renderDashboard();
    if ($("status").textContent.startsWith("Dashboard")) status("");
  } catch (err) {
    status("Dashboard: " + err.message, true);
  }
  pollTimer = setTimeout(poll, document.hidden ? 5 * POLL_MS : POLL_MS);
}

/** Per-second rate of `value(sample)` between consecutive samples. */
function rates(value) {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = (samples[i].time_ms - samples[i - 1].time_ms) / 1000;
    out.push([samples[i].time_ms, dt > 0 ? Math.max(0, value(samples[i]) - value(samples[i - 1])) / dt : 0]);
  }
  return out;
}

function series(value) {
  return samples.map((s) => [s.time_ms, value(s)]);
}

const sum = (xs) => xs.reduce((a, b) => a + b, 0);
const engines = (s) => (s.models || []).map((m) => m.engine).filter(Boolean);
const maxOf = (xs) => xs.length ? Math.max(...xs) : null;
/** The worst model's percentile `p` of `measure`, in ms. */
const worst = (s, measure, p) => {
  const v = maxOf(engines(s).map((e) => e[measure]?.[p]).filter((x) => x != null));
  return v === null ? null : v * 1000;
};

function fmt(v, unit = "") {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const n = Math.abs(v) >= 100 ? Math.round(v).toLocaleString() : Number(v.toFixed(v < 10 ? 2 : 1)).toLocaleString();
  return n + unit;
}

function bytes(v) {
  if (!v) return "0";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  const i = Math.min(units.length - 1, Math.floor(Math.log2(v) / 10));
  return (v / 2 ** (10 * i)).toFixed(i ? 1 : 0) + " " + units[i];
}

function last(points) {
  return points.length ? points[points.length - 1][1] : null;
}

function renderDashboard() {
  if (live.kind === "router") renderRouter(); else renderServer();
}

function renderServer() {
  const tokRate = rates((s) => sum(engines(s).map((e) => e.generated_tokens)));
  const running = series((s) => sum(engines(s).map((e) => e.running)));
  const waiting = series((s) => sum(engines(s).map((e) => e.waiting)));
  const ttft50 = series((s) => worst(s, "ttft_s", "p50"));
  const ttft99 = series((s) => worst(s, "ttft_s", "p99"));
  const itl50 = series((s) => worst(s, "itl_s", "p50"));
  const itl99 = series((s) => worst(s, "itl_s", "p99"));
  const kv = series((s) => 100 * (maxOf(engines(s).map((e) => e.kv_usage)) ?? 0));
  const es = engines(live);
  const queries = sum(es.map((e) => e.prefix_cache_queries));
  const cache = live.response_cache || {};
  const lookups = (cache.hits || 0) + (cache.misses || 0);
  cards([
    ["Running", fmt(last(running))],
    ["Waiting", fmt(last(waiting))],
    ["Output tok/s", fmt(last(tokRate))],
    ["TTFT p50 / p99", fmt(last(ttft50), " ms") + " / " + fmt(last(ttft99), " ms")],
    ["ITL p50 / p99", fmt(last(itl50), " ms") + " / " + fmt(last(itl99), " ms")],
    ["KV cache", fmt(last(kv), " %")],
    ["Prefix-cache hits", queries ? fmt(100 * sum(es.map((e) => e.prefix_cache_hits)) / queries, " %") : "–"],
    ["Response-cache hits", lookups ? `${cache.hits} of ${lookups}` : "–"],
    ["Coalesced", fmt(live.coalesced ?? 0)],
    ["Refused", fmt(sum(Object.values(live.rejections || {})))],
    ["Connections", fmt(live.connections ?? 0)],
  ]);
  charts([
    ["Output tokens/s", [["tok/s", tokRate]]],
    ["Requests", [["running", running], ["waiting", waiting]]],
    ["TTFT, last minute (ms)", [["p50", ttft50], ["p99", ttft99]]],
    ["Inter-token latency, last minute (ms)", [["p50", itl50], ["p99", itl99]]],
    ["KV cache use (%)", [["used", kv]]],
  ]);
  const tiers = (byTier) => Object.entries(byTier || {}).filter(([, n]) => n).map(([t, n]) => `${t} ${n}`).join(", ") || "0";
  tables([
    ["Models", ["Model", "State", "Kind", "In flight", "Running by tier", "Waiting by tier", "KV", "Device", "Host"],
      (live.models || []).map((m) => [m.id, m.state, m.kind || "–", m.in_flight, tiers(m.engine?.running_by_tier),
        tiers(m.engine?.waiting_by_tier), m.engine ? fmt(100 * m.engine.kv_usage, " %") : "–", bytes(m.device_bytes), bytes(m.host_bytes)])],
    ["KV tiers", ["Model", "Host memory", "Disk", "Restored pages (host / disk / shared)", "Errors"],
      (live.models || []).filter((m) => m.kv_tiers).map((m) => {
        const t = m.kv_tiers, r = t.restored_pages;
        return [m.id, `${bytes(t.host.bytes)} of ${bytes(t.host.capacity_bytes)}`, t.disk ? bytes(t.disk.bytes) : "–",
          `${r.host} / ${r.disk} / ${r.shared}`, t.errors];
      })],
    ["Refusals by reason", ["Reason", "Count"], Object.entries(live.rejections || {})],
    ["Answers by status", ["Status", "Count"], Object.entries(live.http || {})],
    ["SLOs (" + (live.slo?.mode || "off") + ")", ["SLO", "Model", "Tier", "Measure", "Target", "Measured", "Samples", "Met"],
      (live.slo?.slos || []).map((s) => [s.slo, s.model, s.tier, s.metric + (s.quantile ? " p" + 100 * s.quantile : ""), fmt(s.target),
        fmt(s.measured), s.samples, s.met ? "yes" : "no"])],
  ]);
}

function renderRouter() {
  const workers = live.workers || [];
  const total = (s) => sum(Object.values(s.requests || {}));
  const reqRate = rates(total);
  const errRate = rates((s) => sum(Object.values(s.errors || {})));
  const retryRate = rates((s) => sum(Object.values(s.retries || {})));
  const outstanding = workers.map((w) => [w.label, series((s) => (s.workers || []).find((x) => x.id === w.id)?.outstanding ?? 0)]);
  const healthy = workers.filter((w) => w.healthy && !w.draining).length;
  cards([
    ["Workers healthy", `${healthy} of ${workers.length}`],
    ["Requests/s", fmt(last(reqRate))],
    ["Outstanding", fmt(sum(workers.map((w) => w.outstanding)))],
    ["Failed attempts/s", fmt(last(errRate))],
    ["Retries/s", fmt(last(retryRate))],
    ["Open breakers", fmt(workers.filter((w) => w.breaker !== "closed").length)],
    ["Policy", live.policy],
  ]);
  charts([
    ["Requests/s", [["answered", reqRate], ["failed attempts", errRate], ["retries", retryRate]]],
    ["Outstanding by worker", outstanding],
  ]);
  const ms = (s) => (s == null ? "–" : fmt(1000 * s, " ms"));
  tables([
    ["Workers", ["Worker", "URL", "Health", "Breaker", "Outstanding", "Running", "Waiting", "KV", "TTFT", "ITL", "Answered", "Models"],
      workers.map((w) => [w.label, w.url, w.draining ? "draining" : w.routed_away ? "routed away" : w.healthy ? "healthy" : "down",
        w.breaker, w.outstanding, w.load?.running ?? "–", w.load?.waiting ?? "–",
        w.load ? fmt(100 * w.load.kv_usage, " %") : "–", ms(w.ttft_ewma_s), ms(w.itl_ewma_s), w.answered, (w.models || []).join(", ")])],
    ["Canaries", ["Canary", "Phase", "Share", "Stable: requests, errors, TTFT p50", "Canary: requests, errors, TTFT p50"],
      (live.canaries || []).map((c) => [c.name, c.phase, fmt(c.share, " %"), arm(c.stable), arm(c.canary)])],
    ["Experiments", ["Experiment", "Split to b", "Arms", "TTFT verdict"], (live.experiments || []).map((e) =>
      [e.id, fmt(e.split_percent, " %"), (e.arms || []).map((a) => `${a.name}: ${a.requests} (${a.errors} errors)`).join(", "), e.ttft_ms?.verdict ?? "–"])],
    ["Failed attempts by reason", ["Reason", "Count"], Object.entries(live.errors || {})],
    ["SLO actions", ["Action", "Count"], Object.entries(live.slo_actions || {})],
  ]);
}

/** A canary arm in one cell. */
function arm(a) {
  return a ? `${a.group}: ${a.requests}, ${a.errors}, ${fmt(a.ttft_ms?.p50, " ms")}` : "–";
}

function cards(items) {
  $("cards").replaceChildren(...items.map(([name, value]) => {
    const c = el("div", "card");
    c.append(el("div", "value", value), el("div", "name", name));
    return c;
  }));
}

const chartCanvases = new Map();
const colours = ["--c1", "--c2", "--c3", "--c4"];

function charts(specs) {
  const box = $("charts");
  box.dataset.samples = samples.length;
  const titles = specs.map(([t]) => t);
  if ([...chartCanvases.keys()].join("|") !== titles.join("|")) {
    chartCanvases.clear();
    box.replaceChildren(...specs.map(([title]) => {
      const fig = el("figure");
      const canvas = el("canvas");
      canvas.setAttribute("role", "img");
      const cap = el("figcaption");
      fig.append(cap, canvas);
      chartCanvases.set(title, { canvas, cap });
      return fig;
    }));
  }
  for (const [title, lines] of specs) {
    const { canvas, cap } = chartCanvases.get(title);
    const style = getComputedStyle(document.documentElement);
    const drawn = lines.map(([name, points], i) => ({ name, points, colour: style.getPropertyValue(colours[i % colours.length]).trim() }));
    cap.replaceChildren(el("strong", "", title), ...drawn.map((l) => {
      const k = el("span", "key", `${l.name} ${fmt(last(l.points))}`);
      k.style.setProperty("--swatch", l.colour);
      return k;
    }));
    canvas.setAttribute("aria-label", title + ": " + drawn.map((l) => `${l.name} ${fmt(last(l.points))}`).join(", "));
    draw(canvas, drawn, style);
  }
}

function draw(canvas, lines, style) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (!w || !h) return;
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  const g = canvas.getContext("2d");
  g.scale(dpr, dpr);
  // The span grows with the history, from 10 s up to HISTORY_SECONDS.
  const end = live.time_ms;
  const start = Math.min(end - 10_000, Math.max(end - HISTORY_SECONDS * 1000, samples[0].time_ms));
  const values = lines.flatMap((l) => l.points.map((p) => p[1])).filter((v) => v != null);
  const top = niceCeil(Math.max(1, ...values));
  const left = 44, bottom = h - 16;
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = style.getPropertyValue("--muted");
  g.strokeStyle = style.getPropertyValue("--line");
  g.lineWidth = 1;
  for (const f of [0, 0.5, 1]) {
    const y = bottom - f * (bottom - 6);
    g.beginPath(); g.moveTo(left, y); g.lineTo(w, y); g.stroke();
    g.fillText(fmt(top * f), 2, y + 4);
  }
  g.fillText(`-${Math.round((end - start) / 1000)}s`, left, h - 2);
  g.fillText("now", w - 24, h - 2);
  const x = (t) => left + (w - left) * (t - start) / (end - start);
  const y = (v) => bottom - (bottom - 6) * v / top;
  g.lineWidth = 2;
  for (const l of lines) {
    g.strokeStyle = l.colour;
    g.beginPath();
    let pen = false;
    for (const [t, v] of l.points) {
      if (v == null || t < start) { pen = false; continue; }
      if (pen) g.lineTo(x(t), y(v)); else g.moveTo(x(t), y(v));
      pen = true;
    }
    g.stroke();
  }
}

function niceCeil(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * p).find((c) => c >= v);
}

function tables(specs) {
  $("tables").replaceChildren(...specs.filter(([, , rows]) => rows.length).map(([title, head, rows]) => {
    const wrap = el("div", "table-wrap");
    const t = el("table");
    t.append(el("caption", "", title));
    const tr = el("tr");
    tr.append(...head.map((h) => { const th = el("th", "", h); th.scope = "col"; return th; }));
    t.append(el("thead")); t.tHead.append(tr);
    const body = el("tbody");
    body.append(...rows.map((r) => { const row = el("tr"); row.append(...r.map((c) => el("td", "", String(c ?? "–")))); return row; }));
    t.append(body);
    wrap.append(t);
    return wrap;
  }));
}

// ---------------------------------------------------------------- start

$("key-button").addEventListener("click", askKey);
document.addEventListener("visibilitychange", () => { if (!document.hidden) poll(); });
window.addEventListener("resize", () => { if (live && !$("view-dash").hidden) renderDashboard(); });

(async () => {
  try {
    const l = await fetch("/ui/live", { headers: headers(false) });
    if (l.ok) $("kind").textContent = (await l.json()).kind === "router" ? "router" : "";
  } catch { /* shown by the first real request */ }
  const dashboard = location.hash === "#dashboard";
  showTab(dashboard ? "tab-dash" : "tab-chat");
  if (dashboard) refreshModels(); // the chat tab lists them as it opens
})();
