// The connection badge: whether the page's live streams are connected, reconnecting or gone.

import { $ } from "./dom.js";

export function setConnection(kind, text) {
  const el = $("#connection");
  el.className = `conn conn-${kind}`;
  el.textContent = text;
}

export function watchSource(source) {
  source.addEventListener("open", () => setConnection("connected", "live"));
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CLOSED) setConnection("disconnected", "disconnected");
    else setConnection("connecting", "reconnecting…");
  });
}
