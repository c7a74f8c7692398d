// One log line as shown: ANSI colours as classes, an agent's JSON event (claude, codex, gemini)
// described in words.

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

export function describeEvent(ev) {
  // claude
  if (ev.type === "assistant" && ev.message) {
    return (ev.message.content || []).map((b) => b.type === "text" ? ["assistant", b.text]
      : b.type === "tool_use" ? ["tool", `⚙ ${b.name} ${JSON.stringify(b.input)}`] : null).filter(Boolean);
  }
  if (ev.type === "user" && ev.message) {
    return (ev.message.content || []).filter((b) => b.type === "tool_result")
      .map((b) => [b.is_error ? "error" : "tool", `↳ ${typeof b.content === "string" ? b.content : JSON.stringify(b.content)}`]);
  }
  if (ev.type === "result" && "is_error" in ev) return [[ev.is_error ? "error" : "result", `result: ${ev.result ?? ev.subtype}`]];
  if (ev.type === "system") return [["meta", `system ${ev.subtype || ""} ${ev.model || ev.message || ""}`]];
  // codex
  if (ev.item) {
    const item = ev.item;
    if (item.type === "agent_message") return [["assistant", item.text]];
    if (item.type === "command_execution") return [["tool", `⚙ ${item.command} ${item.exit_code ?? ""}`]];
    if (item.type === "error") return [["error", item.message]];
  }
  if (ev.type === "turn.failed") return [["error", `turn failed: ${ev.error && ev.error.message}`]];
  if (ev.type === "error") return [["error", ev.message || JSON.stringify(ev.error)]];
  // gemini
  if (ev.type === "message") return ev.role === "assistant" ? [["assistant", ev.content]] : [["meta", `${ev.role}: ${ev.content}`]];
  if (ev.type === "tool_use") return [["tool", `⚙ ${ev.tool_name} ${JSON.stringify(ev.parameters)}`]];
  if (ev.type === "tool_result") return [["tool", `↳ ${ev.status} ${ev.output || ""}`]];
  if (ev.type === "result") return [[ev.status === "error" ? "error" : "result", `result: ${ev.status} ${ev.error ? ev.error.message : ""}`]];
  if (ev.type) return [["meta", ev.type]];
  return null;
}
