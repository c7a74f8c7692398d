// Numbers and times as the page writes them: usage, sizes, durations, dates.

// A whole number with its thousands grouped (12,345), as toLocaleString("en") writes it, without
// the first locale-aware call's cost (loading the locale's data took 50 ms of the page's opening).
export function countText(n) {
  return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

export function usageText(u) {
  const tokens = `${countText(u.tokens_in)} tokens in, ${countText(u.tokens_out)} out`;
  return u.cost_usd == null ? tokens : `${tokens}, $${u.cost_usd.toFixed(4)}`;
}

export function bytesText(n) {
  const units = ["bytes", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return i === 0 ? `${n} bytes` : `${n.toFixed(1)} ${units[i]}`;
}

export const ms = (iso) => (iso ? Date.parse(iso) : NaN);

export function durationText(seconds) {
  if (!Number.isFinite(seconds)) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return h ? `${h} h ${m} min` : `${m} min ${s % 60} s`;
}

export function timeText(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString("sv-SE").replace(" ", " ");
}
