// Pending approvals of operations runs (agent mode, `run-agent ops`): what is asked, by which
// rule and why, with Approve and Deny. Answers go to the same API the CLI's `ops approve` uses.

const REFRESH_MS = 2000;
let listener = () => undefined;
const panel = document.createElement("section");
panel.id = "approvals";
panel.hidden = true;
panel.setAttribute("aria-live", "polite");
document.body.insertBefore(panel, document.querySelector("main"));

const text = (tag, value, cls) => {
  const el = document.createElement(tag);
  el.textContent = value;
  if (cls) el.className = cls;
  return el;
};

function asked(row) {
  const d = row.details || {};
  return d.command || d.path || row.operationType || row.operationId;
}

async function answer(row, decision, error) {
  const url = `/api/ops/runs/${encodeURIComponent(row.runId)}/approvals/` +
    encodeURIComponent(row.operationId);
  const response = await fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ decision, operationHash: row.operationHash }),
  });
  if (!response.ok) error.textContent = (await response.json()).error;
  await refresh();
}

function render(rows) {
  panel.replaceChildren();
  panel.hidden = rows.length === 0;
  if (!rows.length) return;
  panel.append(text("h2", rows.length === 1 ? "Waiting for approval" :
    `${rows.length} operations waiting for approval`));
  for (const row of rows) {
    const item = document.createElement("div");
    item.className = "approval";
    item.id = `approval-${row.runId}-${row.operationId}`;
    item.dataset.run = row.runId;
    item.dataset.operation = row.operationId;
    const d = row.details || {};
    item.append(
      text("span", `${row.project_id}/${row.task_id} · run ${row.runId}`, "where"),
      text("code", asked(row), "asked"),
      text("span", [d.policy, row.reason].filter(Boolean).join(": "), "why"),
    );
    const error = text("span", "", "error");
    const approve = text("button", "Approve", "approve");
    const deny = text("button", "Deny", "deny");
    approve.type = deny.type = "button";
    approve.dataset.needs = deny.dataset.needs = "operate";
    approve.addEventListener("click", () => answer(row, "approved", error));
    deny.addEventListener("click", () => answer(row, "denied", error));
    item.append(approve, deny, error);
    panel.append(item);
  }
}

async function refresh() {
  try {
    const response = await fetch("/api/ops/approvals");
    if (!response.ok) return;
    const rows = await response.json();
    render(rows);
    listener(rows); // the task list and the task view show which tasks wait
  } catch (_) {
    // The server is away: the page's own connection badge says so; try again later.
  }
}

// The panel kept fresh; `onRows` hears every answer (the task list's `showAwaiting`).
export function watchApprovals(onRows) {
  listener = onRows;
  refresh();
  setInterval(refresh, REFRESH_MS);
}
