// The task's timeline: its runs as bars on one time axis.

import { $ } from "./dom.js";
import { durationText, ms, timeText } from "./format.js";
import { state } from "./state.js";

// The loop as a picture: one bar per run on the task's time axis, coloured by status, as long as
// the run took; the waits between attempts are the dashed gaps; a person's messages are marks
// where they were sent, each saying the attempt it was handed to (or that it waits for the next).
export function renderTimeline(runs, messages = []) {
  const box = $("#timeline");
  box.replaceChildren();
  box.hidden = runs.length === 0;
  if (!runs.length) return;
  const now = Date.now();
  const spans = runs.map((r) => {
    const start = ms(r.start_time);
    const end = r.end_time ? ms(r.end_time) : r.status === "running" ? now : start;
    return { run: r, start, end: Math.max(end, start) };
  });
  const sent = messages.map((m) => ({ message: m, at: ms(m.at) }));
  const t0 = Math.min(spans[0].start, ...sent.map((m) => m.at));
  const t1 = Math.max(...spans.map((s) => s.end), ...sent.map((m) => m.at), t0 + 1);
  const pct = (t) => `${(((t - t0) / (t1 - t0)) * 100).toFixed(3)}%`;
  const track = document.createElement("div");
  track.className = "track";
  spans.forEach((s, i) => {
    if (i > 0 && s.start > spans[i - 1].end) {
      const gap = document.createElement("div");
      gap.className = "gap";
      gap.style.left = pct(spans[i - 1].end);
      gap.style.width = pct(t0 + (s.start - spans[i - 1].end));
      gap.title = `waited ${durationText((s.start - spans[i - 1].end) / 1000)} before attempt ${s.run.attempt}`;
      track.append(gap);
    }
    const bar = document.createElement("button");
    bar.type = "button";
    bar.className = `bar ${s.run.status}`;
    bar.dataset.run = s.run.run_id;
    if (s.run.run_id === state.run) bar.classList.add("selected");
    bar.style.left = pct(s.start);
    bar.style.width = pct(t0 + (s.end - s.start));
    bar.textContent = `#${s.run.attempt}`;
    bar.title = `attempt ${s.run.attempt}: ${s.run.status}, ${durationText((s.end - s.start) / 1000)}` +
      (s.run.message ? ` — ${s.run.message}` : "");
    bar.setAttribute("aria-label", bar.title);
    track.append(bar);
  });
  const attempts = new Map(runs.map((r) => [r.run_id, r.attempt]));
  for (const { message, at } of sent) {
    const mark = document.createElement("span");
    mark.className = `message-mark${message.run_id ? "" : " waiting"}`;
    mark.style.left = pct(at);
    mark.textContent = "✉";
    const handed = message.run_id ? `handed to attempt ${attempts.get(message.run_id) ?? message.run_id}`
      : "waits for the next attempt";
    mark.title = `message ${message.number}${message.now ? " (now)" : ""} at ${timeText(message.at)}, ${handed}: ${message.text}`;
    mark.setAttribute("aria-label", mark.title);
    track.append(mark);
  }
  const axis = document.createElement("div");
  axis.className = "axis";
  axis.textContent = `${timeText(runs[0].start_time)} → ${durationText((t1 - t0) / 1000)} in all`;
  box.append(track, axis);
}
