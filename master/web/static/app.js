// downcluster console: plain JavaScript, no framework, nothing fetched from outside this server.
// Every value from the server is put in the page with textContent (never as HTML).
"use strict";

const state = { me: null, csrf: null, timer: null, view: null, sockets: new Map(), project: "" };
const FINAL = ["SUCCESS", "FAIL", "CANCEL", "EXPIRED"];
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "onclick" || k === "onsubmit" || k === "onchange") node[k] = v;
    else if (k === "class") node.className = v;
    else if (k === "width") node.style.width = v; // CSSOM: allowed under the page's CSP, unlike a style attribute
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

async function api(method, path, body, raw) {
  const headers = {};
  if (method !== "GET") headers["X-CSRF-Token"] = state.csrf || "";
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch("/api/v1" + path, { method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body) });
  if (res.status === 401 && path !== "/session") { showSignIn(); throw new Error("signed out"); }
  if (raw) return res;
  const data = await res.json().catch(() => ({ error: res.statusText }));
  if (!res.ok) throw new Error(data.error || res.statusText);
  return data;
}

function table(columns, rows, empty = "nothing yet") {
  const head = el("tr", {}, columns.map((c) => el("th", { class: c.num ? "num" : "" }, c.title)));
  const body = rows.length ? rows.map((r) => el("tr", {}, columns.map((c) => {
    const v = c.value(r);
    return el("td", { class: c.num ? "num" : "" }, v instanceof Node ? v : String(v ?? "-"));
  }))) : [el("tr", {}, el("td", { colspan: columns.length, class: "muted" }, empty))];
  return el("table", {}, el("thead", {}, head), el("tbody", {}, body));
}

const col = (title, value, num) => ({ title, value: typeof value === "function" ? value : (r) => r[value], num });
const age = (s) => (s == null ? "-" : s < 120 ? `${s.toFixed(0)} s` : `${(s / 60).toFixed(1)} min`);
const when = (iso) => (iso ? iso.replace("T", " ").slice(0, 19) : "-");
// who may change the jobs it sees: an admin, or a user (in its projects; the API decides)
const canChange = () => state.me && (state.me.role === "admin" || state.me.role === "user");
function flash(text, bad) { const s = $("status"); s.textContent = text; s.className = bad ? "error" : "ok"; }

function action(label, fn, cls) {
  return el("button", { class: cls || "", onclick: async (e) => {
    e.preventDefault();
    try { const r = await fn(); flash(`${label}: ${JSON.stringify(r)}`); refresh(); }
    catch (err) { flash(`${label}: ${err.message}`, true); }
  } }, label);
}

// --- views -----------------------------------------------------------------------------
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

const views = {
  async overview() {
    const fresh = state.series && Date.now() - state.seriesAt < 30000;  // the charts move by the minute
    const [d, s] = await Promise.all([api("GET", "/overview"), fresh ? state.series : api("GET", "/series")]);
    if (!fresh) { state.series = s; state.seriesAt = Date.now(); }
    const queues = [...new Set(s.depths.flatMap((p) => Object.keys(p).filter((k) => k !== "minute")))]
      .sort((a, b) => Math.max(...s.depths.map((p) => p[b] || 0)) - Math.max(...s.depths.map((p) => p[a] || 0))).slice(0, 6);
    const rate = d.last_hour.rate == null ? "-" : (d.last_hour.rate * 100).toFixed(1) + "%";
    return [
      el("h1", {}, "Overview"),
      el("div", { class: "cards" },
        el("div", { class: "card", id: "card-rate" }, el("b", {}, rate), el("span", {}, `success, last hour (${d.last_hour.success} ok, ${d.last_hour.fail} failed)`)),
        el("div", { class: "card" }, el("b", {}, String(d.workers.length)), el("span", {}, "workers alive")),
        el("div", { class: "card" }, el("b", {}, String(d.queues.reduce((a, q) => a + q.depth, 0))), el("span", {}, "entries queued"))),
      el("h2", {}, "Last 24 hours"),
      el("div", { class: "charts" },
        lineChart("chart-pages", "pages per minute (UTC)", s.from, s.to, s.pages, ["stored", "failed"], true),
        lineChart("chart-depth", "queue depth (entries, as sampled)", s.from, s.to, s.depths, queues, false)),
      el("h2", {}, "Queues"),
      table([col("queue", "queue"), col("depth", "depth", 1), col("cap", "cap", 1),
             col("fill", (q) => q.cap == null ? "-" : el("div", { class: "bar", title: `${q.depth}/${q.cap}` }, el("i", { width: `${Math.min(100, 100 * q.depth / Math.max(1, q.cap)).toFixed(0)}%` }))),
             col("oldest entry", (q) => age(q.oldest_age_s), 1)], d.queues, "no queues"),
      el("h2", {}, "Workers"),
      table([col("worker", "id"), col("host", "host"), col("downloads in flight", "inflight", 1),
             col("entries done", "entries_done", 1), col("running jobs", (w) => w.jobs.join(", ") || "-")], d.workers, "no worker alive"),
      el("h2", {}, "Hosts throttled now"),
      table([col("host", "host"), col("in flight", "in_flight", 1),
             col("why", (h) => (h.paused_s ? `paused ${h.paused_s} s more (Retry-After)` : "at its limit"))],
            d.throttled_hosts || [], "no host throttled"),
      el("h2", {}, "Recent alerts"),
      table([col("when", (a) => when(a.add_datetime)), col("job", "job"), col("type", "type"), col("reason", "reason")], d.alerts, "no alerts"),
    ];
  },

  async jobs() {
    const d = inProject(await api("GET", "/jobs"), "jobs");
    const statuses = ["LIVE", "DISPATCH", "SUCCESS", "FAIL", "CANCEL", "DEAD", "queued", "running"];
    const cols = [col("job", (j) => el("a", { href: `#/job/${encodeURIComponent(j.name)}` }, j.name)),
      col("status", (j) => el("span", { class: `status-${j.status}` }, j.status)), col("priority", "priority", 1),
      col("type", "type"), col("host", (j) => j.host || "-"),
      ...statuses.map((s) => col(s, (j) => j.counts[s], 1))];
    if (canChange()) cols.push(col("", (j) => j.status === "ON"
      ? action("Disable", () => api("POST", `/jobs/${encodeURIComponent(j.name)}/disable`), "danger")
      : action("Enable", () => api("POST", `/jobs/${encodeURIComponent(j.name)}/enable`))));
    return [el("h1", {}, "Jobs"), table(cols, d.jobs, "no jobs registered")];
  },

  async job(name) {
    const q = encodeURIComponent(name);
    const [j, dead, data] = await Promise.all([api("GET", `/jobs/${q}`),
      api("GET", `/jobs/${q}/tasks?status=DEAD&limit=50`), api("GET", `/jobs/${q}/data?limit=50`)]);
    const counts = Object.entries(j.counts).map(([k, v]) => `${k} ${v}`).join(" · ");
    const deadHead = [el("h2", {}, `DEAD tasks (${j.counts.DEAD})`)];
    if (canChange() && j.counts.DEAD) deadHead.push(action("Requeue DEAD tasks", () => api("POST", `/jobs/${q}/tasks/requeue`, { status: ["DEAD"] })));
    return [
      el("h1", {}, `Job ${j.name} `, el("span", { class: `status-${j.status}` }, j.status)),
      ...generatorSection(j, q),
      el("p", {}, `priority ${j.priority} · ${j.type} downloader · engine ${j.settings ? j.settings.download_engine : "-"} · host ${j.host || "any"}`),
      el("p", { class: "muted" }, counts),
      el("h2", {}, "Recent failures"),
      table([col("url", "uri"), col("attempts", "download_times", 1), col("reason", "failed_reason"), col("when", (t) => when(t.last_update_datetime))], j.recent_failures, "no failures"),
      ...deadHead,
      table([col("url", "uri"), col("attempts", "download_times", 1), col("recoveries", "recoveries", 1), col("reason", "failed_reason")], dead.tasks, "no DEAD tasks"),
      el("h2", {}, "Data"),
      table([col("url", "url"), col("status", "status_code", 1), col("size", "size", 1), col("stored", (r) => when(r.add_datetime)),
             col("", (r) => el("button", { onclick: () => preview(r) }, "Preview"))], data.data, "no data stored"),
    ];
  },

  async exports() {
    const [all, everyJob] = await Promise.all([api("GET", "/exports?limit=50"), api("GET", "/jobs")]);
    const d = inProject(all, "exports"), jobs = inProject(everyJob, "jobs");
    const form = exportForm(jobs.jobs.map((j) => j.name));
    watchExports(d.exports);
    return [
      el("h1", {}, "Exports"),
      table([col("id", "id"), col("job", "job"), col("format", "format"), col("state", (e) => el("span", { id: `state-${e.id}` }, stateBadge(e))),
             col("progress", (e) => el("div", { id: `progress-${e.id}` }, progressBar(e))), col("bytes", "bytes", 1),
             col("requested", (e) => when(e.created_at)),
             col("file", (e) => e.state === "SUCCESS" ? action("Download", () => download(e.id)) : (e.error || "-")),
             col("", (e) => ["PENDING", "RUNNING"].includes(e.state) ? action("Cancel", () => api("POST", `/exports/${e.id}/cancel`), "danger") : "")],
            d.exports, "no exports yet"),
      el("h2", {}, "Request an export"), form,
    ];
  },

  async logs(kind) {
    kind = kind || "download";
    const d = await api("GET", `/logs/${kind}?limit=100`);
    const pick = el("select", { id: "log-kind", onchange: (e) => { location.hash = `#/logs/${e.target.value}`; } },
      ["download", "dispatch", "alert", "registration"].map((k) => { const o = el("option", { value: k }, k); if (k === kind) o.selected = true; return o; }));
    const shapes = {
      download: [col("when", (l) => when(l.add_datetime)), col("job", "job"), col("status", "status"), col("bytes", "response_size", 1), col("ms", (l) => (l.spend_time / 1000).toFixed(0), 1), col("host", "downloads_hostname"), col("reason", "failed_reason")],
      dispatch: [col("when", (l) => when(l.add_datetime)), col("job", "job"), col("status", "status"), col("queue", "queue"), col("tasks", "count", 1), col("reason", "reason")],
      alert: [col("when", (l) => when(l.add_datetime)), col("job", "job"), col("type", "type"), col("reason", "reason")],
      registration: [col("when", (l) => when(l.add_datetime)), col("name", "name"), col("manifest", "manifest"), col("reason", "reason")],
    };
    return [el("h1", {}, "Logs ", pick), table(shapes[kind], d.logs, "no entries")];
  },
};

// A job's generator: its state, schedule and next run, its last runs, and (admins, users) on / off / run now.
function generatorSection(j, q) {
  const g = j.generator;
  if (!g) return [];
  const head = [el("h2", {}, "Generator ", el("span", { class: `gen-${g.state}` }, g.state))];
  if (canChange()) {
    head.push(g.state === "on"
      ? action("Switch off", () => api("POST", `/jobs/${q}/generator/off`), "danger")
      : action("Switch on", () => api("POST", `/jobs/${q}/generator/on`)));
    head.push(action("Run now", () => api("POST", `/jobs/${q}/generator/run`)));
  }
  const tested = g.tested ? "" : " · no passing dry run of this code yet (downcluster generator test)";
  return [
    ...head,
    el("p", {}, `${g.type} · schedule ${g.schedule} · next run ${when(g.next_at)}${tested}`),
    table([col("when", (r) => when(r.add_datetime)), col("status", "status"), col("trigger", "trigger"),
           col("added", "added", 1), col("duplicate", "duplicate", 1), col("rejected", "rejected", 1),
           col("bytes", "bytes", 1), col("s", (r) => (r.spend_time / 1e6).toFixed(2), 1), col("host", "hostname"),
           col("reason", (r) => r.failed_reason || r.errors.slice(0, 3).map((e) => `line ${e.line}: ${e.reason}`).join("; ") || "-")],
          g.runs, "no runs yet"),
  ];
}

const stateBadge = (e) => el("span", { class: `state-${e.state}` }, e.state);
function progressBar(e) {
  const total = e.rows_total || 0, pct = total ? Math.min(100, (100 * e.rows_done) / total) : (e.state === "SUCCESS" ? 100 : 0);
  return el("div", {}, el("div", { class: "bar", title: `${e.rows_done}/${total}` }, el("i", { width: `${pct.toFixed(0)}%` })),
    el("span", { class: "muted" }, `${e.rows_done} / ${e.rows_total ?? "?"} rows`));
}

// A finished export's file through a fresh temporary link (links live 5 minutes).
async function download(id) {
  const link = await api("GET", `/exports/${id}/link`);
  location.href = link.url;
  return { link: "opened", expires_at: link.expires_at };
}

// The exports page is not redrawn by the timer: each unfinished export has a WebSocket that
// tells its state and progress as they change; a final state redraws the page (for its file).
function watchExports(list) {
  const live = new Set(list.filter((e) => !FINAL.includes(e.state)).map((e) => e.id));
  for (const [id, ws] of state.sockets) if (!live.has(id)) { ws.close(); state.sockets.delete(id); }
  for (const id of live) {
    if (state.sockets.has(id)) continue;
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/api/v1/exports/${id}/events`);
    ws.onmessage = (m) => {
      const e = JSON.parse(m.data);
      if (e.error) return;
      const where = $(`state-${id}`), bar = $(`progress-${id}`);
      if (where) where.replaceChildren(stateBadge(e));
      if (bar) bar.replaceChildren(progressBar(e));
      if (FINAL.includes(e.state)) { ws.close(); state.sockets.delete(id); refresh(); }
    };
    ws.onclose = () => { if (state.sockets.get(id) === ws) state.sockets.delete(id); };
    state.sockets.set(id, ws);
  }
}

function closeSockets() { for (const ws of state.sockets.values()) ws.close(); state.sockets.clear(); }

function exportForm(jobNames) {
  // built once and kept, so a redraw never loses what was typed
  if (state.exportForm) {
    const pick = state.exportForm.querySelector("#export-job");
    const have = [...pick.options].map((o) => o.value).join("\n");
    if (have !== jobNames.join("\n")) pick.replaceChildren(...jobNames.map((n) => el("option", { value: n }, n)));
    return state.exportForm;
  }
  const field = (label, input) => el("label", {}, label, " ", input);
  const form = el("form", { id: "export-form" },
    field("job", el("select", { id: "export-job" }, jobNames.map((n) => el("option", { value: n }, n)))),
    field("format", el("select", { id: "export-format" }, ["xlsx", "csv", "jsonl"].map((f) => el("option", { value: f }, f)))),
    field("HTTP status", el("input", { id: "export-status", placeholder: "200, 404", size: "10" })),
    field("since", el("input", { id: "export-since", placeholder: "2026-01-01T00:00:00Z", size: "20" })),
    field("until", el("input", { id: "export-until", size: "20" })),
    el("br", {}),
    field("mail to", el("input", { id: "export-mails", placeholder: "a@example.org, b@example.org", size: "30" })),
    field("callback URL", el("input", { id: "export-callback", size: "30" })),
    el("br", {}),
    el("label", { class: "block" }, "template (JSON or TOML, optional)", el("br", {}),
       el("textarea", { id: "export-template", rows: "6", cols: "80", placeholder: '{"title": "Pages", "col": [{"title": "Request", "children": [{"title": "URL", "name": "url"}]}, {"title": "Status", "name": "status_code"}]}\n(JSON or TOML; see the README)' })),
    el("br", {}),
    el("button", { type: "submit" }, "Request export"));
  form.onsubmit = async (e) => {
    e.preventDefault();
    const v = (id) => $(id).value.trim();
    const list = (id) => v(id).split(",").map((x) => x.trim()).filter(Boolean);
    const body = { job: v("export-job"), format: v("export-format"), template: $("export-template").value,
      filter: { status: list("export-status").map((x) => (/^\d+$/.test(x) ? Number(x) : x)), since: v("export-since") || null, until: v("export-until") || null },
      mails: list("export-mails"), callback_url: v("export-callback") || null };
    try {
      const r = await api("POST", "/exports", body);
      flash(`export ${r.id}: ${r.state}${r.deduplicated ? " (an identical export was reused)" : ""}`);
      document.activeElement.blur();
      refresh();
    } catch (err) { flash(`export: ${err.message}`, true); }
  };
  state.exportForm = form;
  return form;
}

async function preview(row) {
  const res = await api("GET", `/data/${row.id}/body`, undefined, true);
  const buf = new Uint8Array(await res.arrayBuffer());
  const shown = buf.slice(0, 65536);
  $("preview-meta").textContent = `${row.url} · HTTP ${row.status_code} · ${buf.length} bytes${buf.length > shown.length ? " (first 64 KiB shown)" : ""}`;
  $("preview-body").textContent = new TextDecoder("utf-8", { fatal: false }).decode(shown);
  $("preview").hidden = false;
  $("preview").scrollIntoView();
}

// --- routing, refresh, sign-in ---------------------------------------------------------
function route() {
  const [, name, arg] = (location.hash || "#/overview").split("/");
  return { name: views[name] ? name : "overview", arg: arg ? decodeURIComponent(arg) : undefined };
}

async function refresh() {
  if (!state.me) return;
  const { name, arg } = route();
  if (name !== "exports") closeSockets();
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === name);
  if (document.activeElement && document.activeElement.closest && document.activeElement.closest("#view form")) return; // not while a form is being filled
  try {
    const nodes = await views[name](arg);
    $("view").replaceChildren(...nodes);
    $("view").dataset.view = name;
  } catch (err) {
    if (err.message !== "signed out") flash(err.message, true);
  }
}

function showSignIn() {
  state.me = null; clearInterval(state.timer); closeSockets();
  $("signin").hidden = false; $("nav").hidden = true; $("signout").hidden = true;
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
  const held = me.projects == null ? "every project" : `projects ${me.projects.join(", ") || "none"}`;
  $("who").textContent = `${me.name} (${me.role}, ${held})`;
  refresh();
  clearInterval(state.timer);
  state.timer = setInterval(() => { if (route().name !== "exports") refresh(); }, 3000);
}

$("signin-form").onsubmit = async (e) => {
  e.preventDefault();
  try { signedIn(await api("POST", "/session", { token: $("token").value })); $("token").value = ""; $("signin-error").textContent = ""; }
  catch (err) { $("signin-error").textContent = err.message; }
};
$("project").onchange = (e) => {
  state.project = e.target.value; localStorage.setItem("downcluster.project", state.project); refresh();
};
$("signout").onclick = async () => { await api("POST", "/session/end", {}).catch(() => {}); showSignIn(); };
$("preview-close").onclick = () => { $("preview").hidden = true; };
window.onhashchange = () => { $("preview").hidden = true; refresh(); };
api("GET", "/session").then(signedIn).catch(() => showSignIn());
