// The log view: only the lines on screen are in the page, however long the file.
//
// A file opens at its end: its last TAIL_BYTES through the byte-range file API, then live bytes
// over SSE from where that read stopped. Earlier parts are read in CHUNK_BYTES steps, by
// themselves up to PREFETCH_BYTES, and beyond that as the reader scrolls up. Each line is one
// row of LINE_HEIGHT px (long lines scroll sideways), so the page holds only the rows on screen
// whatever the file's size. Line numbers (and links to a line) appear as soon as the server has
// counted the lines before the first byte read (GET .../files/NAME/lines?offset=), long before
// the file's start is read: a line's number is then that count plus its place in what is read.

import { hashFor } from "./address.js";
import { $ } from "./dom.js";
import { countText } from "./format.js";
import { ansiToNodes, describe, errorMarks } from "./lines.js";
import { search } from "./search.js";
import { state } from "./state.js";

const LINE_HEIGHT = 17;
const TAIL_BYTES = 256 * 1024;
const CHUNK_BYTES = 2 * 1024 * 1024;
const PREFETCH_BYTES = window.runAgentPrefetchBytes ?? 64 * 1024 * 1024; // (a seam for tests)
const OVERSCAN = 30;
const NEWLINE = 10;
const decoder = new TextDecoder();

function concatBytes(a, b) {
  const both = new Uint8Array(a.length + b.length);
  both.set(a, 0);
  both.set(b, a.length);
  return both;
}

export const log = {
  el: $("#log"),
  sizer: null,
  rows: null,
  reset() {
    this.generation = (this.generation || 0) + 1;
    this.lines = []; // whole lines, as text
    this.partial = ""; // the last line while it has no newline yet
    this.from = 0; // the byte offset of the first byte read (0: the file's start is read)
    this.head = null; // bytes at `from` before the first newline: a line cut by the read
    this.url = null;
    this.loading = false;
    this.ended = false;
    this.failure = -1; // the line where the run failed
    this.target = -1; // the file's line (from 0) the address names
    this.targetShown = false;
    this.base = 0; // the file's line number (from 0) of lines[0]; null while not known
    this.shift = 0; // lines prepended since the count of lines before `from` was asked for
    this.shown = "";
    this.drawnTo = 0; // the row after the last one in the page
    this.following = true; // stay at the end as lines arrive (until the reader scrolls up)
    this.rules = null; // how the agent's JSON events read, as its backend says (null: as written)
    this.el.replaceChildren();
    this.sizer = document.createElement("div");
    this.sizer.className = "sizer";
    this.rows = document.createElement("div");
    this.rows.className = "rows";
    this.sizer.append(this.rows);
    this.el.append(this.sizer);
    this.el.scrollTop = 0;
    search.reset();
    this.draw();
  },
  get count() {
    return this.lines.length + (this.partial ? 1 : 0);
  },
  text(i) {
    return i < this.lines.length ? this.lines[i] : this.partial;
  },
  numbered() {
    return this.base !== null;
  },
  atBottom() {
    return this.el.scrollHeight - this.el.scrollTop - this.el.clientHeight < 40;
  },
  // The file at `url` from its end; the byte offset where live bytes take over.
  async open(url) {
    const generation = this.generation;
    this.url = url;
    const probe = await fetch(`${url}?length=0`);
    const size = Number(probe.headers.get("X-File-Size") || 0);
    const from = Math.max(0, size - TAIL_BYTES);
    const bytes = size ? new Uint8Array(await (await fetch(`${url}?offset=${from}&length=${size - from}`)).arrayBuffer()) : new Uint8Array();
    if (generation !== this.generation) return null;
    this.from = from;
    let rest = bytes;
    if (from > 0) {
      const cut = bytes.indexOf(NEWLINE);
      this.head = cut < 0 ? bytes : bytes.slice(0, cut);
      rest = cut < 0 ? new Uint8Array() : bytes.slice(cut + 1);
      this.base = null;
      this.countBefore(generation, from);
    }
    const parts = decoder.decode(rest).split("\n");
    this.partial = parts.pop();
    this.lines = parts;
    this.draw();
    this.el.scrollTop = this.el.scrollHeight;
    this.draw();
    this.prefetch(generation);
    return size;
  },
  // The number of the first line read: the server counts the newlines before `from` (the line
  // cut at `from` is one more), while earlier parts may be prepended meanwhile (`shift`).
  async countBefore(generation, from) {
    this.shift = 0;
    let answer = null;
    try {
      const response = await fetch(`${this.url}/lines?offset=${from}`);
      if (response.ok) answer = await response.json();
    } catch {
      answer = null; // the server is away: numbers come when the file's start is read
    }
    if (!answer || generation !== this.generation || this.base !== null) return;
    this.base = answer.newlines + 1 - this.shift;
    this.draw(true);
    this.showTarget();
  },
  // Earlier parts by themselves, up to PREFETCH_BYTES from the end; the rest on scroll.
  async prefetch(generation) {
    let read = 0;
    while (generation === this.generation && this.from > 0 && read < PREFETCH_BYTES) {
      const got = await this.loadEarlier();
      if (!got) break; // a read the reader's scroll began is under way: it goes on from there
      read += got;
    }
  },
  async loadEarlier() {
    if (this.loading || this.from === 0 || !this.url) return 0;
    this.loading = true;
    const generation = this.generation;
    const from = Math.max(0, this.from - CHUNK_BYTES);
    try {
      const response = await fetch(`${this.url}?offset=${from}&length=${this.from - from}`);
      const bytes = new Uint8Array(await response.arrayBuffer());
      if (generation !== this.generation) return 0;
      let both = concatBytes(bytes, this.head || new Uint8Array());
      let head = null;
      if (from > 0) {
        const cut = both.indexOf(NEWLINE);
        if (cut < 0) {
          this.head = both;
          this.from = from;
          return bytes.length;
        }
        head = both.slice(0, cut);
        both = both.slice(cut + 1);
      }
      const earlier = decoder.decode(both).split("\n");
      this.from = from;
      this.head = head;
      this.prepend(earlier);
      return bytes.length;
    } finally {
      if (generation === this.generation) this.loading = false;
    }
  },
  prepend(earlier) {
    const stick = this.following;
    const top = this.el.scrollTop;
    this.lines = earlier.concat(this.lines);
    if (this.failure >= 0) this.failure += earlier.length;
    if (this.base !== null) this.base = Math.max(0, this.base - earlier.length);
    else this.shift += earlier.length;
    if (this.from === 0 && this.head === null) this.base = 0; // the start is read: exact
    search.shifted(earlier.length);
    this.draw(true);
    this.el.scrollTop = stick ? this.el.scrollHeight : top + earlier.length * LINE_HEIGHT;
    this.draw();
    this.showTarget();
  },
  // Lines that arrive below the rows in the page change only the log's height: a reader scrolled
  // up has their rows left as they are, however fast lines come (rebuilding them for each line
  // kept a slow machine's page busy for as long as the agent wrote).
  append(text, whole = false) {
    const stick = this.following;
    const before = this.lines.length; // the first row that changes (the partial line's)
    const parts = (this.partial + text).split("\n");
    this.partial = parts.pop();
    for (const line of parts) this.lines.push(line);
    if (whole) this.flush();
    search.added(before);
    this.draw(before < this.drawnTo);
    if (stick) this.el.scrollTop = this.el.scrollHeight;
    else if (text) $("#follow-button").hidden = false;
    this.draw();
  },
  flush() {
    if (this.partial) this.lines.push(this.partial);
    this.partial = "";
  },
  // The address's line, once lines are numbered: scrolled to once, earlier parts read first
  // when it lies before what is read.
  showTarget() {
    if (this.target < 0 || this.targetShown || this.base === null) return;
    const at = this.target - this.base;
    if (at < 0 && this.from > 0) {
      const generation = this.generation;
      setTimeout(() => { if (generation === this.generation) this.loadEarlier(); }, 0);
      return;
    }
    if (at < 0 || at >= this.count) return;
    this.targetShown = true;
    this.scrollTo(at);
  },
  scrollTo(i) {
    this.following = false;
    this.el.scrollTop = Math.max(0, i * LINE_HEIGHT - this.el.clientHeight / 3);
    this.draw();
  },
  // The rows on screen (and OVERSCAN more each side), built afresh when that range changes.
  // A log out of sight (the fleet view, a task without runs) draws nothing: reading its box
  // would lay out the whole page, the sidebar's thousand tasks with it, for nothing. It is drawn
  // when it comes into sight (the ResizeObserver below sees its box change).
  draw(force = false) {
    this.sizer.style.height = `${this.count * LINE_HEIGHT}px`;
    if (this.el.closest("[hidden]")) {
      this.shown = "";
      this.drawnTo = 0;
      return;
    }
    const first = Math.max(0, Math.floor(this.el.scrollTop / LINE_HEIGHT) - OVERSCAN);
    const last = Math.min(this.count, first + Math.ceil((this.el.clientHeight || 600) / LINE_HEIGHT) + 2 * OVERSCAN);
    const key = `${first}:${last}:${this.base}`;
    if (!force && key === this.shown) return;
    this.shown = key;
    this.drawnTo = last;
    this.rows.style.transform = `translateY(${first * LINE_HEIGHT}px)`;
    const nodes = [];
    for (let i = first; i < last; i += 1) nodes.push(this.render(i));
    this.rows.replaceChildren(...nodes);
  },
  render(i) {
    const line = this.text(i);
    const div = document.createElement("div");
    div.className = "line";
    div.dataset.index = i;
    if (i === this.failure) div.classList.add("failure");
    if (this.base !== null && i + this.base === this.target) div.classList.add("target");
    if (search.isCurrent(i)) div.classList.add("current-match");
    const number = document.createElement("a");
    number.className = "ln";
    if (this.numbered()) {
      const n = this.base + i + 1;
      number.dataset.ln = n;
      number.href = hashFor(state.task, state.run, state.file) + `/L${n}`;
      number.title = `link to line ${n}`;
    }
    const text = document.createElement("span");
    text.className = "text";
    let described = null;
    if (this.rules && !$("#raw-toggle").checked && line.startsWith("{")) {
      try { described = describe(JSON.parse(line), this.rules); } catch { described = null; }
    }
    if (described) {
      if (!described.length) {
        const span = document.createElement("span");
        span.className = "ev-meta";
        span.textContent = "·";
        text.append(span);
      }
      for (const [kind, said] of described) {
        const span = document.createElement("span");
        span.className = `ev-${kind}`;
        span.textContent = String(said ?? "").replaceAll("\n", " ↵ ");
        text.append(span, document.createTextNode(" "));
      }
    } else {
      text.append(...ansiToNodes(line));
    }
    search.mark(text);
    div.append(number, text);
    return div;
  },
  rerender() {
    this.draw(true);
  },
  // The first error event of a JSON stream, read from the start: where a failed run failed.
  // Only a line holding what one of the rules' errors asks for is parsed.
  findFailure() {
    const marks = this.rules ? errorMarks(this.rules) : [];
    for (let i = 0; i < this.count && marks.length; i += 1) {
      const line = this.text(i);
      if (!line.startsWith("{") || !marks.some((m) => m.every((s) => line.includes(s)))) continue;
      let described = null;
      try { described = describe(JSON.parse(line), this.rules); } catch { continue; }
      if (described && described.some(([kind]) => kind === "error")) return i;
    }
    return -1;
  },
};

search.log = log;

// Copy: every line read so far (the whole file once its start is read), as the file has it.
async function copyLog() {
  const text = log.lines.join("\n") + (log.partial ? `\n${log.partial}` : "");
  const button = $("#copy-button");
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = `copied ${countText(log.count)} lines`;
  } catch {
    button.textContent = "copy refused";
  }
  setTimeout(() => { button.textContent = "copy"; }, 2000);
}

$("#raw-toggle").addEventListener("change", () => log.rerender());
$("#copy-button").addEventListener("click", copyLog);
$("#follow-button").addEventListener("click", () => {
  log.following = true;
  log.el.scrollTop = log.el.scrollHeight;
  log.draw();
  $("#follow-button").hidden = true;
});
log.el.addEventListener("scroll", () => {
  log.draw();
  log.following = log.atBottom();
  if (log.following) $("#follow-button").hidden = true;
  if (log.el.scrollTop < 50 * LINE_HEIGHT) log.loadEarlier();
});
// When the log's box changes size (a window resize, the run header above it growing), a log
// that was following its end stays at its end.
new ResizeObserver(() => {
  if (log.following) log.el.scrollTop = log.el.scrollHeight;
  log.draw();
}).observe(log.el);
