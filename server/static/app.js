// The run-agent page: task lists and run logs, kept live over server-sent events.
// Every view has an address in the hash: #new, #P/T, #P/T/RUN, #P/T/RUN/TAB; Back and Forward
// move between them, and an address can be shared.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = {
  tasks: new Map(), // "P/T" -> the task's row from /api/events
  task: null, // "P/T" shown
  detail: null, // its /api/projects/P/tasks/T answer
  run: null, // run id shown
  file: "stdout", // tab shown
  followLoop: true, // show each new attempt as it starts (no run named in the address)
  autoTab: true, // the tab was chosen by the page (a failed run opens where it failed)
  agents: null, // /api/agents
  schedules: [], // /api/schedules
  awaiting: new Map(), // "P/T" -> its operations awaiting approval (from approvals.js)
};
const TABS = ["stdout", "stderr", "output", "prompt"];
const FAILED = new Set(["failed", "timed_out", "lost"]);
let eventsSource = null;
let logSource = null;

// Connection state ---------------------------------------------------------------------------

function setConnection(kind, text) {
  const el = $("#connection");
  el.className = `conn conn-${kind}`;
  el.textContent = text;
}

function watchSource(source) {
  source.addEventListener("open", () => setConnection("connected", "live"));
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CLOSED) setConnection("disconnected", "disconnected");
    else setConnection("connecting", "reconnecting…");
  });
}

// Task list ----------------------------------------------------------------------------------

function connectEvents() {
  eventsSource = new EventSource("/api/events");
  watchSource(eventsSource);
  eventsSource.addEventListener("snapshot", (e) => {
    state.tasks = new Map(JSON.parse(e.data).map((row) => [key(row), row]));
    renderTasks();
    if (state.task) refreshTask();
  });
  eventsSource.addEventListener("task", (e) => {
    const row = JSON.parse(e.data);
    const before = state.tasks.get(key(row));
    state.tasks.set(key(row), row);
    renderTasks();
    refreshSchedulesSoon();
    if (state.task === key(row)) onTaskChanged(before, row);
  });
  // A paste run's outbox, inbox or session changed (which changes no row): its panel reads it.
  eventsSource.addEventListener("paste", (e) => {
    if (state.task === key(JSON.parse(e.data))) pastePanel.refresh();
  });
  eventsSource.addEventListener("removed", (e) => {
    state.tasks.delete(key(JSON.parse(e.data)));
    renderTasks();
  });
}

const key = (row) => `${row.project_id}/${row.task_id}`;

function badge(status) {
  const span = document.createElement("span");
  span.className = `badge ${status}`;
  span.textContent = status === AWAITING ? "awaiting approval" : status;
  return span;
}

// A task with an operation awaiting approval shows that, whatever its loop's status: an
// operations run (`run-agent ops`) has no run-info, so its task would read "pending".
const AWAITING = "awaiting_approval";
const shownStatus = (row) => (state.awaiting.has(key(row)) ? AWAITING : row.status);

document.addEventListener("approvals", (e) => {
  const awaiting = new Map();
  for (const row of e.detail) {
    const label = key(row);
    if (!awaiting.has(label)) awaiting.set(label, []);
    awaiting.get(label).push(row);
  }
  const before = JSON.stringify([...state.awaiting]);
  state.awaiting = awaiting;
  if (JSON.stringify([...awaiting]) === before) return;
  renderTasks();
  if (state.task) {
    const row = state.tasks.get(state.task);
    setTaskStatus(state.detail ? state.detail.status : row ? row.status : "");
  }
});

// The task view's status badge, and what its awaited operations are with a link to answer them.
function setTaskStatus(status) {
  const waiting = state.awaiting.get(state.task) || [];
  const shown = waiting.length ? AWAITING : status;
  const el = $("#task-status");
  el.className = `badge ${shown}`;
  el.textContent = shown === AWAITING ? "awaiting approval" : shown;
  const box = $("#task-approvals");
  box.replaceChildren();
  box.hidden = !waiting.length;
  for (const row of waiting) {
    const d = row.details || {};
    const p = document.createElement("p");
    const asked = document.createElement("code");
    asked.textContent = d.command || d.path || row.operationType || row.operationId;
    const answer = document.createElement("a");
    answer.href = `#approval-${row.runId}-${row.operationId}`;
    answer.textContent = "approve or deny";
    answer.addEventListener("click", (event) => {
      event.preventDefault(); // the address stays the task's
      const item = document.getElementById(`approval-${row.runId}-${row.operationId}`);
      if (!item) return;
      item.scrollIntoView({ block: "center" });
      item.querySelector("button.approve").focus();
    });
    p.append(`run ${row.runId} waits for approval of operation ${row.operationId}: `, asked, " — ", answer);
    box.append(p);
  }
}

function renderTasks() {
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

function taskLink(row, prefix = "") {
  const a = document.createElement("a");
  a.href = `#${key(row)}`;
  a.dataset.task = key(row);
  if (state.task === key(row)) a.classList.add("selected");
  const name = document.createElement("span");
  const shown = prefix && row.task_id.startsWith(prefix) ? row.task_id.slice(prefix.length) : row.task_id;
  name.textContent = `${shown} (${row.runs})`;
  name.title = row.task_id;
  a.append(name, badge(shownStatus(row)));
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

// Schedules ----------------------------------------------------------------------------------

let schedulesTimer = null;

function refreshSchedulesSoon() {
  clearTimeout(schedulesTimer);
  schedulesTimer = setTimeout(loadSchedules, 300);
}

async function loadSchedules() {
  const response = await fetch("/api/schedules");
  if (!response.ok) return;
  const rows = await response.json();
  state.schedules = rows;
  renderTasks();
  $("#schedules").hidden = rows.length === 0;
  const list = $("#schedule-list");
  list.replaceChildren();
  for (const row of rows) {
    const li = document.createElement("li");
    li.dataset.schedule = row.name;
    const run = document.createElement("button");
    run.type = "button";
    run.textContent = "run now";
    run.addEventListener("click", () => runSchedule(row.name));
    const name = document.createElement("div");
    name.className = "name";
    name.textContent = row.name + (row.enabled ? "" : " (disabled)");
    const when = document.createElement("div");
    when.className = "muted";
    when.textContent = `${row.cron} ${row.timezone} · next ${row.next[0] || "—"}`;
    const last = document.createElement("div");
    last.className = "last";
    last.textContent = row.last_fired
      ? `last ${row.last_fired} → ${row.last_task}: ${row.last_outcome || "running"}`
      : "not fired yet";
    li.append(run, name, when, last);
    list.append(li);
  }
}

async function runSchedule(name) {
  const response = await fetch(`/api/schedules/${encodeURIComponent(name)}/run`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: "{}",
  });
  const answer = await response.json();
  if (!response.ok) {
    alert(answer.error);
    return;
  }
  await loadSchedules();
  navigate(hashFor(`${answer.project_id}/${answer.task_id}`));
}

// Addresses ----------------------------------------------------------------------------------

function parseHash() {
  const parts = location.hash.slice(1).split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "new" && parts.length === 1) return { view: "new" };
  if (parts.length < 2) return { view: "home" };
  const [project, task, run, tab, line] = parts;
  const number = /^L(\d+)$/.exec(line || "");
  return {
    view: "task", task: `${project}/${task}`, run: run || null, tab: TABS.includes(tab) ? tab : null,
    line: number && tab ? Number(number[1]) : null,
  };
}

function hashFor(task, run = null, tab = null, line = null) {
  const parts = [...task.split("/"), run, tab, line && `L${line}`].filter(Boolean).map(encodeURIComponent);
  return `#${parts.join("/")}`;
}

// A new entry in the history (a click); `replace` for the page's own choices (which run and tab
// a task opens on), so Back goes to what the reader saw before, not through them.
function navigate(hash, replace = false) {
  if (hash === location.hash || (hash === "#" && !location.hash)) return route();
  if (replace) {
    history.replaceState(null, "", hash || location.pathname);
    return route();
  }
  location.hash = hash; // the hashchange event routes
  return undefined;
}

async function route() {
  const where = parseHash();
  document.body.classList.toggle("nav-open", where.view === "home");
  $("#new-task").hidden = where.view !== "new";
  $("#task-view").hidden = where.view !== "task";
  $("#placeholder").hidden = where.view !== "home";
  if (where.view !== "task") {
    closeLog();
    clearSearch();
    state.task = null;
    state.detail = null;
    pastePanel.hide();
    renderTasks();
    if (where.view === "new") {
      loadAgents();
      $("#new-task textarea[name=prompt]").focus();
    }
    return;
  }
  state.followLoop = where.run === null;
  state.autoTab = where.tab === null;
  if (where.run) state.run = where.run;
  if (where.tab) state.file = where.tab;
  state.line = where.line;
  if (state.task !== where.task) {
    state.task = where.task;
    state.detail = null;
    state.run = where.run;
    closeLog();
    clearSearch(); // a search belongs to the log it was typed over, not to the next task's
    $("#run-view").hidden = true;
    renderTasks();
  }
  await refreshTask();
}

// One task -----------------------------------------------------------------------------------

function taskUrl(label) {
  const [project, task] = label.split("/");
  return `/api/projects/${encodeURIComponent(project)}/tasks/${encodeURIComponent(task)}`;
}

async function refreshTask() {
  const label = state.task;
  const response = await fetch(taskUrl(label));
  if (label !== state.task) return; // the reader moved on meanwhile
  if (!response.ok) {
    $("#task-title").textContent = label;
    $("#task-summary").textContent = (await response.json()).error;
    pastePanel.show(label, null);
    return;
  }
  const detail = await response.json();
  state.detail = detail;
  $("#task-title").textContent = label;
  setTaskStatus(detail.status);
  $("#task-prompt").textContent = detail.prompt || "";
  $("#stop-button").disabled = detail.status !== "running";
  $("#delete-button").disabled = detail.status === "running";
  const resume = $("#resume-button");
  resume.disabled = detail.status === "running";
  // A completed task runs again only when asked to, in so many words (the CLI's --again).
  resume.textContent = detail.status === "completed" ? "Run again" : "Resume";
  resume.dataset.again = detail.status === "completed" ? "1" : "";
  renderSummary(detail);
  renderTimeline(detail.runs_list);
  renderRuns(detail.runs_list);
  renderGit(detail.git, detail.status);
  pastePanel.show(label, detail);
  const latest = detail.runs_list.at(-1);
  if (!latest) {
    $("#run-view").hidden = true;
    return;
  }
  const wanted = state.followLoop || !state.run ? latest.run_id : state.run;
  const run = detail.runs_list.find((r) => r.run_id === wanted) || latest;
  await showRun(run);
}

function renderSummary(detail) {
  const parts = [];
  const latest = detail.runs_list.at(-1);
  if (detail.status === "running") {
    parts.push(`running attempt ${latest ? latest.attempt : 1}`);
  } else if (detail.loop_message || latest) {
    parts.push(detail.loop_message || (latest.message ? `last run: ${latest.message}` : `last run ${latest.status}`));
  }
  parts.push(`${detail.runs_list.length} ${detail.runs_list.length === 1 ? "run" : "runs"}`);
  if (detail.usage) parts.push(`all runs: ${usageText(detail.usage)}`);
  if (detail.disk_bytes != null) parts.push(`${bytesText(detail.disk_bytes)} on disk`);
  $("#task-summary").textContent = parts.join(" · ");
}

function usageText(u) {
  const tokens = `${u.tokens_in.toLocaleString("en")} tokens in, ${u.tokens_out.toLocaleString("en")} out`;
  return u.cost_usd == null ? tokens : `${tokens}, $${u.cost_usd.toFixed(4)}`;
}

function bytesText(n) {
  const units = ["bytes", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return i === 0 ? `${n} bytes` : `${n.toFixed(1)} ${units[i]}`;
}

const ms = (iso) => (iso ? Date.parse(iso) : NaN);

function durationText(seconds) {
  if (!Number.isFinite(seconds)) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return h ? `${h} h ${m} min` : `${m} min ${s % 60} s`;
}

function timeText(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString("sv-SE").replace(" ", " ");
}

// The loop as a picture: one bar per run on the task's time axis, coloured by status, as long as
// the run took; the waits between attempts are the dashed gaps.
function renderTimeline(runs) {
  const box = $("#timeline");
  box.replaceChildren();
  box.hidden = runs.length === 0;
  if (!runs.length) return;
  const now = Date.now();
  const spans = runs.map((r) => {
    const start = ms(r.start_time);
    const end = r.end_time ? ms(r.end_time) : r.status === "running" ? now : start;
    return { run: r, start, end: Math.max(end, start) };
  });
  const t0 = spans[0].start;
  const t1 = Math.max(...spans.map((s) => s.end), t0 + 1);
  const pct = (t) => `${(((t - t0) / (t1 - t0)) * 100).toFixed(3)}%`;
  const track = document.createElement("div");
  track.className = "track";
  spans.forEach((s, i) => {
    if (i > 0 && s.start > spans[i - 1].end) {
      const gap = document.createElement("div");
      gap.className = "gap";
      gap.style.left = pct(spans[i - 1].end);
      gap.style.width = pct(t0 + (s.start - spans[i - 1].end));
      gap.title = `waited ${durationText((s.start - spans[i - 1].end) / 1000)} before attempt ${s.run.attempt}`;
      track.append(gap);
    }
    const bar = document.createElement("button");
    bar.type = "button";
    bar.className = `bar ${s.run.status}`;
    bar.dataset.run = s.run.run_id;
    if (s.run.run_id === state.run) bar.classList.add("selected");
    bar.style.left = pct(s.start);
    bar.style.width = pct(t0 + (s.end - s.start));
    bar.textContent = `#${s.run.attempt}`;
    bar.title = `attempt ${s.run.attempt}: ${s.run.status}, ${durationText((s.end - s.start) / 1000)}` +
      (s.run.message ? ` — ${s.run.message}` : "");
    bar.setAttribute("aria-label", bar.title);
    track.append(bar);
  });
  const axis = document.createElement("div");
  axis.className = "axis";
  axis.textContent = `${timeText(runs[0].start_time)} → ${durationText((t1 - t0) / 1000)} in all`;
  box.append(track, axis);
}

// An issue run's git work: the issue and its link, the branch, whether a commit carries the
// ready marker, and the commits since the base (newest first). Commits land without a run
// ending, so a running task's view is refreshed every few seconds while it shows them.
let gitTimer = null;
function renderGit(git, status) {
  const section = $("#task-git");
  section.hidden = !git;
  clearTimeout(gitTimer);
  if (!git) return;
  const issue = $("#git-issue");
  issue.replaceChildren();
  if (git.issue) {
    const number = `issue #${git.issue.number}`;
    if (git.issue.url && /^https?:\/\//.test(git.issue.url)) {
      const a = document.createElement("a");
      a.href = git.issue.url;
      a.rel = "noopener noreferrer";
      a.target = "_blank";
      a.textContent = number;
      issue.append(a);
    } else {
      issue.append(number);
    }
  }
  $("#git-branch").textContent = git.branch || "";
  const marker = $("#git-marker");
  marker.className = `badge ${git.marker_seen ? "completed" : "pending"}`;
  marker.textContent = git.marker_seen ? "ready marker seen" : "no ready marker yet";
  const list = $("#git-commits");
  list.replaceChildren();
  for (const commit of git.commits) {
    const li = document.createElement("li");
    const sha = document.createElement("code");
    sha.textContent = commit.sha.slice(0, 8);
    li.append(sha, ` ${commit.subject}`);
    list.append(li);
  }
  if (status === "running") {
    const shown = state.task;
    gitTimer = setTimeout(() => { if (state.task === shown) refreshTask(); }, 5000);
  }
}

function renderRuns(runs) {
  const list = $("#runs");
  list.replaceChildren();
  for (const run of runs) {
    const li = document.createElement("li");
    if (run.previous_run_id) {
      const chain = document.createElement("span");
      chain.className = "chain";
      chain.textContent = "→";
      li.append(chain);
    }
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.run = run.run_id;
    b.title = `${run.run_id}: ${run.message || run.status}` + (run.host ? ` (on ${run.host})` : "");
    if (run.run_id === state.run) b.classList.add("selected");
    b.append(`#${run.attempt} `, badge(run.status));
    li.append(b);
    list.append(li);
  }
}

function onTaskChanged(before, row) {
  setTaskStatus(row.status);
  const newRun = row.latest_run && (!before || !before.latest_run ||
    before.latest_run.run_id !== row.latest_run.run_id || before.latest_run.status !== row.latest_run.status);
  if (newRun || !before || before.status !== row.status) refreshTask();
}

async function action(name, body = {}) {
  $("#action-error").textContent = "";
  const response = await fetch(`${taskUrl(state.task)}/${name}`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  if (!response.ok) $("#action-error").textContent = (await response.json()).error;
  await refreshTask();
}

async function deleteTask() {
  const label = state.task;
  const size = state.detail ? ` (${bytesText(state.detail.disk_bytes)})` : "";
  if (!confirm(`Delete task ${label} and all its runs${size}? This cannot be undone.`)) return;
  $("#action-error").textContent = "";
  const response = await fetch(taskUrl(label), {
    method: "DELETE", headers: { "Content-Type": "application/json" }, body: "{}",
  });
  if (!response.ok) {
    $("#action-error").textContent = (await response.json()).error;
    return;
  }
  state.tasks.delete(label);
  navigate("#");
}

// One run ------------------------------------------------------------------------------------

// The run shown: its header, and its file in the tab asked for; a failed run opens where it
// failed (stderr if it wrote any, else the stream's error event).
async function showRun(run) {
  const changed = run.run_id !== state.run || $("#run-view").hidden;
  state.run = run.run_id;
  document.querySelectorAll("#runs button, #timeline .bar").forEach((b) =>
    b.classList.toggle("selected", b.dataset.run === run.run_id));
  $("#run-view").hidden = false;
  renderRunHeader(run);
  let tab = state.file;
  // Chosen again when the run is another, or has just ended (a run watched live opens on
  // stdout, and moves to where it failed when it fails).
  const seen = `${run.run_id}/${run.status}`;
  if (state.autoTab && (changed || state.tabFor !== seen)) {
    state.tabFor = seen;
    tab = await failureTab(run);
  }
  if (run.run_id !== state.run) return;
  const hash = hashFor(state.task, state.followLoop ? null : run.run_id, state.autoTab ? null : tab,
    state.autoTab ? null : state.line);
  if (hash !== location.hash) history.replaceState(null, "", hash);
  if (state.opened !== `${run.run_id}/${tab}`) openFile(tab);
  else {
    applyLine();
    showFailure(); // the stream may have ended before the run's end was known here
  }
}

async function failureTab(run) {
  if (!FAILED.has(run.status)) return "stdout";
  const response = await fetch(`${runUrlOf(run.run_id)}/files/stderr?length=0`);
  return Number(response.headers.get("X-File-Size") || 0) > 0 ? "stderr" : "stdout";
}

function renderRunHeader(run) {
  const runs = state.detail ? state.detail.runs_list : [run];
  const index = runs.findIndex((r) => r.run_id === run.run_id);
  const start = ms(run.start_time);
  const end = run.end_time ? ms(run.end_time) : Date.now();
  const rows = [
    ["status", null],
    ["why", run.message || (run.status === "running" ? "still running" : `ended ${run.status}`) +
      (run.reason ? ` (${run.reason.replaceAll("_", " ")})` : "")],
    ["exit code", run.exit_code == null ? "—" : String(run.exit_code)],
    ["attempt", (run.last_attempt ? `${run.attempt} of ${run.last_attempt}` : `${run.attempt}`) +
      ` · run ${index + 1} of ${runs.length}`],
    ["duration", durationText((end - start) / 1000) + (run.end_time ? "" : " so far")],
    ["agent", `${run.agent}${run.agent_version ? ` ${run.agent_version}` : ""} (${run.backend})`],
    ["started", timeText(run.start_time)],
    ["ended", run.end_time ? timeText(run.end_time) : "—"],
    ["folder", run.cwd],
    ["host", run.host || "—"],
  ];
  if (run.parent_run_id) rows.push(["parent run", run.parent_run_id]);
  if (run.previous_run_id) rows.push(["restart of", run.previous_run_id]);
  if (run.tokens_in != null || run.tokens_out != null || run.cost_usd != null) {
    rows.push(["usage", usageText({ tokens_in: run.tokens_in || 0, tokens_out: run.tokens_out || 0, cost_usd: run.cost_usd })]);
  }
  const dl = $("#run-header");
  dl.replaceChildren();
  dl.className = `run-header ${run.status}`;
  for (const [name, value] of rows) {
    const item = document.createElement("div");
    item.dataset.field = name;
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.dataset.field = name;
    if (name === "status") dd.append(badge(run.status), ` ${run.run_id}`);
    else if (name === "restart of" || name === "parent run") {
      const a = document.createElement("a");
      a.textContent = value;
      a.href = name === "restart of" ? hashFor(state.task, value) : "#";
      if (name === "parent run") a.removeAttribute("href");
      dd.append(a);
    } else dd.textContent = value;
    item.append(dt, dd);
    dl.append(item);
  }
}

// One run's files ----------------------------------------------------------------------------

function runUrlOf(runId) {
  return `${taskUrl(state.task)}/runs/${encodeURIComponent(runId)}`;
}

function runUrl() {
  return runUrlOf(state.run);
}

function closeLog() {
  if (logSource) logSource.close();
  logSource = null;
  state.opened = null;
}

async function openFile(name) {
  state.file = name;
  document.querySelectorAll(".tabs button[data-file]").forEach((b) => b.classList.toggle("active", b.dataset.file === name));
  $("#download").href = `${runUrl()}/files/${name}?download=1`;
  closeLog();
  const opened = `${state.run}/${name}`;
  state.opened = opened;
  state.failureShown = null; // a log opened afresh is shown at its failure again
  log.reset();
  log.target = state.line ? state.line - 1 : -1;
  if (name === "prompt") {
    const text = await (await fetch(`${runUrl()}/files/prompt`)).text();
    if (state.opened !== opened) return;
    log.append(text, true);
    log.ended = true;
    log.showTarget();
    return;
  }
  const size = await log.open(`${runUrl()}/files/${name}`);
  if (size === null || state.opened !== opened) return;
  const source = new EventSource(`${runUrl()}/stream/${name}?from=${size}`);
  logSource = source;
  watchSource(source);
  source.addEventListener("data", (e) => log.append(JSON.parse(e.data)));
  source.addEventListener("end", () => {
    log.flush();
    log.draw(true);
    source.close();
    setConnection("connected", "live");
    log.ended = true;
    showFailure();
  });
}

// The line the address names (#P/T/RUN/TAB/L123), once the lines are numbered.
function applyLine() {
  const target = state.line ? state.line - 1 : -1;
  if (target === log.target) return;
  log.target = target;
  log.targetShown = false;
  log.showTarget();
  log.draw(true);
}

// On a failed run's stream, the first error event is where the failure is: scroll to it.
function showFailure() {
  if (!state.autoTab || state.file !== "stdout" || !log.ended || state.failureShown === state.run) return;
  const run = state.detail && state.detail.runs_list.find((r) => r.run_id === state.run);
  if (!run || !FAILED.has(run.status)) return;
  const at = log.findFailure();
  if (at < 0) return;
  state.failureShown = state.run;
  log.failure = at;
  log.scrollTo(at);
  log.draw(true);
}

const ANSI = /\x1b\[([0-9;]*)m|\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07/g;

function ansiToNodes(text) {
  const nodes = [];
  let classes = [];
  let last = 0;
  const push = (s) => {
    if (!s) return;
    const span = document.createElement("span");
    span.textContent = s;
    if (classes.length) span.className = classes.join(" ");
    nodes.push(span);
  };
  for (const m of text.matchAll(ANSI)) {
    push(text.slice(last, m.index));
    last = m.index + m[0].length;
    if (m[1] === undefined) continue;
    for (const code of (m[1] || "0").split(";").map(Number)) {
      if (code === 0) classes = [];
      else if (code === 1) classes.push("ansi-bold");
      else if (code === 39) classes = classes.filter((c) => !c.startsWith("fg-"));
      else if ((code >= 30 && code <= 37) || (code >= 90 && code <= 97)) {
        classes = classes.filter((c) => !c.startsWith("fg-"));
        classes.push(`fg-${code}`);
      }
    }
  }
  push(text.slice(last));
  return nodes;
}

function describeEvent(ev) {
  // claude
  if (ev.type === "assistant" && ev.message) {
    return (ev.message.content || []).map((b) => b.type === "text" ? ["assistant", b.text]
      : b.type === "tool_use" ? ["tool", `⚙ ${b.name} ${JSON.stringify(b.input)}`] : null).filter(Boolean);
  }
  if (ev.type === "user" && ev.message) {
    return (ev.message.content || []).filter((b) => b.type === "tool_result")
      .map((b) => [b.is_error ? "error" : "tool", `↳ ${typeof b.content === "string" ? b.content : JSON.stringify(b.content)}`]);
  }
  if (ev.type === "result" && "is_error" in ev) return [[ev.is_error ? "error" : "result", `result: ${ev.result ?? ev.subtype}`]];
  if (ev.type === "system") return [["meta", `system ${ev.subtype || ""} ${ev.model || ev.message || ""}`]];
  // codex
  if (ev.item) {
    const item = ev.item;
    if (item.type === "agent_message") return [["assistant", item.text]];
    if (item.type === "command_execution") return [["tool", `⚙ ${item.command} ${item.exit_code ?? ""}`]];
    if (item.type === "error") return [["error", item.message]];
  }
  if (ev.type === "turn.failed") return [["error", `turn failed: ${ev.error && ev.error.message}`]];
  if (ev.type === "error") return [["error", ev.message || JSON.stringify(ev.error)]];
  // gemini
  if (ev.type === "message") return ev.role === "assistant" ? [["assistant", ev.content]] : [["meta", `${ev.role}: ${ev.content}`]];
  if (ev.type === "tool_use") return [["tool", `⚙ ${ev.tool_name} ${JSON.stringify(ev.parameters)}`]];
  if (ev.type === "tool_result") return [["tool", `↳ ${ev.status} ${ev.output || ""}`]];
  if (ev.type === "result") return [[ev.status === "error" ? "error" : "result", `result: ${ev.status} ${ev.error ? ev.error.message : ""}`]];
  if (ev.type) return [["meta", ev.type]];
  return null;
}


// The log view: only the lines on screen are in the page ------------------------------------
//
// A file opens at its end: its last TAIL_BYTES through the byte-range file API, then live bytes
// over SSE from where that read stopped. Earlier parts are read in CHUNK_BYTES steps, by
// themselves up to PREFETCH_BYTES, and beyond that as the reader scrolls up. Each line is one
// row of LINE_HEIGHT px (long lines scroll sideways), so the page holds only the rows on screen
// whatever the file's size. Line numbers (and links to a line) appear as soon as the server has
// counted the lines before the first byte read (GET .../files/NAME/lines?offset=), long before
// the file's start is read: a line's number is then that count plus its place in what is read.

const LINE_HEIGHT = 17;
const TAIL_BYTES = 256 * 1024;
const CHUNK_BYTES = 2 * 1024 * 1024;
const PREFETCH_BYTES = window.runAgentPrefetchBytes ?? 64 * 1024 * 1024; // (a seam for tests)
const OVERSCAN = 30;
const NEWLINE = 10;
const decoder = new TextDecoder();

function concatBytes(a, b) {
  const both = new Uint8Array(a.length + b.length);
  both.set(a, 0);
  both.set(b, a.length);
  return both;
}

const log = {
  el: $("#log"),
  sizer: null,
  rows: null,
  reset() {
    this.generation = (this.generation || 0) + 1;
    this.lines = []; // whole lines, as text
    this.partial = ""; // the last line while it has no newline yet
    this.from = 0; // the byte offset of the first byte read (0: the file's start is read)
    this.head = null; // bytes at `from` before the first newline: a line cut by the read
    this.url = null;
    this.loading = false;
    this.ended = false;
    this.failure = -1; // the line where the run failed
    this.target = -1; // the file's line (from 0) the address names
    this.targetShown = false;
    this.base = 0; // the file's line number (from 0) of lines[0]; null while not known
    this.shift = 0; // lines prepended since the count of lines before `from` was asked for
    this.shown = "";
    this.following = true; // stay at the end as lines arrive (until the reader scrolls up)
    this.el.replaceChildren();
    this.sizer = document.createElement("div");
    this.sizer.className = "sizer";
    this.rows = document.createElement("div");
    this.rows.className = "rows";
    this.sizer.append(this.rows);
    this.el.append(this.sizer);
    this.el.scrollTop = 0;
    search.reset();
    this.draw();
  },
  get count() {
    return this.lines.length + (this.partial ? 1 : 0);
  },
  text(i) {
    return i < this.lines.length ? this.lines[i] : this.partial;
  },
  numbered() {
    return this.base !== null;
  },
  atBottom() {
    return this.el.scrollHeight - this.el.scrollTop - this.el.clientHeight < 40;
  },
  // The file at `url` from its end; the byte offset where live bytes take over.
  async open(url) {
    const generation = this.generation;
    this.url = url;
    const probe = await fetch(`${url}?length=0`);
    const size = Number(probe.headers.get("X-File-Size") || 0);
    const from = Math.max(0, size - TAIL_BYTES);
    const bytes = size ? new Uint8Array(await (await fetch(`${url}?offset=${from}&length=${size - from}`)).arrayBuffer()) : new Uint8Array();
    if (generation !== this.generation) return null;
    this.from = from;
    let rest = bytes;
    if (from > 0) {
      const cut = bytes.indexOf(NEWLINE);
      this.head = cut < 0 ? bytes : bytes.slice(0, cut);
      rest = cut < 0 ? new Uint8Array() : bytes.slice(cut + 1);
      this.base = null;
      this.countBefore(generation, from);
    }
    const parts = decoder.decode(rest).split("\n");
    this.partial = parts.pop();
    this.lines = parts;
    this.draw();
    this.el.scrollTop = this.el.scrollHeight;
    this.draw();
    this.prefetch(generation);
    return size;
  },
  // The number of the first line read: the server counts the newlines before `from` (the line
  // cut at `from` is one more), while earlier parts may be prepended meanwhile (`shift`).
  async countBefore(generation, from) {
    this.shift = 0;
    let answer = null;
    try {
      const response = await fetch(`${this.url}/lines?offset=${from}`);
      if (response.ok) answer = await response.json();
    } catch {
      answer = null; // the server is away: numbers come when the file's start is read
    }
    if (!answer || generation !== this.generation || this.base !== null) return;
    this.base = answer.newlines + 1 - this.shift;
    this.draw(true);
    this.showTarget();
  },
  // Earlier parts by themselves, up to PREFETCH_BYTES from the end; the rest on scroll.
  async prefetch(generation) {
    let read = 0;
    while (generation === this.generation && this.from > 0 && read < PREFETCH_BYTES) {
      const got = await this.loadEarlier();
      if (!got) break; // a read the reader's scroll began is under way: it goes on from there
      read += got;
    }
  },
  async loadEarlier() {
    if (this.loading || this.from === 0 || !this.url) return 0;
    this.loading = true;
    const generation = this.generation;
    const from = Math.max(0, this.from - CHUNK_BYTES);
    try {
      const response = await fetch(`${this.url}?offset=${from}&length=${this.from - from}`);
      const bytes = new Uint8Array(await response.arrayBuffer());
      if (generation !== this.generation) return 0;
      let both = concatBytes(bytes, this.head || new Uint8Array());
      let head = null;
      if (from > 0) {
        const cut = both.indexOf(NEWLINE);
        if (cut < 0) {
          this.head = both;
          this.from = from;
          return bytes.length;
        }
        head = both.slice(0, cut);
        both = both.slice(cut + 1);
      }
      const earlier = decoder.decode(both).split("\n");
      this.from = from;
      this.head = head;
      this.prepend(earlier);
      return bytes.length;
    } finally {
      if (generation === this.generation) this.loading = false;
    }
  },
  prepend(earlier) {
    const stick = this.following;
    const top = this.el.scrollTop;
    this.lines = earlier.concat(this.lines);
    if (this.failure >= 0) this.failure += earlier.length;
    if (this.base !== null) this.base = Math.max(0, this.base - earlier.length);
    else this.shift += earlier.length;
    if (this.from === 0 && this.head === null) this.base = 0; // the start is read: exact
    search.shifted(earlier.length);
    this.draw(true);
    this.el.scrollTop = stick ? this.el.scrollHeight : top + earlier.length * LINE_HEIGHT;
    this.draw();
    this.showTarget();
  },
  append(text, whole = false) {
    const stick = this.following;
    const before = this.lines.length;
    const parts = (this.partial + text).split("\n");
    this.partial = parts.pop();
    for (const line of parts) this.lines.push(line);
    if (whole) this.flush();
    search.added(before);
    this.draw(true);
    if (stick) this.el.scrollTop = this.el.scrollHeight;
    else if (text) $("#follow-button").hidden = false;
    this.draw();
  },
  flush() {
    if (this.partial) this.lines.push(this.partial);
    this.partial = "";
  },
  // The address's line, once lines are numbered: scrolled to once, earlier parts read first
  // when it lies before what is read.
  showTarget() {
    if (this.target < 0 || this.targetShown || this.base === null) return;
    const at = this.target - this.base;
    if (at < 0 && this.from > 0) {
      const generation = this.generation;
      setTimeout(() => { if (generation === this.generation) this.loadEarlier(); }, 0);
      return;
    }
    if (at < 0 || at >= this.count) return;
    this.targetShown = true;
    this.scrollTo(at);
  },
  scrollTo(i) {
    this.following = false;
    this.el.scrollTop = Math.max(0, i * LINE_HEIGHT - this.el.clientHeight / 3);
    this.draw();
  },
  // The rows on screen (and OVERSCAN more each side), built afresh when that range changes.
  draw(force = false) {
    this.sizer.style.height = `${this.count * LINE_HEIGHT}px`;
    const first = Math.max(0, Math.floor(this.el.scrollTop / LINE_HEIGHT) - OVERSCAN);
    const last = Math.min(this.count, first + Math.ceil((this.el.clientHeight || 600) / LINE_HEIGHT) + 2 * OVERSCAN);
    const key = `${first}:${last}:${this.base}`;
    if (!force && key === this.shown) return;
    this.shown = key;
    this.rows.style.transform = `translateY(${first * LINE_HEIGHT}px)`;
    const nodes = [];
    for (let i = first; i < last; i += 1) nodes.push(this.render(i));
    this.rows.replaceChildren(...nodes);
  },
  render(i) {
    const line = this.text(i);
    const div = document.createElement("div");
    div.className = "line";
    div.dataset.index = i;
    if (i === this.failure) div.classList.add("failure");
    if (this.base !== null && i + this.base === this.target) div.classList.add("target");
    if (search.isCurrent(i)) div.classList.add("current-match");
    const number = document.createElement("a");
    number.className = "ln";
    if (this.numbered()) {
      const n = this.base + i + 1;
      number.dataset.ln = n;
      number.href = hashFor(state.task, state.run, state.file) + `/L${n}`;
      number.title = `link to line ${n}`;
    }
    const text = document.createElement("span");
    text.className = "text";
    let described = null;
    if (!$("#raw-toggle").checked && line.startsWith("{")) {
      try { described = describeEvent(JSON.parse(line)); } catch { described = null; }
    }
    if (described) {
      if (!described.length) {
        const span = document.createElement("span");
        span.className = "ev-meta";
        span.textContent = "·";
        text.append(span);
      }
      for (const [kind, said] of described) {
        const span = document.createElement("span");
        span.className = `ev-${kind}`;
        span.textContent = String(said ?? "").replaceAll("\n", " ↵ ");
        text.append(span, document.createTextNode(" "));
      }
    } else {
      text.append(...ansiToNodes(line));
    }
    search.mark(text);
    div.append(number, text);
    return div;
  },
  rerender() {
    this.draw(true);
  },
  // The first error event of a JSON stream, read from the start: where a failed run failed.
  findFailure() {
    for (let i = 0; i < this.count; i += 1) {
      const line = this.text(i);
      if (!line.startsWith("{") || !line.includes("rror")) continue;
      let described = null;
      try { described = describeEvent(JSON.parse(line)); } catch { continue; }
      if (described && described.some(([kind]) => kind === "error")) return i;
    }
    return -1;
  },
};

// Copy: every line read so far (the whole file once its start is read), as the file has it.
async function copyLog() {
  const text = log.lines.join("\n") + (log.partial ? `\n${log.partial}` : "");
  const button = $("#copy-button");
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = `copied ${log.count.toLocaleString("en")} lines`;
  } catch {
    button.textContent = "copy refused";
  }
  setTimeout(() => { button.textContent = "copy"; }, 2000);
}

// A search box emptied, with its count and marks (a new task's log starts unsearched).
function clearSearch() {
  clearTimeout(searchTimer);
  $("#search").value = "";
  search.reset();
  log.draw(true);
}

// Search: every line that holds the words (the file's text, any case), a count, next and
// previous, and the matches marked on screen.
const search = {
  query: "",
  matches: [],
  current: -1,
  reset() {
    this.matches = [];
    this.current = -1;
    this.query = $("#search").value.toLowerCase();
    if (this.query && log.lines) this.run(false);
    else this.show();
  },
  run(jump = true) {
    this.query = $("#search").value.toLowerCase();
    this.matches = [];
    if (this.query) {
      for (let i = 0; i < log.count; i += 1) {
        if (log.text(i).toLowerCase().includes(this.query)) this.matches.push(i);
      }
    }
    this.current = this.matches.length ? this.matches.length - 1 : -1; // the latest first
    this.show();
    if (jump && this.current >= 0) log.scrollTo(this.matches[this.current]);
    log.draw(true);
  },
  added(from) {
    if (!this.query) return;
    for (let i = from; i < log.count; i += 1) {
      if (log.text(i).toLowerCase().includes(this.query) && this.matches.at(-1) !== i) this.matches.push(i);
    }
    this.show();
  },
  shifted(by) {
    if (this.query) {
      const current = this.current >= 0 ? this.matches[this.current] + by : -1;
      this.run(false);
      if (current >= 0) this.current = Math.max(0, this.matches.indexOf(current));
      this.show();
    }
  },
  step(by) {
    if (!this.matches.length) return;
    this.current = (this.current + by + this.matches.length) % this.matches.length;
    this.show();
    log.scrollTo(this.matches[this.current]);
    log.draw(true);
  },
  isCurrent(i) {
    return this.current >= 0 && this.matches[this.current] === i;
  },
  show() {
    const count = $("#search-count");
    if (!this.query) count.textContent = "";
    else if (!this.matches.length) count.textContent = "no match";
    else count.textContent = `${this.current + 1} of ${this.matches.length}`;
  },
  mark(el) {
    if (!this.query) return;
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    const texts = [];
    while (walker.nextNode()) texts.push(walker.currentNode);
    for (const node of texts) {
      const value = node.nodeValue;
      const lower = value.toLowerCase();
      let at = lower.indexOf(this.query);
      if (at < 0) continue;
      const pieces = [];
      let last = 0;
      while (at >= 0) {
        pieces.push(document.createTextNode(value.slice(last, at)));
        const mark = document.createElement("mark");
        mark.textContent = value.slice(at, at + this.query.length);
        pieces.push(mark);
        last = at + this.query.length;
        at = lower.indexOf(this.query, last);
      }
      pieces.push(document.createTextNode(value.slice(last)));
      node.replaceWith(...pieces);
    }
  },
};

// The start form -----------------------------------------------------------------------------

async function loadAgents() {
  if (state.agents) return;
  const response = await fetch("/api/agents");
  if (!response.ok) return;
  state.agents = await response.json();
  const select = $("#agent-choice");
  select.replaceChildren();
  const fallback = document.createElement("option");
  fallback.value = "";
  fallback.textContent = state.agents.default ? `config default (${state.agents.default})` : "config default";
  select.append(fallback);
  for (const agent of state.agents.agents) {
    const option = document.createElement("option");
    option.value = agent.name;
    option.textContent = `${agent.name} — ${agent.type}${agent.model ? ` · ${agent.model}` : ""}`;
    select.append(option);
  }
}

const FORM_FIELDS = ["task_id", "agent", "cwd", "timeout", "idle_timeout", "max_restarts", "until"];

// Wiring -------------------------------------------------------------------------------------

$("#tasks").addEventListener("click", (e) => {
  const a = e.target.closest("a[data-task]");
  if (!a) return;
  e.preventDefault();
  navigate(hashFor(a.dataset.task));
});
for (const list of ["#runs", "#timeline"]) {
  $(list).addEventListener("click", (e) => {
    const b = e.target.closest("button[data-run]");
    if (b) navigate(hashFor(state.task, b.dataset.run));
  });
}
document.querySelectorAll(".tabs button[data-file]").forEach((b) =>
  b.addEventListener("click", () => navigate(hashFor(state.task, state.run, b.dataset.file))));
$("#raw-toggle").addEventListener("change", () => log.rerender());
let searchTimer = null;
$("#search").addEventListener("input", () => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => search.run(), 120);
});
$("#search").addEventListener("keydown", (e) => {
  if (e.key !== "Enter") return;
  e.preventDefault();
  clearTimeout(searchTimer);
  if (search.query !== $("#search").value.toLowerCase()) search.run();
  else search.step(e.shiftKey ? -1 : 1);
});
$("#search-prev").addEventListener("click", () => search.step(-1));
$("#copy-button").addEventListener("click", copyLog);
$("#search-next").addEventListener("click", () => search.step(1));
$("#task-filter").addEventListener("input", renderTasks);
$("#status-filter").addEventListener("change", renderTasks);
$("#follow-button").addEventListener("click", () => {
  log.following = true;
  log.el.scrollTop = log.el.scrollHeight;
  log.draw();
  $("#follow-button").hidden = true;
});
log.el.addEventListener("scroll", () => {
  log.draw();
  log.following = log.atBottom();
  if (log.following) $("#follow-button").hidden = true;
  if (log.el.scrollTop < 50 * LINE_HEIGHT) log.loadEarlier();
});
// When the log's box changes size (a window resize, the run header above it growing), a log
// that was following its end stays at its end.
new ResizeObserver(() => {
  if (log.following) log.el.scrollTop = log.el.scrollHeight;
  log.draw();
}).observe(log.el);
$("#stop-button").addEventListener("click", () => action("stop"));
$("#resume-button").addEventListener("click", (event) =>
  action("resume", event.currentTarget.dataset.again ? { again: true } : {}));
$("#delete-button").addEventListener("click", deleteTask);
$("#new-task-button").addEventListener("click", () => navigate("#new"));
$("#nav-toggle").addEventListener("click", () => document.body.classList.toggle("nav-open"));
$("#cancel-new").addEventListener("click", () => {
  $("#new-task-error").textContent = "";
  if (state.cameInApp) history.back();
  else navigate("#");
});
$("#new-task").addEventListener("submit", async (e) => {
  e.preventDefault();
  const form = new FormData(e.target);
  const body = { prompt: form.get("prompt") };
  for (const name of FORM_FIELDS) if (form.get(name)) body[name] = form.get(name);
  const project = encodeURIComponent(form.get("project"));
  const response = await fetch(`/api/projects/${project}/tasks`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  const answer = await response.json();
  if (!response.ok) {
    $("#new-task-error").textContent = answer.error;
    return;
  }
  $("#new-task-error").textContent = "";
  e.target.reset();
  // The form's address is replaced by the task's: Back from the task does not reopen the form.
  navigate(hashFor(`${answer.project_id}/${answer.task_id}`), true);
});
window.addEventListener("hashchange", () => {
  state.cameInApp = true;
  route();
});

log.reset();
connectEvents();
loadSchedules();
setInterval(loadSchedules, 30000);
route();

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
