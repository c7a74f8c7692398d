// Addresses: the page's own in the hash (#new, #P/T, #P/T/RUN, #P/T/RUN/TAB/L123) and a task's
// in the API, and moving between addresses.

import { TABS } from "./state.js";

// The router shows the view an address names. It registers itself here (it imports the views,
// and the views move the reader with `navigate`), so no module imports one that imports it.
let route = () => undefined;

export function routeWith(router) {
  route = router;
}

export function parseHash() {
  const parts = location.hash.slice(1).split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "new" && parts.length === 1) return { view: "new" };
  if (parts.length < 2) return { view: "home" };
  const [project, task, run, tab, line] = parts;
  const number = /^L(\d+)$/.exec(line || "");
  return {
    view: "task", task: `${project}/${task}`, run: run || null, tab: TABS.includes(tab) ? tab : null,
    line: number && tab ? Number(number[1]) : null,
  };
}

export function hashFor(task, run = null, tab = null, line = null) {
  const parts = [...task.split("/"), run, tab, line && `L${line}`].filter(Boolean).map(encodeURIComponent);
  return `#${parts.join("/")}`;
}

// A new entry in the history (a click); `replace` for the page's own choices (which run and tab
// a task opens on), so Back goes to what the reader saw before, not through them.
export function navigate(hash, replace = false) {
  if (hash === location.hash || (hash === "#" && !location.hash)) return route();
  if (replace) {
    history.replaceState(null, "", hash || location.pathname);
    return route();
  }
  location.hash = hash; // the hashchange event routes
  return undefined;
}

export function taskUrl(label) {
  const [project, task] = label.split("/");
  return `/api/projects/${encodeURIComponent(project)}/tasks/${encodeURIComponent(task)}`;
}
