// The page's first view: the fleet at a glance (GET /api/fleet). How many tasks run, wait for a
// slot, wait for other tasks or wait for a person; the tasks that need a person, each with its
// action; the queue in the order it starts (and, after it, any task whose queue record cannot be
// read, saying why); the agents paused by their provider's limit, each with a button that lifts
// the pause; whether the whole queue is held, with the buttons that hold or release it and stop
// every loop; which task waits for which (`--after`); today's spend against each daily budget. It is read
// again whenever a task's row changes (the root event stream), so it stays live.

import { hashFor, navigate, taskUrl } from "./address.js";
import { $, badge } from "./dom.js";
import { countText } from "./format.js";
import { describe, rulesOf } from "./lines.js";
import { turns } from "./turns.js";

const COUNTS = [["running", "running"], ["queued", "queued"], ["blocked", "blocked"],
  ["unreadable", "unreadable"], ["needs_person", "need a person"]];
const ACTIONS = { approval: "approve or deny", reply: "paste the reply", over_budget: "resume with", stuck: "resume",
  blocked: "open" };

let shown = false;
let timer = null;
const reads = turns();

export function showFleet(visible) {
  shown = visible;
  $("#fleet").hidden = !visible;
  if (visible) loadFleet();
}

// Many rows change at once when a fleet moves: one read for them all.
export function refreshFleetSoon() {
  if (!shown || timer) return;
  timer = setTimeout(() => {
    timer = null;
    loadFleet();
  }, 250);
}

export async function loadFleet() {
  const mine = reads.take();
  const response = await fetch("/api/fleet");
  const found = await response.json();
  // A read answered after a later one was shown, or the reader went elsewhere: not shown. (One
  // answered while a later one is under way is shown: the page opening on a busy sidebar shows
  // the fleet as soon as its first read is in, not after the read its task list asked for.)
  if (!shown || !reads.show(mine)) return;
  if (!response.ok) {
    $("#fleet-error").textContent = found.error;
    return;
  }
  $("#fleet-error").textContent = "";
  renderCounts(found);
  renderRunning(found.running || []);
  renderNeeds(found.needs);
  renderPaused(found.paused || []);
  renderRaces(found.races || []);
  renderHold(found.hold || null);
  renderQueue(found.queue, found.limits);
  renderAfter(found.after || []);
  renderSpent(found.day, found.spent);
}

function renderCounts(found) {
  const list = $("#fleet-counts");
  list.replaceChildren();
  for (const [name, words] of COUNTS) {
    if (name === "unreadable" && !found.counts[name]) continue; // shown only when there is one
    const li = document.createElement("li");
    li.dataset.count = name;
    const n = document.createElement("strong");
    n.textContent = String(found.counts[name]);
    li.append(n, ` ${words}`);
    if (name === "queued" && found.limits.max_running != null) li.append(` (max_running ${found.limits.max_running})`);
    list.append(li);
  }
}

// The loops running, longest first: agent, attempt, how long, and the last line of its stdout
// that reads as something (by its backend's rules, as the log reads it).
function renderRunning(running) {
  const list = $("#fleet-running");
  list.replaceChildren();
  $("#fleet-running-box").hidden = running.length === 0;
  for (const loop of running) {
    const li = document.createElement("li");
    li.dataset.task = `${loop.project_id}/${loop.task_id}`;
    const what = document.createElement("span");
    what.className = "meta";
    const since = loop.seconds == null ? "" : ` · ${spanWords(loop.seconds)}`;
    what.textContent = `${loop.agent ?? ""} · attempt ${loop.attempt ?? "?"}${since}`;
    const last = document.createElement("span");
    last.className = "last-line";
    li.append(taskAnchor(loop.project_id, loop.task_id), " ", what, " ", last);
    list.append(li);
    lastLine(loop).then((text) => { last.textContent = text; });
  }
}

async function lastLine(loop) {
  const rules = loop.backend ? await rulesOf(loop.backend) : null;
  for (const line of [...loop.last_lines].reverse()) {
    let text = line;
    if (rules) {
      try {
        const parts = describe(JSON.parse(line), rules);
        if (parts) text = parts.map(([, t]) => t).join(" ");
      } catch { /* not JSON: as written */ }
    }
    text = text.replace(/\s+/g, " ").trim();
    if (text) return text.length > 160 ? `${text.slice(0, 159)}…` : text;
  }
  return "";
}

// "45s", "12m 3s", "3h 20m", "2d 4h" (as runagent/duration.py words it).
function spanWords(seconds) {
  const whole = Math.floor(seconds);
  const [d, h, m, s] = [Math.floor(whole / 86400), Math.floor(whole % 86400 / 3600),
    Math.floor(whole % 3600 / 60), whole % 60];
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

function taskAnchor(projectId, taskId) {
  const a = document.createElement("a");
  const label = `${projectId}/${taskId}`;
  a.href = hashFor(label);
  a.textContent = label;
  a.dataset.task = label;
  return a;
}

function renderNeeds(needs) {
  const list = $("#fleet-needs");
  list.replaceChildren();
  $("#fleet-needs-box").hidden = needs.length === 0;
  for (const need of needs) {
    const li = document.createElement("li");
    li.dataset.task = `${need.project_id}/${need.task_id}`;
    li.dataset.waitsFor = need.waits_for;
    const what = document.createElement("span");
    what.className = `badge ${need.waits_for}`;
    what.textContent = need.waits_for;
    const message = document.createElement("span");
    message.className = "message";
    message.textContent = need.message;
    const answer = document.createElement("code");
    answer.textContent = need.answer;
    answer.title = "the command that answers it";
    li.append(taskAnchor(need.project_id, need.task_id), " ", what, " ", message, " ", action(need), " ", answer);
    list.append(li);
  }
}

// What the page can do about a need: resume a stuck task, resume one stopped by its budget with
// a larger one (one a daily budget stopped: say what lifts it, no button that cannot work); an approval or a reply is given in the task's own view; a task blocked by one it
// runs after opens that one, which is resumed first.
function action(need) {
  const label = `${need.project_id}/${need.task_id}`;
  if (need.waits_for === "approval" || need.waits_for === "reply" || need.waits_for === "blocked") {
    const target = need.waits_for === "blocked" && need.on ? need.on : label;
    const open = document.createElement("button");
    open.type = "button";
    open.textContent = need.waits_for === "blocked" ? `${ACTIONS.blocked} ${target}` : ACTIONS[need.waits_for];
    open.addEventListener("click", () => navigate(hashFor(target)));
    return open;
  }
  const form = document.createElement("form");
  form.className = "need-action";
  form.dataset.needs = "operate";
  let budget = null;
  if (need.waits_for === "over_budget" && !need.answer.includes("--budget")) {
    // A daily budget stopped it: no larger task budget can lift it, only config.yaml or tomorrow.
    const said = document.createElement("span");
    said.textContent = need.answer;
    return said;
  }
  if (need.waits_for === "over_budget") {
    budget = document.createElement("input");
    budget.name = "budget";
    budget.required = true;
    budget.placeholder = "e.g. 1usd, 400k-tokens";
    budget.setAttribute("aria-label", `a larger budget for ${label}`);
  }
  const go = document.createElement("button");
  go.type = "submit";
  go.textContent = ACTIONS[need.waits_for];
  const error = document.createElement("span");
  error.className = "error";
  form.append(go, ...(budget ? [" ", budget] : []), " ", error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = budget ? { budget: budget.value } : {};
    const response = await fetch(`${taskUrl(label)}/resume`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    if (!response.ok) {
      error.textContent = (await response.json()).error;
      return;
    }
    error.textContent = "";
    refreshFleetSoon();
  });
  return form;
}

// The agents a provider's limit paused across the fleet ("claude paused until 17:00 UTC: ..."),
// each with a button that lifts the pause (POST /api/fleet/unpause).
function renderPaused(paused) {
  const list = $("#fleet-paused");
  list.replaceChildren();
  $("#fleet-paused-box").hidden = paused.length === 0;
  for (const pause of paused) {
    const li = document.createElement("li");
    li.dataset.agent = pause.agent;
    const words = document.createElement("span");
    words.className = "message";
    words.textContent = pause.words;
    const lift = document.createElement("button");
    lift.dataset.needs = "operate";
    lift.type = "button";
    lift.textContent = "unpause";
    const error = document.createElement("span");
    error.className = "error";
    lift.addEventListener("click", async () => {
      const response = await fetch("/api/fleet/unpause", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ agent: pause.agent }),
      });
      if (!response.ok) {
        error.textContent = (await response.json()).error;
        return;
      }
      loadFleet();
    });
    li.append(words, " ", lift, " ", error);
    list.append(li);
  }
}

// The races running, each with its racers side by side: the racer (a link), its agent, status,
// attempt and last check.
function renderRaces(races) {
  const list = $("#fleet-races");
  list.replaceChildren();
  $("#fleet-races-box").hidden = races.length === 0;
  for (const row of races) {
    const li = document.createElement("li");
    li.dataset.task = `${row.project_id}/${row.task_id}`;
    const racers = document.createElement("ul");
    racers.className = "racers";
    for (const racer of row.race.racers) {
      const item = document.createElement("li");
      item.dataset.racer = racer.task_id;
      const check = racer.last_check == null ? "" : ` · check ${racer.last_check}`;
      const attempt = racer.attempt == null ? "" : ` · attempt ${racer.attempt}`;
      item.append(taskAnchor(row.project_id, racer.task_id), ` ${racer.agent || ""} `,
        badge(racer.won ? "won" : racer.status), `${attempt}${check}`);
      racers.append(item);
    }
    li.append(taskAnchor(row.project_id, row.task_id), " ", badge(row.status), racers);
    list.append(li);
  }
}

// Whether the whole queue is held (by a person, not an agent's pause), and the button that holds
// or releases it (POST /api/fleet/hold, /api/fleet/release).
let held = false;

function renderHold(hold) {
  held = hold !== null;
  $("#fleet-hold").classList.toggle("held", held);
  $("#fleet-hold-state").textContent = held ? hold.words : "the queue runs: queued tasks start as their turns come";
  $("#fleet-hold-button").textContent = held ? "Release the queue" : "Hold the queue";
}

async function post(path, body = {}) {
  const response = await fetch(path, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  const answer = await response.json();
  $("#fleet-hold-error").textContent = response.ok ? "" : answer.error;
  return response.ok ? answer : null;
}

$("#fleet-hold-button").addEventListener("click", async () => {
  if (await post(held ? "/api/fleet/release" : "/api/fleet/hold")) loadFleet();
});

// Every loop stopped and the queue emptied at once (POST /api/stop-all), the queue held meanwhile
// so that no slot one frees starts the next; what the token reaches only.
$("#fleet-stop-all").addEventListener("click", async () => {
  if (!confirm("Stop every running task and take every queued one out of the queue?")) return;
  const said = $("#fleet-stop-all-said");
  said.textContent = "stopping…";
  const done = await post("/api/stop-all");
  if (!done) {
    said.textContent = "";
    return;
  }
  const parts = [];
  if (done.stopped.length) parts.push(`stopped ${done.stopped.length} running: ${done.stopped.join(", ")}`);
  if (done.left_queue.length) parts.push(`took ${done.left_queue.length} out of the queue, never started: ${done.left_queue.join(", ")}`);
  said.textContent = parts.join(" · ") || "nothing runs or waits";
  loadFleet();
});

// Which task waits for which (`--after`): each waiting task, under it the tasks it waits for
// with where each stands now, each a link.
function renderAfter(rows) {
  const list = $("#fleet-after");
  list.replaceChildren();
  $("#fleet-after-box").hidden = rows.length === 0;
  for (const row of rows) {
    const li = document.createElement("li");
    li.dataset.task = `${row.project_id}/${row.task_id}`;
    const on = document.createElement("ul");
    on.setAttribute("aria-label", "waits for");
    for (const other of row.on) {
      const item = document.createElement("li");
      item.dataset.on = other.task;
      const [project, task] = other.task.split("/");
      item.append(taskAnchor(project, task), " ", badge(other.status));
      on.append(item);
    }
    li.append(taskAnchor(row.project_id, row.task_id), " ", badge(row.status), " waits for", on);
    list.append(li);
  }
}

function renderQueue(rows, limits) {
  const list = $("#fleet-queue");
  list.replaceChildren();
  $("#fleet-queue-empty").hidden = rows.length > 0;
  for (const row of rows) {
    const li = document.createElement("li");
    li.dataset.task = `${row.project_id}/${row.task_id}`;
    const waits = document.createElement("span");
    waits.className = "waits";
    waits.textContent = row.queue.waits_for + (row.queue.priority ? ` · priority ${row.queue.priority}` : "");
    li.append(taskAnchor(row.project_id, row.task_id), " ", badge(row.status), " ", waits);
    list.append(li);
  }
  $("#fleet-limits").textContent = limitsText(limits);
}

// The limits as the server lists them, in its order, naming none itself (LimitsSettings owns
// their names): a cap (`max_running 4`), or caps by name (`projects` {web: 1}: `project web 1`).
function limitsText(limits) {
  const parts = [];
  for (const [name, value] of Object.entries(limits)) {
    if (value === null) continue;
    if (typeof value !== "object") parts.push(`${name} ${value}`);
    else for (const [key, cap] of Object.entries(value)) parts.push(`${name.replace(/s$/, "")} ${key} ${cap}`);
  }
  return parts.length ? `limits: ${parts.join(", ")}` : "no limits: every start runs at once";
}

function renderSpent(day, spent) {
  $("#fleet-day").textContent = day;
  const body = $("#fleet-spent tbody");
  body.replaceChildren();
  for (const row of spent) {
    const tr = document.createElement("tr");
    tr.dataset.what = row.what;
    if (row.spent) tr.className = "spent";
    const used = row.used;
    const cells = [
      row.what,
      countText((used.tokens_in + used.tokens_out)),
      used.cost_usd == null ? "—" : `$${used.cost_usd.toFixed(2)}`,
      row.words ? row.words + (row.spent ? " · spent" : "") : "no budget",
    ];
    for (const text of cells) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.append(td);
    }
    body.append(tr);
  }
}

$("#fleet").addEventListener("click", (e) => {
  const a = e.target.closest("a[data-task]");
  if (!a) return;
  e.preventDefault();
  navigate(hashFor(a.dataset.task));
});
