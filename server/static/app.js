// The run-agent page: task lists and run logs, kept live over server-sent events. This module is
// the page's entry (index.html loads it as a module, no build step): it loads each view's module,
// wires the approvals panel to the task list, and starts the streams and the router.
// Every view has an address in the hash: #new, #P/T, #P/T/RUN, #P/T/RUN/TAB; Back and Forward
// move between them, and an address can be shared.

import { watchApprovals } from "./approvals.js";
import { $ } from "./dom.js";
import { connectEvents } from "./events.js";
import { log } from "./logview.js";
import { route } from "./router.js";
import { loadSchedules } from "./schedules.js";
import { search } from "./search.js";
import { showAwaiting } from "./tasklist.js";

// The console, the browser tests and bench/page.py read the log and its search by these names,
// as they could when the page was one classic script.
window.log = log;
window.search = search;

$("#nav-toggle").addEventListener("click", () => document.body.classList.toggle("nav-open"));

// What this page's access lets it do: a read token's page offers no action it would be refused.
async function showAccess() {
  const response = await fetch("/api/health");
  if (!response.ok) return;
  const { access } = await response.json();
  if (!access) return;
  document.body.dataset.scope = access.scope;
  document.body.dataset.reach = access.projects ? "some" : "every"; // a hold needs every project
  const note = $("#access-note");
  const where = access.projects ? ` (projects ${access.projects.join(", ")})` : "";
  const words = {
    read: `read-only access${where}: this page shows the runs; starting, stopping and answering need an operate token`,
    operate: `operate access${where}: deleting needs an admin token`,
  };
  note.hidden = !(access.scope in words);
  note.textContent = words[access.scope] || "";
}

showAccess();
log.reset();
connectEvents();
loadSchedules();
setInterval(loadSchedules, 30000);
route();
watchApprovals(showAwaiting);
