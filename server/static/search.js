// The log's search box: every line that holds the words, a count, next and previous.

import { $ } from "./dom.js";

// A search box emptied, with its count and marks (a new task's log starts unsearched).
export function clearSearch() {
  clearTimeout(searchTimer);
  $("#search").value = "";
  search.reset();
  search.log.draw(true);
}

// Search: every line that holds the words (the file's text, any case), a count, next and
// previous, and the matches marked on screen.
export const search = {
  log: null, // the log view searched: it hands itself over, as it imports this module
  query: "",
  matches: [],
  current: -1,
  reset() {
    this.matches = [];
    this.current = -1;
    this.query = $("#search").value.toLowerCase();
    if (this.query && this.log.lines) this.run(false);
    else this.show();
  },
  run(jump = true) {
    this.query = $("#search").value.toLowerCase();
    this.matches = [];
    if (this.query) {
      for (let i = 0; i < this.log.count; i += 1) {
        if (this.log.text(i).toLowerCase().includes(this.query)) this.matches.push(i);
      }
    }
    this.current = this.matches.length ? this.matches.length - 1 : -1; // the latest first
    this.show();
    if (jump && this.current >= 0) this.log.scrollTo(this.matches[this.current]);
    this.log.draw(true);
  },
  added(from) {
    if (!this.query) return;
    for (let i = from; i < this.log.count; i += 1) {
      if (this.log.text(i).toLowerCase().includes(this.query) && this.matches.at(-1) !== i) this.matches.push(i);
    }
    this.show();
  },
  shifted(by) {
    if (this.query) {
      const current = this.current >= 0 ? this.matches[this.current] + by : -1;
      this.run(false);
      if (current >= 0) this.current = Math.max(0, this.matches.indexOf(current));
      this.show();
    }
  },
  step(by) {
    if (!this.matches.length) return;
    this.current = (this.current + by + this.matches.length) % this.matches.length;
    this.show();
    this.log.scrollTo(this.matches[this.current]);
    this.log.draw(true);
  },
  isCurrent(i) {
    return this.current >= 0 && this.matches[this.current] === i;
  },
  show() {
    const count = $("#search-count");
    if (!this.query) count.textContent = "";
    else if (!this.matches.length) count.textContent = "no match";
    else count.textContent = `${this.current + 1} of ${this.matches.length}`;
  },
  mark(el) {
    if (!this.query) return;
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    const texts = [];
    while (walker.nextNode()) texts.push(walker.currentNode);
    for (const node of texts) {
      const value = node.nodeValue;
      const lower = value.toLowerCase();
      let at = lower.indexOf(this.query);
      if (at < 0) continue;
      const pieces = [];
      let last = 0;
      while (at >= 0) {
        pieces.push(document.createTextNode(value.slice(last, at)));
        const mark = document.createElement("mark");
        mark.textContent = value.slice(at, at + this.query.length);
        pieces.push(mark);
        last = at + this.query.length;
        at = lower.indexOf(this.query, last);
      }
      pieces.push(document.createTextNode(value.slice(last)));
      node.replaceWith(...pieces);
    }
  },
};

let searchTimer = null;
$("#search").addEventListener("input", () => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => search.run(), 120);
});
$("#search").addEventListener("keydown", (e) => {
  if (e.key !== "Enter") return;
  e.preventDefault();
  clearTimeout(searchTimer);
  if (search.query !== $("#search").value.toLowerCase()) search.run();
  else search.step(e.shiftKey ? -1 : 1);
});
$("#search-prev").addEventListener("click", () => search.step(-1));
$("#search-next").addEventListener("click", () => search.step(1));
