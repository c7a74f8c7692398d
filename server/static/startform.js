// The start form (#new): the agents to choose from, and a task started from what was typed.

import { hashFor, navigate } from "./address.js";
import { $ } from "./dom.js";
import { state } from "./state.js";

export async function loadAgents() {
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

const FORM_FIELDS = ["task_id", "agent", "cwd", "timeout", "idle_timeout", "max_restarts", "until",
  "after", "priority", "budget", "stuck_after", "worktree", "base", "check", "check_timeout",
  "session", "race", "agents"];

$("#new-task-button").addEventListener("click", () => navigate("#new"));
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
  if (form.get("issue_number") || form.get("issue_repo")) {
    body.issue = { number: form.get("issue_number"), repo: form.get("issue_repo"), url: form.get("issue_url") };
  }
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
