// delivery-ledger dashboard: the Send budgets panel (/api/budgets) and its Release button
// (POST /api/budgets/{agent}/release, the same signed event as 'ledger budgets release').
// Uses app.js's helpers (api, post, el, table, fmt); every value goes in as text.
"use strict";

let releasing = null;

function resetText(iso) { return iso.slice(0, 19).replace("T", " ") + " UTC"; }

async function drawBudgets() {
  const data = await api("/api/budgets");
  const held = data.budgets.reduce((n, b) => n + b.held, 0);
  document.getElementById("budgets-title").textContent =
    `Send budgets (${fmt(data.budgets.length)})` + (held ? ` · held over budget: ${fmt(held)}` : "");
  document.getElementById("table-budgets").replaceChildren(table(data.budgets, [
    { title: "agent", cls: "budget-agent", key: "agent" },
    { title: "channel", cls: "budget-channel", render: (b) => b.channel || "every channel" },
    { title: "limit", cls: "budget-limit", render: (b) => `${fmt(b.limit)} per ${b.window}` },
    { title: "used this window", cls: "budget-used",
      render: (b) => el("span", { class: b.used >= b.allowed ? "budget-full" : "",
        "data-used": String(b.used), "data-allowed": String(b.allowed),
        text: `${fmt(b.used)} of ${fmt(b.allowed)}` }) },
    { title: "resets at", cls: "budget-resets mono",
      render: (b) => el("time", { datetime: b.resets_at, text: resetText(b.resets_at) }) },
    { title: "held over budget", cls: "budget-held", render: (b) => el("span", {
      class: b.held ? "budget-held-some" : "", "data-held": String(b.held), text: fmt(b.held) }) },
    { title: "act", render: (b) => releaseButton(b) },
  ], "no agent has a send budget (ledger budgets set)"));
}

function releaseButton(b) {
  if (!b.held) return "–";
  const button = el("button", { type: "button", class: "act act-release", "data-agent": b.agent,
    text: `Release ${fmt(b.held)}` });
  button.addEventListener("click", () => openRelease(b));
  return button;
}

function openRelease(b) {
  releasing = { agent: b.agent, channel: b.channel };
  document.getElementById("release-agent").textContent = b.agent;
  document.getElementById("release-where").textContent =
    `${b.channel || "every channel"} · ${fmt(b.used)} of ${fmt(b.allowed)} used · ${fmt(b.held)} held`;
  document.getElementById("release-count").value = String(b.held);
  document.getElementById("release-operator").value = localStorage.getItem("ledger-operator") || "";
  document.getElementById("release-reason").value = "";
  releaseError("");
  document.getElementById("release-dialog").showModal();
  const name = document.getElementById("release-operator");
  (name.value ? document.getElementById("release-reason") : name).focus();
}

function releaseError(message) {
  const node = document.getElementById("release-error");
  node.textContent = message;
  node.classList.toggle("hidden", !message);
}

async function submitRelease(event) {
  event.preventDefault();
  if (!releasing) return;
  const operator = document.getElementById("release-operator").value.trim();
  const reason = document.getElementById("release-reason").value.trim();
  const count = Number(document.getElementById("release-count").value);
  if (!Number.isInteger(count) || count < 1) { releaseError("count: how many may go, 1 or more"); return; }
  if (!operator) { releaseError("type your name: it goes into the event"); return; }
  if (!reason) { releaseError("a reason is required, for the record"); return; }
  localStorage.setItem("ledger-operator", operator);
  const data = { count, operator, reason };
  if (releasing.channel) data.channel = releasing.channel;
  const submit = document.getElementById("release-submit");
  submit.disabled = true;
  try {
    const answer = await post("/api/budgets/" + encodeURIComponent(releasing.agent) + "/release", data);
    document.getElementById("release-dialog").close();
    const notice = document.getElementById("act-notice");
    notice.textContent = `release of ${fmt(answer.count)} of ${answer.agent}'s held deliveries ` +
      `appended as event ${answer.event_id} by ${answer.operator}`;
    notice.dataset.eventId = answer.event_id;
    notice.classList.remove("hidden");
    releasing = null;
  } catch (e) {
    releaseError(e.message);
  } finally {
    submit.disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("release-form").addEventListener("submit", submitRelease);
  document.getElementById("release-cancel").addEventListener("click", () => {
    releasing = null;
    document.getElementById("release-dialog").close();
  });
});
