// One task: its status and what it waits for, summary, git work, runs, and Stop, Resume and Delete.

import { hashFor, navigate, taskUrl } from "./address.js";
import { $, badge } from "./dom.js";
import { bytesText, usageText } from "./format.js";
import { pastePanel } from "./paste.js";
import { showRun } from "./runview.js";
import { AWAITING, state } from "./state.js";
import { renderTimeline } from "./timeline.js";
import { turns } from "./turns.js";

// The task view's status badge, and what its awaited operations are with a link to answer them.
export function setTaskStatus(status) {
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

const reads = turns(); // the task's reads (events, timers and actions each ask for one)
const diffs = turns();

export async function refreshTask() {
  const label = state.task;
  const mine = reads.take();
  const response = await fetch(taskUrl(label));
  const detail = await response.json();
  // The reader moved on meanwhile, or a later read was shown: this one is stale.
  if (label !== state.task || !reads.show(mine)) return;
  if (!response.ok) {
    $("#task-title").textContent = label;
    $("#task-summary").textContent = detail.error;
    pastePanel.show(label, null);
    return;
  }
  state.detail = detail;
  $("#task-title").textContent = label;
  setTaskStatus(detail.status);
  $("#task-prompt").textContent = detail.prompt || "";
  // A queued or blocked task is taken out of the queue by Stop, as `run-agent stop` does.
  const waiting = detail.status === "queued" || detail.status === "blocked";
  $("#stop-button").disabled = detail.status !== "running" && !waiting;
  $("#stop-button").textContent = waiting ? "Leave the queue" : "Stop";
  $("#delete-button").disabled = detail.status === "running";
  const resume = $("#resume-button");
  resume.disabled = detail.status === "running" || waiting;
  // A completed task runs again only when asked to, in so many words (the CLI's --again).
  resume.textContent = detail.status === "completed" ? "Run again" : "Resume";
  resume.dataset.again = detail.status === "completed" ? "1" : "";
  renderSummary(detail);
  renderWaits(detail);
  renderRace(detail);
  renderTimeline(detail.runs_list, detail.messages || []);
  renderSteer(detail);
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

// What the task waits for (a slot, other tasks, a person when its queue record cannot be read)
// and the tasks that wait for it, each a link.
function renderWaits(detail) {
  const box = $("#task-waits");
  box.replaceChildren();
  const lines = [];
  if (detail.queue) {
    const p = document.createElement("p");
    p.className = "waits-for";
    const state = detail.queue.unreadable ? "unreadable" : detail.status === "blocked" ? "blocked" : "queued";
    p.append(`${state}: ${detail.queue.waits_for}`);
    if (detail.queue.after.length) p.append(" · after ", ...links(detail.queue.after));
    lines.push(p);
  }
  if (detail.waited_on_by && detail.waited_on_by.length) {
    const p = document.createElement("p");
    p.className = "waited-on-by";
    p.append("waited on by ", ...links(detail.waited_on_by));
    lines.push(p);
  }
  box.append(...lines);
  box.hidden = lines.length === 0;
}

// A race's racers side by side (agent, status, attempt, spend, last check, why it is out), each
// a link to its own task. A racer's row changing refreshes the race while it is shown.
let raceTimer = null;
function renderRace(detail) {
  const section = $("#task-race");
  const race = detail.race;
  section.hidden = !race;
  clearTimeout(raceTimer);
  if (!race) return;
  const said = race.winner ? `won by ${race.winner}` : race.outcome ? race.outcome : "racing";
  const spent = race.usage ? ` · all racers: ${usageText(race.usage)}` : "";
  const budget = race.budget ? ` (budget ${race.budget.join(" and ")})` : "";
  $("#race-summary").textContent = `race of ${race.racers.length}: ${said}${spent}${budget}`;
  const body = $("#race-racers");
  body.replaceChildren();
  for (const racer of race.racers) {
    const tr = document.createElement("tr");
    tr.dataset.racer = racer.task_id;
    if (racer.won) tr.className = "won";
    const reason = racer.reason ? `${racer.reason}${racer.message ? `: ${racer.message}` : ""}` : "";
    const cells = [links([`${detail.project_id}/${racer.task_id}`]), [racer.agent || ""],
      [badge(racer.won ? "won" : racer.status)], [racer.attempt == null ? "" : String(racer.attempt)],
      [racer.usage ? usageText(racer.usage) : ""],
      [racer.last_check == null ? "" : String(racer.last_check)], [reason]];
    for (const parts of cells) {
      const td = document.createElement("td");
      td.append(...parts);
      tr.append(td);
    }
    body.append(tr);
  }
  if (detail.status === "running") {
    const shown = state.task;
    raceTimer = setTimeout(() => { if (state.task === shown) refreshTask(); }, 3000);
  }
}

// Whether `label` is a racer of the race shown: its row changing changes the race's view.
export function racerShown(label) {
  const detail = state.detail;
  if (!detail || !detail.race || state.task !== `${detail.project_id}/${detail.task_id}`) return false;
  return detail.race.racers.some((r) => `${detail.project_id}/${r.task_id}` === label);
}

function links(labels) {
  const parts = [];
  labels.forEach((label, i) => {
    if (i) parts.push(", ");
    const a = document.createElement("a");
    a.href = hashFor(label);
    a.textContent = label;
    a.addEventListener("click", (event) => {
      event.preventDefault();
      navigate(hashFor(label));
    });
    parts.push(a);
  });
  return parts;
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
  // A worktree run of its own (no issue) is not finished by a marker: no badge until one shows.
  marker.hidden = "fork_commit" in git && !git.issue && !git.marker_seen;
  renderWayBack(git, status);
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

// A worktree's way back: its commits since the fork, the diff stat, and Merge (into the branch
// it started from) once the task has completed; or what was done with it.
function renderWayBack(git, status) {
  const line = $("#git-way-back");
  line.hidden = !("fork_commit" in git) || git.removed;
  const box = $("#git-diff-box");
  box.hidden = line.hidden || git.ahead === 0;
  if (box.open && box.dataset.tip !== git.commits[0]?.sha) loadDiff();
  if (line.hidden) return;
  const into = git.into ? ` → ${git.into}` : "";
  const what = `${git.ahead} commit${git.ahead === 1 ? "" : "s"} since the fork${git.diffstat ? ` · ${git.diffstat}` : ""}${into}`;
  const behind = git.behind ? ` · ${git.into} has ${git.behind} commit${git.behind === 1 ? "" : "s"} it lacks` : "";
  const done = git.merged ? ` · merged into ${git.merged.into} (${git.merged.how})`
    : git.pushed ? ` · pushed to ${git.pushed.remote}` : "";
  $("#git-ahead").textContent = what + behind + done + rebaseText(git.rebase);
  const button = $("#merge-button");
  button.hidden = status !== "completed" || !git.into || git.ahead === 0 || Boolean(git.merged);
  const pending = git.rebase && ["conflict", "check_failed"].includes(git.rebase.state);
  $("#rebase-button").hidden = !git.into || !git.behind || pending || Boolean(git.merged)
    || ["running", "queued", "blocked"].includes(status);
}

// A rebase its agent has to finish, in words (none once it is merged or resolved).
function rebaseText(rebase) {
  if (!rebase) return "";
  if (rebase.state === "conflict") return ` · rebase onto ${rebase.onto}: conflicts in ${rebase.files.join(", ")}, for its agent to resolve`;
  if (rebase.state === "check_failed") return ` · rebase onto ${rebase.onto}: its check fails on the result, for its agent to fix`;
  return "";
}

// The branch's changes since its fork, as `merge` would bring them back: loaded when opened
// (and again when the branch moves), shown as text.
async function loadDiff() {
  const box = $("#git-diff-box");
  const label = state.task;
  const mine = diffs.take();
  const response = await fetch(`${taskUrl(label)}/diff`);
  const body = await response.json();
  // Another task's, or older than one shown (each one that ends is shown: a diff slower than
  // the reads that ask for it would otherwise never be).
  if (label !== state.task || !diffs.show(mine)) return;
  if (!response.ok) {
    $("#git-diff").textContent = body.error;
    return;
  }
  box.dataset.tip = body.tip;
  const cut = body.truncated ? "\n[the diff goes on: its first 2 MiB are shown]" : "";
  $("#git-diff").textContent = body.diff + cut;
}

$("#git-diff-box").addEventListener("toggle", () => { if ($("#git-diff-box").open) loadDiff(); });
$("#merge-button").addEventListener("click", () => action("merge"));
$("#rebase-button").addEventListener("click", () => action("rebase"));

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

export function onTaskChanged(before, row) {
  setTaskStatus(row.status);
  const newRun = row.latest_run && (!before || !before.latest_run ||
    before.latest_run.run_id !== row.latest_run.run_id || before.latest_run.status !== row.latest_run.status);
  if (newRun || !before || before.status !== row.status) refreshTask();
}

async function action(name, body = {}) {
  const label = state.task;
  $("#action-error").textContent = "";
  const response = await fetch(`${taskUrl(label)}/${name}`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  const error = response.ok ? null : (await response.json()).error;
  if (label !== state.task) return; // said of a task the reader has left
  if (error) $("#action-error").textContent = error;
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
    const { error } = await response.json();
    if (label === state.task) $("#action-error").textContent = error;
    return;
  }
  state.tasks.delete(label);
  if (label === state.task) navigate("#"); // the reader may have moved on meanwhile
}

for (const list of ["#runs", "#timeline"]) {
  $(list).addEventListener("click", (e) => {
    const b = e.target.closest("button[data-run]");
    if (b) navigate(hashFor(state.task, b.dataset.run));
  });
}
$("#stop-button").addEventListener("click", () => action("stop"));
$("#resume-button").addEventListener("click", (event) =>
  action("resume", event.currentTarget.dataset.again ? { again: true } : {}));
$("#delete-button").addEventListener("click", deleteTask);

// The box under the log: a person's words for the task's next attempt (resume with a message).
// A running task's next attempt gets them, or, with "now", its current attempt ends for them; a
// stopped or failed task is resumed with them, a completed one run again.
function renderSteer(detail) {
  const running = detail.status === "running";
  $("#steer-now").disabled = !running;
  if (!running) $("#steer-now").checked = false;
  $("#steer-send").textContent = running ? "Send to the next attempt"
    : detail.status === "completed" ? "Run again with it" : "Resume with it";
}

$("#steer-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = $("#steer-text");
  const body = { message: text.value };
  if ($("#steer-now").checked) body.now = true;
  if (state.detail && state.detail.status === "completed") body.again = true;
  $("#steer-error").textContent = "";
  $("#steer-said").textContent = "";
  const response = await fetch(`${taskUrl(state.task)}/resume`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  if (!response.ok) {
    $("#steer-error").textContent = (await response.json()).error;
    return;
  }
  const answer = await response.json();
  text.value = "";
  $("#steer-now").checked = false;
  $("#steer-said").textContent = answer.steered
    ? `message ${answer.message.number} kept: ${answer.message.now ? "the current attempt ends and the next starts with it" : "the next attempt starts with it"}`
    : "resumed with the message";
  await refreshTask();
});
