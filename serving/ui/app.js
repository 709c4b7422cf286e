// The koord-recommender dashboard: plain JavaScript over the service's own REST API (/api/v1), no build step.
// Views (by URL hash): #/ overview, #/workload/<namespace>/<workload>, #/nodes, #/node/<node>.
"use strict";

const TOKEN_KEY = "koord-recommender.token";
// The API sits beside /ui wherever the service is mounted (also behind a path-prefix proxy).
const API_BASE = location.pathname.replace(/\/ui(\/.*)?$/, "") + "/api/v1/";
const COLORS = { limit: "#8c8c8c", usage: "#d62728", short: "#08306b", long: "#6baed6", target: "#2ca02c", request: "#5f6b7a", live: "#ff7f0e" };
const HOUR = 3600;
const view = document.getElementById("view");

// ---- REST ---------------------------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

function path(...segments) {
  return segments.map(encodeURIComponent).join("/");
}

async function api(relative) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  let response;
  try {
    response = await fetch(API_BASE + relative, { headers, cache: "no-cache" });
  } catch (error) {
    throw new ApiError(0, "cannot reach the service (" + error.message + ")");
  }
  if (!response.ok) {
    let detail = response.statusText;
    try {
      const body = await response.json();
      detail = body.detail || body.error || detail;
    } catch (_) { /* not JSON: keep the status text */ }
    throw new ApiError(response.status, typeof detail === "string" ? detail : JSON.stringify(detail));
  }
  return response.json();
}

// ---- small helpers ------------------------------------------------------------------------------------------------

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function state(kind, ...message) {
  return el("div", { class: "state", "data-kind": kind, "data-testid": "state-" + kind }, ...message);
}

const GIB = 1024 ** 3, MIB = 1024 ** 2;
const fmt = {
  cpu: (v) => (v === null || v === undefined ? "–" : Math.abs(v) < 1 ? Math.round(v * 1000) + "m" : v.toFixed(2)),
  memory: (v) => (v === null || v === undefined ? "–" : Math.abs(v) >= GIB ? (v / GIB).toFixed(2) + " Gi" : (v / MIB).toFixed(0) + " Mi"),
  cost: (v) => (v === null || v === undefined ? "not backtested" : v.toPrecision(3)),
  time: (t) => new Date(t * 1000).toISOString().replace("T", " ").replace(/:\d\d\.\d+Z$/, " UTC"),
  age: (seconds) => (seconds < 2 * 86400 ? (seconds / HOUR).toFixed(0) + " h" : (seconds / 86400).toFixed(0) + " days"),
};

// One unit per axis or column, chosen by its largest value: cores or millicores, GiB or MiB.
const UNITS = {
  cpu: (largest) => (largest >= 1 ? { scale: 1, suffix: "" } : { scale: 1e-3, suffix: "m" }),
  memory: (largest) => (largest >= GIB ? { scale: GIB, suffix: " Gi" } : { scale: MIB, suffix: " Mi" }),
};

// A round step (1, 2 or 5 times a power of ten) that cuts `span` into about `count` parts.
function roundStep(span, count) {
  const raw = span / count, power = 10 ** Math.floor(Math.log10(raw)), fraction = raw / power;
  return (fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10) * power;
}

// A formatter in one unit with as many decimals as `step` (in that unit) needs.
function inUnit(unit, step) {
  const digits = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  return (v) => (v === null || v === undefined ? "–" : (v / unit.scale).toFixed(digits) + unit.suffix);
}

// A column's formatter: one unit for all its values.
function columnFormat(kind, values) {
  const largest = Math.max(0, ...values.filter((v) => v !== null && v !== undefined).map(Math.abs));
  const unit = UNITS[kind](largest);
  // Cores with three decimals below 10 (a 34m value stays 0.034), two above; GiB with two; m and MiB whole.
  return inUnit(unit, unit.scale === 1 ? (largest < 10 ? 0.001 : 0.01) : unit.scale === GIB ? 0.01 : 1);
}

// A change is recommended − current (the API's `change` fields): below zero frees resources, shown with its own sign.
function signed(format, v) {
  if (v === null || v === undefined) return el("span", { class: "muted" }, "–");
  const text = (v < 0 ? "−" : "+") + format(Math.abs(v));
  return el("span", { class: v < 0 ? "saving" : v > 0 ? "missing" : "", title: v < 0 ? "the request would shrink by this" : v > 0 ? "the request would grow by this" : "" }, text);
}

// A value on the grid of the quantities written (`recommender.limits.on_grid`): what cpuQuantity / memoryQuantity say.
function onGrid(resource, value) {
  return resource === "cpu" ? Math.ceil(Number((value * 1000).toFixed(6))) / 1000
    : value < MIB ? Math.ceil(value) : Math.ceil(value / MIB) * MIB;
}
// Kubernetes quantities as the service writes them (recommender/units.py): CPU rounded up to whole milli-cores,
// memory rounded up to whole MiB (Gi when a whole number of GiB).
function cpuQuantity(cores) {
  const milli = Math.round(onGrid("cpu", cores) * 1000);
  return milli % 1000 ? milli + "m" : String(milli / 1000);
}
function memoryQuantity(bytes) {
  const written = onGrid("memory", bytes);
  if (bytes < MIB) return String(written);
  const mebibytes = written / MIB;
  return mebibytes % 1024 ? mebibytes + "Mi" : mebibytes / 1024 + "Gi";
}

// ---- model status, token, errors ----------------------------------------------------------------------------------

const statusBadge = document.getElementById("model-status");
const banner = document.getElementById("banner");

async function refreshStatus() {
  banner.hidden = true;
  try {
    const status = await api("status");
    statusBadge.dataset.state = status.stale ? "stale" : "fresh";
    statusBadge.textContent = `model ${status.version} · ${fmt.age(status.age_seconds)} old`;
    statusBadge.title = `source ${status.source}; data ${fmt.time(status.data_window.first_sample)} – ${fmt.time(status.data_window.last_sample)}`;
    if (status.stale) {
      banner.hidden = false;
      banner.dataset.kind = "stale";
      banner.textContent = `Stale model: these recommendations were made for ${fmt.time(status.as_of)}, ` +
        `${fmt.age(status.age_seconds)} ago (more than ${fmt.age(status.stale_after_seconds)}). ` +
        "Check that training runs (recommender train, the training CronJob).";
    }
    return status;
  } catch (error) {
    statusBadge.dataset.state = "error";
    statusBadge.textContent = error.status === 401 ? "token needed" : error.status === 503 ? "no model" : "status unavailable";
    return null;
  }
}

const tokenForm = document.getElementById("token-form");
const tokenInput = document.getElementById("token-input");
document.getElementById("token-button").addEventListener("click", () => {
  tokenForm.hidden = !tokenForm.hidden;
  if (!tokenForm.hidden) tokenInput.focus();
});
tokenForm.addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, tokenInput.value.trim());
  tokenInput.value = "";
  tokenForm.hidden = true;
  render();
});
document.getElementById("token-clear").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  render();
});

function errorState(error) {
  if (error.status === 401) {
    tokenForm.hidden = false;
    const had = sessionStorage.getItem(TOKEN_KEY);
    return state("unauthorized", el("strong", {}, had ? "The token was refused." : "This service needs a bearer token."),
      " Enter one above (a token from the token file, or a Kubernetes ServiceAccount token when TokenReview is on).");
  }
  if (error.status === 503) {
    return state("no-model", el("strong", {}, "No model version is loaded yet. "),
      "Train one (", el("code", {}, "recommender train --input usage.csv --store model-store"),
      ") and the service picks it up within seconds. ", el("span", { class: "muted" }, error.message));
  }
  if (error.status === 404) return state("not-found", el("strong", {}, "Not found: "), error.message);
  return state("error", el("strong", {}, error.status ? `Error ${error.status}: ` : "Error: "), error.message);
}

// ---- the chart ----------------------------------------------------------------------------------------------------

// Series: {label, color, points: [[hours from as_of, value|null], ...], width, dash, step}. Draws an SVG with hours
// on x (0 = the decision time: observed before, forecast after) and the value on y, plus a hover readout.
function chart(title, format, series, kind) {
  const width = 640, height = 250, left = 62, right = 24, top = 12, bottom = 32;
  const drawn = series.filter((s) => s.points.some(([, y]) => y !== null && y !== undefined));
  const xs = drawn.flatMap((s) => s.points.map(([x]) => x));
  const ys = drawn.flatMap((s) => s.points.map(([, y]) => y)).filter((y) => y !== null && y !== undefined);
  const box = el("div", { class: "chart", "data-testid": "chart" }, el("h3", {}, title));
  if (!ys.length) {
    box.append(state("no-data", "No samples for this resource."));
    return box;
  }
  const xMin = Math.min(...xs, 0), xMax = Math.max(...xs, 1);
  // Ticks at round steps in one unit (1, 2 or 5 x 10^k), the top one just above the highest value.
  const highest = Math.max(...ys) || 1;
  const unit = UNITS[kind](highest);
  const yStep = roundStep(highest / unit.scale, 4) * unit.scale;
  const yMax = Math.ceil((highest * 1.02) / yStep) * yStep;
  const tick = inUnit(unit, yStep / unit.scale);
  const sx = (x) => left + ((x - xMin) / (xMax - xMin)) * (width - left - right);
  const sy = (y) => top + (1 - y / yMax) * (height - top - bottom);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", title);
  const add = (tag, attributes, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  for (let i = 0; i * yStep <= yMax * (1 + 1e-9); i++) {
    const y = i * yStep;
    add("line", { class: "grid", x1: left, x2: width - right, y1: sy(y), y2: sy(y) });
    add("text", { x: left - 6, y: sy(y) + 4, "text-anchor": "end", "data-tick": y }, tick(y));
  }
  const tickStep = xMax - xMin > 48 ? 12 : 6;
  for (let x = Math.ceil(xMin / tickStep) * tickStep; x <= xMax; x += tickStep) {
    add("line", { class: "grid", x1: sx(x), x2: sx(x), y1: top, y2: height - bottom });
    add("text", { x: sx(x), y: height - bottom + 14, "text-anchor": "middle" }, x === 0 ? "now" : (x > 0 ? "+" : "") + x + " h");
  }
  add("line", { class: "axis", x1: left, x2: width - right, y1: height - bottom, y2: height - bottom });
  add("line", { class: "now", x1: sx(0), x2: sx(0), y1: top, y2: height - bottom });
  add("text", { x: width - right, y: height - 4, "text-anchor": "end" }, "hours from the decision time");
  for (const s of drawn) {
    let d = "", pen = false;
    for (const [x, y] of s.points) {
      if (y === null || y === undefined) { pen = false; continue; }
      if (!pen) d += `M${sx(x).toFixed(1)},${sy(y).toFixed(1)}`;
      else if (s.step) d += `H${sx(x).toFixed(1)}V${sy(y).toFixed(1)}`;
      else d += `L${sx(x).toFixed(1)},${sy(y).toFixed(1)}`;
      pen = true;
    }
    const line = add("path", { d, fill: "none", stroke: s.color, "stroke-width": s.width || 1.6, "data-series": s.key });
    if (s.dash) line.setAttribute("stroke-dasharray", s.dash);
    if (s.marker) add("circle", { cx: sx(s.marker[0]), cy: sy(s.marker[1]), r: 4, fill: s.color, "data-series": s.key + "-marker" });
  }
  const cursor = add("line", { class: "axis", x1: 0, x2: 0, y1: top, y2: height - bottom, visibility: "hidden" });
  const readout = el("div", { class: "muted readout" }, "\u00a0");
  svg.addEventListener("mousemove", (event) => {
    const bounds = svg.getBoundingClientRect();
    const x = xMin + ((event.clientX - bounds.left) / bounds.width * width - left) / (width - left - right) * (xMax - xMin);
    if (x < xMin || x > xMax) return;
    cursor.setAttribute("x1", sx(x));
    cursor.setAttribute("x2", sx(x));
    cursor.setAttribute("visibility", "visible");
    const parts = drawn.map((s) => {
      let best = null;
      for (const [px, py] of s.points) if (px <= x + 1e-9 && py !== null && py !== undefined) best = py;
      return best === null ? null : `${s.label} ${format(best)}`;
    }).filter(Boolean);
    readout.textContent = `${x >= 0 ? "+" : ""}${x.toFixed(1)} h: ${parts.join(" · ")}`;
  });
  box.append(svg, el("div", { class: "legend" },
    drawn.map((s) => el("span", {}, el("i", { style: `background:${s.color}` }), s.label))), readout);
  return box;
}

function flat(label, key, color, value, x0, x1, extra = {}) {
  return { label, key, color, points: value === null || value === undefined ? [] : [[x0, value], [x1, value]], ...extra };
}

function timeline(values, startHours, stepHours) {
  return (values || []).map((v, i) => [startHours + i * stepHours, v]);
}

// ---- overview -----------------------------------------------------------------------------------------------------

const MAX_ROWS = 500;
const filters = { namespace: "", kind: "", qos: "", priority: "", q: "", sort: "cpu", risky: false };

function readFilters() {
  const query = new URLSearchParams(location.hash.split("?")[1] || "");
  for (const key of Object.keys(filters)) {
    if (key === "risky") filters.risky = query.get("risky") === "1";
    else filters[key] = query.get(key) || (key === "sort" ? "cpu" : "");
  }
}

function writeFilters() {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(filters)) {
    if (key === "risky" ? value : value && !(key === "sort" && value === "cpu")) query.set(key, key === "risky" ? "1" : value);
  }
  const text = query.toString();
  history.replaceState(null, "", "#/" + (text ? "?" + text : ""));
}

const SORTS = {
  // Most freed first: the most negative change.
  cpu: (a, b) => (a.cpu_cores.change ?? Infinity) - (b.cpu_cores.change ?? Infinity),
  memory: (a, b) => (a.memory_bytes.change ?? Infinity) - (b.memory_bytes.change ?? Infinity),
  // Most serious first: OOM kills, then memory above its request, throttling, CPU above its request, count of risks.
  risk: (a, b) => (b.oom_kills - a.oom_kills)
    || ((b.memory_bytes.usage_above_request_fraction || 0) - (a.memory_bytes.usage_above_request_fraction || 0))
    || ((b.cpu_throttled_fraction || 0) - (a.cpu_throttled_fraction || 0))
    || ((b.cpu_cores.usage_above_request_fraction || 0) - (a.cpu_cores.usage_above_request_fraction || 0))
    || (b.risks.length - a.risks.length),
  name: (a, b) => `${a.namespace}/${a.workload}/${a.container}`.localeCompare(`${b.namespace}/${b.workload}/${b.container}`),
};

function matches(row) {
  const q = filters.q.toLowerCase();
  return (!filters.namespace || row.namespace === filters.namespace)
    && (!filters.kind || (row.kind || "unknown") === filters.kind)
    && (!filters.qos || row.qos_class === filters.qos)
    && (!filters.priority || row.priority_class === filters.priority)
    && (!filters.risky || row.risks.length > 0)
    && (!q || `${row.namespace}/${row.workload}/${row.container}`.toLowerCase().includes(q));
}

function totalsCards(totals, title) {
  const cpu = columnFormat("cpu", [totals.cpu_request_cores, totals.cpu_recommended_cores]);
  const cpuAll = columnFormat("cpu", [totals.cpu_request_cores_all_replicas]);
  const memory = columnFormat("memory", [totals.memory_request_bytes, totals.memory_recommended_bytes]);
  const memoryAll = columnFormat("memory", [totals.memory_request_bytes_all_replicas]);
  const stale = totals.stale ? `; ${totals.stale} stale, left out of these sums` : "";
  return el("div", { class: "cards", "data-testid": "totals" },
    el("div", { class: "card" }, el("div", { class: "label" }, `${title}: CPU requested → recommended`),
      el("div", { class: "value" }, `${cpu(totals.cpu_request_cores)} → ${cpu(totals.cpu_recommended_cores)} cores`),
      el("div", { class: "detail" }, signed(cpu, totals.cpu_change_cores), " cores per replica, ",
        signed(cpuAll, totals.cpu_change_cores_all_replicas), " across all replicas if applied")),
    el("div", { class: "card" }, el("div", { class: "label" }, `${title}: memory requested → recommended`),
      el("div", { class: "value" }, `${memory(totals.memory_request_bytes)} → ${memory(totals.memory_recommended_bytes)}`),
      el("div", { class: "detail" }, signed(memory, totals.memory_change_bytes), " per replica, ",
        signed(memoryAll, totals.memory_change_bytes_all_replicas), " across all replicas if applied")),
    el("div", { class: "card" }, el("div", { class: "label" }, "containers"),
      el("div", { class: "value" }, totals.containers),
      el("div", { class: "detail", "data-testid": "totals-detail" }, `${totals.at_risk} at risk${stale}`)));
}

function select(name, label, values, current) {
  return el("label", {}, label, el("select", { name, "data-filter": name },
    el("option", { value: "" }, "all"),
    values.map((v) => el("option", { value: v, selected: v === current }, v))));
}

async function renderOverview() {
  readFilters();
  const data = await api("overview");
  const rows = data.workloads;
  if (!rows.length) return [state("no-data", "The loaded model version has no workloads.")];
  const distinct = (f) => [...new Set(rows.map(f))].sort();
  // One unit per column over every row (not only those shown), so a filter does not change the units.
  const columns = {
    cpu: columnFormat("cpu", rows.flatMap((r) => [r.cpu_cores.current_request, r.cpu_cores.recommended])),
    cpuChange: columnFormat("cpu", rows.map((r) => r.cpu_cores.change)),
    memory: columnFormat("memory", rows.flatMap((r) => [r.memory_bytes.current_request, r.memory_bytes.recommended])),
    memoryChange: columnFormat("memory", rows.map((r) => r.memory_bytes.change)),
  };
  const body = el("tbody", { "data-testid": "workload-rows" });
  const count = el("span", { class: "muted", "data-testid": "row-count" });
  const fill = () => {
    const shown = rows.filter(matches).sort(SORTS[filters.sort] || SORTS.cpu);
    // A big cluster's table stays quick to draw: the first rows in the chosen order, the rest behind the filters.
    count.textContent = `${shown.length} of ${rows.length} containers` +
      (shown.length > MAX_ROWS ? `, the first ${MAX_ROWS} shown: narrow the filters for the rest` : "");
    body.replaceChildren(...(shown.length ? shown.slice(0, MAX_ROWS).map((row) => overviewRow(row, columns))
      : [el("tr", {}, el("td", { colspan: 10 }, state("no-match", "No workload matches these filters.")))]));
  };
  const controls = el("form", { class: "filters", onsubmit: (e) => e.preventDefault() },
    el("label", {}, "search", el("input", { type: "search", name: "q", value: filters.q, placeholder: "namespace/workload/container", "data-filter": "q" })),
    select("namespace", "namespace", distinct((r) => r.namespace), filters.namespace),
    select("kind", "kind", distinct((r) => r.kind || "unknown"), filters.kind),
    select("qos", "QoS class", distinct((r) => r.qos_class), filters.qos),
    select("priority", "priority class", distinct((r) => r.priority_class), filters.priority),
    el("label", {}, "sort by", el("select", { name: "sort", "data-filter": "sort" },
      [["cpu", "CPU savings"], ["memory", "memory savings"], ["risk", "risk"], ["name", "name"]].map(([v, text]) =>
        el("option", { value: v, selected: v === filters.sort }, text)))),
    el("label", {}, "at risk only", el("input", { type: "checkbox", name: "risky", checked: filters.risky, "data-filter": "risky" })),
    count);
  controls.addEventListener("input", (event) => {
    const key = event.target.dataset.filter;
    if (!key) return;
    filters[key] = event.target.type === "checkbox" ? event.target.checked : event.target.value;
    writeFilters();
    fill();
  });
  fill();
  const namespaces = Object.entries(data.namespaces);
  const totals = namespaces.map(([, t]) => t);
  const per = (kind, keys) => columnFormat(kind, totals.flatMap((t) => keys.map((k) => t[k])));
  const nsCpu = per("cpu", ["cpu_request_cores", "cpu_recommended_cores"]), nsCpuChange = per("cpu", ["cpu_change_cores"]);
  const nsCpuAll = per("cpu", ["cpu_change_cores_all_replicas"]);
  const nsMemory = per("memory", ["memory_request_bytes", "memory_recommended_bytes"]);
  const nsMemoryChange = per("memory", ["memory_change_bytes"]), nsMemoryAll = per("memory", ["memory_change_bytes_all_replicas"]);
  return [
    el("h1", {}, "Workloads: current requests against recommendations"),
    totalsCards(data.cluster, "cluster"),
    el("p", { class: "muted" }, "Per replica, and times each workload's current replicas where it says so. The current request " +
      "is the container's request, or its limit where only a limit is set; a change in green frees resources, in red adds " +
      "what is missing. A stale container (no samples for days) is marked so and left out of every total: nothing would " +
      "change for it. The same figures as `recommender show`. Recommendations made for " + fmt.time(data.as_of) + "."),
    el("details", { open: namespaces.length > 1 },
      el("summary", {}, `${namespaces.length} namespace${namespaces.length > 1 ? "s" : ""}`),
      el("table", { "data-testid": "namespaces" },
        el("thead", {}, el("tr", {}, ["namespace", "containers", "at risk", "stale", "CPU requested", "CPU recommended", "CPU change",
          "CPU change, all replicas", "memory requested", "memory recommended", "memory change",
          "memory change, all replicas"].map((h, i) => el("th", { class: i ? "num" : "" }, h)))),
        el("tbody", {}, namespaces.map(([name, t]) => el("tr", {},
          el("td", {}, el("a", { href: "#/?namespace=" + encodeURIComponent(name) }, name)),
          el("td", { class: "num" }, t.containers), el("td", { class: "num" }, t.at_risk), el("td", { class: "num" }, t.stale),
          el("td", { class: "num" }, nsCpu(t.cpu_request_cores)), el("td", { class: "num" }, nsCpu(t.cpu_recommended_cores)),
          el("td", { class: "num" }, signed(nsCpuChange, t.cpu_change_cores)),
          el("td", { class: "num" }, signed(nsCpuAll, t.cpu_change_cores_all_replicas)),
          el("td", { class: "num" }, nsMemory(t.memory_request_bytes)), el("td", { class: "num" }, nsMemory(t.memory_recommended_bytes)),
          el("td", { class: "num" }, signed(nsMemoryChange, t.memory_change_bytes)),
          el("td", { class: "num" }, signed(nsMemoryAll, t.memory_change_bytes_all_replicas))))))),
    el("h2", {}, "Containers"),
    controls,
    el("table", { "data-testid": "workloads" },
      el("thead", {}, el("tr", {}, ["workload", "container", "kind", "QoS / priority", "replicas", "CPU request → recommended",
        "CPU change", "memory request → recommended", "memory change", "risks"].map((h, i) =>
        el("th", { class: [4, 5, 6, 7, 8].includes(i) ? "num" : "" }, h)))),
      body),
  ];
}

// A stale resource's change: nothing would be applied, and the totals leave it out.
function change(format, comparison) {
  return comparison.stale ? el("span", { class: "muted", "data-testid": "stale-change", title: "no samples for days: left out of the totals" }, "stale")
    : signed(format, comparison.change);
}

function overviewRow(row, columns) {
  const link = "#/workload/" + path(row.namespace, row.workload);
  return el("tr", { "data-workload": `${row.namespace}/${row.workload}/${row.container}`, "data-stale": row.stale ? "true" : null },
    el("td", {}, el("a", { href: link }, `${row.namespace}/${row.workload}`),
      row.stale ? el("span", { class: "tag", "data-testid": "stale-tag" }, "stale") : null),
    el("td", {}, row.container),
    el("td", {}, row.kind || el("span", { class: "muted" }, "unknown")),
    el("td", {}, el("span", { class: "tag" }, row.qos_class), el("span", { class: "tag" }, row.priority_class)),
    el("td", { class: "num" }, row.replicas),
    el("td", { class: "num" }, `${columns.cpu(row.cpu_cores.current_request)} → ${columns.cpu(row.cpu_cores.recommended)}`),
    el("td", { class: "num" }, change(columns.cpuChange, row.cpu_cores)),
    el("td", { class: "num" }, `${columns.memory(row.memory_bytes.current_request)} → ${columns.memory(row.memory_bytes.recommended)}`),
    el("td", { class: "num" }, change(columns.memoryChange, row.memory_bytes)),
    el("td", {}, row.risks.map((r) => el("span", { class: "risk" }, r))));
}

// ---- workload page ------------------------------------------------------------------------------------------------

function resourceChart(kind, rec, lines, stepHours) {
  const learned = rec[kind];
  const own = lines[kind === "cpu" ? "cpu_cores" : "memory_bytes"];
  const format = fmt[kind];
  const title = kind === "cpu" ? "CPU (cores)" : "memory";
  if (!learned || !own) return chart(title, format, [], kind);
  const past = own.usage.length * stepHours;
  const ahead = learned.short_term.length * stepHours;
  const current = kind === "cpu" ? rec.current.cpu_request_cores : rec.current.memory_request_bytes;
  // The peak is marked where the line rises to it after the decision time (null: the line is highest now).
  const peak = learned.peak.at === null ? undefined : [(learned.peak.at - lines.as_of) / HOUR, learned.peak.value];
  const live = learned.live_short_term;
  // The learned live line over its block (the next step, re-issued every pass), drawn over the short-term line whose
  // first step it is, with a dot at its start: a 5-minute block is a sliver of a two-day chart.
  const liveStart = live ? (live.issued_at - lines.as_of) / HOUR : 0;
  const liveLine = live ? [flat(`live short-term line (learned, ${liveBlock(live)})`, "live_short_term", COLORS.live,
    live.value, liveStart, (live.until - lines.as_of) / HOUR, { width: 4, marker: [liveStart, live.value] })] : [];
  // Drawn wide and light first, so a narrow line on the same value stays visible on top.
  return chart(`${title} of ${rec.container}`, format, [
    flat("limit", "limit", COLORS.limit, own.limit, -past, ahead, { width: 2.5 }),
    flat("long-term reservation", "long_term", COLORS.long, learned.long_term, 0, ahead, { width: 3 }),
    { label: "usage", key: "usage", color: COLORS.usage, points: timeline(own.usage, -past, stepHours) },
    { label: "short-term reservation", key: "short_term", color: COLORS.short, step: true, marker: peak,
      points: [...timeline(learned.short_term, 0, stepHours), [ahead, learned.short_term[learned.short_term.length - 1]]] },
    ...liveLine,
    flat("recommended request", "target", COLORS.target, learned.target, 0, ahead, { dash: "6 4" }),
    flat("current request", "request", COLORS.request, current, -past, ahead, { dash: "2 3", width: 1.2 }),
  ], kind);
}

// The block a live line covers, as its label says it ("next 5 min", "next 1 h").
function liveBlock(live) {
  if (!live) return "next step";
  const minutes = Math.round((live.until - live.issued_at) / 60);
  return minutes % 60 === 0 ? `next ${minutes / 60} h` : `next ${minutes} min`;
}

// Why a peak has no time (`peak.at` null): the line is highest at the decision time and falls, or it holds its
// highest from some step to the horizon's end, so no one time stands out.
function noPeakTime(line, stepSeconds) {
  const top = Math.max(...line), first = line.indexOf(top);
  if (line.slice(first).some((v) => v < top)) return " now (highest at the decision time)";
  return ` (no single time: highest from ${first ? `+${(first * stepSeconds / HOUR).toFixed(1)} h` : "now"} on)`;
}

function recommendationTable(rec, stepSeconds, row) {
  const rows = [
    ["current request (the limit where none is set)", (r) => r === "cpu" ? rec.current.cpu_request_cores ?? rec.current.cpu_limit_cores
      : rec.current.memory_request_bytes ?? rec.current.memory_limit_bytes],
    ["current limit", (r) => r === "cpu" ? rec.current.cpu_limit_cores : rec.current.memory_limit_bytes],
    // As written: the quantity the YAML and the webhook write (rounded up to a millicore or a MiB).
    ["recommended request (target, as written)", (r) => rec[r] && onGrid(r, rec[r].target)],
    ["lower bound", (r) => rec[r]?.lower_bound],
    ["upper bound", (r) => rec[r]?.upper_bound],
    ["uncapped target", (r) => rec[r]?.uncapped_target],
    [`live short-term line (learned, ${liveBlock(rec.cpu?.live_short_term ?? rec.memory?.live_short_term)})`,
      (r) => rec[r]?.live_short_term?.value],
    ["long-term reservation", (r) => rec[r]?.long_term],
    ["forecast peak", (r) => rec[r]?.peak.value],
    ["recommended limit", (r) => rec[r]?.limit],
    // On the same grid as the limit it bounds: a limit floored at the highest sample is that sample rounded up.
    ["ceiling: max(limit, highest sample)", (r) => rec[r]?.ceiling == null ? null : onGrid(r, rec[r].ceiling)],
  ];
  const peakTime = (r) => !rec[r] ? "" : rec[r].peak.at === null ? noPeakTime(rec[r].short_term, stepSeconds)
    : " at " + fmt.time(rec[r].peak.at);
  // The level the lines are calibrated to over the whole fleet, not a promise for this container; none where the
  // lines are held flat (stale), as no forecast was made at any level.
  const level = (r) => !rec[r] ? "–" : rec[r].stale ? "none: no forecast (stale)"
    : rec[r].levels ? (100 * rec[r].levels.short_term).toFixed(1) + " %" : "–";
  const share = (unit) => {
    const value = row?.[unit]?.usage_above_recommended_fraction;
    return value === null || value === undefined ? "–" : (100 * value).toFixed(1) + " %";
  };
  const stale = ["cpu", "memory"].some((r) => rec[r]?.stale);
  const cpu = columnFormat("cpu", rows.map(([, value]) => value("cpu")));
  const memory = columnFormat("memory", rows.map(([, value]) => value("memory")));
  const table = el("table", { "data-testid": "recommendation" },
    el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", { class: "num" }, "CPU"), el("th", { class: "num" }, "memory"))),
    el("tbody", {}, rows.map(([label, value]) => el("tr", {}, el("td", {}, label),
      el("td", { class: "num" }, cpu(value("cpu")), label === "forecast peak" ? peakTime("cpu") : ""),
      el("td", { class: "num" }, memory(value("memory")), label === "forecast peak" ? peakTime("memory") : ""))),
      el("tr", {}, el("td", {}, "risk level (the share of every pod's samples the lines are built to leave above them, over the fleet; one container's own can differ)"),
        el("td", { class: "num" }, level("cpu")), el("td", { class: "num" }, level("memory"))),
      el("tr", { "data-testid": "own-share" }, el("td", {}, "this container's own share of the last day above the recommended request (its busiest pod per 5 minutes, which passes it more often than its pods do on average)"),
        el("td", { class: "num" }, share("cpu_cores")), el("td", { class: "num" }, share("memory_bytes")))));
  if (!stale) return table;
  // What the lines hold, as the service names it per resource (`models.short_term`).
  const held = ["cpu", "memory"].filter((r) => rec[r]?.stale)
    .map((r) => `${r === "cpu" ? "CPU" : "memory"}: ${(rec[r].models?.short_term || "the current request held flat").replace(/^stale: /, "")}`);
  return el("div", {}, el("p", { class: "stale", "data-testid": "stale-recommendation" },
    `Stale: no samples since ${rec.history ? fmt.time(rec.history.last_sample) : "long ago"}, so no fresh forecast was made ` +
    `and every line holds what the container asks for now (${held.join("; ")}). The webhook leaves this container alone ` +
    "and the totals leave it out."), table);
}

// The lines the usage ceiling touched, each with its rule: held at the ceiling, or the evidence above it.
function ceilingRules(rec) {
  const names = { target: "request (target)", uncapped_target: "uncapped target", upper_bound: "upper bound",
    short_term: "short-term reservation", live_short_term: "live short-term line", long_term: "long-term reservation",
    peak: "forecast peak" };
  const items = [];
  for (const resource of ["cpu", "memory"]) {
    for (const [line, rule] of Object.entries(rec[resource]?.ceiling_rules || {})) {
      items.push(el("li", {}, `${resource === "cpu" ? "CPU" : "memory"} ${names[line] || line}: ${rule}`));
    }
  }
  if (!items.length) return null;
  return el("div", { "data-testid": "ceiling-rules" }, el("p", { class: "muted" },
    "No line goes above max(limit, highest sample of the history window) without evidence that the container needs " +
    "more (OOM kills, usage at the limit, CPU throttling):"), el("ul", {}, items));
}

// How many days of data a model's window (`days=14.0`, `7 daily maxima`) really covered for this container.
function windowUsed(name, rec, asOf) {
  const found = name.match(/days=([\d.]+)/) || name.match(/(\d+) daily maxima/);
  if (!found || !rec.history) return "–";
  const window = Number(found[1]), had = (asOf - rec.history.first_sample) / 86400;
  return had < window ? `${had.toFixed(1)} of ${window} days (all its data)` : `${window} days`;
}

// The calibration factor, and where the line was brought from each step's busiest pod to every pod's samples, that
// factor too (`pod_factor`, 1 for a container of one pod at a time): the two scales between the model and the line.
function calibration(quality) {
  const own = "×" + quality.calibration_factor.toFixed(2);
  const pods = quality.pod_factor ?? 1;
  return pods === 1 ? own : `${own}, ×${pods.toFixed(2)} for every pod`;
}

function modelsTable(rec, asOf) {
  const lineNames = { target: "request (target)", short_term: "short-term reservation", long_term: "long-term reservation", peak: "peak" };
  const body = [];
  for (const resource of ["cpu", "memory"]) {
    const models = rec[resource]?.models;
    if (!models) continue;
    for (const [line, label] of Object.entries(lineNames)) {
      const quality = (models.quality || {})[line];
      body.push(el("tr", {}, el("td", {}, resource), el("td", {}, label),
        el("td", {}, el("code", {}, models[line].replace(/ (cost=\S+|not yet backtested) x\S+$/, ""))),
        el("td", { class: "num" }, windowUsed(models[line], rec, asOf)),
        el("td", { class: "num" }, quality ? fmt.cost(quality.cost) : el("span", { class: "muted" }, "rule")),
        el("td", { class: "num" }, quality ? fmt.cost(quality.next_best_cost) : ""),
        el("td", { class: "num" }, quality ? calibration(quality) : "")));
    }
  }
  if (!body.length) return state("no-data", "This version does not record which models drew the lines.");
  return el("table", { "data-testid": "models" },
    el("thead", {}, el("tr", {}, ["resource", "line", "chosen model", "window used", "backtest cost", "best other", "calibration"]
      .map((h, i) => el("th", { class: i > 2 ? "num" : "" }, h)))),
    el("tbody", {}, body));
}

function yamlSnippet(namespace, workload, kind, recs, version) {
  const lines = [
    `# ${namespace}/${workload}: resources recommended by koord-recommender (model ${version}), per container.`,
    "# Limits, where set, are the recommendation's limit, what the webhook writes: scaled by recommended / current request as VPA does,",
    "# never below the request nor below the highest usage of the history window (memory: plus a margin).",
    `# kubectl -n ${namespace} edit ${kind ? kind.toLowerCase() : "<kind>"} ${workload}`,
  ];
  // Where the pod spec sits in the workload's manifest.
  const podSpec = { Pod: ["spec"], CronJob: ["spec", "jobTemplate", "spec", "template", "spec"] }[kind] || ["spec", "template", "spec"];
  podSpec.forEach((key, depth) => lines.push("  ".repeat(depth) + key + ":"));
  const indent = "  ".repeat(podSpec.length);
  lines.push(indent + "containers:");
  for (const rec of recs) {
    if (rec.cpu?.stale || rec.memory?.stale) {
      lines.push(`${indent}  # ${rec.container} is stale (no samples for days): sized from old samples; the webhook leaves it alone.`);
    }
    lines.push(`${indent}  - name: ${rec.container}`, `${indent}    resources:`, `${indent}      requests:`);
    if (rec.cpu) lines.push(`${indent}        cpu: ${cpuQuantity(rec.cpu.target)}`);
    if (rec.memory) lines.push(`${indent}        memory: ${memoryQuantity(rec.memory.target)}`);
    // The limit is the recommendation's own `limit` (on the quantity grid, what the webhook writes), never recomputed.
    const limits = [];
    if (rec.cpu?.limit != null) limits.push(`${indent}        cpu: ${cpuQuantity(rec.cpu.limit)}`);
    if (rec.memory?.limit != null) limits.push(`${indent}        memory: ${memoryQuantity(rec.memory.limit)}`);
    if (limits.length) lines.push(`${indent}      limits:`, ...limits);
  }
  return lines.join("\n") + "\n";
}

async function renderWorkload(namespace, workload) {
  const [recs, overview, status] = await Promise.all([
    api("recommendations/" + path(namespace, workload)),
    api("overview"),
    api("status"),
  ]);
  const lines = await Promise.all(recs.map((r) => api("recommendations/" + path(namespace, workload, r.container) + "/lines")));
  const rows = Object.fromEntries(overview.workloads.filter((w) => w.namespace === namespace && w.workload === workload)
    .map((w) => [w.container, w]));
  const kind = recs[0].kind;
  const sections = [
    el("p", {}, el("a", { href: "#/" }, "← all workloads")),
    el("h1", {}, `${namespace}/${workload}`),
  ];
  recs.forEach((rec, i) => {
    const own = lines[i], row = rows[rec.container];
    const stepHours = own.step_seconds / HOUR;
    sections.push(
      el("h2", {}, "container ", el("code", {}, rec.container), " ",
        row ? [el("span", { class: "tag" }, rec.kind || "kind unknown"), el("span", { class: "tag" }, row.qos_class),
          el("span", { class: "tag" }, row.priority_class)] : null),
      row && row.risks.length ? el("p", {}, row.risks.map((r) => el("span", { class: "risk" }, r))) : null,
      el("p", { class: "muted" }, `Learned from ${rec.history ? rec.history.pods + " pods, " + rec.history.samples + " samples, " +
        fmt.time(rec.history.first_sample) + " – " + fmt.time(rec.history.last_sample) : "no history"}; ` +
        `decision time ${fmt.time(own.as_of)}; the last day observed, then the forecast horizon.`),
      el("div", { class: "charts" }, resourceChart("cpu", rec, own, stepHours), resourceChart("memory", rec, own, stepHours)),
      el("h3", {}, "Recommendation"), recommendationTable(rec, own.step_seconds, row), ceilingRules(rec),
      el("h3", {}, "Models and their backtest quality"),
      el("p", { class: "muted" }, "Each line's model is chosen for the fleet, not per container: a rolling-origin backtest on " +
        "the last days over all containers (a third of the fleet by burstiness may keep a choice of its own), calibrated to " +
        "the fleet's risk level. In a fleet under 30 containers nothing is chosen or pooled: each container's lines are " +
        "the flat quantile of its own history at the risk level, unscaled. The " +
        "cost is this container's own on that backtest, weighing usage above the line against unused room, relative to " +
        "usage (lower is better). A model's window reaches back only as far as the container's data: the window used says how far."),
      modelsTable(rec, own.as_of));
  });
  const yaml = yamlSnippet(namespace, workload, kind, recs, status.version);
  const pre = el("pre", { class: "yaml", "data-testid": "yaml" }, yaml);
  const copy = el("button", { type: "button", class: "copy" }, "copy");
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(yaml);
      copy.textContent = "copied";
    } catch (_) {
      getSelection().selectAllChildren(pre);
      copy.textContent = "selected: press Ctrl+C";
    }
  });
  sections.push(el("h2", {}, "Recommended resources ", copy), pre);
  return sections;
}

// ---- nodes --------------------------------------------------------------------------------------------------------

async function renderNodes() {
  const names = await api("nodes");
  if (!names.length) {
    return [el("h1", {}, "Nodes"), state("no-data", "The service knows no nodes. Node lines need the cluster view: set ",
      el("code", {}, "KOORD_RECOMMENDER_EXTENDER__PODS_FILE"), " and ", el("code", {}, "..._NODES_FILE"),
      " (kept fresh by ", el("code", {}, "recommender cluster-files"), ").")];
  }
  return [el("h1", {}, "Nodes"), el("ul", { "data-testid": "nodes" },
    names.map((n) => el("li", {}, el("a", { href: "#/node/" + path(n) }, n))))];
}

function nodeChart(kind, resource, lines) {
  const format = fmt[kind];
  const stepHours = lines.step_seconds / HOUR;
  const ahead = resource.short_term_reservation.length * stepHours;
  const usageStep = (resource.usage_step_seconds ?? lines.usage_step_seconds ?? lines.step_seconds) / HOUR;
  const usage = Array.isArray(resource.usage) ? resource.usage : [];
  const usageStart = resource.usage_start ?? lines.usage_start;
  const past = usageStart !== undefined && usageStart !== null ? (usageStart - lines.as_of) / HOUR : -usage.length * usageStep;
  const span = [Math.min(past, 0), ahead];
  const threshold = resource.allocatable && resource.threshold_percent ? resource.allocatable * resource.threshold_percent / 100 : null;
  return chart(kind === "cpu" ? "CPU (cores)" : "memory", format, [
    flat("allocatable", "allocatable", "#222", resource.allocatable, ...span, { width: 1.2 }),
    flat("usage threshold", "threshold", "#b42318", threshold, ...span, { dash: "4 3", width: 1.2 }),
    flat("limit", "limit", COLORS.limit, resource.limit, ...span, { width: 2.5 }),
    flat("long-term reservation", "long_term", COLORS.long, resource.long_term_reservation, 0, ahead, { width: 3 }),
    { label: "usage", key: "usage", color: COLORS.usage, points: timeline(usage, past, usageStep) },
    flat("system usage", "system", "#9467bd", resource.system_usage, ...span, { dash: "2 2", width: 1.2 }),
    { label: "short-term reservation", key: "short_term", color: COLORS.short, step: true,
      points: [...timeline(resource.short_term_reservation, 0, stepHours),
        [ahead, resource.short_term_reservation[resource.short_term_reservation.length - 1]]] },
  ], kind);
}

function reclaimableTable(lines) {
  const resources = [["cpu", lines.cpu_cores], ["memory", lines.memory_bytes]].filter(([, r]) => r && r.reclaimable);
  if (!resources.length) return null;
  const koord = (r, key) => (r.reclaimable.koordinator || {})[key];
  const rows = [
    ["koord-batch (below the short-term line)", (r) => r.reclaimable.batch],
    ["koord-mid (below the long-term line)", (r) => r.reclaimable.mid],
    ["Koordinator's batch, policy usage", (r) => koord(r, "usage")],
    ["Koordinator's batch, policy request (memory only)", (r) => koord(r, "request")],
    ["Koordinator's batch, policy maxUsageRequest", (r) => koord(r, "max_usage_request")],
    ["Koordinator's mid", (r) => koord(r, "mid")],
  ];
  return [el("h2", {}, "Reclaimable"),
    el("table", { "data-testid": "reclaimable" },
      el("thead", {}, el("tr", {}, el("th", {}, ""), resources.map(([k]) => el("th", { class: "num" }, k)))),
      el("tbody", {},
        rows.map(([label, value]) => el("tr", {}, el("td", {}, label),
          resources.map(([k, r]) => el("td", { class: "num" }, fmt[k](value(r) ?? null))))),
        el("tr", {}, el("td", {}, "policy"), resources.map(([, r]) => el("td", { class: "num" }, r.reclaimable.policy ?? "–"))),
        el("tr", {}, el("td", {}, "stale node metrics"), resources.map(([, r]) =>
          el("td", { class: "num" }, r.reclaimable.stale ? "yes: batch resources withdrawn" : "no")))))];
}

async function renderNode(node) {
  const lines = await api("nodes/" + path(node) + "/lines");
  const pods = Array.isArray(lines.pods) ? lines.pods : null;
  return [
    el("p", {}, el("a", { href: "#/nodes" }, "← all nodes")),
    el("h1", {}, "node ", el("code", {}, node)),
    el("p", { class: "muted" }, `Sum of its pods' lines (their requests where nothing is learned); decision time ${fmt.time(lines.as_of)}.`),
    el("div", { class: "charts" }, nodeChart("cpu", lines.cpu_cores, lines), nodeChart("memory", lines.memory_bytes, lines)),
    reclaimableTable(lines),
    pods === null ? null : el("h2", {}, `Pods (${pods.length})`),
    pods === null ? null : pods.length === 0 ? state("no-data", "No pods on this node.") :
      el("table", { "data-testid": "pods" },
        el("thead", {}, el("tr", {}, ["namespace", "pod", "workload", "priority class"].map((h) => el("th", {}, h)))),
        el("tbody", {}, pods.map((p) => el("tr", {}, el("td", {}, p.namespace), el("td", {}, p.pod),
          el("td", {}, p.workload ? el("a", { href: "#/workload/" + path(p.namespace, p.workload) }, p.workload) : "–"),
          el("td", {}, p.priority_class ?? "–"))))),
  ];
}

// ---- routing ------------------------------------------------------------------------------------------------------

let rendering = 0;

async function render() {
  const ticket = ++rendering;
  const [route] = location.hash.replace(/^#\/?/, "").split("?");
  const parts = route.split("/").filter(Boolean).map(decodeURIComponent);
  view.replaceChildren(state("loading", "Loading…"));
  view.dataset.ready = "false";
  // The route drawn, beside "ready": a hash change is dispatched after the URL changes, so "ready" alone can still
  // describe the page being left (what a test or a script waiting for the new page must not read).
  view.dataset.route = route;
  const status = refreshStatus();
  let content;
  try {
    if (parts[0] === "workload" && parts.length === 3) content = await renderWorkload(parts[1], parts[2]);
    else if (parts[0] === "nodes") content = await renderNodes();
    else if (parts[0] === "node" && parts.length === 2) content = await renderNode(parts[1]);
    else content = await renderOverview();
  } catch (error) {
    if (!(error instanceof ApiError)) console.error(error);
    content = [errorState(error instanceof ApiError ? error : new ApiError(0, error.message))];
  }
  await status;
  if (ticket !== rendering) return;
  view.replaceChildren(...content.flat().filter(Boolean));
  view.dataset.ready = "true";
}

window.addEventListener("hashchange", render);
render();
