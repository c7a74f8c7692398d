// What the page shows and knows, shared by every view: the task, run and tab shown, the rows the
// server sent, and the names a task and a status are known by.

export const state = {
  tasks: new Map(), // "P/T" -> the task's row from /api/events
  task: null, // "P/T" shown
  detail: null, // its /api/projects/P/tasks/T answer
  run: null, // run id shown
  file: "stdout", // tab shown
  followLoop: true, // show each new attempt as it starts (no run named in the address)
  autoTab: true, // the tab was chosen by the page (a failed run opens where it failed)
  routed: null, // the address the router last showed (the page rewrites only that one)
  agents: null, // /api/agents
  schedules: [], // /api/schedules
  awaiting: new Map(), // "P/T" -> its operations awaiting approval (from approvals.js)
};

export const TABS = ["stdout", "stderr", "output", "prompt", "check"];
export const FAILED = new Set(["failed", "timed_out", "lost", "over_budget", "stuck"]);

export const key = (row) => `${row.project_id}/${row.task_id}`;

// A task with an operation awaiting approval shows that, whatever its loop's status: an
// operations run (`run-agent ops`) has no run-info, so its task would read "pending".
export const AWAITING = "awaiting_approval";
export const shownStatus = (row) => (state.awaiting.has(key(row)) ? AWAITING : row.status);
