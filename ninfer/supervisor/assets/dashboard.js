// ninfer supervisor dashboard: polls the JSON API (/api/...) and draws with plain canvas; no outside resources.
"use strict";
const $ = (id) => document.getElementById(id);
const GIB = 1 << 30;
let adminKey = sessionStorage.getItem("ninfer-admin-key") || "";
let lastStatus = null;
let samples = [];

async function api(path, opts = {}) {
  const headers = Object.assign({ "content-type": "application/json" }, opts.headers || {});
  if (adminKey) headers["authorization"] = "Bearer " + adminKey;
  const r = await fetch(path, Object.assign({}, opts, { headers }));
  if (r.status === 401) { $("keybox").classList.remove("hidden"); throw new Error("admin key needed"); }
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error((body.error && body.error.message) || ("HTTP " + r.status));
  return body;
}

function say(text, kind) { const m = $("msg"); m.textContent = text; m.className = "msg " + (kind || ""); }
const fmt = (v, d = 0) => (v === null || v === undefined) ? "—" : Number(v).toFixed(d);
const gib = (b) => (b / GIB).toFixed(2);
const esc = (s) => String(s === null || s === undefined ? "—" : s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
const clock = (t) => t ? new Date(t * 1000).toLocaleTimeString() : "—";

// ---- charts ----------------------------------------------------------------------------------------------
function frame(cv) {
  if (cv.clientWidth && cv.width !== cv.clientWidth) cv.width = cv.clientWidth;  // follow the layout
  const g = cv.getContext("2d");
  g.clearRect(0, 0, cv.width, cv.height);
  g.font = "10px sans-serif";
  return g;
}
function axes(g, cv, ymax, label) {
  g.strokeStyle = "#ddd"; g.fillStyle = "#777";
  for (let i = 0; i <= 4; i++) {
    const y = 8 + (cv.height - 24) * (1 - i / 4);
    g.beginPath(); g.moveTo(34, y); g.lineTo(cv.width - 4, y); g.stroke();
    g.fillText((ymax * i / 4).toFixed(ymax < 4 ? 2 : 0), 2, y + 3);
  }
  if (label) g.fillText(label, cv.width - 90, cv.height - 3);
}
// series: [{values: [[x, y], ...], color, dots}]; x in seconds
function lineChart(cv, series, ymax) {
  const g = frame(cv);
  const xs = series.flatMap((s) => s.values.map((p) => p[0]));
  if (!xs.length) { g.fillStyle = "#999"; g.fillText("no data yet", cv.width / 2 - 25, cv.height / 2); return; }
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const ys = series.flatMap((s) => s.values.map((p) => p[1]));
  const top = ymax || Math.max(1e-9, ...ys) * 1.1;
  axes(g, cv, top, Math.round(x1 - x0) + " s");
  const X = (x) => 36 + (cv.width - 42) * (x - x0) / (x1 - x0);
  const Y = (y) => 8 + (cv.height - 24) * (1 - Math.min(y, top) / top);
  for (const s of series) {
    g.strokeStyle = g.fillStyle = s.color; g.lineWidth = 1.5;
    if (s.dots) { for (const [x, y] of s.values) { g.beginPath(); g.arc(X(x), Y(y), 2.5, 0, 7); g.fill(); } continue; }
    g.beginPath();
    s.values.forEach(([x, y], i) => (i ? g.lineTo(X(x), Y(y)) : g.moveTo(X(x), Y(y))));
    g.stroke();
  }
}
// stacked bars: rows [{a, b}] drawn bottom a (color ca), top b (color cb)
function barChart(cv, rows, ca, cb) {
  const g = frame(cv);
  if (!rows.length) { g.fillStyle = "#999"; g.fillText("no requests yet", cv.width / 2 - 35, cv.height / 2); return; }
  const top = Math.max(1, ...rows.map((r) => r.a + r.b)) * 1.1;
  axes(g, cv, top, "tokens");
  const w = (cv.width - 42) / rows.length;
  rows.forEach((r, i) => {
    const x = 36 + i * w, h = cv.height - 24;
    const ha = h * r.a / top, hb = h * r.b / top;
    g.fillStyle = ca; g.fillRect(x + 1, 8 + h - ha, Math.max(1, w - 2), ha);
    g.fillStyle = cb; g.fillRect(x + 1, 8 + h - ha - hb, Math.max(1, w - 2), hb);
  });
}
// one horizontal bar of parts [{bytes, color, label}] out of total, with a marker at reserve (from the right)
function memoryBar(cv, total, parts, reserve) {
  const g = frame(cv);
  if (!total) { g.fillStyle = "#999"; g.fillText("no GPU", 4, 20); return; }
  const W = cv.width - 8, X = (b) => 4 + W * b / total;
  g.fillStyle = "#eee"; g.fillRect(4, 6, W, 24);
  let at = 0;
  for (const p of parts) { g.fillStyle = p.color; g.fillRect(X(at), 6, Math.max(0, X(at + p.bytes) - X(at)), 24); at += p.bytes; }
  if (reserve) {
    const x = X(total - reserve);
    g.fillStyle = "rgba(192,57,43,.18)"; g.fillRect(x, 4, 4 + W - x, 28);
    g.strokeStyle = "#c0392b"; g.lineWidth = 2; g.beginPath(); g.moveTo(x, 2); g.lineTo(x, 34); g.stroke();
    g.fillStyle = "#c0392b"; g.fillText("reserve " + gib(reserve) + " GiB", Math.min(x + 3, cv.width - 90), 44);
  }
}

// ---- panels ----------------------------------------------------------------------------------------------
const PLAN_COLORS = { weights: "#34495e", kv_pool: "#2f7ed8", gdn_lanes: "#17a589", checkpoints: "#8e44ad", workspace: "#f39c12", graph_pools: "#e4572e" };

function renderStatus(s) {
  lastStatus = s;
  const e = s.engine;
  const badge = $("engine-state");
  badge.textContent = e.state; badge.className = "badge " + e.state;
  $("engine-model").textContent = e.model_id || "—";
  $("engine-preset").textContent = e.preset || e.active_preset || "—";
  const sel = $("preset-select");
  const names = s.presets.map((p) => p.name).join("\n");
  if (sel.dataset.names !== names) {
    sel.innerHTML = s.presets.map((p) => `<option value="${esc(p.name)}" title="${esc(p.description)}">${esc(p.name)}</option>`).join("");
    sel.dataset.names = names;
    sel.value = s.active;
  }
  const rows = [
    ["state", e.state + (e.next_restart_in_s !== null ? ` (restart in ${fmt(e.next_restart_in_s, 1)} s)` : "")],
    ["health", e.health], ["engine URL", e.url], ["pid", e.pid], ["active preset", e.active_preset],
    ["up since", clock(e.ready_at)], ["crashes", e.crash_count], ["restarts", e.restart_count],
    ["last exit code", e.last_exit_code], ["last error", e.last_error || "none"],
  ];
  if (e.restart_to_apply) rows.push(["configuration", "saved changes apply at the next restart"]);
  $("engine-table").innerHTML = rows.map(([k, v]) => `<tr><td>${k}</td><td id="engine-${k.replace(/ /g, "-")}">${esc(v)}</td></tr>`).join("");
  const gpu = s.gpu, mem = s.memory;
  const plan = mem.plan || {};
  if (!gpu.available) {
    $("gpu-line").textContent = "GPU: absent (" + gpu.detail + ")" + (mem.reserve_gib ? `; reserve ${mem.reserve_gib} GiB applies on a GPU` : "");
    memoryBar($("gpu-bar"), 0, [], 0);
  } else {
    const kept = mem.reserve_kept === false ? " — less free than the reserve!" : "";
    $("gpu-line").textContent = `${gpu.name}: ${gib(gpu.used_bytes)} GiB used, ${gib(gpu.free_bytes)} free of ${gib(gpu.total_bytes)} GiB; reserve ${mem.reserve_gib} GiB${kept}`;
    const parts = Object.keys(PLAN_COLORS).filter((k) => plan[k]).map((k) => ({ bytes: plan[k], color: PLAN_COLORS[k] }));
    const planned = parts.reduce((a, p) => a + p.bytes, 0);
    parts.push({ bytes: Math.max(0, gpu.used_bytes - planned), color: "#bbb" });
    memoryBar($("gpu-bar"), gpu.total_bytes, parts, mem.reserve_bytes);
  }
  const legend = Object.keys(PLAN_COLORS).filter((k) => plan[k]).map((k) => `<i style="background:${PLAN_COLORS[k]}"></i>${k} ${gib(plan[k])}`);
  $("plan-legend").innerHTML = legend.length ? "engine memory plan (GiB): " + legend.join(" ") + (gpu.available ? ' <i style="background:#bbb"></i>other' : "")
    : "engine memory plan: none (" + (e.state === "running" ? "the reference backend plans no device memory" : "engine not running") + ")";
}

function renderRequests(r) {
  $("requests").tBodies[0].innerHTML = r.requests.map((q) => `<tr data-key="${esc(q.key)}">
    <td>${clock(q.time)}</td><td>${esc(q.client)}</td><td>${esc(q.model)}</td><td class="${q.status}">${q.status}</td>
    <td>${fmt(q.prompt_tokens)}</td><td>${fmt(q.cached_tokens)}</td><td>${fmt(q.completion_tokens)}</td>
    <td>${fmt(q.ttft_s, 3)}</td><td>${fmt(q.tok_s, 1)}</td><td>${esc(q.finish_reason)}</td></tr>`).join("");
  $("clients").tBodies[0].innerHTML = r.clients.map((c) => `<tr><td>${esc(c.client)}</td><td>${c.requests}</td>
    <td>${c.running}</td><td>${c.errors}</td><td>${c.prompt_tokens}</td><td>${c.cached_tokens}</td>
    <td>${c.completion_tokens}</td><td>${clock(c.last_seen)}</td></tr>`).join("");
  const done = r.requests.filter((q) => q.status === "done").slice(0, 40).reverse();
  barChart($("reuse-bars"), done.map((q) => ({ a: q.cached_tokens || 0, b: Math.max(0, (q.prompt_tokens || 0) - (q.cached_tokens || 0)) })), "#17a589", "#c8d6e5");
  const fin = r.requests.filter((q) => q.end);
  lineChart($("latency-chart"), [
    { values: fin.filter((q) => q.ttft_s !== null).map((q) => [q.end, q.ttft_s]), color: "#2f7ed8", dots: true },
    { values: fin.filter((q) => q.total_s !== null).map((q) => [q.end, q.total_s]), color: "#e4572e", dots: true },
  ]);
  const p = done.reduce((a, q) => a + (q.prompt_tokens || 0), 0), c = done.reduce((a, q) => a + (q.cached_tokens || 0), 0);
  const last = samples[samples.length - 1] || {};
  $("reuse-line").textContent = `last ${done.length} requests: ${c} of ${p} prompt tokens cached (${p ? (100 * c / p).toFixed(0) : 0}%)` +
    (last.checkpoints !== undefined ? `; checkpoints ${last.checkpoints} (${gib(last.checkpoint_bytes || 0)} of ${gib(last.checkpoint_budget_bytes || 0)} GiB)` : "") +
    (last.evicted_nodes !== undefined ? `; evicted: ${last.evicted_nodes} prefix nodes, ${last.evicted_checkpoints} checkpoints` : "");
}

function renderSamples() {
  const s = samples;
  lineChart($("queue-chart"), [
    { values: s.filter((x) => x.lanes_total !== undefined).map((x) => [x.t, x.lanes_total]), color: "#999" },
    { values: s.filter((x) => x.lanes_busy !== undefined).map((x) => [x.t, x.lanes_busy]), color: "#2f7ed8" },
    { values: s.filter((x) => x.queue !== undefined).map((x) => [x.t, x.queue]), color: "#e4572e" },
  ]);
  lineChart($("gpu-chart"), [{ values: s.filter((x) => x.gpu_used !== undefined).map((x) => [x.t, x.gpu_used / GIB]), color: "#34495e" }]);
  const share = [];
  for (let i = 1; i < s.length; i++) {  // cached share of the prompt tokens that arrived between two samples
    const dp = (s[i].prompt_tokens || 0) - (s[i - 1].prompt_tokens || 0), dc = (s[i].cached_tokens || 0) - (s[i - 1].cached_tokens || 0);
    if (dp > 0 && dc >= 0) share.push([s[i].t, dc / dp]);
  }
  lineChart($("reuse-chart"), [
    { values: share, color: "#17a589", dots: true },
    { values: s.filter((x) => x.checkpoint_budget_bytes).map((x) => [x.t, x.checkpoint_bytes / x.checkpoint_budget_bytes]), color: "#8e44ad" },
  ], 1);
}

// ---- actions -----------------------------------------------------------------------------------------------
async function act(fn, okText) {
  try { const r = await fn(); say(okText(r), "ok"); } catch (err) { say(err.message, "error"); }
  tick();
}
for (const b of document.querySelectorAll("button[data-op]")) {
  b.onclick = () => act(() => api("/api/engine/" + b.dataset.op, { method: "POST" }), () => b.dataset.op + " requested");
}
$("switch-btn").onclick = () => act(() => api("/api/switch", { method: "POST", body: JSON.stringify({ preset: $("preset-select").value }) }),
  (r) => `switching to ${r.preflight.preset} (${r.preflight.model_id}; artifact checked: ${r.preflight.verified}; ${r.preflight.memory})`);
async function loadConfig() {
  try { $("config-text").value = JSON.stringify(await api("/api/config"), null, 2); $("config-msg").textContent = ""; }
  catch (err) { $("config-msg").textContent = err.message; }
}
async function saveConfig(restart) {
  let data;
  try { data = JSON.parse($("config-text").value); } catch (err) { $("config-msg").textContent = "not JSON: " + err.message; return; }
  try {
    const r = await api("/api/config", { method: "PUT", body: JSON.stringify(data) });
    $("config-msg").textContent = "saved" + (r.backup ? " (previous kept as " + r.backup + ")" : "");
    if (restart) await api("/api/engine/restart", { method: "POST" });
    $("config-text").value = JSON.stringify(r.config, null, 2);
  } catch (err) { $("config-msg").textContent = err.message; }
}
$("config-reload").onclick = loadConfig;
$("config-save").onclick = () => saveConfig(false);
$("config-save-restart").onclick = () => saveConfig(true);
$("key-btn").onclick = () => { adminKey = $("key-input").value.trim(); sessionStorage.setItem("ninfer-admin-key", adminKey); $("keybox").classList.add("hidden"); loadConfig(); tick(); };

// ---- polling -----------------------------------------------------------------------------------------------
let ticks = 0;
async function tick() {
  try {
    renderStatus(await api("/api/status"));
    const since = samples.length ? samples[samples.length - 1].t : 0;
    samples = samples.concat((await api("/api/metrics?since=" + since)).samples).slice(-600);
    renderSamples();
    renderRequests(await api("/api/requests?limit=200"));
    if (ticks++ % 5 === 0) $("engine-log").textContent = (await api("/api/engine/log?lines=40")).lines.join("\n");
    document.body.dataset.updated = String(Date.now());
  } catch (err) { if (!String(err.message).includes("admin key")) say("dashboard: " + err.message, "error"); }
}
loadConfig();
tick();
setInterval(tick, 1000);
