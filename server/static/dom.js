// The page's elements: found by selector, and the status badge every list shows.

import { AWAITING } from "./state.js";

export const $ = (sel) => document.querySelector(sel);

export function badge(status) {
  const span = document.createElement("span");
  span.className = `badge ${status}`;
  span.textContent = status === AWAITING ? "awaiting approval" : status;
  return span;
}
