// Small helpers shared by the pages: DOM building (text only, never innerHTML with data), the API client,
// number formatting, and a poller that stops when the page changes.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// replaceChildren without its pitfalls: nested arrays are flattened, null/undefined/false left out.
export function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}

export class ApiError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code;
    this.param = err.param;
  }
}

// Every call goes to the public /v1 API; the key rides in the HttpOnly cookie set at sign-in. A call that
// changes something says application/json (the server refuses other types with the cookie: auth.py), an upload
// stays multipart; the browser adds the Origin header the server checks.
export async function api(path, { method = "GET", body, form } = {}) {
  const init = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
  if (form) init.body = form;
  else if (method !== "GET") {
    init.headers["Content-Type"] = "application/json";
    if (body !== undefined) init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (res.status === 401 && !path.startsWith("/v1/dashboard/session")) {
    location.hash = "#/login";
  }
  if (!res.ok) throw new ApiError(res.status, data);
  return data;
}

export function qs(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === null || v === undefined || v === "") continue;
    if (Array.isArray(v)) v.forEach((x) => u.append(k, x));
    else u.append(k, v);
  }
  const s = u.toString();
  return s ? `?${s}` : "";
}

export const fmt = {
  int: (n) => (n === null || n === undefined ? "–" : Math.round(n).toLocaleString("en-US")),
  num: (n, d = 3) => (n === null || n === undefined || Number.isNaN(n) ? "–" : Number(n).toPrecision(d)),
  fixed: (n, d = 2) => (n === null || n === undefined ? "–" : Number(n).toFixed(d)),
  money: (n) => (n === null || n === undefined ? "–" : `$${Number(n).toFixed(n < 1 ? 4 : 2)}`),
  duration(s) {
    if (s === null || s === undefined || !Number.isFinite(s)) return "–";
    s = Math.max(0, Math.round(s));
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
  },
  bytes(n) {
    if (n === null || n === undefined) return "–";
    const u = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
  },
  time: (t) => (t ? new Date(t * 1000).toLocaleString() : "–"),
  clock: (t) => (t ? new Date(t * 1000).toLocaleTimeString([], { hour12: false }) : "–"),
};

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

export function badge(status) {
  return h("span", { class: `badge ${status}` }, status);
}

export function toast(message) {
  const el = document.getElementById("toast");
  el.textContent = message;
  el.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { el.hidden = true; }, 2500);
}

export async function copy(text, what) {
  try {
    await navigator.clipboard.writeText(text);
    toast(`${what} copied`);
  } catch {
    toast(`Select the ${what.toLowerCase()} below and copy it`);
  }
}

// A poller tied to the current page: the router aborts `signal` when the user navigates away.
export function poll(signal, fn, ms, immediate = true) {
  let timer = null;
  const tick = async () => {
    if (signal.aborted) return;
    try { await fn(); } catch (e) { if (!(e instanceof ApiError)) console.error(e); }
    if (!signal.aborted) timer = setTimeout(tick, ms);
  };
  signal.addEventListener("abort", () => clearTimeout(timer));
  if (immediate) tick();
  else timer = setTimeout(tick, ms);
}

export function sparkline(values, { width = 110, height = 26, label = "loss" } = {}) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img");
  const finite = values.filter((v) => Number.isFinite(v));
  if (finite.length < 2) {
    svg.setAttribute("aria-label", `${label}: no curve yet`);
    return svg;
  }
  const lo = Math.min(...finite), hi = Math.max(...finite);
  const span = hi - lo || 1;
  const pts = values
    .map((v, i) => (Number.isFinite(v) ? `${((i / (values.length - 1)) * (width - 2) + 1).toFixed(1)},${(height - 2 - ((v - lo) / span) * (height - 4)).toFixed(1)}` : null))
    .filter(Boolean);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", pts.join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", "#1f5fbf");
  line.setAttribute("stroke-width", "1.5");
  svg.append(line);
  svg.setAttribute("aria-label", `${label} from ${finite[0].toPrecision(3)} to ${finite[finite.length - 1].toPrecision(3)}`);
  return svg;
}

export function field(labelText, input, hint) {
  const id = input.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  input.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, labelText, hint ? h("span", { class: "hint" }, ` ${hint}`) : null), input);
}

// ---- settings: their names and labels come from the server's schema, generated from RunConfig's declarations

let schemaOnce = null;
export function settingsSchema() {
  schemaOnce ||= api("/v1/fine_tuning/hyperparameters/schema").catch((e) => { schemaOnce = null; throw e; });
  return schemaOnce;
}

// The API names a setting as `method.<type>.hyperparameters.<key>`, a job parameter by its name, and a setting
// callers cannot set as `the server's “<label>” setting`. In the dashboard each becomes its form field's label,
// a link that opens and highlights the field when the New job page shows it. An action a message points at (the
// schema's `actions`: e.g. the evaluation route) becomes the control on the page that does it.
const API_NAMES = /method\.(?:supervised|dpo)\.hyperparameters\.([a-z_]+)|\b(training_file|validation_file)\b|the server's “([^”]+)” setting/g;

export function inDashboardTerms(text, schema) {
  let message = String(text ?? "");
  if (!schema) return [message];
  // what a message tells its reader to do (an evaluation's route, the checkpoints' list): the page's own controls
  for (const a of Object.values(schema.actions || {})) message = message.split(a.api).join(a.dashboard);
  const props = schema.schema.properties;
  const out = [];
  let last = 0;
  for (const m of message.matchAll(API_NAMES)) {
    out.push(message.slice(last, m.index));
    last = m.index + m[0].length;
    if (m[3]) { out.push(h("strong", {}, `“${m[3]}”`), " (a server setting)"); continue; }
    const key = m[1] || m[2];
    const label = m[1] ? props[key]?.title : schema.job_parameters[key];
    out.push(label ? settingLink(key, label) : m[0]);
  }
  out.push(message.slice(last));
  return out;
}

function settingLink(key, label) {
  return h("a", {
    href: `#/new`, class: "setting-ref", "data-setting": key,
    onclick: (ev) => {
      const target = document.getElementById(`nj-${key}`);
      if (!target) return;  // not on the New job page: the link goes there
      ev.preventDefault();
      const more = target.closest("details");
      if (more) more.open = true;
      target.classList.add("highlight");
      target.focus();
      setTimeout(() => target.classList.remove("highlight"), 2500);
    },
  }, `“${label}”`);
}
