// downcluster console: plain JavaScript, no framework, nothing fetched from outside this server.
// Every value from the server is put in the page with textContent (never as HTML).
// Every control that calls the API carries data-action="<operationId>" (as in /api/v1/openapi.json);
// a control the token's role may not use is not drawn (the API refuses it anyway).
"use strict";

const state = { me: null, csrf: null, timer: null, sockets: new Map(), project: "", forms: new Map(),
  errors: new Map(), sort: new Map(), filter: new Map(), cursor: new Map(), secret: null, drawn: 0 };
const FINAL = ["SUCCESS", "FAIL", "CANCEL", "EXPIRED"];
const TASK_STATUSES = ["LIVE", "DISPATCH", "SUCCESS", "FAIL", "CANCEL", "DEAD"];
const CANCELLABLE = ["LIVE", "DISPATCH", "FAIL"], REQUEUEABLE = ["FAIL", "DEAD", "CANCEL"];
const TIMED = ["overview", "jobs", "job", "logs"]; // redrawn every 3 s; the rest live by WebSocket or on action
const $ = (id) => document.getElementById(id);

// --- roles: which operations a role's token may call (master/access.py) ----------------------
const ADMIN_OPS = ["create_project", "list_tokens", "create_token", "grant_token", "revoke_token", "get_audit",
  "enable_type", "disable_type", "dispatch"];
const CHANGE_OPS = ["register_job", "enable_job", "disable_job", "generator_on", "generator_off", "generator_run",
  "add_job_tasks", "cancel_tasks", "requeue_tasks", "dry_run_job", "show_dry_run"];
function may(op) {
  const role = state.me ? state.me.role : "";
  if (role === "admin") return true;
  if (ADMIN_OPS.includes(op)) return false;
  return CHANGE_OPS.includes(op) ? role === "user" : true;
}
// an export's (a download task's) cancel and retry: its requester or an admin
const mine = (requestedBy) => state.me.role === "admin" || requestedBy === state.me.name;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node[k] = v;
    else if (k === "class") node.className = v;
    else if (k === "width") node.style.width = v; // CSSOM: allowed under the page's CSP, unlike a style attribute
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== "" && c != null) node.append(c instanceof Node ? c : document.createTextNode(c));
  return node;
}

async function api(method, path, body, raw) {
  const headers = {};
  if (method !== "GET") headers["X-CSRF-Token"] = state.csrf || "";
  let payload;
  if (typeof body === "string") { headers["Content-Type"] = "text/plain"; payload = body; }
  else if (body !== undefined) { headers["Content-Type"] = "application/json"; payload = JSON.stringify(body); }
  const res = await fetch("/api/v1" + path, { method, headers, credentials: "same-origin", body: payload });
  if (res.status === 401 && path !== "/session") { showSignIn(); throw new Error("signed out"); }
  if (raw && res.ok) return res;
  const data = await res.json().catch(() => ({ error: `${res.status} ${res.statusText}` }));
  if (!res.ok) throw new Error(data.error || res.statusText);
  return data;
}
const q = encodeURIComponent;
const age = (s) => (s == null ? "-" : s < 120 ? `${s.toFixed(0)} s` : `${(s / 60).toFixed(1)} min`);
const when = (iso) => (iso ? iso.replace("T", " ").slice(0, 19) : "-");
const num = (n) => (n == null ? "-" : Number(n).toLocaleString("en"));
function flash(text, bad) { const s = $("status"); s.textContent = text; s.className = bad ? "error" : "ok"; }
const oneLine = (text) => String(text).split("\n")[0].slice(0, 400);

// A control calling operation ``op``: not drawn when the role may not; its error is one line
// right beside it (kept across redraws until it is used again or the page changes).
function act(op, label, fn, opts = {}) {
  if (!may(op)) return "";
  const key = `${op}:${opts.key || label}`;
  const err = el("span", { class: "error inline", "data-error-for": key }, state.errors.get(key) || "");
  const button = el("button", { type: "button", "data-action": op, class: opts.cls || "", title: opts.title,
    onclick: async (e) => {
      e.preventDefault();
      try {
        const r = await fn();
        state.errors.delete(key); err.textContent = "";
        if (r !== undefined) flash(`${label}: ${typeof r === "string" ? r : JSON.stringify(r)}`);
        if (!opts.stay) refresh(true);
      } catch (x) {
        state.errors.set(key, oneLine(x.message)); err.textContent = oneLine(x.message);
      }
    } }, label);
  return el("span", { class: "act" }, button, err);
}

// --- tables: sort by a column (its header is a button), filter by status, page ---------------
// columns: {title, value(row) -> text or Node, key(row) -> sortable, num}
const col = (title, value, num, key) => ({ title, num,
  value: typeof value === "function" ? value : (r) => r[value],
  key: key || (typeof value === "function" ? null : (r) => r[value]) });

function table(columns, rows, empty = "nothing yet", id = "") {
  const sorted = sortRows(id, columns, rows);
  const head = el("tr", {}, columns.map((c, i) => el("th", { class: c.num ? "num" : "", scope: "col",
    "aria-sort": sortMark(id, i) }, c.key && id ? el("button", { type: "button", class: "sort",
    onclick: () => { toggleSort(id, i); refresh(true); } }, c.title, sortArrow(id, i)) : c.title)));
  const body = sorted.length ? sorted.map((r) => el("tr", {}, columns.map((c) => {
    const v = c.value(r);
    return el("td", { class: c.num ? "num" : "", "data-label": c.title }, v instanceof Node ? v : String(v ?? "-"));
  }))) : [el("tr", {}, el("td", { colspan: columns.length, class: "muted" }, empty))];
  return el("div", { class: "scroll" }, el("table", { id: id || undefined }, el("thead", {}, head), el("tbody", {}, body)));
}
function sortRows(id, columns, rows) {
  const s = state.sort.get(id);
  if (!s || !columns[s.i] || !columns[s.i].key) return rows;
  const key = columns[s.i].key;
  return [...rows].sort((a, b) => {
    const x = key(a), y = key(b);
    const c = typeof x === "number" && typeof y === "number" ? x - y : String(x ?? "").localeCompare(String(y ?? ""));
    return s.dir * c;
  });
}
function toggleSort(id, i) {
  const s = state.sort.get(id);
  state.sort.set(id, { i, dir: s && s.i === i ? -s.dir : 1 });
}
const sortMark = (id, i) => { const s = state.sort.get(id); return s && s.i === i ? (s.dir > 0 ? "ascending" : "descending") : undefined; };
const sortArrow = (id, i) => { const s = state.sort.get(id); return s && s.i === i ? (s.dir > 0 ? " ▲" : " ▼") : ""; };

// A status filter (a select; "" is every status) whose choice is kept per table.
function statusFilter(id, choices, label = "status") {
  const pick = el("select", { id: `filter-${id}`, "aria-label": `${label} shown`, onchange: (e) => {
    state.filter.set(id, e.target.value); state.cursor.delete(id); refresh(true);
  } }, el("option", { value: "" }, `every ${label}`), choices.map((c) => el("option", { value: c }, c)));
  pick.value = state.filter.get(id) || "";
  return el("label", { class: "filter" }, `${label} `, pick);
}

// Cursor paging (the API's ``next``): a stack of the cursors that led here, so "Previous" works.
function pager(id, op, next) {
  const stack = state.cursor.get(id) || [];
  const go = (s) => { state.cursor.set(id, s); refresh(true); };
  return el("div", { class: "pager" },
    el("button", { type: "button", "data-action": op, disabled: !stack.length, onclick: () => go(stack.slice(0, -1)) }, "Previous"),
    el("span", { class: "muted" }, `page ${stack.length + 1}`),
    el("button", { type: "button", "data-action": op, disabled: !next, onclick: () => go([...stack, next]) }, "Next"));
}
const cursorOf = (id) => { const s = state.cursor.get(id) || []; return s.length ? s[s.length - 1] : null; };

// A form built once and kept, so a redraw never loses what was typed.
function keep(key, build) {
  if (!state.forms.has(key)) state.forms.set(key, build());
  return state.forms.get(key);
}
function formError(form) { return form.querySelector(".form-error"); }
async function submitting(form, fn) {
  const err = formError(form);
  try { err.textContent = ""; await fn(); } catch (x) { err.textContent = oneLine(x.message); }
}
const field = (label, input, cls) => el("label", { class: cls || "" }, label, " ", input);

// --- charts: SVG drawn here (no library, nothing from a CDN) ------------------------------
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2f6fde", "#d64545", "#2e9e5b", "#c98a1a", "#7b4fc4", "#1d9bb0", "#888"];
function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  for (const c of children.flat(Infinity)) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}
const hhmm = (t) => new Date(t * 1000).toISOString().slice(11, 16);

// The top of a y axis labelled at 0, half and top: for whole counts (queue depths, pages) an even
// whole number, so the three labels are whole and distinct (0, 1, 2 for a depth of 1); else a
// "nice" number (1, 2 or 5 times a power of ten).
function axisTop(values) {
  const high = Math.max(0, ...values);
  if (values.every(Number.isInteger)) return 2 * Math.max(1, Math.ceil(high / 2));
  const p = 10 ** Math.floor(Math.log10(high || 1));
  return [1, 2, 5, 10].map((m) => m * p).find((n) => n >= high) || 10 * p;
}
const axisLabel = (v) => (Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(3))));

// One line per series over [from, to]; points are {minute, <series>: value}; a minute without
// a point counts as 0 for counters (``zeros``) and as a gap otherwise.
function lineChart(id, title, from, to, points, names, zeros) {
  const W = 560, H = 180, L = 44, R = 14, T = 10, B = 24;
  const max = axisTop(points.flatMap((p) => names.map((n) => p[n] || 0)));
  const x = (t) => L + ((t - from) / Math.max(1, to - from)) * (W - L - R);
  const y = (v) => T + (1 - v / max) * (H - T - B);
  const grid = [0, 0.5, 1].map((f) => [svg("line", { x1: L, x2: W - R, y1: y(max * f), y2: y(max * f), stroke: "#e3e7f0" }),
    svg("text", { x: L - 4, y: y(max * f) + 4, "text-anchor": "end", "font-size": 10, fill: "#666", class: "y-tick" }, axisLabel(max * f))]);
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((f) => svg("text", { x: x(from + f * (to - from)), y: H - 6, "text-anchor": "middle",
    "font-size": 10, fill: "#666" }, hhmm(from + f * (to - from))));
  const byMinute = new Map(points.map((p) => [p.minute, p]));
  const lines = names.map((n, i) => {
    let d = "", pen = false;
    for (let t = Math.floor(from / 60) * 60; t <= to; t += 60) {
      const p = byMinute.get(t);
      if (!p && !zeros) { pen = false; continue; }
      const v = p ? p[n] || 0 : 0;
      d += `${pen ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`; pen = true;
    }
    const dots = zeros ? [] : points.filter((p) => p[n] != null).map((p) => svg("circle", { cx: x(p.minute).toFixed(1),
      cy: y(p[n]).toFixed(1), r: 2, fill: COLORS[i % COLORS.length] }));  // a lone sample still shows
    return [svg("path", { d: d || "M0,0", fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 1.5, "data-series": n }), dots];
  });
  const legend = names.map((n, i) => svg("text", { x: L + 8 + i * 86, y: T + 10, "font-size": 11, fill: COLORS[i % COLORS.length] }, n));
  return el("figure", { class: "chart", id }, el("figcaption", {}, title),
    svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": title }, grid, ticks, lines, legend));
}

// --- views -----------------------------------------------------------------------------
const views = {};

views.overview = async function () {
  const fresh = state.series && Date.now() - state.seriesAt < 30000;  // the charts move by the minute
  const [d, s] = await Promise.all([api("GET", "/overview"), fresh ? state.series : api("GET", "/series")]);
  if (!fresh) { state.series = s; state.seriesAt = Date.now(); }
  const queues = [...new Set(s.depths.flatMap((p) => Object.keys(p).filter((k) => k !== "minute")))]
    .sort((a, b) => Math.max(...s.depths.map((p) => p[b] || 0)) - Math.max(...s.depths.map((p) => p[a] || 0))).slice(0, 6);
  const rate = d.last_hour.rate == null ? "-" : (d.last_hour.rate * 100).toFixed(1) + "%";
  const card = (value, text, id) => el("div", { class: "card", id }, el("b", {}, value), el("span", {}, text));
  return [
    el("h1", {}, "Overview ", act("dispatch", "Dispatch now", () => api("POST", "/dispatch"))),
    el("div", { class: "cards" },
      card(rate, `success, last hour (${d.last_hour.success} ok, ${d.last_hour.fail} failed)`, "card-rate"),
      card(String(d.workers.length), "workers alive"), card(String(d.queues.reduce((a, x) => a + x.depth, 0)), "entries queued")),
    el("h2", {}, "Last 24 hours"),
    el("div", { class: "charts" },
      lineChart("chart-pages", "pages per minute (UTC)", s.from, s.to, s.pages, ["stored", "failed"], true),
      lineChart("chart-depth", "queue depth (entries, as sampled)", s.from, s.to, s.depths, queues, false)),
    el("h2", {}, "Queues"),
    table([col("queue", "queue"), col("depth", "depth", 1), col("cap", "cap", 1),
      col("fill", (x) => x.cap == null ? "-" : el("div", { class: "bar", title: `${x.depth}/${x.cap}` }, el("i", { width: `${Math.min(100, 100 * x.depth / Math.max(1, x.cap)).toFixed(0)}%` }))),
      col("oldest entry", (x) => age(x.oldest_age_s), 1, (x) => x.oldest_age_s || 0)], d.queues, "no queues", "t-queues"),
    el("h2", {}, "Workers"),
    table([col("worker", "id"), col("host", "host"), col("downloads in flight", "inflight", 1),
      col("entries done", "entries_done", 1), col("running jobs", (w) => w.jobs.join(", ") || "-")], d.workers, "no worker alive", "t-workers"),
    el("h2", {}, "Hosts throttled now"),
    table([col("host", "host"), col("in flight", "in_flight", 1),
      col("why", (h) => (h.paused_s ? `paused ${h.paused_s} s more (Retry-After)` : "at its limit"))], d.throttled_hosts || [], "no host throttled"),
    el("h2", {}, "Recent alerts"),
    table([col("when", (a) => when(a.add_datetime), 0, (a) => a.add_datetime), col("job", "job"), col("type", "type"), col("reason", "reason")], d.alerts, "no alerts", "t-alerts"),
  ];
};

const JOB_PAGE = 50;
views.jobs = async function () {
  const d = inProject(await api("GET", "/jobs"), "jobs");
  const statuses = ["LIVE", "DISPATCH", "SUCCESS", "FAIL", "CANCEL", "DEAD", "queued", "running"];
  const shown = d.jobs.filter((j) => !state.filter.get("t-jobs") || j.status === state.filter.get("t-jobs"));
  const page = Number(state.cursor.get("t-jobs-n") || 0), pages = Math.max(1, Math.ceil(shown.length / JOB_PAGE));
  const cols = [col("job", (j) => el("a", { href: `#/job/${q(j.name)}` }, j.name), 0, (j) => j.name),
    col("status", (j) => el("span", { class: `status-${j.status}` }, j.status), 0, (j) => j.status),
    col("priority", "priority", 1), col("type", "type"), col("host", (j) => j.host || "-", 0, (j) => j.host),
    ...statuses.map((s) => col(s, (j) => num(j.counts[s]), 1, (j) => j.counts[s] || 0))];
  if (may("enable_job")) cols.push(col("", (j) => onOff(j)));
  const go = (n) => { state.cursor.set("t-jobs-n", n); refresh(true); };
  return [el("h1", {}, "Jobs ", may("register_job") ? el("a", { class: "button", href: "#/register", "data-action": "register_job" }, "Register a job") : ""),
    el("div", { class: "tools" }, statusFilter("t-jobs", ["ON", "OFF"])),
    table(cols, sortRows("t-jobs", cols, shown).slice(page * JOB_PAGE, (page + 1) * JOB_PAGE), "no jobs registered", "t-jobs"),
    pages > 1 ? el("div", { class: "pager" }, el("button", { type: "button", disabled: page === 0, onclick: () => go(page - 1) }, "Previous"),
      el("span", { class: "muted" }, `page ${page + 1} of ${pages}`), el("button", { type: "button", disabled: page + 1 >= pages, onclick: () => go(page + 1) }, "Next")) : ""];
};
const onOff = (j) => (j.status === "ON"
  ? act("disable_job", "Disable", () => api("POST", `/jobs/${q(j.name)}/disable`), { cls: "danger", key: j.name })
  : act("enable_job", "Enable", () => api("POST", `/jobs/${q(j.name)}/enable`), { key: j.name }));

views.job = async function (name) {
  const n = q(name), filter = state.filter.get("t-tasks") || "", after = cursorOf("t-tasks");
  const taskQuery = `limit=20${filter ? `&status=${filter}` : ""}${after ? `&after=${after}` : ""}`;
  const [j, tasks, data] = await Promise.all([api("GET", `/jobs/${n}`), api("GET", `/jobs/${n}/tasks?${taskQuery}`),
    api("GET", `/jobs/${n}/data?limit=20`)]);
  const counts = TASK_STATUSES.map((k) => `${k} ${num(j.counts[k])}`).join(" · ");
  return [
    el("h1", {}, `Job ${j.name} `, el("span", { class: `status-${j.status}` }, j.status), " ", onOff(j),
      may("register_job") ? el("a", { class: "button", href: `#/edit/${n}`, "data-action": "register_job" }, "Change settings and code") : ""),
    el("p", {}, `project ${j.project ?? "-"} · priority ${j.priority} · ${j.type} downloader (${num(j.code_chars)} chars of code) · engine ${j.settings ? j.settings.download_engine : "-"} · host ${j.host || "any"}`),
    el("p", { class: "muted", id: "job-counts" }, counts),
    ...generatorSection(j, n),
    ...(may("dry_run_job") ? dryRunSection(name) : []),
    ...(may("add_job_tasks") ? addUrlsSection(name) : []),
    ...(may("cancel_tasks") ? bulkSection(name) : []),
    el("h2", {}, "Tasks"),
    el("div", { class: "tools" }, statusFilter("t-tasks", TASK_STATUSES), lookupForm(name)),
    table(taskColumns(), tasks.tasks, filter ? `no ${filter} tasks` : "no tasks", "t-tasks"),
    pager("t-tasks", "list_tasks", tasks.next),
    el("h2", {}, "Recent failures"),
    table([col("url", (t) => el("a", { href: `#/task/${t.id}` }, t.uri), 0, (t) => t.uri), col("attempts", "download_times", 1),
      col("reason", "failed_reason"), col("when", (t) => when(t.last_update_datetime), 0, (t) => t.last_update_datetime)], j.recent_failures, "no failures", "t-fail"),
    el("h2", {}, "Data (oldest first) ", el("a", { class: "button", href: `#/exports/${n}`, "data-action": "request_export" }, "Export…")),
    table([col("url", "url"), col("status", "status_code", 1), col("size", "size", 1), col("stored", (r) => when(r.add_datetime), 0, (r) => r.add_datetime),
      col("", (r) => el("button", { type: "button", "data-action": "get_body", onclick: () => preview(r) }, "Preview"))], data.data, "no data stored", "t-data"),
  ];
};
const taskColumns = () => [
  col("url", (t) => el("a", { href: `#/task/${t.id}` }, t.uri), 0, (t) => t.uri),
  col("status", (t) => el("span", { class: `task-${t.status}` }, t.status), 0, (t) => t.status),
  col("attempts", "download_times", 1), col("recoveries", "recoveries", 1), col("reason", (t) => t.failed_reason || "-", 0, (t) => t.failed_reason),
  col("updated", (t) => when(t.last_update_datetime), 0, (t) => t.last_update_datetime)];

function lookupForm(name) {
  const input = el("input", { id: "lookup-url", type: "url", placeholder: "find a task by its URL", size: "34", "aria-label": "a task's URL" });
  const err = el("span", { class: "error form-error" });
  return el("form", { class: "inline-form", onsubmit: async (e) => {
    e.preventDefault();
    try { const t = await api("GET", `/jobs/${q(name)}/tasks/lookup?url=${q(input.value.trim())}`); location.hash = `#/task/${t.id}`; }
    catch (x) { err.textContent = oneLine(x.message); }
  } }, input, el("button", { type: "submit", "data-action": "find_task" }, "Find"), err);
}

// Dry run: the job's engine on one URL, on a worker, with a task's walls; nothing stored. Its
// answer is waited for 20 s a request (a blocking pop on the server), asked again while it waits.
function dryRunSection(name) {
  const form = keep(`dry:${name}`, () => {
    const url = el("input", { id: "dry-url", type: "url", required: true, placeholder: "https://example.org/page", "aria-label": "the URL to fetch" });
    const result = el("div", { id: "dry-result", "aria-live": "polite" });
    const f = el("form", { id: "dry-form", class: "panel" }, el("div", { class: "row" }, url,
      el("button", { type: "submit", "data-action": "dry_run_job" }, "Dry run"), el("span", { class: "error form-error" })), result);
    f.onsubmit = (e) => { e.preventDefault(); submitting(f, async () => {
      result.replaceChildren(el("p", { class: "muted" }, "waiting for a worker…"));
      let r = await api("POST", `/jobs/${q(name)}/dry-run`, { url: url.value.trim() });
      for (let i = 0; r.state !== "done" && i < 15; i++) r = await api("GET", `/jobs/${q(name)}/dry-run/${r.id}?wait=20`);
      result.replaceChildren(...dryRunResult(r));
    }); };
    return f;
  });
  return [el("h2", {}, "Dry run on one URL"), el("p", { class: "muted" }, "What this job would fetch (a worker runs its engine with every limit a task has); nothing is stored."), form];
}
function dryRunResult(r) {
  if (r.state !== "done") return [el("p", { class: "error", id: "dry-error" }, "no worker answered yet: is one running?")];
  if (r.error) return [el("p", { class: "error", id: "dry-error" }, oneLine(r.error))];
  const d = r.response;
  return [el("p", { class: "ok", id: "dry-summary" }, `HTTP ${d.status_code} · ${num(d.size)} bytes · ${d.encoding} · ${(r.spend_time / 1e6).toFixed(2)} s${d.url !== r.url ? ` · from ${d.url}` : ""}`),
    table([col("header", "k"), col("value", "v")], Object.entries(d.headers).map(([k, v]) => ({ k, v })), "no headers"),
    el("pre", { class: "body", id: "dry-body" }, d.body + (d.truncated ? "\n… (cut)" : ""))];
}

// Add URLs: pasted, or read from a file the browser opens (nothing uploaded but its lines).
function addUrlsSection(name) {
  const form = keep(`add:${name}`, () => {
    const text = el("textarea", { id: "urls", rows: "5", placeholder: "one URL a line", "aria-label": "URLs, one a line" });
    const file = el("input", { id: "urls-file", type: "file", accept: ".txt,.csv,text/plain", "aria-label": "a file of URLs" });
    const report = el("div", { id: "add-report" });
    const f = el("form", { id: "add-form", class: "panel" }, text, el("div", { class: "row" }, field("or a file", file),
      el("button", { type: "submit", "data-action": "add_job_tasks" }, "Add URLs"), el("span", { class: "error form-error" })), report);
    file.onchange = async () => { if (file.files[0]) text.value = await file.files[0].text(); };
    f.onsubmit = (e) => { e.preventDefault(); submitting(f, async () => {
      const r = await api("POST", `/jobs/${q(name)}/tasks`, text.value);
      report.replaceChildren(el("p", { class: "ok", id: "add-summary" }, `added ${num(r.added)} · duplicate ${num(r.duplicate)} · rejected ${num(r.rejected.length)}`),
        r.rejected.length ? table([col("line", "line", 1), col("reason", "reason")], r.rejected.slice(0, 100)) : "");
      text.value = ""; file.value = ""; document.activeElement.blur(); refresh(true);
    }); };
    return f;
  });
  return [el("h2", {}, "Add URLs"), form];
}

// Cancel or requeue the job's tasks of the statuses ticked.
function bulkSection(name) {
  const box = (prefix, s, on) => el("label", { class: "check" }, el("input", { type: "checkbox", value: s, id: `${prefix}-${s}`, checked: on }), s);
  const ticked = (prefix, all) => all.filter((s) => $(`${prefix}-${s}`) && $(`${prefix}-${s}`).checked);
  const form = keep(`bulk:${name}`, () => el("div", { class: "panel", id: "bulk" },
    el("div", { class: "row" }, "Cancel the tasks that are ", CANCELLABLE.map((s) => box("cancel", s, s !== "DISPATCH")), " "),
    el("div", { class: "row" }, "Requeue the tasks that are ", REQUEUEABLE.map((s) => box("requeue", s, s !== "CANCEL")), " ")));
  form.querySelectorAll(".act").forEach((a) => a.remove());
  form.children[0].append(act("cancel_tasks", "Cancel tasks", () => api("POST", `/jobs/${q(name)}/tasks/cancel`, { status: ticked("cancel", CANCELLABLE) }), { cls: "danger" }));
  form.children[1].append(act("requeue_tasks", "Requeue tasks", () => api("POST", `/jobs/${q(name)}/tasks/requeue`, { status: ticked("requeue", REQUEUEABLE) })));
  return [el("h2", {}, "Cancel or requeue"), form];
}

// A job's generator: its state, schedule and next run, its last runs, and (admins, users) on / off / run now.
function generatorSection(j, n) {
  const g = j.generator;
  if (!g) return [el("p", { class: "muted" }, "No generator: this job's URLs come from Add URLs (or links it follows).")];
  const head = [el("h2", {}, "Generator ", el("span", { class: `gen-${g.state}` }, g.state), " ",
    g.state === "on" ? act("generator_off", "Switch off", () => api("POST", `/jobs/${n}/generator/off`), { cls: "danger" })
      : act("generator_on", "Switch on", () => api("POST", `/jobs/${n}/generator/on`)),
    act("generator_run", "Run now", () => api("POST", `/jobs/${n}/generator/run`)))];
  const tested = g.tested ? "" : " · no passing dry run of this code yet (downcluster generator test, on the master)";
  return [
    ...head,
    el("p", {}, `${g.type} · schedule ${g.schedule} · next run ${when(g.next_at)}${tested}`),
    table([col("when", (r) => when(r.add_datetime), 0, (r) => r.add_datetime), col("status", "status"), col("trigger", "trigger"),
      col("added", "added", 1), col("duplicate", "duplicate", 1), col("rejected", "rejected", 1),
      col("bytes", "bytes", 1), col("s", (r) => (r.spend_time / 1e6).toFixed(2), 1, (r) => r.spend_time), col("host", "hostname"),
      col("log", (r) => r.failed_reason || r.errors.slice(0, 3).map((e) => `line ${e.line}: ${e.reason}`).join("; ") || "-")],
    g.runs, "no runs yet", "t-runs"),
  ];
}

// --- a task ------------------------------------------------------------------------------
views.task = async function (id) {
  const t = await api("GET", `/tasks/${q(id)}`);
  const facts = [["job", el("a", { href: `#/job/${q(t.job)}` }, t.job)], ["url", t.url], ["status", el("span", { class: `task-${t.status}` }, t.status)],
    ["attempts", num(t.attempts)], ["recoveries", num(t.recoveries)], ["reason", t.failed_reason || "-"], ["retry at", when(t.retry_at)],
    ["depth", String(t.depth)], ["found on", t.parent ? el("a", { href: `#/task/${t.parent}` }, t.parent) : "- (added, not found on a page)"],
    ["sitemap", t.sitemap || "-"], ["queue", t.queue || "-"], ["host", t.host || "any"],
    ["data", t.data_id ? el("button", { type: "button", "data-action": "get_body", onclick: () => preview({ id: t.data_id, url: t.url, status_code: "" }) }, `Preview ${t.data_id}`) : "- (nothing stored)"],
    ["visits", `${num(t.visits)} (${num(t.not_modified)} not modified)`], ["added", when(t.add_datetime)], ["updated", when(t.last_update_datetime)]];
  return [
    el("h1", {}, "Task ", el("code", {}, t.id)),
    el("dl", { class: "facts", id: "task-facts" }, facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
    el("h2", {}, `Attempts (${t.download_logs.length}), newest first`),
    table([col("when", (l) => when(l.add_datetime), 0, (l) => l.add_datetime), col("status", "status"), col("bytes", "response_size", 1), col("ms", (l) => (l.spend_time / 1000).toFixed(0), 1, (l) => l.spend_time), col("host", "downloads_hostname"),
      col("reason", (l) => l.failed_reason || "-")], t.download_logs, "no attempt yet", "t-attempts"),
    el("h2", {}, "Versions"),
    table([col("version", "version", 1), col("stored", (v) => when(v.add_datetime), 0, (v) => v.add_datetime), col("HTTP", (v) => v.status_code ?? "-", 1, (v) => v.status_code),
      col("latest", (v) => (v.latest ? "yes" : "")),
      col("", (v) => el("button", { type: "button", "data-action": "get_body", onclick: () => preview({ id: v.data_id, url: t.url, status_code: v.status_code }) }, "Preview"))],
    t.versions || [], "no version stored", "t-versions"),
    el("h2", {}, "Links found on it"), linksFound(t),
  ];
};
// The tasks whose ``parent`` is this one are not listed by the API: the page says where they are.
function linksFound(t) {
  return el("p", { class: "muted" }, t.data_id
    ? `Links found on this page become tasks of ${t.job} at depth ${t.depth + 1} (their page names this task under "found on"); the API lists no children of a task.`
    : "Nothing stored yet: no links found.");
}

// --- registering and changing a job: manifest and code in editors ---------------------------
const SAMPLE_MANIFEST = 'name = "my-job"\npriority = 5\ntype = "python"\ncode = "my_job.py"\n\n[settings]\ndispatch_num = 100\nmax_retry_times = 3\n';
const SAMPLE_CODE = "import urllib.request\n\n\ndef download(task):\n    with urllib.request.urlopen(task['url'], timeout=30) as resp:\n        return {'status_code': resp.status, 'headers': dict(resp.headers), 'body': resp.read()}\n";
function editor(id, label, value, rows) {
  const area = el("textarea", { id, rows: String(rows), spellcheck: "false", "aria-label": label, wrap: "off" });
  area.value = value;
  const gutter = el("pre", { class: "gutter", "aria-hidden": "true" });
  const mark = el("p", { class: "line-error error", id: `${id}-error`, hidden: true, role: "alert" });
  const number = () => { gutter.textContent = area.value.split("\n").map((_, i) => i + 1).join("\n"); gutter.scrollTop = area.scrollTop; };
  area.oninput = () => { number(); mark.hidden = true; area.classList.remove("bad"); };
  area.onscroll = () => { gutter.scrollTop = area.scrollTop; place(area, mark); };
  number();
  return el("div", { class: "editor-block" }, el("span", { class: "editor-label" }, label), el("div", { class: "editor" }, gutter, area, mark));
}
// The error beside the line it names (its top at that line), and that line selected.
function place(area, mark) {
  const line = Number(mark.dataset.line || 0);
  if (!line) return;
  const height = parseFloat(getComputedStyle(area).lineHeight) || 18;
  mark.style.top = `${Math.max(0, (line - 1) * height - area.scrollTop + 6)}px`;
}
function showLineError(message) {
  const m = /line (\d+)/.exec(message);
  const where = /^(generator |manifest|name|priority|type |settings|host|follow|sitemaps)/.test(message) || !/code/.test(message) ? "manifest" : "code";
  const area = $(where), mark = $(`${where}-error`);
  const line = m ? Number(m[1]) : keyLine(area.value, message);
  mark.textContent = line ? `◀ line ${line}: ${message}` : message;
  mark.dataset.line = String(line || 1);
  mark.hidden = false; area.classList.add("bad");
  if (line) {
    const lines = area.value.split("\n"), start = lines.slice(0, line - 1).reduce((a, l) => a + l.length + 1, 0);
    area.focus(); area.setSelectionRange(start, start + (lines[line - 1] || "").length);
    area.scrollTop = Math.max(0, (line - 3) * (parseFloat(getComputedStyle(area).lineHeight) || 18));
  }
  place(area, mark);
}

// An error that names a key but no line ("priority must be ..."): the line where that key is set.
function keyLine(text, message) {
  const key = /^(?:manifest key |setting )?['"]?([A-Za-z_][A-Za-z0-9_]*)/.exec(message);
  if (!key) return 0;
  const at = text.split("\n").findIndex((l) => new RegExp(`^\\s*${key[1]}\\s*=`).test(l));
  return at + 1;
}

views.register = async function (name) {
  const editing = name !== undefined;
  const held = (await api("GET", "/projects")).projects || [];
  const key = editing ? `edit:${name}` : "register";
  const form = keep(key, () => registerForm(editing, name, held));
  if (editing && !form.dataset.filled) { form.dataset.filled = "1"; prefill(name, form.querySelector("#manifest")); }
  return [el("h1", {}, editing ? `Change job ${name}` : "Register a job"), form];
};
views.edit = (name) => views.register(name);

function registerForm(editing, name, held) {
  const pick = el("select", { id: "reg-project", "aria-label": "project" }, held.map((p) => el("option", { value: String(p.id) }, `${p.id} ${p.name}`)));
  if (state.project) pick.value = state.project;
  const form = el("form", { id: "register-form", class: "panel" },
    el("p", { class: "muted" }, editing
      ? "Registering again under the same name changes the job: its settings and code are replaced by these. The manifest below is rebuilt from what the API shows (its proxy, password masked: left as it is, the stored one is kept; its cookie and headers); the code is not handed back: paste it."
      : "The manifest (TOML) and, for a python or shell job, its code. Nothing is stored unless both validate; the error is shown beside the line it names."),
    held.length > 1 && !editing ? field("project", pick) : "",
    el("div", { class: "editors" }, editor("manifest", "manifest (TOML)", editing ? "" : SAMPLE_MANIFEST, 14), editor("code", "code (python or shell)", editing ? "" : SAMPLE_CODE, 14)),
    el("div", { class: "row" }, el("button", { type: "submit", "data-action": "register_job" }, editing ? "Save changes" : "Register"),
      el("a", { href: editing ? `#/job/${q(name)}` : "#/jobs" }, "Cancel"), el("span", { class: "error form-error" })));
  form.onsubmit = async (e) => {
    e.preventDefault();
    const body = { manifest: $("manifest").value, code: $("code").value || null };
    if (held.length > 1 && !editing) body.project = Number(pick.value);
    try {
      formError(form).textContent = "";
      const r = await api("POST", "/jobs", body);
      state.forms.delete(editing ? `edit:${name}` : "register");
      flash(`job ${r.name} ${editing ? "changed" : "registered"} in project ${r.project}`);
      location.hash = `#/job/${q(r.name)}`;
    } catch (x) { showLineError(oneLine(x.message)); }
  };
  return form;
}

// A manifest rebuilt from what the job's page shows (its code is not handed back by the API).
async function prefill(name, area) {
  const j = await api("GET", `/jobs/${q(name)}`);
  const s = j.settings || {};
  const lines = [`name = "${j.name}"`, `priority = ${j.priority}`, `type = "${j.type}"`];
  if (j.host) lines.push(`host = "${j.host}"`);
  if (j.type !== "none") lines.push(`code = "${j.name}.${j.type === "python" ? "py" : "sh"}"`);
  lines.push("", "[settings]");
  for (const k of ["dispatch_num", "max_retry_times", "download_engine", "prior", "host_concurrency", "host_delay", "obey_robots", "allow_private"]) {
    if (s[k] == null) continue;
    const v = s[k], float = k === "host_delay" && Number.isInteger(v); // TOML: 0 is an integer, 0.0 a float
    lines.push(`${k} = ${typeof v === "string" ? JSON.stringify(v) : float ? v.toFixed(1) : String(v)}`);
  }
  if (s.report_mails) lines.push(`report_mails = ${JSON.stringify(s.report_mails)}`);
  const handed = s.header_values !== undefined; // proxy, cookie and header values: to those who may change the job
  if (handed && s.proxy) lines.push(`proxy = ${JSON.stringify(s.proxy)}`);
  if (handed && s.cookie) lines.push(`cookie = ${JSON.stringify(s.cookie)}`);
  if (handed && Object.keys(s.header_values).length) {
    lines.push(`headers = { ${Object.entries(s.header_values).map(([k, v]) => `${JSON.stringify(k)} = ${JSON.stringify(v)}`).join(", ")} }`);
  }
  const hidden = (handed ? [] : ["proxy", "cookie"].filter((k) => s[k]).concat(s.headers && s.headers.length ? ["headers"] : []))
    .concat(s.download_js_chars ? ["download_js"] : []);
  if (hidden.length) lines.push(`# not handed back by the API (set again, or they are dropped): ${hidden.join(", ")}`);
  for (const [table, value] of [["follow", j.follow], ["sitemaps", j.sitemaps]]) if (value) lines.push("", `[${table}]`, ...tomlPairs(value));
  if (j.generator) lines.push("", "# this job has a [generator] (its code is not handed back by the API): declare it again here or it is removed");
  area.value = lines.join("\n") + "\n";
  area.dispatchEvent(new Event("input"));
}
// key = value lines of a flat table (strings, numbers, booleans, arrays of them), as TOML.
const tomlPairs = (table) => Object.entries(table).filter(([, v]) => v != null && typeof v !== "object" || Array.isArray(v))
  .map(([k, v]) => `${k} = ${JSON.stringify(v)}`);

// --- exports of jobs -----------------------------------------------------------------------
views.exports = async function (job) {
  const [all, everyJob] = await Promise.all([api("GET", "/exports?limit=100"), api("GET", "/jobs")]);
  const d = inProject(all, "exports"), jobs = inProject(everyJob, "jobs");
  const pick = state.filter.get("t-exports") || "";
  const rows = d.exports.filter((e) => e.job && (!pick || e.state === pick));
  const form = exportForm(jobs.jobs.map((j) => j.name), job);
  watchExports(rows.map((e) => e.id), rows.filter((e) => !FINAL.includes(e.state)).map((e) => e.id));
  return [
    el("h1", {}, "Exports of jobs"),
    el("div", { class: "tools" }, statusFilter("t-exports", ["PENDING", "RUNNING", ...FINAL], "state")),
    table([col("id", "id"), col("job", "job"), col("format", "format"), col("state", (e) => el("span", { id: `state-${e.id}` }, stateBadge(e)), 0, (e) => e.state),
      col("progress", (e) => el("div", { id: `progress-${e.id}` }, progressBar(e))), col("bytes", "bytes", 1),
      col("requested", (e) => `${when(e.created_at)} by ${e.requested_by || "-"}`, 0, (e) => e.created_at),
      col("file", (e) => fileCell(e.id, e.state, e.error, e.requested_by)),
      col("", (e) => exportControls(e.id, e.state, e.requested_by))], rows, "no exports yet", "t-exports"),
    el("h2", {}, "Request an export"), form,
  ];
};
function fileCell(id, st, error) {
  if (st === "SUCCESS") return act("export_link", "Download", () => download(id), { key: id, stay: true });
  return error ? el("span", { class: "error" }, oneLine(error)) : "-";
}
function exportControls(id, st, requestedBy) {
  if (!mine(requestedBy)) return "";
  if (["PENDING", "RUNNING"].includes(st)) return act("cancel_export", "Cancel", () => api("POST", `/exports/${id}/cancel`), { cls: "danger", key: id });
  if (st === "FAIL") return act("retry_export", "Retry", () => api("POST", `/exports/${id}/retry`), { key: id });
  return "";
}

const stateBadge = (e) => el("span", { class: `state-${e.state}` }, e.state);
function progressBar(e) {
  const done = e.rows_done ?? e.rows ?? 0, total = e.rows_total ?? e.total;
  const pct = total ? Math.min(100, (100 * done) / total) : (e.state === "SUCCESS" ? 100 : 0);
  return el("div", {}, el("div", { class: "bar", title: `${done}/${total ?? "?"}` }, el("i", { width: `${pct.toFixed(0)}%` })),
    el("span", { class: "muted" }, `${num(done)} / ${total == null ? "?" : num(total)} rows`));
}

// A finished export's file through a fresh temporary link (links live 5 minutes).
async function download(id) {
  const link = await api("GET", `/exports/${id}/link`);
  location.href = link.url;
  return `link opened, valid until ${when(link.expires_at)}`;
}

// Pages of exports and download tasks are not redrawn by the timer: each unfinished one has a
// WebSocket that tells its state and progress as they change; a final state redraws the page.
function watchExports(shown, live) {
  const wanted = new Set(live);
  for (const [id, ws] of state.sockets) if (!wanted.has(id)) { ws.close(); state.sockets.delete(id); }
  for (const id of wanted) {
    if (state.sockets.has(id)) continue;
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/api/v1/exports/${id}/events`);
    ws.onmessage = (m) => {
      const e = JSON.parse(m.data);
      if (e.error) return;
      const where = $(`state-${id}`), bar = $(`progress-${id}`);
      if (where) where.replaceChildren(stateBadge(e));
      if (bar) bar.replaceChildren(progressBar(e));
      if (FINAL.includes(e.state)) { ws.close(); state.sockets.delete(id); refresh(true); }
    };
    ws.onclose = () => { if (state.sockets.get(id) === ws) state.sockets.delete(id); };
    state.sockets.set(id, ws);
  }
}
function closeSockets() { for (const ws of state.sockets.values()) ws.close(); state.sockets.clear(); }

function exportForm(jobNames, chosen) {
  const form = keep("export", buildExportForm);
  const pick = form.querySelector("#export-job");
  if ([...pick.options].map((o) => o.value).join("\n") !== jobNames.join("\n")) pick.replaceChildren(...jobNames.map((n) => el("option", { value: n }, n)));
  if (chosen && jobNames.includes(chosen)) pick.value = chosen;
  form.querySelector("button[type=submit]").hidden = !may("request_export");
  return form;
}
function buildExportForm() {
  const form = el("form", { id: "export-form", class: "panel" },
    field("job", el("select", { id: "export-job" })),
    field("format", el("select", { id: "export-format" }, ["xlsx", "csv", "jsonl", "warc"].map((f) => el("option", { value: f }, f)))),
    field("HTTP status", el("input", { id: "export-status", placeholder: "200, 404", size: "10" })),
    field("since", el("input", { id: "export-since", placeholder: "2026-01-01T00:00:00Z", size: "20" })),
    field("until", el("input", { id: "export-until", size: "20" })),
    field("mail to", el("input", { id: "export-mails", placeholder: "a@example.org, b@example.org", size: "30" })),
    field("callback URL", el("input", { id: "export-callback", size: "30" })),
    el("label", { class: "block" }, "template (JSON or TOML, optional)",
      el("textarea", { id: "export-template", rows: "5", placeholder: '{"title": "Pages", "col": [{"title": "URL", "name": "url"}, {"title": "Status", "name": "status_code"}]}' })),
    el("div", { class: "row" }, el("button", { type: "submit", "data-action": "request_export" }, "Request export"), el("span", { class: "error form-error" })));
  form.onsubmit = (e) => {
    e.preventDefault();
    const v = (id) => $(id).value.trim();
    const list = (id) => v(id).split(",").map((x) => x.trim()).filter(Boolean);
    const body = { job: v("export-job"), format: v("export-format"), template: $("export-template").value,
      filter: { status: list("export-status").map((x) => (/^\d+$/.test(x) ? Number(x) : x)), since: v("export-since") || null, until: v("export-until") || null },
      mails: list("export-mails"), callback_url: v("export-callback") || null };
    submitting(form, async () => {
      const r = await api("POST", "/exports", body);
      flash(`export ${r.id}: ${r.state}${r.deduplicated ? " (an identical export was reused)" : ""}`);
      document.activeElement.blur(); refresh(true);
    });
  };
  return form;
}

// --- the download center: every download task of the token's projects ------------------------
const CENTER_STATUS = { 1: "waiting", 2: "running", 3: "done", 4: "failed", 5: "cancelled", 6: "expired" };
views.center = async function () {
  const held = (await api("GET", "/projects")).projects || [];
  const ids = state.project ? [state.project] : held.map((p) => String(p.id));
  const page = Number(state.cursor.get("t-center-n") || 1), status = state.filter.get("t-center") || "";
  const statusNo = Object.keys(CENTER_STATUS).find((k) => CENTER_STATUS[k] === status);
  const d = ids.length ? await api("GET", `/center/tasks?project_ids=${ids.slice(0, 100).join(",")}&page=${page}&page_size=20${statusNo ? `&status=${statusNo}` : ""}`)
    : { tasks: [], total: 0, page: 1, page_size: 20 };
  const owners = await requesters(d.tasks);
  watchExports(d.tasks.map((t) => t.task_id), d.tasks.filter((t) => !FINAL.includes(t.state)).map((t) => t.task_id));
  const pages = Math.max(1, Math.ceil(d.total / d.page_size)), go = (n) => { state.cursor.set("t-center-n", n); refresh(true); };
  return [
    el("h1", {}, "Download tasks"),
    el("p", { class: "muted" }, "Every download task of the projects this token holds, newest first: its progress arrives as it happens, its file stays here until it expires."),
    el("div", { class: "tools" }, statusFilter("t-center", Object.values(CENTER_STATUS))),
    table(centerColumns(owners), d.tasks, "no download tasks", "t-center"),
    el("div", { class: "pager" }, el("button", { type: "button", "data-action": "list_center_tasks", disabled: page <= 1, onclick: () => go(page - 1) }, "Previous"),
      el("span", { class: "muted" }, `page ${page} of ${pages} · ${num(d.total)} task${d.total === 1 ? "" : "s"}`),
      el("button", { type: "button", "data-action": "list_center_tasks", disabled: page >= pages, onclick: () => go(page + 1) }, "Next")),
    el("h2", {}, "Request a download task"), centerForm(held),
  ];
};
const centerColumns = (owners) => [
  col("name", (t) => t.name || "-", 0, (t) => t.name), col("project", "project_id", 1), col("type", "type"),
  col("state", (t) => el("span", { id: `state-${t.task_id}` }, stateBadge(t)), 0, (t) => t.state),
  col("progress", (t) => el("div", { id: `progress-${t.task_id}` }, progressBar(t))),
  col("bytes", (t) => num(t.bytes), 1, (t) => t.bytes || 0), col("created", (t) => when(t.created_at), 0, (t) => t.created_at),
  col("file", (t) => fileCell(t.task_id, t.state, t.error)),
  col("", (t) => el("span", {}, exportControls(t.task_id, t.state, owners.get(t.task_id)),
    mine(owners.get(t.task_id)) && FINAL.includes(t.state) ? act("delete_center_tasks", "Delete", () => api("DELETE", `/center/tasks?task_ids=${t.task_id}&project_ids=${t.project_id}`), { cls: "danger", key: t.task_id }) : ""))];

// Who requested each unfinished or failed task (the center's listing does not say; its export does).
async function requesters(tasks) {
  const out = new Map();
  await Promise.all(tasks.filter((t) => t.state !== "EXPIRED").map(async (t) => {
    try { out.set(t.task_id, (await api("GET", `/exports/${t.task_id}`)).requested_by); } catch (x) { /* gone meanwhile */ }
  }));
  return out;
}

function centerForm(held) {
  const form = keep("center", () => buildCenterForm(held));
  form.querySelector("button[type=submit]").hidden = !may("deliver_center_task");
  return form;
}
function buildCenterForm(held) {
  const form = el("form", { id: "center-form", class: "panel" },
    field("project", el("select", { id: "center-project" }, held.map((p) => el("option", { value: String(p.id) }, `${p.id} ${p.name}`)))),
    field("name", el("input", { id: "center-name", required: true, minlength: "2", maxlength: "60", size: "20" })),
    field("file name", el("input", { id: "center-file", size: "16", placeholder: "(the name)" })),
    field("type", el("select", { id: "center-type" }, el("option", { value: "excel" }, "excel (xlsx)"), el("option", { value: "csv" }, "csv"))),
    field("source URL", el("input", { id: "center-source", type: "url", size: "40", placeholder: "https://erp.example.org/orders (pulled page by page)" }), "block"),
    el("label", { class: "block" }, "or the rows, pasted (a JSON list of objects)",
      el("textarea", { id: "center-rows", rows: "4", placeholder: '[{"order_no": "A1", "amount": 12.5}]' })),
    el("label", { class: "block" }, "template (JSON: column key → title; optional)",
      el("textarea", { id: "center-template", rows: "3", placeholder: '{"order_no": "Order", "amount": "Amount"}' })),
    el("div", { class: "row" }, el("button", { type: "submit", "data-action": "deliver_center_task" }, "Request download task"), el("span", { class: "error form-error" })));
  form.onsubmit = (e) => { e.preventDefault(); submitting(form, () => deliver(form)); };
  return form;
}
async function deliver(form) {
  const v = (id) => $(id).value.trim();
  const json = (id, what) => { if (!v(id)) return undefined; try { return JSON.parse(v(id)); } catch (x) { throw new Error(`${what} is not valid JSON: ${x.message}`); } };
  const body = { project_id: Number(v("center-project")), name: v("center-name"), type: v("center-type") };
  if (v("center-file")) body.file_name = v("center-file");
  if (v("center-source")) body.source_url = v("center-source");
  const rows = json("center-rows", "the rows"), template = json("center-template", "the template");
  if (rows !== undefined) body.source_data = rows;
  if (template !== undefined) body.template = template;
  if (!body.source_url && body.source_data === undefined) throw new Error("give a source URL or paste the rows");
  const r = await api("POST", "/center/tasks", body);
  flash(`download task ${r.task_id}: ${r.state}`);
  form.reset(); document.activeElement.blur(); refresh(true);
}

// --- logs ----------------------------------------------------------------------------------
views.logs = async function (kind) {
  kind = kind || "download";
  const after = cursorOf(`t-log-${kind}`);
  const d = await api("GET", `/logs/${kind}?limit=100${after ? `&after=${after}` : ""}`);
  const pick = el("select", { id: "log-kind", "aria-label": "log", onchange: (e) => { location.hash = `#/logs/${e.target.value}`; } },
    ["download", "dispatch", "alert", "registration"].map((k) => { const o = el("option", { value: k }, k); if (k === kind) o.selected = true; return o; }));
  const t = (l) => when(l.add_datetime), tk = (l) => l.add_datetime;
  const shapes = {
    download: [col("when", t, 0, tk), col("job", "job"), col("status", "status"), col("bytes", "response_size", 1), col("ms", (l) => (l.spend_time / 1000).toFixed(0), 1, (l) => l.spend_time), col("host", "downloads_hostname"), col("reason", "failed_reason")],
    dispatch: [col("when", t, 0, tk), col("job", "job"), col("status", "status"), col("queue", "queue"), col("tasks", "count", 1), col("reason", "reason")],
    alert: [col("when", t, 0, tk), col("job", "job"), col("type", "type"), col("reason", "reason")],
    registration: [col("when", t, 0, tk), col("name", "name"), col("manifest", "manifest"), col("reason", "reason")],
  };
  const shown = state.filter.get(`t-log-${kind}`) ? d.logs.filter((l) => l.status === state.filter.get(`t-log-${kind}`)) : d.logs;
  return [el("h1", {}, "Logs ", pick),
    kind === "download" || kind === "dispatch" ? el("div", { class: "tools" }, statusFilter(`t-log-${kind}`, kind === "download" ? ["SUCCESS", "FAIL"] : ["OK", "FAIL", "SKIP"])) : "",
    table(shapes[kind], shown, "no entries", `t-log-${kind}`), pager(`t-log-${kind}`, "list_logs", d.next)];
};

// --- admin: projects, tokens, downloader types, the audit log ---------------------------------
views.admin = async function () {
  if (!may("list_tokens")) return [el("p", { class: "error" }, "an admin token is needed")];
  const before = cursorOf("t-audit"), action = state.filter.get("t-audit") || "";
  const [p, t, types, audit] = await Promise.all([api("GET", "/projects"), api("GET", "/tokens"), api("GET", "/types"),
    api("GET", `/audit?limit=50${before ? `&before=${before}` : ""}${action ? `&action=${action}` : ""}`)]);
  return [
    el("h1", {}, "Admin"),
    el("h2", {}, "Projects"),
    table([col("id", "id", 1), col("name", "name"), col("private reach", (x) => (x.allow_private ? "yes" : "no"), 0, (x) => x.allow_private)], p.projects, "no projects", "t-projects"),
    projectForm(),
    el("h2", {}, "Tokens"),
    secretBox(),
    table(tokenColumns(p.projects), t.tokens, "no tokens", "t-tokens"),
    tokenForm(p.projects),
    el("h2", {}, "Downloader types"),
    table([col("language", "language"), col("supported", (x) => (x.is_support ? "yes" : "no")), col("jobs", "jobs", 1),
      col("", (x) => (x.is_support ? act("disable_type", "Disable", () => api("POST", `/types/${x.language}/disable`), { cls: "danger", key: x.language })
        : act("enable_type", "Enable", () => api("POST", `/types/${x.language}/enable`), { key: x.language })))], types.types, "no types"),
    el("h2", {}, "Audit log"),
    el("div", { class: "tools" }, statusFilter("t-audit", ["job.register", "job.change", "job.on", "job.off", "tasks.add", "tasks.cancel", "tasks.requeue",
      "export.request", "export.cancel", "export.retry", "project.create", "token.create", "token.grant", "token.ungrant", "token.revoke"], "action")),
    table([col("when", (a) => when(a.at || a.when), 0, (a) => a.at || a.when), col("who", (a) => `${a.actor} (${a.role})`, 0, (a) => a.actor), col("action", "action"),
      col("target", "target"), col("project", (a) => a.project ?? "-", 1, (a) => a.project), col("detail", (a) => JSON.stringify(a.detail || {}))], audit.entries || audit.audit || [], "no entries", "t-audit"),
    pager("t-audit", "get_audit", audit.next),
  ];
};
function projectForm() {
  return keep("project", () => {
    const f = el("form", { id: "project-form", class: "panel" },
      field("name", el("input", { id: "project-name", required: true, size: "20", placeholder: "team-b" })),
      el("label", { class: "check" }, el("input", { type: "checkbox", id: "project-private" }), "private reach (its download tasks may pull from private addresses)"),
      el("button", { type: "submit", "data-action": "create_project" }, "Create project"), el("span", { class: "error form-error" }));
    f.onsubmit = (e) => { e.preventDefault(); submitting(f, async () => {
      const r = await api("POST", "/projects", { name: $("project-name").value.trim(), allow_private: $("project-private").checked });
      flash(`project ${r.id} ${r.name} created`); f.reset(); document.activeElement.blur(); projectSwitcher(); refresh(true);
    }); };
    return f;
  });
}
const tokenColumns = (projects) => [col("name", "name"), col("role", "role"),
  col("projects", (t) => (t.role === "admin" ? "all" : t.projects.join(", ") || "-")), col("granted jobs", (t) => t.jobs.join(", ") || "-"),
  col("created", (t) => when(t.created), 0, (t) => t.created), col("last used", (t) => when(t.last_used), 0, (t) => t.last_used),
  col("", (t) => el("span", { class: "controls" }, grantControl(t, projects),
    act("revoke_token", "Revoke", () => api("POST", `/tokens/${q(t.name)}/revoke`), { cls: "danger", key: t.name })))];
function grantControl(t, projects) {
  if (t.role === "admin" || !may("grant_token")) return "";
  const pick = el("select", { "aria-label": `project to give ${t.name}` }, projects.map((p) => el("option", { value: String(p.id) }, `${p.id} ${p.name}`)));
  const give = (remove) => () => api("POST", `/tokens/${q(t.name)}/grant`, { projects: [Number(pick.value)], remove });
  return el("span", {}, pick, act("grant_token", "Give", give(false), { key: `${t.name}+` }), act("grant_token", "Take", give(true), { key: `${t.name}-` }));
}
function tokenForm(projects) {
  const f = keep("token", () => {
    const form = el("form", { id: "token-form", class: "panel" },
      field("name", el("input", { id: "token-name", required: true, size: "16" })),
      field("role", el("select", { id: "token-role" }, ["user", "analyst", "admin"].map((r) => el("option", { value: r }, r)))),
      field("projects", el("select", { id: "token-projects", multiple: true, size: "3" })),
      el("button", { type: "submit", "data-action": "create_token" }, "Create token"), el("span", { class: "error form-error" }));
    form.onsubmit = (e) => { e.preventDefault(); submitting(form, async () => {
      const chosen = [...$("token-projects").selectedOptions].map((o) => Number(o.value));
      const r = await api("POST", "/tokens", { name: $("token-name").value.trim(), role: $("token-role").value, projects: chosen });
      state.secret = r; form.reset(); document.activeElement.blur(); refresh(true);
    }); };
    return form;
  });
  const pick = f.querySelector("#token-projects");
  if (pick.options.length !== projects.length) pick.replaceChildren(...projects.map((p) => el("option", { value: String(p.id) }, `${p.id} ${p.name}`)));
  return f;
}
// A new token's secret, shown once: kept in memory until dismissed, never stored.
function secretBox() {
  const s = state.secret;
  if (!s) return "";
  return el("div", { class: "panel secret", id: "token-secret" }, el("b", {}, `Token ${s.name} (${s.role}): copy it now, it is not shown again`),
    el("code", { id: "token-value" }, s.token), el("button", { type: "button", onclick: () => { state.secret = null; refresh(true); } }, "I have copied it"));
}

async function preview(row) {
  try {
    const res = await api("GET", `/data/${row.id}/body`, undefined, true);
    const buf = new Uint8Array(await res.arrayBuffer());
    const shown = buf.slice(0, 65536);
    $("preview-meta").textContent = `${row.url} · HTTP ${row.status_code} · ${buf.length} bytes${buf.length > shown.length ? " (first 64 KiB shown)" : ""}`;
    $("preview-body").textContent = new TextDecoder("utf-8", { fatal: false }).decode(shown);
  } catch (x) { $("preview-meta").textContent = ""; $("preview-body").textContent = oneLine(x.message); }
  $("preview").hidden = false;
  $("preview").scrollIntoView();
}

// --- routing, refresh, sign-in ---------------------------------------------------------
function route() {
  const [, name, arg] = (location.hash || "#/overview").split("/");
  return { name: views[name] ? name : "overview", arg: arg ? decodeURIComponent(arg) : undefined };
}

async function refresh(now) {
  if (!state.me) return;
  const { name, arg } = route();
  if (!["exports", "center"].includes(name)) closeSockets();
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === name);
  const typing = document.activeElement && document.activeElement.closest && document.activeElement.closest("#view form");
  if (typing && !now) return; // not while a form is being filled
  const focused = document.activeElement && document.activeElement.id;
  const mark = ++state.drawn; // a slower, older draw never replaces a newer one
  try {
    const nodes = await views[name](arg);
    if (mark !== state.drawn) return;
    $("view").replaceChildren(...nodes);
    $("view").dataset.view = name;
    $("view").dataset.arg = arg || "";
    if (focused && $(focused) && !typing) $(focused).focus(); // keyboard users keep their place
  } catch (err) {
    if (err.message !== "signed out" && mark === state.drawn) $("view").replaceChildren(el("h1", {}, name), el("p", { class: "error", id: "view-error" }, oneLine(err.message)));
  }
}

function showSignIn() {
  state.me = null; clearInterval(state.timer); closeSockets(); state.forms.clear(); state.secret = null;
  $("signin").hidden = false; $("nav").hidden = true; $("signout").hidden = true; $("project").hidden = true;
  $("view").replaceChildren(); $("who").textContent = "";
}

// The project switcher: the console shows one project's jobs and exports, or all the token holds.
function inProject(answer, key) {
  if (!state.project) return answer;
  return { ...answer, [key]: answer[key].filter((row) => String(row.project) === state.project) };
}

async function projectSwitcher() {
  const pick = $("project");
  let list = [];
  try { list = (await api("GET", "/projects")).projects || []; } catch (err) { list = []; }
  if (state.project && !list.some((p) => String(p.id) === state.project)) state.project = "";
  pick.replaceChildren(el("option", { value: "" }, "all projects"),
    ...list.map((p) => { const o = el("option", { value: String(p.id) }, `${p.id} ${p.name}`); o.selected = String(p.id) === state.project; return o; }));
  pick.hidden = list.length === 0;
}

function signedIn(me) {
  state.me = me; state.csrf = me.csrf;
  state.project = localStorage.getItem("downcluster.project") || "";
  projectSwitcher();
  $("signin").hidden = true; $("nav").hidden = false; $("signout").hidden = false;
  $("nav-admin").hidden = me.role !== "admin";
  const held = me.projects == null ? "every project" : `projects ${me.projects.join(", ") || "none"}`;
  $("who").textContent = `${me.name} (${me.role}, ${held})`;
  refresh(true);
  clearInterval(state.timer);
  state.timer = setInterval(() => { if (TIMED.includes(route().name)) refresh(); }, 3000);
}

$("signin-form").onsubmit = async (e) => {
  e.preventDefault();
  try { signedIn(await api("POST", "/session", { token: $("token").value })); $("token").value = ""; $("signin-error").textContent = ""; }
  catch (err) { $("signin-error").textContent = oneLine(err.message); }
};
$("project").onchange = (e) => {
  state.project = e.target.value; localStorage.setItem("downcluster.project", state.project); state.cursor.clear(); refresh(true);
};
$("signout").onclick = async () => { await api("POST", "/session/end", {}).catch(() => {}); showSignIn(); };
$("preview-close").onclick = () => { $("preview").hidden = true; };
window.onhashchange = () => { $("preview").hidden = true; state.errors.clear(); refresh(true); };
api("GET", "/session").then(signedIn).catch(() => showSignIn());
