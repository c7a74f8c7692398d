// The root event stream (/api/events): task rows as they change, handed to the views that show them.

import { watchSource } from "./connection.js";
import { refreshFleetSoon } from "./fleet.js";
import { pastePanel } from "./paste.js";
import { refreshSchedulesSoon } from "./schedules.js";
import { key, state } from "./state.js";
import { renderTasks } from "./tasklist.js";
import { onTaskChanged, racerShown, refreshTask } from "./taskview.js";

let eventsSource = null;

export function connectEvents() {
  eventsSource = new EventSource("/api/events");
  watchSource(eventsSource);
  eventsSource.addEventListener("snapshot", (e) => {
    state.tasks = new Map(JSON.parse(e.data).map((row) => [key(row), row]));
    renderTasks();
    refreshFleetSoon();
    if (state.task) refreshTask();
  });
  eventsSource.addEventListener("task", (e) => {
    const row = JSON.parse(e.data);
    const before = state.tasks.get(key(row));
    state.tasks.set(key(row), row);
    renderTasks();
    refreshFleetSoon();
    refreshSchedulesSoon();
    if (state.task === key(row)) onTaskChanged(before, row);
    else if (racerShown(key(row))) refreshTask(); // a racer of the race shown moved on
  });
  // A paste run's outbox, inbox or session changed (which changes no row): its panel reads it.
  eventsSource.addEventListener("paste", (e) => {
    refreshFleetSoon();
    if (state.task === key(JSON.parse(e.data))) pastePanel.refresh();
  });
  // A detached loop said more in supervisor.log (how it ended comes after its last row change).
  eventsSource.addEventListener("loop", (e) => {
    if (state.task === key(JSON.parse(e.data))) refreshTask();
  });
  eventsSource.addEventListener("removed", (e) => {
    state.tasks.delete(key(JSON.parse(e.data)));
    renderTasks();
    refreshFleetSoon();
  });
}
