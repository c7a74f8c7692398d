// A paste run's panel (the copy-paste protocol): the outbox to carry to a chat window, its size
// and a Copy button; a box for the chat's reply and Send; the last reply's results, the model's
// messages, and the summary once it said DONE. The task view shows it with the task; the root
// stream's `paste` event refreshes it. Everything from the server is shown as text, never as markup.

import { countText } from "./format.js";

const panel = document.createElement("section");
panel.id = "paste";
panel.hidden = true;
panel.setAttribute("aria-label", "paste session");
// Static markup only; the session's values are set with textContent below.
panel.innerHTML = `
  <h3>Paste <span id="paste-state" class="muted"></span></h3>
  <div id="paste-outbox">
    <p class="paste-meta">
      outbox <code id="paste-name"></code> · sequence <span id="paste-sequence"></span> ·
      <span id="paste-size"></span>
      <button type="button" id="paste-copy">Copy</button>
      <span id="paste-copied" aria-live="polite"></span>
    </p>
    <textarea id="paste-fallback" readonly hidden aria-label="the outbox, selected: press Ctrl+C to copy"></textarea>
    <details id="paste-text-box"><summary>outbox text</summary><pre id="paste-text"></pre></details>
  </div>
  <div id="paste-results-box" hidden><h4>Results of the last reply</h4><div id="paste-results"></div></div>
  <div id="paste-messages-box" hidden><h4>Messages</h4><div id="paste-messages"></div></div>
  <p id="paste-summary-box" hidden><strong>DONE</strong> <span id="paste-summary"></span></p>
  <form id="paste-form" data-needs="operate">
    <label for="paste-reply">Reply <span class="muted">(paste the chat's whole answer)</span></label>
    <textarea id="paste-reply" name="reply" rows="6" spellcheck="false" autocomplete="off"></textarea>
    <div class="row">
      <button type="submit" id="paste-send" title="send the reply (Ctrl+Enter)">Send</button>
      <span id="paste-sent" class="muted" aria-live="polite"></span>
      <span id="paste-error" class="error" aria-live="polite"></span>
    </div>
    <p id="paste-note" class="muted" hidden></p>
  </form>`;
const el = (id) => panel.querySelector(`#${id}`);
let label = null; // "P/T" the panel is for
let view = null; // its GET .../paste answer
let status = null; // the task's status, from its detail
let asked = 0; // requests made, so an older answer never replaces a newer one

const url = (of) => {
  const [project, task] = of.split("/");
  return `/api/projects/${encodeURIComponent(project)}/tasks/${encodeURIComponent(task)}/paste`;
};

function line(tag, text, cls) {
  const node = document.createElement(tag);
  node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

const waiting = (n) => (n === 1 ? "a reply" : `${n} replies`);

function render() {
  const v = view;
  panel.hidden = !v;
  if (!v) return;
  el("paste-state").textContent = v.complete
    ? `· session ${v.session} complete`
    : `· session ${v.session} · waiting for the reply to outbox ${v.sequence}` +
      (v.waiting_replies.length ? ` · ${waiting(v.waiting_replies.length)} in the inbox, not yet carried out` : "");
  el("paste-outbox").hidden = v.complete;
  el("paste-form").hidden = v.complete;
  if (!v.complete) {
    el("paste-name").textContent = v.outbox;
    el("paste-sequence").textContent = v.sequence;
    el("paste-size").textContent = v.size === null
      ? "the outbox file cannot be read" : `${countText(v.size)} characters`;
    el("paste-copy").disabled = v.text === null;
    const text = el("paste-text");
    if (text.textContent !== (v.text || "")) text.textContent = v.text || "";
  }
  const results = el("paste-results");
  results.replaceChildren();
  for (const r of v.results) {
    const item = line("div", "", `result ${r.success ? "ok" : "failed"}`);
    const [head, ...rest] = r.lines;
    item.append(line("div", head, "head"));
    if (rest.length) item.append(line("pre", rest.join("\n"), "output"));
    results.append(item);
  }
  el("paste-results-box").hidden = v.results.length === 0;
  const messages = el("paste-messages");
  messages.replaceChildren(...v.messages.map((m) => line("div", m, "message")));
  el("paste-messages-box").hidden = v.messages.length === 0;
  el("paste-summary-box").hidden = !v.complete;
  el("paste-summary").textContent = v.summary || "(no summary)";
  const note = el("paste-note");
  note.hidden = v.complete || status === "running" || status === null;
  note.textContent = "The task is not running: a reply sent now waits in the inbox until it is resumed.";
}

async function refresh() {
  const of = label;
  if (!of) return;
  const mine = ++asked;
  let found = null;
  try {
    const response = await fetch(url(of));
    if (response.ok) found = await response.json();
    else if (response.status !== 404) return; // keep what is shown; the next event retries
  } catch {
    return; // the server is away: the connection badge says so
  }
  if (of !== label || mine !== asked) return;
  if (view && found && (found.session !== view.session || found.sequence !== view.sequence)) {
    el("paste-copied").textContent = ""; // a new outbox: not copied yet
    el("paste-sent").textContent = "";
    el("paste-fallback").hidden = true;
  }
  view = found;
  render();
}

// The selected task (the task view, after reading its detail); `paste` says it has a paste folder.
function show(of, detail) {
  status = detail ? detail.status : null;
  if (of !== label) {
    label = of;
    view = null;
    el("paste-reply").value = ""; // a reply typed for one task is never sent to another
    for (const id of ["paste-sent", "paste-error", "paste-copied"]) el(id).textContent = "";
    el("paste-fallback").hidden = true;
    el("paste-text-box").open = false;
    render();
  }
  if ((detail && detail.paste) || view) refresh();
  else render();
}

function hide() {
  label = null;
  view = null;
  render();
}

// Copy: the clipboard API where the page may use it (https, localhost); else (http on a LAN
// address) the outbox in a selected text box, copied with execCommand, or left selected for
// the person's own Ctrl+C.
async function copy() {
  const text = view && view.text;
  if (text === null || text === undefined) return;
  const said = el("paste-copied");
  const area = el("paste-fallback");
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      area.hidden = true;
      said.textContent = `copied ${countText(text.length)} characters`;
      return;
    } catch {
      // refused (no permission, the page not focused): the fallback below
    }
  }
  area.value = text;
  area.hidden = false;
  area.focus();
  area.select();
  area.setSelectionRange(0, text.length);
  let done = false;
  try {
    done = document.execCommand("copy");
  } catch {
    done = false;
  }
  if (done) {
    area.hidden = true;
    said.textContent = `copied ${countText(text.length)} characters`;
  } else {
    said.textContent = "the browser would not copy: the outbox is selected below, press Ctrl+C (⌘C)";
  }
}

async function send(event) {
  event.preventDefault();
  const of = label;
  const box = el("paste-reply");
  const button = el("paste-send");
  el("paste-error").textContent = "";
  el("paste-sent").textContent = "sending…";
  button.disabled = true;
  try {
    const response = await fetch(url(of), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ reply: box.value }),
    });
    let answer = {};
    try {
      answer = await response.json();
    } catch {
      answer = {};
    }
    if (of !== label) return;
    if (!response.ok) {
      el("paste-sent").textContent = "";
      el("paste-error").textContent = answer.error || `the server refused it (${response.status})`;
      return;
    }
    box.value = "";
    el("paste-sent").textContent = `sent as ${answer.file}; the run reads it in a moment`;
  } catch {
    if (of === label) {
      el("paste-sent").textContent = "";
      el("paste-error").textContent = "the server cannot be reached; the reply is still in the box";
    }
  } finally {
    button.disabled = false;
  }
  await refresh();
}

el("paste-copy").addEventListener("click", copy);
el("paste-form").addEventListener("submit", send);
el("paste-reply").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
    e.preventDefault();
    el("paste-form").requestSubmit();
  }
});
// A module runs once the page is parsed: its place in the task view is there.
document.querySelector("#task-view").insertBefore(panel, document.querySelector("#task-git"));
export const pastePanel = { show, hide, refresh };
