#include "cluster/dashboard_page.h"

namespace flyt::cluster {

const char kDashboardPage[] = R"flyt_page(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Flyt cluster</title>
<style>
  :root { --bg:#0f1720; --panel:#17212c; --line:#2a3746; --text:#e6edf3; --dim:#8b9bab;
          --sm:#4aa3ff; --mem:#7ee0a1; --used:#f5b94a; --bad:#ff6b6b; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.4 system-ui, sans-serif; background:var(--bg); color:var(--text); }
  header { display:flex; align-items:baseline; gap:16px; padding:14px 22px;
           border-bottom:1px solid var(--line); }
  header h1 { font-size:19px; margin:0; }
  header .when { color:var(--dim); }
  main { padding:18px 22px; display:grid; gap:18px; }
  .cards { display:grid; grid-template-columns:repeat(auto-fit, minmax(170px, 1fr)); gap:12px; }
  .card, section { background:var(--panel); border:1px solid var(--line); border-radius:8px; }
  .card { padding:12px 14px; }
  .card .v { font-size:26px; font-weight:600; }
  .card .k { color:var(--dim); }
  section { padding:12px 14px; }
  section h2 { font-size:15px; margin:0 0 10px; }
  .gpus { display:grid; grid-template-columns:repeat(auto-fill, minmax(330px, 1fr)); gap:12px; }
  .gpu { border:1px solid var(--line); border-radius:6px; padding:10px; }
  .gpu .title { display:flex; justify-content:space-between; margin-bottom:6px; }
  .gpu .title .node { color:var(--dim); }
  .bar-label { display:flex; justify-content:space-between; color:var(--dim); font-size:12px; }
  svg.bar { width:100%; height:14px; display:block; margin:2px 0 8px; }
  table { width:100%; border-collapse:collapse; }
  th, td { text-align:left; padding:6px 8px; border-bottom:1px solid var(--line); }
  th { color:var(--dim); font-weight:500; }
  .state-running, .state-up { color:var(--mem); }
  .state-down, .state-failed { color:var(--bad); }
  .state-draining, .state-starting { color:var(--used); }
  .legend span { display:inline-block; width:10px; height:10px; margin:0 4px 0 12px; border-radius:2px; }
  #error { color:var(--bad); }
  .dim { color:var(--dim); }
</style>
</head>
<body>
<header><h1>Flyt cluster</h1><span class="when" id="when">loading…</span><span id="error"></span></header>
<main>
  <div class="cards" id="cards"></div>
  <section><h2>GPUs <span class="legend dim"><span style="background:var(--sm)"></span>SMs promised
    <span style="background:var(--mem)"></span>memory promised
    <span style="background:var(--used)"></span>memory in use</span></h2>
    <div class="gpus" id="gpus"></div></section>
  <section><h2>Tenants</h2><table id="tenants"></table></section>
  <section><h2>Nodes</h2><table id="nodes"></table></section>
  <section><h2>Recent events</h2><table id="events"></table></section>
</main>
<script>
"use strict";
const GiB = 1024 ** 3;
const esc = s => String(s ?? "").replace(/[&<>"']/g,
    c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const gib = b => (b / GiB).toFixed(b >= 10 * GiB ? 0 : 1) + " GiB";
function bar(parts, total) {  // parts: [[value, color]], stacked left to right
  let x = 0, rects = "";
  for (const [v, color] of parts) {
    const w = total > 0 ? Math.min(100 - x, 100 * v / total) : 0;
    rects += `<rect x="${x}%" y="0" width="${w}%" height="14" fill="${color}"/>`;
    x += w;
  }
  return `<svg class="bar" preserveAspectRatio="none"><rect width="100%" height="14" ` +
         `fill="#243140"/>${rects}</svg>`;
}
function table(el, head, rows) {
  el.innerHTML = "<tr>" + head.map(h => `<th>${h}</th>`).join("") + "</tr>" +
      (rows.length ? rows.join("") : `<tr><td class="dim" colspan="${head.length}">none</td></tr>`);
}
function render(c) {
  const nodes = c.nodes || [], servers = c.servers || [], vms = c.vms || [];
  const gpus = nodes.flatMap(n => (n.gpus || []).map(g => ({...g, node: n.node_id})));
  const smTotal = gpus.reduce((a, g) => a + (g.sm_count || 0), 0);
  const smUsed = gpus.reduce((a, g) => a + (g.sm_used || 0), 0);
  const memTotal = gpus.reduce((a, g) => a + (g.memory_bytes || 0), 0);
  const memUsed = servers.reduce((a, s) => a + (s.memory_used || 0), 0);
  const up = nodes.filter(n => n.state !== "down").length;
  document.getElementById("cards").innerHTML = [
    [`${up} / ${nodes.length}`, "nodes up"], [gpus.length, "GPUs"],
    [`${servers.length} / ${vms.length}`, "tenants running / VMs"],
    [`${smUsed} / ${smTotal}`, "SMs promised"], [`${gib(memUsed)} / ${gib(memTotal)}`, "memory in use"],
    [servers.reduce((a, s) => a + (s.sessions || 0), 0), "client processes"],
  ].map(([v, k]) => `<div class="card"><div class="v">${esc(v)}</div><div class="k">${k}</div></div>`).join("");
  const byGpu = {};
  for (const s of servers) (byGpu[s.gpu_uuid] ||= []).push(s);
  document.getElementById("gpus").innerHTML = gpus.map(g => {
    const mine = byGpu[g.uuid] || [];
    const used = mine.reduce((a, s) => a + (s.memory_used || 0), 0);
    return `<div class="gpu" data-gpu="${esc(g.uuid)}"><div class="title"><b>${esc(g.name)} #${esc(g.index)}</b>` +
      `<span class="node">${esc(g.node)} · ${mine.length} tenant(s)</span></div>` +
      `<div class="bar-label"><span>SMs</span><span>${g.sm_used || 0} / ${g.sm_count} promised</span></div>` +
      bar([[g.sm_used || 0, "var(--sm)"]], g.sm_count) +
      `<div class="bar-label"><span>memory</span><span>${gib(used)} used, ${gib(g.memory_used || 0)} / ` +
      `${gib(g.memory_bytes)} promised</span></div>` +
      bar([[used, "var(--used)"], [Math.max(0, (g.memory_used || 0) - used), "var(--mem)"]], g.memory_bytes) +
      `<div class="dim">${mine.map(s => esc(s.vm_ip)).join(", ") || "no tenant"}</div></div>`;
  }).join("") || '<div class="dim">no GPU registered</div>';
  table(document.getElementById("tenants"),
        ["VM", "node / GPU", "SMs", "memory used / share", "", "sessions", "state", "restarts"],
        servers.map(s => `<tr data-vm="${esc(s.vm_ip)}"><td>${esc(s.vm_ip)}</td>` +
          `<td>${esc(s.node_id)} <span class="dim">${esc((s.gpu_uuid || "").slice(0, 12))}</span></td>` +
          `<td>${esc(s.sm)}</td><td>${gib(s.memory_used || 0)} / ${gib(s.memory_bytes)}</td>` +
          `<td style="width:18%">${bar([[s.memory_used || 0, "var(--used)"]], s.memory_bytes)}</td>` +
          `<td>${esc(s.sessions || 0)}</td><td class="state-${esc(s.state)}">${esc(s.state)}</td>` +
          `<td>${esc(s.restarts || 0)}</td></tr>`));
  table(document.getElementById("nodes"), ["node", "host", "address", "GPUs", "state"],
        nodes.map(n => `<tr data-node="${esc(n.node_id)}"><td>${esc(n.node_id)}</td><td>${esc(n.hostname)}</td>` +
          `<td>${esc(n.address)}</td><td>${(n.gpus || []).length}</td>` +
          `<td class="state-${esc(n.state)}">${esc(n.state)}</td></tr>`));
  table(document.getElementById("events"), ["time", "event", "subject", "detail"],
        (c.events || []).slice().reverse().map(e => `<tr><td>${new Date(e.time_ms).toLocaleTimeString()}</td>` +
          `<td>${esc(e.kind)}</td><td>${esc(e.subject)}</td><td class="dim">${esc(e.detail)}</td></tr>`));
  document.getElementById("when").textContent = "updated " + new Date().toLocaleTimeString();
  document.body.dataset.rendered = "1";
}
async function refresh() {
  try {
    const r = await fetch("api/cluster", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = "cannot reach the cluster manager: " + e.message;
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
)flyt_page";

}  // namespace flyt::cluster
