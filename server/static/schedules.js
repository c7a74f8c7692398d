// The schedules in the sidebar: each with its next firing and last outcome, and "run now".

import { hashFor, navigate } from "./address.js";
import { $ } from "./dom.js";
import { state } from "./state.js";
import { renderTasks } from "./tasklist.js";

let schedulesTimer = null;

export function refreshSchedulesSoon() {
  clearTimeout(schedulesTimer);
  schedulesTimer = setTimeout(loadSchedules, 300);
}

export async function loadSchedules() {
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
    run.dataset.needs = "operate";
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
