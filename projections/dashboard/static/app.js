// delivery-ledger dashboard: renders /api/overview and /api/runs/{id} into the page and
// refreshes them in place (fetch, no reload). Charts are SVG drawn here: no CDN, no library.
// Every value from the API goes in through textContent/attributes, never as HTML.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const STATUS_COLORS = {
  PENDING: "#6b8fd6", SENT: "#9b7fd1", UNKNOWN: "#e0a030", CONFIRMED: "#3fa36b", FAILED: "#d9534f",
};
const PALETTE = ["#3fa36b", "#d9534f", "#e0a030", "#6b8fd6", "#9b7fd1", "#4fb3bf", "#c06c9f",
  "#8c8c3f", "#7f7f7f", "#b5651d"];
let refreshTimer = null;

// The bearer token (when the server needs one) comes once in the URL fragment: #token=...
(function keepToken() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    sessionStorage.setItem("ledger-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
})();

async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem("ledger-token");
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch(path, { headers, cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// A state-changing request: JSON, the token in a header (never a cookie), same origin.
async function post(path, data) {
  const headers = { "Content-Type": "application/json" };
  const token = sessionStorage.getItem("ledger-token");
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch(path, { method: "POST", headers, body: JSON.stringify(data),
    cache: "no-store", credentials: "omit" });
  let body = {};
  try { body = await response.json(); } catch (e) { body = { error: response.statusText }; }
  if (!response.ok) {
    throw new Error((body.error || response.statusText) + (body.hint ? " — " + body.hint : ""));
  }
  return body;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text != null) node.textContent = text;
  return node;
}

function fmt(n) { return Number(n).toLocaleString("en-US"); }

function runLink(runId, key) {
  const href = "/runs/" + encodeURIComponent(runId) + (key ? "?key=" + encodeURIComponent(key) : "");
  return el("a", { href, class: "run-link", text: runId });
}

function showError(message) {
  const node = document.getElementById("error");
  node.textContent = message || "";
  node.classList.toggle("hidden", !message);
}

function stamp(text) {
  const node = document.getElementById("updated");
  node.textContent = text;
  node.dataset.at = String(Date.now());
}

// ---- charts ---------------------------------------------------------------------------

// A vertical bar chart: columns [{label, parts: [{name, value, color}]}], stacked parts.
function stackedColumns(columns, opts) {
  const width = 560, height = opts.height || 200, left = 44, bottom = 34, top = 10;
  const max = Math.max(1, ...columns.map((c) => c.parts.reduce((s, p) => s + p.value, 0)));
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
    "aria-label": opts.label });
  const plotH = height - bottom - top, slot = (width - left - 8) / Math.max(1, columns.length);
  for (const frac of [0, 0.5, 1]) {
    const y = top + plotH * (1 - frac);
    chart.append(svg("line", { x1: left, x2: width - 4, y1: y, y2: y, class: "grid-line" }));
    chart.append(svg("text", { x: left - 6, y: y + 4, "text-anchor": "end", class: "axis" },
      fmt(Math.round(max * frac))));
  }
  columns.forEach((col, i) => {
    let y = top + plotH;
    const x = left + i * slot + slot * 0.15, w = Math.max(1, slot * 0.7);
    for (const part of col.parts) {
      if (!part.value) continue;
      const h = (part.value / max) * plotH;
      y -= h;
      const rect = svg("rect", { x, y, width: w, height: Math.max(h, 0.5), fill: part.color });
      rect.append(svg("title", {}, `${col.label} ${part.name}: ${fmt(part.value)}`));
      chart.append(rect);
    }
    if (opts.every ? i % opts.every === 0 : true) {
      chart.append(svg("text", { x: x + w / 2, y: height - bottom + 14, "text-anchor": "middle",
        class: "axis" }, col.label));
    }
  });
  return chart;
}

function legend(items) {
  return el("div", { class: "legend" }, ...items.map((it) => {
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = it.color;
    return el("span", { class: "legend-item" }, swatch, it.name);
  }));
}

function drawAttempts(rows) {
  const classes = [...new Set(rows.map((r) => r.error_class || "none"))].sort((a, b) =>
    a === "none" ? -1 : b === "none" ? 1 : a.localeCompare(b));
  const color = (c) => (c === "none" ? PALETTE[0] : PALETTE[1 + (classes.indexOf(c) - 1) % 9]);
  const channels = [...new Set(rows.map((r) => r.channel))];
  const target = document.getElementById("chart-attempts");
  if (!rows.length) { target.replaceChildren(el("p", { class: "empty", text: "no attempts yet" })); return; }
  // Horizontal stacked bars: one per channel, one segment per error class.
  const width = 560, rowH = 26, left = 80;
  const totals = channels.map((ch) => rows.filter((r) => r.channel === ch)
    .reduce((s, r) => s + r.attempts, 0));
  const max = Math.max(1, ...totals);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${channels.length * rowH + 8}`,
    class: "chart", role: "img", "aria-label": "attempts by channel and error class" });
  channels.forEach((ch, i) => {
    const y = 4 + i * rowH;
    chart.append(svg("text", { x: left - 8, y: y + 15, "text-anchor": "end", class: "axis" }, ch));
    let x = left;
    for (const cls of classes) {
      const row = rows.find((r) => r.channel === ch && (r.error_class || "none") === cls);
      if (!row) continue;
      const w = (row.attempts / max) * (width - left - 70);
      const rect = svg("rect", { x, y, width: Math.max(w, 1), height: rowH - 8, fill: color(cls) });
      rect.append(svg("title", {}, `${ch} ${cls}: ${fmt(row.attempts)}`));
      chart.append(rect);
      x += w;
    }
    chart.append(svg("text", { x: x + 6, y: y + 15, class: "axis" }, fmt(totals[i])));
  });
  target.replaceChildren(chart, legend(classes.map((c) => ({ name: c, color: color(c) }))));
}

function drawLatency(latency) {
  const target = document.getElementById("chart-latency");
  const columns = latency.labels.map((label, i) => ({
    label, parts: [{ name: "deliveries", value: latency.counts[i], color: "#3fa36b" }],
  }));
  const mean = latency.count ? (latency.sum_seconds / latency.count).toFixed(2) + " s mean" : "none yet";
  target.replaceChildren(stackedColumns(columns, { label: "delivery latency distribution" }),
    el("p", { class: "note", text: `${fmt(latency.count)} confirmed, ${mean}` }));
}

function drawHours(rows) {
  const statuses = Object.keys(STATUS_COLORS);
  const columns = rows.map((r) => ({
    label: r.hour.slice(11, 13) + "h",
    parts: statuses.map((s) => ({ name: s, value: r[s], color: STATUS_COLORS[s] })),
  }));
  document.getElementById("chart-hours").replaceChildren(
    stackedColumns(columns, { label: "deliveries by state over time", every: 3 }),
    legend(statuses.map((s) => ({ name: s, color: STATUS_COLORS[s] }))));
}

function drawStatusBar(byStatus) {
  const total = Object.values(byStatus).reduce((a, b) => a + b, 0);
  const bar = el("div", { class: "status-bar" });
  const labels = el("div", { class: "status-labels" });
  for (const [status, n] of Object.entries(byStatus)) {
    if (n) {
      const seg = el("span", { class: "segment", title: `${status}: ${n}` });
      seg.style.background = STATUS_COLORS[status];
      seg.style.flexGrow = String(n);
      bar.append(seg);
    }
    const dot = el("span", { class: "swatch" });
    dot.style.background = STATUS_COLORS[status];
    labels.append(el("span", { class: "status-label", "data-status": status }, dot,
      `${status} `, el("b", { text: fmt(n) })));
  }
  document.getElementById("status-bar").replaceChildren(
    el("p", { class: "note", text: `${fmt(total)} deliveries` }), bar, labels);
}

// ---- tables ---------------------------------------------------------------------------

function table(rows, columns, emptyText) {
  if (!rows.length) return el("p", { class: "empty", text: emptyText });
  const head = el("tr", {}, ...columns.map((c) => el("th", { text: c.title })));
  const body = rows.map((r) => el("tr", {}, ...columns.map((c) => {
    const cell = c.render ? c.render(r) : (r[c.key] == null ? "–" : String(r[c.key]));
    return el("td", { class: c.cls || "" }, cell);
  })));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...body));
}

const keyCell = { title: "idempotency key", cls: "mono",
  render: (r) => el("span", { title: r.idempotency_key, text: r.idempotency_key.slice(0, 16) + "…" }) };
const runCell = { title: "run", render: (r) => runLink(r.run_id, r.idempotency_key) };

// ---- operator actions -----------------------------------------------------------------

// The buttons for one delivery: Resolve where an operator may settle it, Redrive where it
// may be sent again. Whether the fold takes the action is the server's to say (409).
function actButtons(d, which) {
  const seen = { status: d.status, fencing_token: d.fencing_token };
  const box = el("span", { class: "act-box" });
  for (const what of which) {
    const b = el("button", { type: "button", class: "act act-" + what, "data-key": d.idempotency_key,
      text: what === "resolve" ? "Resolve" : "Redrive" });
    b.addEventListener("click", () => openAction(what, d, seen));
    box.append(b);
  }
  return box;
}

let acting = null;

function openAction(what, d, seen) {
  acting = { what, key: d.idempotency_key, seen };
  const dialog = document.getElementById("act-dialog");
  document.getElementById("act-title").textContent =
    what === "resolve" ? "Resolve this delivery" : "Redrive this delivery";
  document.getElementById("act-key").textContent = d.idempotency_key;
  document.getElementById("act-where").textContent = `${d.channel} ${d.recipient} · ${seen.status}`;
  document.getElementById("act-outcomes").classList.toggle("hidden", what !== "resolve");
  document.getElementById("act-submit").textContent = what === "resolve" ? "Resolve" : "Redrive";
  document.getElementById("act-operator").value = localStorage.getItem("ledger-operator") || "";
  document.getElementById("act-reason").value = "";
  document.getElementById("act-receiver-id").value = "";
  document.getElementById("act-delivered").checked = true;
  actError("");
  dialog.showModal();
  const name = document.getElementById("act-operator");
  (name.value ? document.getElementById("act-reason") : name).focus();
}

function actError(message) {
  const node = document.getElementById("act-error");
  node.textContent = message;
  node.classList.toggle("hidden", !message);
}

async function submitAction(event) {
  event.preventDefault();
  if (!acting) return;
  const operator = document.getElementById("act-operator").value.trim();
  const reason = document.getElementById("act-reason").value.trim();
  if (!operator) { actError("type your name: it goes into the event"); return; }
  if (!reason) { actError("a reason is required, for the record"); return; }
  localStorage.setItem("ledger-operator", operator);
  const data = { operator, reason, seen: acting.seen };
  if (acting.what === "resolve") {
    data.outcome = document.querySelector('#act-outcomes input[name="outcome"]:checked').value;
    const receiverId = document.getElementById("act-receiver-id").value.trim();
    if (data.outcome === "delivered" && receiverId) data.receiver_id = receiverId;
  }
  const submit = document.getElementById("act-submit");
  submit.disabled = true;
  try {
    const path = "/api/deliveries/" + encodeURIComponent(acting.key) + "/" + acting.what;
    const answer = await post(path, data);
    document.getElementById("act-dialog").close();
    const notice = document.getElementById("act-notice");
    notice.textContent = `${acting.what} of ${acting.key.slice(0, 16)}… appended as event ` +
      `${answer.event_id} by ${answer.operator}; the run's timeline shows it once projected`;
    notice.dataset.eventId = answer.event_id;
    notice.classList.remove("hidden");
    acting = null;
  } catch (e) {
    actError(e.message);
  } finally {
    submit.disabled = false;
  }
}

function drawTables(data) {
  const total = (name) => data.counters.find((c) => c.name === name).value;
  document.getElementById("unknown-title").textContent =
    `Unknown deliveries awaiting reconciliation (${fmt(total("unknown"))})`;
  document.getElementById("failed-title").textContent =
    `Failed deliveries (${fmt(data.deliveries_by_status.FAILED || 0)})`;
  document.getElementById("overdue-title").textContent =
    `Pending deliveries past their SLO (${fmt(total("overdue_pending"))})`;
  document.getElementById("overdue-sent-title").textContent =
    `Sent deliveries past their SLO, not confirmed (${fmt(total("overdue_sent"))})`;
  document.getElementById("table-unknown").replaceChildren(table(data.unknown, [
    runCell, { title: "channel", key: "channel" }, { title: "recipient", key: "recipient", cls: "mono" },
    keyCell, { title: "attempts", key: "attempts" }, { title: "error class", key: "last_error_class" },
    { title: "unknown since", key: "unknown_since", cls: "mono" },
    { title: "act", render: (r) => actButtons({ ...r, status: "UNKNOWN" }, ["resolve", "redrive"]) },
  ], "no unknown deliveries"));
  document.getElementById("table-failed").replaceChildren(table(data.failed, [
    runCell, { title: "channel", key: "channel" }, { title: "recipient", key: "recipient", cls: "mono" },
    keyCell, { title: "attempts", key: "attempts" }, { title: "error class", key: "last_error_class" },
    { title: "redrives", key: "redrives" }, { title: "failed at", key: "failed_at", cls: "mono" },
    { title: "act", render: (r) => actButtons({ ...r, status: "FAILED" }, ["redrive"]) },
  ], "no failed deliveries"));
  document.getElementById("table-overdue").replaceChildren(table(data.overdue_pending, [
    runCell, { title: "channel", key: "channel" }, { title: "recipient", key: "recipient", cls: "mono" },
    keyCell, { title: "attempts", key: "attempts" }, { title: "SLO deadline", key: "slo_deadline", cls: "mono" },
  ], "no pending delivery is past its SLO"));
  document.getElementById("table-overdue-sent").replaceChildren(table(data.overdue_sent, [
    runCell, { title: "channel", key: "channel" }, { title: "recipient", key: "recipient", cls: "mono" },
    keyCell, { title: "provider message id", key: "provider_message_id", cls: "mono" },
    { title: "lookup", key: "reconciliation" },
    { title: "SLO deadline", key: "slo_deadline", cls: "mono" },
  ], "no sent delivery is past its SLO"));
}

function drawCounters(counters) {
  const box = document.getElementById("counters");
  box.replaceChildren(...counters.map((c) => el("div", {
    class: "counter " + c.level, id: "counter-" + c.name, "data-level": c.level,
  }, el("div", { class: "value", text: fmt(c.value) }), el("div", { class: "title", text: c.title }),
  el("div", { class: "threshold", text: `red at ${fmt(c.threshold)}` }))));
}

function age(seconds) {
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

// Pending now, late or not, beside the past-SLO counters: a burst shows before it is late.
function drawBacklog(backlog) {
  const oldest = backlog.pending_now
    ? el("div", { class: "value", id: "backlog-oldest", "data-seconds": String(backlog.oldest_age_seconds),
      title: `requested at ${backlog.oldest_requested_at}`, text: age(backlog.oldest_age_seconds) })
    : el("div", { class: "value", id: "backlog-oldest", "data-seconds": "0", text: "–" });
  const channels = backlog.by_channel.map((c) => el("li", { "data-channel": c.channel },
    el("b", { text: fmt(c.pending) }), ` ${c.channel}, oldest ${age(c.oldest_age_seconds)}`));
  document.getElementById("backlog").replaceChildren(
    el("div", { class: "backlog-item" },
      el("div", { class: "value", id: "backlog-pending", text: fmt(backlog.pending_now) }),
      el("div", { class: "title", text: "pending now (within SLO or past it)" })),
    el("div", { class: "backlog-item" }, oldest,
      el("div", { class: "title", text: "age of the oldest pending delivery" })),
    el("div", { class: "backlog-item" },
      channels.length ? el("ul", { id: "backlog-channels" }, ...channels)
        : el("p", { class: "empty", text: "nothing pending" }),
      el("div", { class: "title", text: "pending by channel" })));
}

// Beside the counters: what operators settled and redrove, and how long the oldest
// UNKNOWN has waited for one.
function drawOperators(ops) {
  const oldest = ops.unknown_now
    ? el("div", { class: "value", id: "operators-oldest-unknown",
      "data-seconds": String(ops.oldest_unknown_age_seconds),
      title: `unknown since ${ops.oldest_unknown_since}`, text: age(ops.oldest_unknown_age_seconds) })
    : el("div", { class: "value", id: "operators-oldest-unknown", "data-seconds": "0", text: "–" });
  const list = (id, counts) => el("ul", { id }, ...Object.entries(counts).map(([name, n]) =>
    el("li", { "data-name": name }, el("b", { text: fmt(n) }), ` ${name.replace("_", " ")}`)));
  document.getElementById("operators").replaceChildren(
    el("div", { class: "backlog-item" }, oldest,
      el("div", { class: "title", text: "age of the oldest unknown delivery" })),
    el("div", { class: "backlog-item" }, list("operators-redrives", ops.redrives),
      el("div", { class: "title", text: "redrives by result" })),
    el("div", { class: "backlog-item" }, list("operators-settled", ops.settled),
      el("div", { class: "title", text: "settled by an operator, by outcome" })));
}

// The endpoint registry (ledger endpoints): each endpoint's state, who stopped it and why.
async function drawEndpoints() {
  const data = await api("/api/endpoints");
  const waiting = Object.entries(data.waiting).map(([why, n]) => `${fmt(n)} ${why}`).join(", ");
  document.getElementById("endpoints-title").textContent =
    `Endpoints (${fmt(data.endpoints.length)})` + (waiting ? ` · waiting: ${waiting}` : "");
  document.getElementById("table-endpoints").replaceChildren(table(data.endpoints, [
    { title: "id", key: "endpoint_id", cls: "mono" },
    { title: "channel", key: "channel" },
    { title: "address", key: "address", cls: "mono" },
    { title: "state", key: "state", render: (r) => el("span", { class: `endpoint-${r.state}`, text: r.state }) },
    { title: "circuit", key: "circuit", render: (r) => el("span", { class: `circuit-${r.circuit}`, text: r.circuit.replace("_", "-"), title: r.circuit_since ? `since ${r.circuit_since}` : "" }) },
    { title: "by", key: "stopped_by" },
    { title: "why", key: "stopped_reason" },
    { title: "since", key: "stopped_at" },
    { title: "secrets", key: "secrets" },
  ], "no endpoints registered (ledger endpoints add)"));
}

// Endpoint health (/api/health): per endpoint how its attempts end, how long deliveries
// take (requested → confirmed), its state and breaker, and what waits for it; per agent,
// what is held over budget.
function ratioText(r) { return r == null ? "–" : (r * 100).toFixed(1) + "%"; }
function secondsText(s) { return s == null ? "–" : (s < 10 ? s.toFixed(2) : s.toFixed(0)) + " s"; }

async function drawHealth() {
  const data = await api("/api/health");
  const named = data.endpoints.filter((e) => e.endpoint !== "(other)").length;
  document.getElementById("health-title").textContent =
    `Endpoint health (${fmt(named)} of ${fmt(data.endpoints_total)}, busiest first)`;
  document.getElementById("table-health").replaceChildren(table(data.endpoints, [
    { title: "endpoint", cls: "mono", render: (r) => el("span", { class: "health-endpoint", text: r.endpoint }) },
    { title: "channel", key: "channel" },
    { title: "state", render: (r) => el("span", { class: `endpoint-${r.state}`, text: r.state }) },
    { title: "breaker", render: (r) => el("span", { class: `breaker breaker-${r.breaker}`, text: r.breaker }) },
    { title: "success 1h", cls: "health-ratio-1h", render: (r) => ratioText(r.success["1h"]) + ` (${fmt(r.attempts["1h"])})` },
    { title: "success all", cls: "health-ratio", render: (r) => ratioText(r.success.all) + ` (${fmt(r.attempts.all)})` },
    { title: "p50", cls: "health-p50", render: (r) => secondsText(r.latency.all.p50) },
    { title: "p99", cls: "health-p99", render: (r) => secondsText(r.latency.all.p99) },
    { title: "pending", cls: "health-pending", render: (r) => fmt(r.pending) },
    { title: "waiting", cls: "health-waiting", render: (r) => Object.entries(r.waiting)
      .map(([why, n]) => `${fmt(n)} ${why}`).join(", ") || "–" },
  ], "no endpoint has had traffic yet"));
  const agents = document.getElementById("table-agents");
  if (data.agents == null) { agents.replaceChildren(); return; }
  agents.replaceChildren(el("h3", { text: "Send budgets by agent" }), table(data.agents, [
    { title: "agent", key: "agent" },
    { title: "requested (1h)", key: "requested_1h" },
    { title: "held over budget", key: "held", cls: "agent-held" },
  ], "no agent has sent in the last hour"));
}

async function refreshOverview() {
  try {
    const data = await api("/api/overview");
    drawBacklog(data.backlog);
    drawCounters(data.counters);
    drawOperators(data.operators);
    drawStatusBar(data.deliveries_by_status);
    drawAttempts(data.attempts_by_channel);
    drawLatency(data.latency);
    drawHours(data.by_hour);
    drawTables(data);
    await drawEndpoints();
    await drawBudgets();
    await drawHealth();
    showError("");
    stamp(`as of ${data.now.slice(0, 19).replace("T", " ")} UTC`);
    schedule(refreshOverview, data.refresh_seconds);
  } catch (e) {
    showError("could not load the overview: " + e.message);
    schedule(refreshOverview, 5);
  }
}

// ---- run page -------------------------------------------------------------------------

// Which buttons a delivery of the run page gets, by its state.
const ACTIONS = { UNKNOWN: ["resolve", "redrive"], FAILED: ["redrive"], SENT: ["resolve"] };

function answer(question, ...body) {
  return el("div", { class: "answer" }, el("h3", { text: question }), ...body);
}

// A run may have tens of thousands of deliveries: the API gives a page at a time.
function drawPager(runId, highlight, page) {
  const box = document.getElementById("run-pager");
  if (page.total <= page.limit && page.offset === 0) {
    box.replaceChildren();
    return;
  }
  const first = page.total ? page.offset + 1 : 0;
  const last = page.next_offset === null ? page.total : page.next_offset;
  const go = (offset) => () => refreshRun(runId, highlight, offset);
  const button = (label, offset, id) => {
    const b = el("button", { type: "button", id, text: label });
    if (offset === null) b.disabled = true; else b.addEventListener("click", go(offset));
    return b;
  };
  box.replaceChildren(
    button("previous", page.previous_offset, "run-previous"),
    el("span", { id: "run-range", text: ` deliveries ${fmt(first)}–${fmt(last)} of ${fmt(page.total)} ` }),
    button("next", page.next_offset, "run-next"));
}

async function refreshRun(runId, highlight, offset) {
  try {
    const where = offset === undefined && highlight
      ? "?key=" + encodeURIComponent(highlight) : "?offset=" + (offset || 0);
    const data = await api("/api/runs/" + encodeURIComponent(runId) + where);
    offset = data.page.offset;
    drawPager(runId, highlight, data.page);
    document.getElementById("run-title").textContent = "run " + runId;
    const finished = data.run && ["SUCCEEDED", "FAILED"].includes(data.run.status);
    const left = data.answers.deliveries;
    document.getElementById("answers").replaceChildren(
      answer("Did execution finish?", el("p", { id: "answer-execution",
        class: finished ? "yes" : "no", text: data.answers.execution_finished })),
      answer("Did delivery leave?", left.length
        ? el("ul", { id: "answer-left" }, ...left.map((d) => el("li", {},
          el("b", { text: `${d.channel} ${d.recipient}: ` }),
          el("span", { class: "status-" + d.status, text: `${d.status}, left: ${d.left_system} ` }),
          ACTIONS[d.status] ? actButtons(d, ACTIONS[d.status]) : null)))
        : el("p", { id: "answer-left", text: "no deliveries were requested" })),
      answer("Which key identifies it at the receiver?", el("ul", { id: "answer-keys" },
        ...left.map((d) => el("li", { class: d.idempotency_key === highlight ? "highlight" : "" },
          el("code", { class: "key", text: d.idempotency_key }),
          el("span", { class: "note", text: ` ${d.channel} ${d.recipient} · provider message id ${d.provider_message_id || "none"}` }))))),
    );
    document.getElementById("timeline").replaceChildren(...data.timeline.map((t) => el("li",
      t.operator ? { class: "operator-action " + t.result, "data-operator": t.operator } : {},
      el("time", { text: t.at.replace("T", " ").slice(0, 23) }),
      el("span", { class: "subject", text: t.subject }),
      el("span", { class: "what", text: t.what }))));
    showError("");
    stamp("updated " + new Date().toLocaleTimeString());
    schedule(() => refreshRun(runId, highlight, offset), 5);
  } catch (e) {
    showError(e.message);
    schedule(() => refreshRun(runId, highlight, offset), 5);
  }
}

// ---- search and start -----------------------------------------------------------------

async function runSearch(q) {
  const box = document.getElementById("search-results");
  const data = await api("/api/search?q=" + encodeURIComponent(q));
  const items = data.matches.map((m) => el("li", {},
    runLink(m.run_id, m.idempotency_key),
    m.kind === "delivery"
      ? el("span", { class: "note" }, " delivery ", el("code", { class: "key", text: m.idempotency_key }),
        ` ${m.channel} ${m.recipient} ${m.status}`)
      : el("span", { class: "note", text: ` run ${m.status || ""}` })));
  box.replaceChildren(el("h2", { text: `${items.length} match(es) for “${q}”` }),
    items.length ? el("ul", { id: "search-list" }, ...items) : el("p", { class: "empty", text: "nothing found" }));
  box.classList.remove("hidden");
}

function schedule(fn, seconds) {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(fn, Math.max(0.2, seconds) * 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("act-form").addEventListener("submit", submitAction);
  document.getElementById("act-cancel").addEventListener("click", () => {
    acting = null;
    document.getElementById("act-dialog").close();
  });
  document.getElementById("search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const q = document.getElementById("search").value.trim();
    if (q) runSearch(q).catch((e) => showError("search failed: " + e.message));
  });
  const match = location.pathname.match(/^\/runs\/(.+)$/);
  if (match) {
    document.getElementById("run").classList.remove("hidden");
    const key = new URLSearchParams(location.search).get("key");
    refreshRun(decodeURIComponent(match[1]), key);
  } else {
    document.getElementById("overview").classList.remove("hidden");
    refreshOverview();
  }
});
