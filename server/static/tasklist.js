// The task list in the sidebar: tasks by project, a schedule's firings grouped under its name, the
// filters, and which tasks wait for an approval.

import { hashFor, navigate } from "./address.js";
import { $, badge } from "./dom.js";
import { refreshFleetSoon } from "./fleet.js";
import { key, shownStatus, state } from "./state.js";
import { setTaskStatus } from "./taskview.js";

// The operations awaiting approval (approvals.js reads them): the tasks they belong to show it.
export function showAwaiting(rows) {
  const awaiting = new Map();
  for (const row of rows) {
    const label = key(row);
    if (!awaiting.has(label)) awaiting.set(label, []);
    awaiting.get(label).push(row);
  }
  const before = JSON.stringify([...state.awaiting]);
  state.awaiting = awaiting;
  if (JSON.stringify([...awaiting]) === before) return;
  renderTasks();
  refreshFleetSoon();
  if (state.task) {
    const row = state.tasks.get(state.task);
    setTaskStatus(state.detail ? state.detail.status : row ? row.status : "");
  }
}

export function renderTasks() {
  const nav = $("#tasks");
  nav.replaceChildren();
  if (state.tasks.size === 0) {
    nav.innerHTML = '<p class="empty">No tasks yet.</p>';
    return;
  }
  const words = $("#task-filter").value.trim().toLowerCase().split(/\s+/).filter(Boolean);
  const status = $("#status-filter").value;
  const shown = [...state.tasks.values()].filter((row) =>
    (!status || shownStatus(row) === status) && words.every((w) => key(row).toLowerCase().includes(w)));
  if (shown.length === 0) {
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = `No task matches (of ${state.tasks.size}).`;
    nav.append(p);
    return;
  }
  if (sortOrder() === "recent") {
    // One list across projects, the latest activity first: what runs now, then by when each
    // task's latest run ended (or started); a task that never ran last.
    for (const row of shown.sort(byActivity)) nav.append(taskLink(row, "", true));
    return;
  }
  const byProject = new Map();
  for (const row of shown) {
    if (!byProject.has(row.project_id)) byProject.set(row.project_id, []);
    byProject.get(row.project_id).push(row);
  }
  for (const [project, rows] of [...byProject].sort()) {
    const h = document.createElement("h3");
    h.textContent = project;
    const used = projectUsage(rows);
    if (used) {
      const sum = document.createElement("span");
      sum.className = "usage";
      sum.textContent = used;
      h.append(" ", sum);
    }
    nav.append(h);
    let rest = rows;
    for (const schedule of state.schedules.filter((s) => s.project === project)) {
      const matches = scheduleMatcher(schedule);
      if (!matches) continue;
      const fired = rest.filter((row) => matches.test(row.task_id));
      if (!fired.length) continue;
      rest = rest.filter((row) => !matches.test(row.task_id));
      nav.append(scheduleGroup(schedule.name, fired));
    }
    for (const row of rest.sort((a, b) => a.task_id.localeCompare(b.task_id))) nav.append(taskLink(row));
  }
}

// The list's order, chosen beside the status filter and remembered in this browser.
const SORT_KEY = "run-agent.task-sort";

function sortOrder() {
  return $("#task-sort").value === "recent" ? "recent" : "name";
}

function activity(row) {
  if (row.status === "running") return Number.MAX_SAFE_INTEGER;
  const run = row.latest_run;
  const when = run ? Date.parse(run.end_time || run.start_time || "") : NaN;
  return Number.isNaN(when) ? -1 : when;
}

function byActivity(a, b) {
  const running = a.status === "running" && b.status === "running";
  const ta = running ? Date.parse(a.latest_run?.start_time || "") || 0 : activity(a);
  const tb = running ? Date.parse(b.latest_run?.start_time || "") || 0 : activity(b);
  return tb - ta || key(a).localeCompare(key(b));
}

function taskLink(row, prefix = "", named = false) {
  const a = document.createElement("a");
  a.href = `#${key(row)}`;
  a.dataset.task = key(row);
  if (state.task === key(row)) a.classList.add("selected");
  const name = document.createElement("span");
  const shown = prefix && row.task_id.startsWith(prefix) ? row.task_id.slice(prefix.length) : row.task_id;
  name.textContent = `${named ? key(row) : shown} (${row.runs})`;
  name.title = row.task_id;
  const status = badge(shownStatus(row));
  if (row.queue) status.title = row.queue.waits_for; // queued or blocked: what it waits for
  a.append(name, status);
  if (row.status === "queued" && row.queue && !row.queue.unreadable) {
    const ahead = document.createElement("span");
    ahead.className = "ahead";
    ahead.textContent = ` ${row.queue.ahead} ahead`;
    a.append(ahead);
  }
  return a;
}

// A schedule's tasks under its name: the latest few, then "N more" (and the one shown, if older).
const GROUP_SHOWN = 3;
const expandedGroups = new Set();

function scheduleGroup(name, rows) {
  const group = document.createElement("div");
  group.className = "group";
  group.dataset.schedule = name;
  const title = document.createElement("div");
  title.className = "group-title";
  title.textContent = `schedule ${name} · ${rows.length} ${rows.length === 1 ? "task" : "tasks"}`;
  group.append(title);
  const newest = rows.sort((a, b) => b.task_id.localeCompare(a.task_id));
  const open = expandedGroups.has(name);
  const hidden = open ? [] : newest.slice(GROUP_SHOWN);
  for (const row of newest) if (!hidden.includes(row) || state.task === key(row)) group.append(taskLink(row, `${name}-`));
  const more = hidden.filter((row) => state.task !== key(row)).length;
  if (more || open && rows.length > GROUP_SHOWN) {
    const toggle = document.createElement("button");
    toggle.type = "button";
    toggle.className = "more";
    toggle.textContent = open ? "show fewer" : `${more} more`;
    toggle.addEventListener("click", () => {
      if (open) expandedGroups.delete(name);
      else expandedGroups.add(name);
      renderTasks();
    });
    group.append(toggle);
  }
  return group;
}

// The task ids a schedule's firings get: its template with each placeholder as what it stands
// for; null when every firing is the same task (nothing to group).
function scheduleMatcher(schedule) {
  if (!/\{(date|time|datetime)\}/.test(schedule.task)) return null;
  const escape = (text) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const stands = { "{name}": escape(schedule.name), "{date}": "\\d{8}", "{time}": "\\d{6}", "{datetime}": "\\d{8}-\\d{6}" };
  const pattern = schedule.task.split(/(\{name\}|\{date\}|\{time\}|\{datetime\})/)
    .map((piece) => stands[piece] ?? escape(piece)).join("");
  return new RegExp(`^${pattern}(-\\d+)?$`);
}

// What a project's tasks used, from their rows (each task's runs summed as they ended).
function projectUsage(rows) {
  let tokensIn = 0, tokensOut = 0, cost = null, any = false;
  for (const row of rows) {
    const u = row.usage;
    if (!u) continue;
    any = true;
    tokensIn += u.tokens_in;
    tokensOut += u.tokens_out;
    if (u.cost_usd !== null && u.cost_usd !== undefined) cost = (cost || 0) + u.cost_usd;
  }
  if (!any) return "";
  return `${tokensIn + tokensOut} tokens` + (cost !== null ? ` · $${cost.toFixed(4)}` : "");
}

$("#tasks").addEventListener("click", (e) => {
  const a = e.target.closest("a[data-task]");
  if (!a) return;
  e.preventDefault();
  navigate(hashFor(a.dataset.task));
});
$("#task-filter").addEventListener("input", renderTasks);
$("#status-filter").addEventListener("change", renderTasks);
try {
  $("#task-sort").value = localStorage.getItem(SORT_KEY) === "recent" ? "recent" : "name";
} catch {
  // storage refused (a private window's setting): the order is not remembered
}
$("#task-sort").addEventListener("change", () => {
  try {
    localStorage.setItem(SORT_KEY, sortOrder());
  } catch {
    // as above
  }
  renderTasks();
});
