// One run: its header, the tab its file opens in (a failed run where it failed), and its file in
// the log view, followed live over SSE until the run ends.

import { hashFor, navigate, taskUrl } from "./address.js";
import { setConnection, watchSource } from "./connection.js";
import { $, badge } from "./dom.js";
import { durationText, ms, timeText, usageText } from "./format.js";
import { rulesOf } from "./lines.js";
import { log } from "./logview.js";
import { FAILED, state } from "./state.js";
import { turns } from "./turns.js";

let logSource = null;
const shows = turns(); // a run shown: the latest showRun acts, an earlier one still awaiting does not
const openings = turns(); // a file opened: a later opening (or closeLog) ends an earlier one

// The run shown: its header, and its file in the tab asked for; a failed run opens where it
// failed (stderr if it wrote any, else the stream's error event).
export async function showRun(run) {
  const mine = shows.take();
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
    tab = await failureTab(run);
    // A later show chooses (it asked for the tab too: the tab is marked chosen only here), and
    // a tab the reader chose meanwhile is theirs (their route shows the run).
    if (!shows.latest(mine) || !state.autoTab) return;
    state.tabFor = seen;
  }
  if (run.run_id !== state.run) return;
  const hash = hashFor(state.task, state.followLoop ? null : run.run_id, state.autoTab ? null : tab,
    state.autoTab ? null : state.line);
  // The address says which run and tab are shown; an address the reader moved to whose
  // hashchange has not routed yet is theirs, not rewritten (it would route to this run again).
  if (hash !== location.hash && location.hash === state.routed) {
    history.replaceState(null, "", hash);
    state.routed = hash;
  }
  if (state.opened !== `${run.run_id}/${tab}`) openFile(tab, run.backend);
  else {
    applyLine();
    showFailure(); // the stream may have ended before the run's end was known here
  }
}

async function failureTab(run) {
  if (run.reason === "check_failed") return "check"; // it said it was done: the check said no
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
  if (run.queued_seconds != null) {
    rows.push(["queued", `${durationText(run.queued_seconds)} in the queue before its loop began`]);
  }
  if (run.check_command != null) {
    const ended = run.check_exit_code === 0 ? "passed" : `failed (exit ${run.check_exit_code})`;
    const took = run.check_seconds != null ? ` in ${durationText(run.check_seconds)}` : "";
    rows.push(["check", `${run.check_command} · ${ended}${took}`]);
  }
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

function runUrlOf(runId) {
  return `${taskUrl(state.task)}/runs/${encodeURIComponent(runId)}`;
}

function runUrl() {
  return runUrlOf(state.run);
}

export function closeLog() {
  if (logSource) logSource.close();
  logSource = null;
  state.opened = null;
  openings.take(); // an opening still awaiting its file is over
}

// The run's file `name`; stdout is the agent's stream, read as the run's `backend` says.
async function openFile(name, backend) {
  state.file = name;
  document.querySelectorAll(".tabs button[data-file]").forEach((b) => b.classList.toggle("active", b.dataset.file === name));
  const base = runUrl(); // the run's, whatever is shown when an await below returns
  const url = `${base}/files/${name}`;
  $("#download").href = `${url}?download=1`;
  closeLog();
  const mine = openings.take();
  state.opened = `${state.run}/${name}`;
  state.failureShown = null; // a log opened afresh is shown at its failure again
  log.reset();
  log.target = state.line ? state.line - 1 : -1;
  if (name === "prompt") {
    const text = await (await fetch(url)).text();
    if (!openings.latest(mine)) return;
    log.append(text, true);
    log.ended = true;
    log.showTarget();
    return;
  }
  const rules = name === "stdout" && backend ? await rulesOf(backend) : null;
  if (!openings.latest(mine)) return;
  log.rules = rules;
  const size = await log.open(url);
  if (size === null || !openings.latest(mine)) return;
  const source = new EventSource(`${base}/stream/${name}?from=${size}`);
  logSource = source;
  watchSource(source);
  source.addEventListener("data", (e) => log.append(JSON.parse(e.data)));
  source.addEventListener("end", () => {
    log.flush(); // the partial line becomes a whole one: its row reads the same
    log.draw();
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

document.querySelectorAll(".tabs button[data-file]").forEach((b) =>
  b.addEventListener("click", () => navigate(hashFor(state.task, state.run, b.dataset.file))));
