// The router: the view the address names (the start form, a task, or the list alone), shown
// whenever the address changes.

import { parseHash, routeWith } from "./address.js";
import { $ } from "./dom.js";
import { showFleet } from "./fleet.js";
import { pastePanel } from "./paste.js";
import { closeLog } from "./runview.js";
import { clearSearch } from "./search.js";
import { loadAgents } from "./startform.js";
import { state } from "./state.js";
import { renderTasks } from "./tasklist.js";
import { refreshTask } from "./taskview.js";

export async function route() {
  state.routed = location.hash;
  const where = parseHash();
  // On a narrow screen each view opens on itself (the home view on the fleet); ☰ opens the list.
  document.body.classList.remove("nav-open");
  $("#new-task").hidden = where.view !== "new";
  $("#task-view").hidden = where.view !== "task";
  showFleet(where.view === "home");
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
    $("#action-error").textContent = ""; // as what an action on the last one answered
    $("#run-view").hidden = true;
    renderTasks();
  }
  await refreshTask();
}

window.addEventListener("hashchange", () => {
  state.cameInApp = true;
  route();
});

routeWith(route);
