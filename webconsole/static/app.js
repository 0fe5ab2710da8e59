// The Tidelog console's page: hash routes, one view at a time, its live part redrawn from
// the console's JSON every refresh interval. Everything it loads comes from the console.
"use strict";

const main = document.getElementById("main");
const statusEl = document.getElementById("status");
let refreshMs = 1000;
let timer = null;
let view = null;           // {live: async () => void}
let generation = 0;        // a route change makes older answers stale
const charts = new Map();  // element id -> uPlot

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
// a record's timestamp is any int64: one a Date cannot hold (nanoseconds, say) shows as a number
function timestamp(ms) {
  const d = new Date(ms);
  return Number.isFinite(d.getTime()) ? d.toISOString() : esc(ms);
}
function num(v) { return v === null || v === undefined || v < 0 ? "–" : Number(v).toLocaleString("en-US"); }
function rate(v) { return v === null || v === undefined ? "–" : (v < 10 ? v.toFixed(1) : Math.round(v).toLocaleString("en-US")); }
function bytes(v) {
  if (v === null || v === undefined || v < 0) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i ? v.toFixed(1) : v) + " " + units[i];
}

async function api(path, options = {}) {
  const response = await fetch(path, {headers: {"Content-Type": "application/json"}, ...options});
  let body;
  try { body = await response.json(); } catch (e) { body = {error: `${response.status} ${response.statusText}`}; }
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

function setStatus(text, bad) {
  statusEl.textContent = text;
  statusEl.className = "status" + (bad ? " bad" : "");
}

function confirmAction(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise(resolve => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), {once: true});
    dialog.returnValue = "";
    dialog.showModal();
  });
}

// Runs a cluster-changing action after confirmation; shows the broker's error text on failure.
async function act(question, outEl, call, done) {
  if (!await confirmAction(question)) return;
  outEl.innerHTML = "";
  try {
    const answer = await call();
    outEl.innerHTML = `<div class="ok">${esc(done(answer))}</div>`;
  } catch (e) {
    outEl.innerHTML = `<div class="error" data-role="action-error">${esc(e.message)}</div>`;
  }
}

function chart(id, title, labels, times, seriesValues, width = 460) {
  const el = document.getElementById(id);
  if (!el) return;
  const data = [times.map(t => t / 1000), ...seriesValues];
  const old = charts.get(id);
  if (old && old.root.isConnected && old.series.length === labels.length + 1) {
    old.setData(data);
    return;
  }
  if (old) old.destroy();
  el.innerHTML = "";
  const colors = ["#0b6e99", "#c2410c", "#1f8a4c", "#7c3aed", "#b45309", "#be185d"];
  const opts = {
    title, width, height: 180,
    series: [{}, ...labels.map((label, i) => ({label, stroke: colors[i % colors.length], width: 1.5, spanGaps: false}))],
    axes: [{}, {size: 60}],
  };
  charts.set(id, new uPlot(opts, data, el));
}

function pager(p, go) {
  const wrap = document.createElement("div");
  wrap.className = "pager";
  wrap.innerHTML = `<button data-p="prev" ${p.page <= 1 ? "disabled" : ""}>‹ Prev</button>
    <span data-role="page-info">page ${p.page} of ${p.pages} (${num(p.total)} in all)</span>
    <button data-p="next" ${p.page >= p.pages ? "disabled" : ""}>Next ›</button>`;
  wrap.querySelector('[data-p="prev"]').onclick = () => go(p.page - 1);
  wrap.querySelector('[data-p="next"]').onclick = () => go(p.page + 1);
  return wrap;
}

// -- overview --------------------------------------------------------------------------------

function overviewView() {
  main.innerHTML = `<h1>Cluster</h1><div id="ov"></div>
    <h2>Throughput per broker (bytes/s, last minutes)</h2>
    <p class="legend">In: bytes written to the broker's replicas (produced to its leaders, copied to its followers).
    Out: bytes its followers copied from it. Consumer reads are in the brokers' Prometheus metrics.</p>
    <div class="charts"><div class="chart" id="chart-in"></div><div class="chart" id="chart-out"></div></div>`;
  return {
    async live() {
      const o = await api("/api/overview");
      refreshMs = o.refresh_ms;
      const warn = n => n > 0 ? " warn" : "";
      document.getElementById("ov").innerHTML = `
        <div class="cards">
          <div class="card"><div class="v" data-role="broker-count">${o.brokers.length}</div><div class="k">brokers</div></div>
          <div class="card"><div class="v">${o.controller}</div><div class="k">controller</div></div>
          <div class="card"><div class="v">${num(o.topics)}</div><div class="k">topics</div></div>
          <div class="card"><div class="v">${num(o.partitions)}</div><div class="k">partitions</div></div>
          <div class="card${warn(o.under_replicated)}"><div class="v" data-role="under-replicated">${num(o.under_replicated)}</div><div class="k">under-replicated</div></div>
          <div class="card${warn(o.offline)}"><div class="v" data-role="offline">${num(o.offline)}</div><div class="k">offline partitions</div></div>
          <div class="card"><div class="v">${num(o.groups)}</div><div class="k">consumer groups</div></div>
        </div>
        <p class="muted">cluster id ${esc(o.cluster_id)} · console ${esc(o.version)} ·
          principal ${esc(o.permissions.principal)} (${esc(o.permissions.mode)})</p>
        ${o.error ? `<div class="error">${esc(o.error)}</div>` : ""}
        <table data-role="brokers"><thead><tr><th>Broker</th><th>Host</th><th>Rack</th><th>Version</th><th class="num">Leaders</th>
          <th class="num">In (B/s)</th><th class="num">Out (B/s)</th><th>State</th></tr></thead><tbody>
        ${o.brokers.map(b => `<tr data-broker="${b.id}"><td>${b.id} ${b.controller ? '<span class="badge ctl">controller</span>' : ""}</td>
          <td>${esc(b.host)}:${b.port}</td><td>${esc(b.rack ?? "–")}</td><td data-role="version">${esc(b.version ?? "–")}</td><td class="num">${num(b.leaders)}</td>
          <td class="num">${rate(last(b.bytes_in))}</td><td class="num">${rate(last(b.bytes_out))}</td>
          <td>${b.error ? `<span class="badge out" title="${esc(b.error)}">${b.error.includes("AUTHORIZATION") ? "log dirs not allowed" : "not answering"}</span>` : '<span class="badge isr">up</span>'}</td></tr>`).join("")}
        </tbody></table>`;
      const times = o.brokers.length ? o.brokers[0].bytes_in.map(p => p[0]) : [];
      const align = pts => times.map(t => { const p = pts.find(q => q[0] === t); return p ? p[1] : null; });
      chart("chart-in", "bytes in / s", o.brokers.map(b => `broker ${b.id}`), times, o.brokers.map(b => align(b.bytes_in)));
      chart("chart-out", "bytes out / s", o.brokers.map(b => `broker ${b.id}`), times, o.brokers.map(b => align(b.bytes_out)));
    },
  };
}

function last(points) { return points.length ? points[points.length - 1][1] : null; }

// -- topics ----------------------------------------------------------------------------------

function topicsView(params) {
  let pageNo = Number(params.get("page") || 1);
  let query = params.get("q") || "";
  main.innerHTML = `<h1>Topics</h1>
    <form class="inline" id="search"><label>Filter<input name="q" value="${esc(query)}" placeholder="name contains"></label>
      <button>Filter</button></form>
    <div id="create-area"></div><div id="topics-out"></div><div id="topics"></div>`;
  document.getElementById("search").onsubmit = e => { e.preventDefault(); query = e.target.q.value; pageNo = 1; view.live(); };
  let createShown = false;
  const out = document.getElementById("topics-out");
  function showCreate() {
    createShown = true;
    const area = document.getElementById("create-area");
    area.innerHTML = `<h2>Create a topic</h2><form class="inline" id="create">
      <label>Name<input name="name" required></label>
      <label>Partitions<input name="partitions" type="number" min="1" value="3" style="width:90px"></label>
      <label>Replication factor<input name="rf" type="number" min="1" value="3" style="width:90px"></label>
      <label>Configs (key=value, comma-separated)<input name="configs" placeholder="retention.ms=86400000"></label>
      <button class="primary" data-role="create-topic">Create</button></form>`;
    document.getElementById("create").onsubmit = e => {
      e.preventDefault();
      const f = e.target;
      const configs = {};
      for (const pair of f.configs.value.split(",").map(s => s.trim()).filter(Boolean)) {
        const i = pair.indexOf("=");
        configs[i < 0 ? pair : pair.slice(0, i).trim()] = i < 0 ? "" : pair.slice(i + 1).trim();
      }
      const body = {name: f.name.value.trim(), partitions: Number(f.partitions.value), replication_factor: Number(f.rf.value), configs};
      act(`Create topic "${body.name}" with ${body.partitions} partitions, replication factor ${body.replication_factor}?`, out,
          () => api("/api/topics", {method: "POST", body: JSON.stringify(body)}),
          a => `Created topic ${a.created}.`).then(() => view.live());
    };
  }
  return {
    async live() {
      const t = await api(`/api/topics?page=${pageNo}&size=50&q=${encodeURIComponent(query)}`);
      if (t.can_create && !createShown) showCreate();
      const el = document.getElementById("topics");
      el.innerHTML = `<table data-role="topics"><thead><tr><th>Topic</th><th class="num">Partitions</th><th class="num">RF</th>
        <th class="num">Under-replicated</th><th class="num">Offline</th><th class="num">Size</th>
        <th class="num">Msgs in/s</th><th class="num">Msgs out/s</th><th></th></tr></thead><tbody>
        ${t.items.map(r => `<tr data-topic="${esc(r.name)}"><td><a href="#/topic/${encodeURIComponent(r.name)}">${esc(r.name)}</a></td>
          <td class="num">${r.partitions}</td><td class="num">${r.replication_factor}</td><td class="num">${r.under_replicated}</td>
          <td class="num">${r.offline}</td><td class="num">${bytes(r.size)}</td><td class="num">${rate(r.messages_in)}</td>
          <td class="num">${rate(r.messages_out)}</td>
          <td>${r.can_delete && !r.internal ? `<button class="danger" data-delete="${esc(r.name)}">Delete</button>` : ""}</td></tr>`).join("")}
        </tbody></table>`;
      el.prepend(pager(t, p => { pageNo = p; view.live(); }));
      el.querySelectorAll("[data-delete]").forEach(b => b.onclick = () => {
        const name = b.dataset.delete;
        act(`Delete topic "${name}" and all its records? This cannot be undone.`, out,
            () => api(`/api/topics/${encodeURIComponent(name)}`, {method: "DELETE"}), a => `Deleted topic ${a.deleted}.`)
          .then(() => view.live());
      });
    },
  };
}

// -- one topic -------------------------------------------------------------------------------

function topicView(name, tab, params) {
  const base = `#/topic/${encodeURIComponent(name)}`;
  const tabs = [["partitions", "Partitions"], ["messages", "Messages"], ["produce", "Produce"], ["configs", "Configs"]];
  main.innerHTML = `<h1>Topic ${esc(name)}</h1><div class="tabs">${tabs.map(([k, label]) =>
    `<a href="${base}/${k}" class="${k === tab ? "active" : ""}">${label}</a>`).join("")}</div><div id="tab"></div>`;
  const el = document.getElementById("tab");
  const path = `/api/topics/${encodeURIComponent(name)}`;
  if (tab === "messages") return messagesTab(el, path, params);
  if (tab === "produce") return produceTab(el, path, name);
  if (tab === "configs") return configsTab(el, path, name);
  return partitionsTab(el, path);
}

function partitionsTab(el, path) {
  let pageNo = 1;
  el.innerHTML = `<p class="legend">Each replica on one offset axis, from the smallest log start offset to the largest log end offset:
    <span><i class="swatch" style="background:var(--isr)"></i>in-sync replica</span>
    <span><i class="swatch" style="background:var(--out)"></i>out of sync</span>
    <span><i class="swatch" style="background:var(--hw)"></i>high watermark</span>
    <span>bar: log start offset to log end offset (LEO)</span></p><div id="rates"></div><div id="parts"></div>`;
  return {
    async live() {
      const [t, p] = await Promise.all([api(path), api(`${path}/partitions?page=${pageNo}&size=20`)]);
      const parts = document.getElementById("parts");
      parts.innerHTML = p.error ? `<div class="error">${esc(p.error)}</div>` : "";
      parts.append(pager(p, n => { pageNo = n; view.live(); }));
      for (const part of p.items) parts.insertAdjacentHTML("beforeend", partitionHtml(part));
      document.getElementById("rates").innerHTML = `<p class="muted">${t.partitions} partitions · replication factor ${t.replication_factor}
        · messages in ${rate(last(t.messages_in))}/s · committed by groups ${rate(last(t.messages_out))}/s</p>`;
    },
  };
}

function partitionHtml(part) {
  const [lo, hi] = part.axis;
  const span = Math.max(1, hi - lo);
  const pos = o => (100 * (o - lo) / span).toFixed(2);
  const rows = part.replicas.map((r, i) => {
    const known = r.log_end_offset >= 0;
    const cls = (!known ? "unknown" : (r.in_isr ? "in" : "out")) + (r.stale ? " stale" : "");
    const state = r.in_isr ? '<span class="badge isr">ISR</span>' : '<span class="badge out">out of sync</span>';
    const bar = known ? `<div class="bar" style="left:${pos(Math.max(lo, r.log_start_offset))}%;width:${(pos(r.log_end_offset) - pos(Math.max(lo, r.log_start_offset))).toFixed(2)}%"></div>` : "";
    const hw = part.high_watermark >= 0 ? `<div class="hw${i ? "" : " labelled"}" style="left:${pos(part.high_watermark)}%"></div>` : "";
    return `<div class="replica ${cls}" data-replica="${r.broker}" data-in-isr="${r.in_isr}" data-leo="${r.log_end_offset}">
      <div class="name">broker ${r.broker} ${r.is_leader ? '<span class="badge leader">leader</span>' : ""} ${state}
        ${r.offline ? '<span class="badge out">offline</span>' : ""}${r.stale ? '<span class="badge out">not answering</span>' : ""}</div>
      <div class="axis">${bar}${hw}</div>
      <div class="figures">${known ? `${r.stale ? "last known: " : ""}start ${num(r.log_start_offset)} · LEO ${num(r.log_end_offset)} · lag ${num(r.lag)} · ${bytes(r.size)}` : "broker not answering"}</div></div>`;
  }).join("");
  return `<div class="partition" data-partition="${part.partition}">
    <div class="head"><strong>Partition ${part.partition}</strong><span>leader ${part.leader < 0 ? "none" : part.leader}</span>
      <span>leader epoch ${part.leader_epoch}</span><span>high watermark ${num(part.high_watermark)}</span>
      ${part.under_replicated ? '<span class="badge out">under-replicated</span>' : ""}</div>
    ${rows}
    <div class="scale"><span></span><span class="ends"><span>${num(lo)}</span><span>${num(hi)}</span></span><span></span></div></div>`;
}

function messagesTab(el, path, params) {
  el.innerHTML = `<form class="inline" id="browse">
      <label>Partition<input name="partition" type="number" min="0" value="${esc(params.get("partition") || 0)}" style="width:80px"></label>
      <label>From<select name="from"><option value="offset">offset</option><option value="timestamp">timestamp (ms or ISO)</option></select></label>
      <label>Offset / time<input name="at" value="${esc(params.get("offset") || 0)}"></label>
      <label>Limit<input name="limit" type="number" min="1" max="500" value="50" style="width:80px"></label>
      <label>Show value as<select name="as"><option>text</option><option>json</option><option>hex</option></select></label>
      <button class="primary">Read</button></form><div id="records"></div>`;
  const form = document.getElementById("browse");
  let lastAnswer = null;
  const show = () => { if (lastAnswer) document.getElementById("records").innerHTML = recordsHtml(lastAnswer, form.as.value); };
  // hex is sent only when asked for (or for bytes that are not text): ask again for it
  form.as.onchange = () => (form.as.value === "hex" && lastAnswer && !lastAnswer.hex) ? form.requestSubmit() : show();
  form.onsubmit = async e => {
    e.preventDefault();
    const q = new URLSearchParams({partition: form.partition.value, limit: form.limit.value,
                                   hex: form.as.value === "hex" ? "1" : "0"});
    if (form.from.value === "offset") q.set("offset", form.at.value.trim());
    else q.set("timestamp", /^\d+$/.test(form.at.value.trim()) ? form.at.value.trim() : String(Date.parse(form.at.value)));
    const out = document.getElementById("records");
    try {
      lastAnswer = await api(`${path}/records?${q}`);
      show();
    } catch (err) {
      out.innerHTML = `<div class="error">${esc(err.message)}</div>`;
    }
  };
  return {live: null, init: () => form.requestSubmit()};
}

function payload(p, as) {
  if (p === null) return '<span class="muted">null</span>';
  const cut = p.truncated ? `<span class="muted">first part of ${bytes(p.size)}</span>` : "";
  if ((as === "hex" && p.hex !== undefined) || p.text === null) return `<pre class="value">${esc(p.hex.replace(/(..)/g, "$1 ").trim())}</pre>${cut}`;
  if (as === "json" && !p.truncated) {
    try { return `<pre class="value">${esc(JSON.stringify(JSON.parse(p.text), null, 2))}</pre>`; } catch (e) { /* not JSON */ }
  }
  return `<pre class="value">${esc(p.text)}</pre>${cut}`;
}

function recordsHtml(a, as) {
  return `<p class="muted">partition ${a.partition}: log start offset ${num(a.log_start_offset)}, high watermark ${num(a.high_watermark)}
      (records above it are not shown); ${a.records.length} records from offset ${num(a.from_offset)}${a.budget_reached
        ? `; the answer's size limit was reached: read on from offset ${num(a.next_offset)}` : ""}</p>
    <table data-role="records"><thead><tr><th class="num">Offset</th><th>Timestamp</th><th>Key</th><th>Value</th><th>Headers</th></tr></thead><tbody>
    ${a.records.map(r => `<tr data-offset="${r.offset}"><td class="num">${r.offset}</td>
      <td>${timestamp(r.timestamp)}<br><span class="muted">${r.timestamp_type ? "log append" : "create"} time</span></td>
      <td>${payload(r.key, as === "json" ? "text" : as)}</td><td>${payload(r.value, as)}</td>
      <td>${r.headers.map(h => `${esc(h.key)}: ${payload(h.value, as === "json" ? "text" : as)}`).join("")}${r.headers_omitted
        ? `<span class="muted">and ${num(r.headers_omitted)} more headers</span>` : ""}</td></tr>`).join("")}
    </tbody></table>`;
}

function produceTab(el, path, name) {
  el.innerHTML = `<form class="inline" id="produce" style="flex-direction:column;align-items:stretch;max-width:640px">
      <label>Partition (empty: by key)<input name="partition" type="number" min="0"></label>
      <label>Key<input name="key"></label>
      <label>Value<textarea name="value" rows="4"></textarea></label>
      <label>Headers (name=value, one a line)<textarea name="headers" rows="2"></textarea></label>
      <label>Key and value are<select name="format"><option value="text">text (UTF-8)</option><option value="hex">hex</option></select></label>
      <div><button class="primary" data-role="produce">Produce</button></div></form><div id="produce-out"></div>`;
  const form = document.getElementById("produce");
  form.onsubmit = e => {
    e.preventDefault();
    const headers = {};
    for (const line of form.headers.value.split("\n").map(s => s.trim()).filter(Boolean)) {
      const i = line.indexOf("=");
      headers[i < 0 ? line : line.slice(0, i)] = i < 0 ? "" : line.slice(i + 1);
    }
    const body = {value: form.value.value, key: form.key.value === "" ? null : form.key.value,
      partition: form.partition.value === "" ? null : Number(form.partition.value), headers,
      key_format: form.format.value, value_format: form.format.value};
    act(`Produce this record to topic "${name}"?`, document.getElementById("produce-out"),
        () => api(`${path}/records`, {method: "POST", body: JSON.stringify(body)}),
        a => `Written to partition ${a.partition} at offset ${a.offset}.`);
  };
  api(path).then(t => { if (!t.can_produce) el.innerHTML = '<p class="muted">The console\'s principal may not write to this topic.</p>'; });
  return {live: null};
}

function configsTab(el, path, name) {
  return {
    async live() {
      const t = await api(`${path}?configs=1`);
      el.innerHTML = `${t.configs_error ? `<div class="error">${esc(t.configs_error)}</div>` : ""}
        <table data-role="configs"><thead><tr><th>Config</th><th>Value</th><th>Source</th><th></th></tr></thead><tbody>
        ${t.configs.map(c => `<tr data-config="${esc(c.name)}"><td>${esc(c.name)}</td><td>${c.value === null ? '<span class="muted">(sensitive)</span>' : esc(c.value)}</td>
          <td>${c.default ? "default" : "topic override"}</td>
          <td>${t.can_alter_configs && !c.read_only ? `<button data-edit="${esc(c.name)}">Edit</button>` : ""}
              ${t.can_alter_configs && !c.default ? `<button data-reset="${esc(c.name)}">Reset</button>` : ""}</td></tr>`).join("")}
        </tbody></table><div id="config-out"></div>
        ${t.can_alter_configs ? `<form class="inline" id="config-edit"><label>Config<input name="key"></label>
          <label>Value<input name="value"></label><button class="primary">Set</button></form>` : ""}
        ${t.can_delete && !t.internal ? `<h2>Danger zone</h2><button class="danger" id="delete-topic">Delete topic</button>` : ""}`;
      view.live = null;  // configs change only by the user's hand; no live redraw under an open form
      const out = document.getElementById("config-out");
      const alter = (body, what) => act(`${what} on topic "${name}"?`, out,
        () => api(`${path}/configs`, {method: "POST", body: JSON.stringify(body)}), () => `${what}: done.`);
      el.querySelectorAll("[data-edit]").forEach(b => b.onclick = () => {
        const form = document.getElementById("config-edit");
        form.key.value = b.dataset.edit;
        form.value.focus();
      });
      el.querySelectorAll("[data-reset]").forEach(b => b.onclick = () => alter({delete: [b.dataset.reset]}, `Reset ${b.dataset.reset} to its default`));
      const form = document.getElementById("config-edit");
      if (form) form.onsubmit = e => { e.preventDefault(); alter({set: {[form.key.value.trim()]: form.value.value}}, `Set ${form.key.value.trim()} = ${form.value.value}`); };
      const del = document.getElementById("delete-topic");
      if (del) del.onclick = () => act(`Delete topic "${name}" and all its records? This cannot be undone.`, out,
        () => api(path, {method: "DELETE"}), a => `Deleted topic ${a.deleted}.`);
    },
  };
}

// -- consumer groups -------------------------------------------------------------------------

function groupsView() {
  let pageNo = 1;
  main.innerHTML = `<h1>Consumer groups</h1><div id="groups"></div>`;
  return {
    async live() {
      const g = await api(`/api/groups?page=${pageNo}&size=50`);
      const el = document.getElementById("groups");
      el.innerHTML = `<table data-role="groups"><thead><tr><th>Group</th><th>State</th><th class="num">Members</th>
        <th class="num">Partitions</th><th class="num">Lag</th></tr></thead><tbody>
        ${g.items.map(r => `<tr data-group="${esc(r.group)}"><td><a href="#/group/${encodeURIComponent(r.group)}">${esc(r.group)}</a></td>
          <td>${esc(r.state ?? "–")}</td><td class="num">${num(r.members)}</td><td class="num">${num(r.partitions)}</td>
          <td class="num" data-role="lag">${num(r.lag)}</td></tr>`).join("")}</tbody></table>`;
      el.prepend(pager(g, p => { pageNo = p; view.live(); }));
    },
  };
}

function groupView(gid) {
  main.innerHTML = `<h1>Consumer group ${esc(gid)}</h1><div id="group"></div>
    <div class="charts"><div class="chart" id="chart-lag"></div></div><div id="reset-area"></div>`;
  let resetShown = false;
  return {
    async live() {
      const g = await api(`/api/groups/${encodeURIComponent(gid)}`);
      document.getElementById("group").innerHTML = `
        ${g.error ? `<div class="error">${esc(g.error)}</div>` : ""}
        <div class="cards"><div class="card"><div class="v">${esc(g.state ?? "–")}</div><div class="k">state</div></div>
          <div class="card"><div class="v">${g.members.length}</div><div class="k">members</div></div>
          <div class="card"><div class="v" data-role="total-lag">${num(g.lag)}</div><div class="k">total lag</div></div>
          <div class="card"><div class="v">${esc(g.assignor || "–")}</div><div class="k">assignor (generation ${num(g.generation)})</div></div>
          <div class="card"><div class="v">${num(g.coordinator)}</div><div class="k">coordinator</div></div></div>
        <h2>Members</h2><table data-role="members"><thead><tr><th>Member</th><th>Client</th><th>Host</th><th>Assignment</th></tr></thead><tbody>
          ${g.members.map(m => `<tr><td>${esc(m.member_id)}</td><td>${esc(m.client_id)}</td><td>${esc(m.host)}</td>
            <td>${m.assignment.map(esc).join(", ")}</td></tr>`).join("") || '<tr><td colspan="4" class="muted">no members</td></tr>'}</tbody></table>
        <h2>Offsets</h2><table data-role="offsets"><thead><tr><th>Topic</th><th class="num">Partition</th><th class="num">Committed</th>
          <th class="num">End (HW)</th><th class="num">Lag</th><th>Owner</th></tr></thead><tbody>
          ${g.offsets.map(o => `<tr><td>${esc(o.topic)}</td><td class="num">${o.partition}</td><td class="num">${num(o.committed)}</td>
            <td class="num">${num(o.end)}</td><td class="num">${num(o.lag)}</td><td>${esc(o.owner ?? "–")}</td></tr>`).join("")}</tbody></table>
        <h2>Lag over time</h2>`;
      chart("chart-lag", "total lag (records)", ["lag"], g.lag_history.map(p => p[0]), [g.lag_history.map(p => p[1])], 700);
      if (g.can_reset && !resetShown) showReset(gid, [...new Set(g.offsets.map(o => o.topic))]);
    },
  };
  function showReset(gid, topics) {
    resetShown = true;
    const area = document.getElementById("reset-area");
    area.innerHTML = `<h2>Reset offsets</h2><p class="muted">Only while the group has no members.</p>
      <form class="inline" id="reset"><label>Topic<select name="topic"><option value="">all</option>
        ${topics.map(t => `<option>${esc(t)}</option>`).join("")}</select></label>
      <label>To<select name="to"><option>earliest</option><option>latest</option><option>offset</option></select></label>
      <label>Offset<input name="offset" type="number" min="0" value="0" style="width:110px"></label>
      <button class="danger">Reset</button></form><div id="reset-out"></div>`;
    const form = document.getElementById("reset");
    form.onsubmit = e => {
      e.preventDefault();
      const body = {topic: form.topic.value || null, to: form.to.value, offset: Number(form.offset.value)};
      act(`Reset group "${gid}" offsets${body.topic ? ` of ${body.topic}` : ""} to ${body.to === "offset" ? body.offset : body.to}?`,
          document.getElementById("reset-out"),
          () => api(`/api/groups/${encodeURIComponent(gid)}/reset`, {method: "POST", body: JSON.stringify(body)}),
          a => `Reset: ${Object.entries(a.offsets).map(([k, v]) => `${k} → ${v}`).join(", ")}.`);
    };
  }
}

// -- routing and the refresh loop --------------------------------------------------------------

function route() {
  const [pathPart, queryPart] = location.hash.replace(/^#/, "").split("?");
  const parts = (pathPart || "/").split("/").filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(queryPart || "");
  for (const a of document.querySelectorAll("[data-nav]")) {
    a.classList.toggle("active", a.dataset.nav === (parts[0] === "topic" ? "topics" : parts[0] === "group" ? "groups" : parts[0] || "overview"));
  }
  charts.forEach(c => c.destroy());
  charts.clear();
  generation++;
  if (parts[0] === "topics") view = topicsView(params);
  else if (parts[0] === "topic" && parts[1]) view = topicView(parts[1], parts[2] || "partitions", params);
  else if (parts[0] === "groups") view = groupsView();
  else if (parts[0] === "group" && parts[1]) view = groupView(parts[1]);
  else view = overviewView();
  tick();
  if (view.init) view.init();
}

async function tick() {
  clearTimeout(timer);
  const mine = generation;
  if (view && view.live) {
    try {
      await view.live();
      if (mine === generation) {
        setStatus(`live · updated ${new Date().toLocaleTimeString()}`, false);
        document.getElementById("load-error")?.remove();
      }
    } catch (e) {
      if (mine === generation) {
        setStatus(e.message, true);
        const shown = document.getElementById("load-error");
        if (shown) shown.textContent = e.message;
        else main.insertAdjacentHTML("beforeend", `<div class="error" id="load-error">${esc(e.message)}</div>`);
      }
    }
  }
  if (mine === generation) timer = setTimeout(tick, refreshMs);
}

window.addEventListener("hashchange", route);
route();
