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
  eventsSource.addEventListener("removed", (e) => {
    state.tasks.delete(key(JSON.parse(e.data)));
    renderTasks();
  });
}

const key = (row) => `${row.project_id}/${row.task_id}`;

function badge(status) {
  const span = document.createElement("span");
  span.className = `badge ${status}`;
  span.textContent = status;
  return span;
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
    (!status || row.status === status) && words.every((w) => key(row).toLowerCase().includes(w)));
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
    nav.append(h);
    for (const row of rows.sort((a, b) => a.task_id.localeCompare(b.task_id))) {
      const a = document.createElement("a");
      a.href = `#${key(row)}`;
      a.dataset.task = key(row);
      if (state.task === key(row)) a.classList.add("selected");
      const name = document.createElement("span");
      name.textContent = `${row.task_id} (${row.runs})`;
      a.append(name, badge(row.status));
      nav.append(a);
    }
  }
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
  const [project, task, run, tab] = parts;
  return { view: "task", task: `${project}/${task}`, run: run || null, tab: TABS.includes(tab) ? tab : null };
}

function hashFor(task, run = null, tab = null) {
  const parts = [...task.split("/"), run, tab].filter(Boolean).map(encodeURIComponent);
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
    state.task = null;
    state.detail = null;
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
  if (state.task !== where.task) {
    state.task = where.task;
    state.detail = null;
    state.run = where.run;
    closeLog();
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
    return;
  }
  const detail = await response.json();
  state.detail = detail;
  $("#task-title").textContent = label;
  const status = $("#task-status");
  status.className = `badge ${detail.status}`;
  status.textContent = detail.status;
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
    b.title = `${run.run_id}: ${run.message || run.status}`;
    if (run.run_id === state.run) b.classList.add("selected");
    b.append(`#${run.attempt} `, badge(run.status));
    li.append(b);
    list.append(li);
  }
}

function onTaskChanged(before, row) {
  const status = $("#task-status");
  status.className = `badge ${row.status}`;
  status.textContent = row.status;
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
  const hash = hashFor(state.task, state.followLoop ? null : run.run_id, state.autoTab ? null : tab);
  if (hash !== location.hash) history.replaceState(null, "", hash);
  if (state.opened !== `${run.run_id}/${tab}`) openFile(tab);
  else showFailure(); // the stream may have ended before the run's end was known here
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
    ["agent", `${run.agent}${run.agent_version ? ` ${run.agent_version}` : ""} (${run.backend})`],
    ["attempt", `${run.attempt} · run ${index + 1} of ${runs.length}`],
    ["started", timeText(run.start_time)],
    ["ended", run.end_time ? timeText(run.end_time) : "—"],
    ["duration", durationText((end - start) / 1000) + (run.end_time ? "" : " so far")],
    ["folder", run.cwd],
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

function openFile(name) {
  state.file = name;
  document.querySelectorAll(".tabs button").forEach((b) => b.classList.toggle("active", b.dataset.file === name));
  $("#download").href = `${runUrl()}/files/${name}?download=1`;
  closeLog();
  state.opened = `${state.run}/${name}`;
  log.reset();
  if (name === "prompt") {
    fetch(`${runUrl()}/files/prompt`).then((r) => r.text()).then((text) => log.append(text, true));
    return;
  }
  const source = new EventSource(`${runUrl()}/stream/${name}`);
  logSource = source;
  watchSource(source);
  source.addEventListener("data", (e) => log.append(JSON.parse(e.data)));
  source.addEventListener("end", () => {
    log.flush();
    source.close();
    setConnection("connected", "live");
    log.ended = true;
    showFailure();
  });
}

// On a failed run's stream, the first error event is where the failure is: scroll to it.
function showFailure() {
  if (!state.autoTab || state.file !== "stdout" || !log.ended || state.failureShown === state.run) return;
  const run = state.detail && state.detail.runs_list.find((r) => r.run_id === state.run);
  if (!run || !FAILED.has(run.status)) return;
  const error = log.el.querySelector(".line .ev-error");
  if (!error) return;
  state.failureShown = state.run;
  const line = error.closest(".line");
  line.classList.add("failure");
  log.el.scrollTop = line.offsetTop - log.el.offsetTop - 8;
}

// The log view: ANSI colours, readable JSON events, search, auto-scroll ----------------------

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

const log = {
  el: $("#log"),
  lines: [],
  partial: "",
  partialEl: null,
  reset() {
    this.ended = false;
    this.el.replaceChildren();
    this.lines = [];
    this.partial = "";
    this.partialEl = null;
  },
  append(text, whole = false) {
    const atBottom = this.el.scrollHeight - this.el.scrollTop - this.el.clientHeight < 40;
    const parts = (this.partial + text).split("\n");
    this.partial = parts.pop();
    for (const line of parts) this.addLine(line);
    if (whole) this.flush();
    else this.showPartial();
    if (atBottom) this.el.scrollTop = this.el.scrollHeight;
    else $("#follow-button").hidden = false;
  },
  flush() {
    if (this.partial) this.addLine(this.partial);
    this.partial = "";
    this.showPartial();
  },
  showPartial() {
    if (this.partialEl) this.partialEl.remove();
    this.partialEl = null;
    if (this.partial) {
      this.partialEl = this.render(this.partial);
      this.el.append(this.partialEl);
    }
  },
  addLine(line) {
    this.lines.push(line);
    if (this.partialEl) this.partialEl.remove();
    this.el.append(this.render(line));
    if (this.partialEl) this.el.append(this.partialEl);
  },
  render(line) {
    const div = document.createElement("div");
    div.className = "line";
    div.dataset.text = line;
    let described = null;
    if (!$("#raw-toggle").checked && line.startsWith("{")) {
      try { described = describeEvent(JSON.parse(line)); } catch { described = null; }
    }
    if (described) {
      if (!described.length) div.hidden = true;
      for (const [kind, text] of described) {
        const span = document.createElement("span");
        span.className = `ev-${kind}`;
        span.textContent = text;
        div.append(span, document.createTextNode(" "));
      }
    } else {
      div.append(...ansiToNodes(line));
    }
    applySearch(div);
    return div;
  },
  rerender() {
    const lines = this.lines;
    const partial = this.partial;
    const ended = this.ended;
    this.reset();
    this.ended = ended;
    for (const line of lines) this.addLine(line);
    this.partial = partial;
    this.showPartial();
  },
};

function applySearch(div) {
  const query = $("#search").value.toLowerCase();
  div.classList.toggle("hidden", Boolean(query) && !div.textContent.toLowerCase().includes(query));
}


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
document.querySelectorAll(".tabs button").forEach((b) =>
  b.addEventListener("click", () => navigate(hashFor(state.task, state.run, b.dataset.file))));
$("#raw-toggle").addEventListener("change", () => log.rerender());
$("#search").addEventListener("input", () => log.el.querySelectorAll(".line").forEach(applySearch));
$("#task-filter").addEventListener("input", renderTasks);
$("#status-filter").addEventListener("change", renderTasks);
$("#follow-button").addEventListener("click", () => {
  log.el.scrollTop = log.el.scrollHeight;
  $("#follow-button").hidden = true;
});
log.el.addEventListener("scroll", () => {
  if (log.el.scrollHeight - log.el.scrollTop - log.el.clientHeight < 40) $("#follow-button").hidden = true;
});
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

connectEvents();
loadSchedules();
setInterval(loadSchedules, 30000);
route();
