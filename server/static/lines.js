// One log line as shown: ANSI colours as classes, or an agent's JSON event in words, read by the
// rules its backend states (runagent/loop/lines.py says how they are written). No agent's event
// format is known here: the server tells the rules of each backend.

const ANSI = /\x1b\[([0-9;]*)m|\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07/g;

export function ansiToNodes(text) {
  const nodes = [];
  let classes = [];
  let last = 0;
  const push = (s) => {
    if (!s) return;
    const span = document.createElement("span");
    span.textContent = s;
    if (classes.length) span.className = classes.join(" ");
    nodes.push(span);
  };
  for (const m of text.matchAll(ANSI)) {
    push(text.slice(last, m.index));
    last = m.index + m[0].length;
    if (m[1] === undefined) continue;
    for (const code of (m[1] || "0").split(";").map(Number)) {
      if (code === 0) classes = [];
      else if (code === 1) classes.push("ansi-bold");
      else if (code === 39) classes = classes.filter((c) => !c.startsWith("fg-"));
      else if ((code >= 30 && code <= 37) || (code >= 90 && code <= 97)) {
        classes = classes.filter((c) => !c.startsWith("fg-"));
        classes.push(`fg-${code}`);
      }
    }
  }
  push(text.slice(last));
  return nodes;
}

const told = new Map(); // backend name -> a promise of its rules (null: lines as written)

// The rules a run of `backend` has its stdout lines read by, asked of the server once a backend.
export function rulesOf(backend) {
  if (!told.has(backend)) {
    const asked = fetch(`/api/backends/${encodeURIComponent(backend)}/lines`)
      .then((r) => (r.ok ? r.json() : null))
      .then((answer) => (answer && answer.rules.length ? answer.rules : null))
      .catch(() => {
        told.delete(backend); // the server is away: asked again next time
        return null;
      });
    told.set(backend, asked);
  }
  return told.get(backend);
}

// The value at `path` (field names joined by dots) of `value`; undefined where there is none.
function at(value, path) {
  for (const name of path.split(".")) {
    if (value === null || typeof value !== "object" || !Object.hasOwn(value, name)) return undefined;
    value = value[name];
  }
  return value;
}

function matches(event, rule) {
  return Object.entries(rule.when).every(([path, value]) => at(event, path) === value)
    && rule.has.every((path) => at(event, path) != null);
}

// A part's text: each {PATH|PATH...} as the first value there, a string as it is, else as JSON.
function fill(text, event) {
  return text.replace(/\{([^{}]*)\}/g, (_, paths) => {
    for (const path of paths.split("|")) {
      const value = at(event, path);
      if (value != null) return typeof value === "string" ? value : JSON.stringify(value);
    }
    return "";
  });
}

// The parts [kind, text] `event` reads as by the first of `rules` it matches; null for none.
export function describe(event, rules) {
  const rule = rules.find((r) => matches(event, r));
  if (!rule) return null;
  if (rule.show) return rule.show.map(([kind, text]) => [kind, fill(text, event)]);
  const list = at(event, rule.each);
  if (list == null) return [];
  if (!Array.isArray(list)) return null;
  return list.flatMap((item) => describe(item, rule.rules) || []);
}

// For each way `rules` show an error, the strings it asks an event to hold, as JSON spells them:
// a line holding an error event holds each of one of these (a look before parsing it).
export function errorMarks(rules, above = []) {
  const marks = [];
  for (const rule of rules) {
    const needs = above.concat(Object.values(rule.when).filter((v) => typeof v === "string")
      .map((v) => JSON.stringify(v)));
    if (rule.each) marks.push(...errorMarks(rule.rules, needs));
    else if (rule.show.some(([kind]) => kind === "error")) marks.push(needs);
  }
  return marks;
}
