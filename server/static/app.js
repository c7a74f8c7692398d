// The run-agent page: task lists and run logs, kept live over server-sent events.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = { tasks: new Map(), task: null, run: null, file: "stdout", followLoop: true };
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
  await selectTask(`${answer.project_id}/${answer.task_id}`);
}

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
  const byProject = new Map();
  for (const row of state.tasks.values()) {
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

// One task -----------------------------------------------------------------------------------

function taskUrl(label) {
  const [project, task] = label.split("/");
  return `/api/projects/${encodeURIComponent(project)}/tasks/${encodeURIComponent(task)}`;
}

async function selectTask(label) {
  state.task = label;
  state.run = null;
  state.followLoop = true;
  $("#placeholder").hidden = true;
  $("#new-task").hidden = true;
  $("#task-view").hidden = false;
  renderTasks();
  await refreshTask();
}

async function refreshTask() {
  const response = await fetch(taskUrl(state.task));
  if (!response.ok) return;
  const detail = await response.json();
  $("#task-title").textContent = state.task;
  const status = $("#task-status");
  status.className = `badge ${detail.status}`;
  status.textContent = detail.status;
  $("#task-prompt").textContent = detail.prompt || "";
  $("#stop-button").disabled = detail.status !== "running";
  const resume = $("#resume-button");
  resume.disabled = detail.status === "running";
  // A completed task runs again only when asked to, in so many words (the CLI's --again).
  resume.textContent = detail.status === "completed" ? "Run again" : "Resume";
  resume.dataset.again = detail.status === "completed" ? "1" : "";
  renderRuns(detail.runs_list);
  renderGit(detail.git, detail.status);
  const latest = detail.runs_list.at(-1);
  if (latest && (state.run === null || (state.followLoop && state.run !== latest.run_id))) {
    selectRun(latest.run_id);
  }
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

// One run's files ----------------------------------------------------------------------------

function selectRun(runId) {
  state.run = runId;
  const runs = [...document.querySelectorAll("#runs button")];
  runs.forEach((b) => b.classList.toggle("selected", b.dataset.run === runId));
  $("#run-view").hidden = false;
  openFile(state.file);
}

function runUrl() {
  return `${taskUrl(state.task)}/runs/${encodeURIComponent(state.run)}`;
}

function openFile(name) {
  state.file = name;
  document.querySelectorAll(".tabs button").forEach((b) => b.classList.toggle("active", b.dataset.file === name));
  $("#download").href = `${runUrl()}/files/${name}?download=1`;
  if (logSource) logSource.close();
  logSource = null;
  log.reset();
  if (name === "prompt") {
    fetch(`${runUrl()}/files/prompt`).then((r) => r.text()).then((text) => log.append(text, true));
    return;
  }
  logSource = new EventSource(`${runUrl()}/stream/${name}`);
  watchSource(logSource);
  logSource.addEventListener("data", (e) => log.append(JSON.parse(e.data)));
  logSource.addEventListener("end", () => {
    log.flush();
    logSource.close();
    setConnection("connected", "live");
  });
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
    this.reset();
    for (const line of lines) this.addLine(line);
    this.partial = partial;
    this.showPartial();
  },
};

function applySearch(div) {
  const query = $("#search").value.toLowerCase();
  div.classList.toggle("hidden", Boolean(query) && !div.textContent.toLowerCase().includes(query));
}

// Wiring -------------------------------------------------------------------------------------

$("#tasks").addEventListener("click", (e) => {
  const a = e.target.closest("a[data-task]");
  if (!a) return;
  e.preventDefault();
  selectTask(a.dataset.task);
});
$("#runs").addEventListener("click", (e) => {
  const b = e.target.closest("button[data-run]");
  if (!b) return;
  const runs = [...document.querySelectorAll("#runs button")];
  state.followLoop = b === runs.at(-1);
  selectRun(b.dataset.run);
});
document.querySelectorAll(".tabs button").forEach((b) => b.addEventListener("click", () => openFile(b.dataset.file)));
$("#raw-toggle").addEventListener("change", () => log.rerender());
$("#search").addEventListener("input", () => log.el.querySelectorAll(".line").forEach(applySearch));
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
$("#new-task-button").addEventListener("click", () => {
  $("#new-task").hidden = false;
  $("#task-view").hidden = true;
  $("#placeholder").hidden = true;
});
$("#cancel-new").addEventListener("click", () => { $("#new-task").hidden = true; });
$("#new-task").addEventListener("submit", async (e) => {
  e.preventDefault();
  const form = new FormData(e.target);
  const body = { prompt: form.get("prompt") };
  for (const name of ["task_id", "agent", "max_restarts"]) if (form.get(name)) body[name] = form.get(name);
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
  await selectTask(`${answer.project_id}/${answer.task_id}`);
});

connectEvents();
loadSchedules();
setInterval(loadSchedules, 30000);
if (location.hash.length > 1) selectTask(decodeURIComponent(location.hash.slice(1)));
