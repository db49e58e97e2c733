/**
 * The dashboard: a page, a stylesheet and a script served by the node (no build step, no
 * libraries). It reads and writes through the same /api the CLI uses, with the bearer token of
 * the security issue when the node asks for one (kept for the tab only). Views (hash routes):
 * tasks (search, filters, pages), a task (triggers and next times, history, DAG, actions),
 * a run (why, attempts, error, payload), failures, cluster (nodes, shards, executors). The
 * visible view is re-read every 5 s while the tab is visible; nothing else is polled.
 */
export const DASHBOARD_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>ax dashboard</title><link rel="stylesheet" href="/ui/app.css"></head><body>
<header><a href="#/tasks" class="brand">ax</a>
<nav><a href="#/tasks" data-nav="tasks">Tasks</a><a href="#/failures" data-nav="failures">Failures</a><a href="#/cluster" data-nav="cluster">Cluster</a></nav>
<span id="summary" class="muted">loading…</span><span id="live" class="muted" title="refreshed every 5 s while this tab is visible"></span></header>
<form id="login" hidden><div id="loginmsg" class="bad"></div><label>Bearer token (name.secret) <input id="tok" type="password" autocomplete="off"></label> <button>Use</button></form>
<div id="flash" role="status"></div>
<main id="view"></main>
<script src="/ui/app.js"></script></body></html>`;

export const DASHBOARD_CSS = String.raw`
*{box-sizing:border-box}
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{display:flex;flex-wrap:wrap;align-items:center;gap:8px 16px;padding:10px 16px;background:#fff;border-bottom:1px solid #d0d7de}
.brand{font-weight:700;font-size:18px;color:#1f2328;text-decoration:none}
nav a{margin-right:12px;color:#0969da;text-decoration:none} nav a.on{font-weight:600;text-decoration:underline}
main{padding:12px 16px;max-width:1200px}
h1{font-size:18px;margin:8px 0;overflow-wrap:anywhere} h2{font-size:15px;margin:18px 0 6px}
a{color:#0969da} .muted{color:#656d76} .ok{color:#1a7f37} .bad{color:#cf222e} .warn{color:#9a6700}
code,pre{font:12px ui-monospace,monospace;overflow-wrap:anywhere;white-space:pre-wrap}
pre{background:#fff;border:1px solid #d0d7de;padding:8px;max-height:300px;overflow:auto}
table{border-collapse:collapse;background:#fff;width:100%} td,th{border-bottom:1px solid #d0d7de;padding:5px 8px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f0f3f6;font-weight:600;font-size:13px}
.badge{display:inline-block;padding:0 6px;border-radius:10px;font-size:12px;background:#eaeef2}
.badge.ok{background:#dafbe1} .badge.bad{background:#ffebe9} .badge.warn{background:#fff8c5}
form.filters{display:flex;flex-wrap:wrap;gap:6px;margin:6px 0}
input,select,textarea,button{font:inherit;max-width:100%} input,select,textarea{padding:4px 6px;border:1px solid #d0d7de;border-radius:4px}
textarea{width:100%;min-height:60px}
button{padding:4px 10px;border:1px solid #d0d7de;border-radius:6px;background:#f6f8fa;cursor:pointer} button.danger{color:#cf222e} button:disabled{opacity:.5}
.actions{display:flex;flex-wrap:wrap;gap:6px;margin:8px 0}
.pager{display:flex;gap:8px;align-items:center;margin:8px 0}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(240px,1fr));gap:8px}
.card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:8px 10px}
#flash:not(:empty){margin:8px 16px;padding:6px 10px;border-radius:6px;background:#ddf4ff}
#flash.err{background:#ffebe9}
#login{margin:8px 16px;padding:10px;background:#fff;border:1px solid #d0d7de}
svg.dag{width:100%;height:auto;background:#fff;border:1px solid #d0d7de}
svg.dag text{font:12px system-ui,sans-serif}
ul.why{margin:4px 0;padding-left:20px}
@media (max-width:640px){
 header{padding:8px} main{padding:8px}
 table.rows thead{display:none} table.rows,table.rows tbody,table.rows tr,table.rows td{display:block;width:100%}
 table.rows tr{border-bottom:2px solid #d0d7de;padding:4px 0} table.rows td{border:0;padding:2px 8px}
 table.rows td[data-l]::before{content:attr(data-l) ": ";color:#656d76}
}
`;

export const DASHBOARD_JS = String.raw`
"use strict";
var token = sessionStorage.getItem("axToken") || "";
var timer = null, current = null, lastStatus = null;
function $(id) { return document.getElementById(id); }
function esc(s) { return String(s == null ? "" : s).replace(/[&<>"']/g, function (c) { return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]; }); }
function num(x, d) { if (x == null || x === "") return "—"; var p = Math.pow(10, d == null ? 1 : d); return (Math.round(Number(x) * p) / p).toLocaleString(); }
function when(iso) {
  if (!iso) return "—";
  var t = new Date(iso);
  return '<time datetime="' + esc(iso) + '" title="' + esc(t.toISOString().replace("T", " ").replace(".000Z", "Z") + " UTC") + '">' + esc(t.toLocaleString()) + "</time>";
}
function ago(ms) { if (ms == null) return "never"; var s = Math.max(0, Math.round((Date.now() - ms) / 1000)); return s < 90 ? s + " s ago" : s < 5400 ? Math.round(s / 60) + " min ago" : Math.round(s / 3600) + " h ago"; }
function cls(st) { return st === "success" ? "ok" : (st === "failed" || st === "timed_out" || st === "upstream_failed" || st === "refused") ? "bad" : (st === "paused" || st === "skipped" || st === "retry") ? "warn" : ""; }
function badge(st) { return '<span class="badge ' + cls(st) + '">' + esc(st) + "</span>"; }
function taskLink(n) { return '<a href="#/task/' + encodeURIComponent(n) + '">' + esc(n) + "</a>"; }
function runLink(id) { return '<a href="#/run/' + encodeURIComponent(id) + '"><code>' + esc(id) + "</code></a>"; }
function td(label, html) { return '<td data-l="' + esc(label) + '">' + html + "</td>"; }
function table(heads, rows) { return '<table class="rows"><thead><tr>' + heads.map(function (h) { return "<th>" + esc(h) + "</th>"; }).join("") + "</tr></thead><tbody>" + (rows.join("") || '<tr><td class="muted" colspan="' + heads.length + '">none</td></tr>') + "</tbody></table>"; }
function flash(msg, err) { var f = $("flash"); f.textContent = msg; f.className = err ? "err" : ""; if (msg) setTimeout(function () { if (f.textContent === msg) f.textContent = ""; }, 6000); }

function askToken(msg) { $("login").hidden = false; $("loginmsg").textContent = msg; }
$("login").addEventListener("submit", function (e) { e.preventDefault(); token = $("tok").value.trim(); sessionStorage.setItem("axToken", token); $("login").hidden = true; route(); });

function api(op, args, write) {
  var headers = token ? { authorization: "Bearer " + token } : {};
  var url = "/api/" + op.replace(/\./g, "/");
  var init = { headers: headers };
  if (write) { init.method = "POST"; headers["content-type"] = "application/json"; init.body = JSON.stringify(args || {}); }
  else if (args) { var q = {}; Object.keys(args).forEach(function (k) { if (args[k] !== "" && args[k] != null) q[k] = args[k]; }); url += "?" + new URLSearchParams(q); }
  return fetch(url, init).then(function (r) {
    return r.json().then(function (j) {
      if (r.status === 401 || r.status === 403) askToken(j.error.message);
      if (!j.ok) { var e = new Error(j.error.message); e.code = j.error.code; throw e; }
      return j.value;
    });
  });
}
function act(op, args, done) {
  return api(op, args, true).then(function (v) { flash(op + ": done"); if (done) done(v); else refresh(); return v; }, function (e) { flash(op + ": " + e.message, true); });
}

function parseHash() {
  var h = location.hash.replace(/^#\/?/, ""); var qi = h.indexOf("?");
  var path = (qi < 0 ? h : h.slice(0, qi)).split("/").map(decodeURIComponent);
  var q = {}; new URLSearchParams(qi < 0 ? "" : h.slice(qi + 1)).forEach(function (v, k) { q[k] = v; });
  return { view: path[0] || "tasks", arg: path.slice(1).join("/"), q: q };
}
function setHashQuery(q) {
  var p = parseHash(); var s = new URLSearchParams(); Object.keys(q).forEach(function (k) { if (q[k] !== "" && q[k] != null) s.set(k, q[k]); });
  location.hash = "#/" + p.view + (p.arg ? "/" + encodeURIComponent(p.arg) : "") + (String(s) ? "?" + s : "");
}

function summary() {
  return api("status").then(function (s) {
    lastStatus = s;
    $("summary").textContent = s.namespace + " · " + s.nodes.length + " node(s) · " + s.shardCount + " shards" + (s.unowned.length ? " (" + s.unowned.length + " unowned)" : "") + " · " + num(s.tasks, 0) + " tasks · " + num(s.running, 0) + " running · " + num(s.firedPerSec) + " fires/s";
  });
}

var views = {};

views.tasks = function (p, first) {
  var q = p.q; var page = Math.max(1, Number(q.page) || 1); var size = 50;
  if (first) {
    $("view").innerHTML = '<h1>Tasks</h1><form class="filters" id="filters">' +
      '<input name="q" placeholder="search name" aria-label="search" value="' + esc(q.q || "") + '">' +
      '<select name="state" aria-label="state"><option value="">any state</option>' + ["pending", "running", "success", "failed", "retry", "paused", "upstream_failed", "cancelled"].map(function (s) { return '<option' + (q.state === s ? " selected" : "") + ">" + s + "</option>"; }).join("") + "</select>" +
      '<input name="executor" placeholder="executor" aria-label="executor" value="' + esc(q.executor || "") + '">' +
      '<input name="tag" placeholder="tag" aria-label="tag" value="' + esc(q.tag || "") + '">' +
      '<button>Filter</button></form><div id="count" class="muted"></div><div id="list"></div><div class="pager" id="pager"></div>';
    $("filters").addEventListener("submit", function (e) {
      e.preventDefault(); var f = new FormData(e.target);
      setHashQuery({ q: f.get("q"), state: f.get("state"), executor: f.get("executor"), tag: f.get("tag") });
    });
  }
  return api("task.search", { q: q.q, state: q.state, executor: q.executor, tag: q.tag, limit: size, offset: (page - 1) * size }).then(function (r) {
    var from = r.total ? r.offset + 1 : 0, to = r.offset + r.items.length;
    $("count").textContent = r.total ? "showing " + num(from, 0) + "–" + num(to, 0) + " of " + num(r.total, 0) + " task(s)" : "no task matches";
    $("list").innerHTML = table(["task", "state", "trigger", "next due", "executor", "tags"], r.items.map(function (t) {
      return "<tr>" + td("task", taskLink(t.name)) + td("state", badge(t.state)) + td("trigger", esc(t.triggers.map(function (x) { return x.description; }).join("; ") || "after " + t.upstreams.length + " upstream(s)")) +
        td("next due", when(t.nextDueAt)) + td("executor", esc(t.executor)) + td("tags", t.tags.map(function (g) { return '<a href="#/tasks?tag=' + encodeURIComponent(g) + '" class="badge">' + esc(g) + "</a>"; }).join(" ")) + "</tr>";
    }));
    var pages = Math.max(1, Math.ceil(r.total / size));
    $("pager").innerHTML = '<button id="prev"' + (page <= 1 ? " disabled" : "") + '>‹ prev</button><span>page ' + page + " of " + pages + '</span><button id="next"' + (page >= pages ? " disabled" : "") + ">next ›</button>";
    $("prev").onclick = function () { setHashQuery(Object.assign({}, q, { page: page - 1 })); };
    $("next").onclick = function () { setHashQuery(Object.assign({}, q, { page: page + 1 })); };
  });
};

function layoutDag(d) {
  var ids = d.nodes.map(function (n) { return n.id; }), level = {}, ups = {};
  ids.forEach(function (i) { level[i] = 0; ups[i] = []; });
  d.edges.forEach(function (e) { if (ups[e.downstream]) ups[e.downstream].push(e.upstream); });
  for (var k = 0; k < ids.length; k++) d.edges.forEach(function (e) { if (level[e.upstream] != null && level[e.downstream] != null) level[e.downstream] = Math.max(level[e.downstream], level[e.upstream] + 1); });
  var cols = {}; d.nodes.forEach(function (n) { (cols[level[n.id]] = cols[level[n.id]] || []).push(n); });
  var pos = {}, W = 170, H = 44, maxRow = 0, maxCol = 0;
  Object.keys(cols).forEach(function (c) { cols[c].forEach(function (n, r) { pos[n.id] = { x: 10 + c * (W + 40), y: 10 + r * (H + 16) }; maxRow = Math.max(maxRow, r); }); maxCol = Math.max(maxCol, Number(c)); });
  var fill = { ok: "#dafbe1", bad: "#ffebe9", warn: "#fff8c5", "": "#eaeef2" };
  var svg = '<svg class="dag" role="img" aria-label="dependency graph" viewBox="0 0 ' + (20 + (maxCol + 1) * (W + 40) - 40) + " " + (20 + (maxRow + 1) * (H + 16) - 16) + '" xmlns="http://www.w3.org/2000/svg">' +
    '<defs><marker id="arr" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0L10,5L0,10z" fill="#656d76"/></marker></defs>';
  d.edges.forEach(function (e) {
    var a = pos[e.upstream], b = pos[e.downstream]; if (!a || !b) return;
    var x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
    svg += '<path d="M' + x1 + "," + y1 + " C" + mx + "," + y1 + " " + mx + "," + y2 + " " + x2 + "," + y2 + '" fill="none" stroke="#8c959f" stroke-width="1.5" marker-end="url(#arr)"/>';
  });
  d.nodes.forEach(function (n) {
    var p = pos[n.id], st = n.lastRun || n.state, name = n.name.length > 22 ? n.name.slice(0, 21) + "…" : n.name;
    svg += '<a href="#/task/' + encodeURIComponent(n.name) + '"><g class="dagnode" data-task="' + esc(n.name) + '"><title>' + esc(n.name + " — " + n.state + (n.lastRun ? ", last run " + n.lastRun : "")) + "</title>" +
      '<rect x="' + p.x + '" y="' + p.y + '" width="' + W + '" height="' + H + '" rx="6" fill="' + fill[cls(st)] + '" stroke="' + (n.name === d.root ? "#0969da" : "#8c959f") + '" stroke-width="' + (n.name === d.root ? 2 : 1) + '"/>' +
      '<text x="' + (p.x + 8) + '" y="' + (p.y + 18) + '" font-weight="600">' + esc(name) + '</text><text x="' + (p.x + 8) + '" y="' + (p.y + 35) + '" fill="#656d76">' + esc(n.state + (n.lastRun ? " · " + n.lastRun : "")) + "</text></g></a>";
  });
  return svg + "</svg>";
}

views.task = function (p, first) {
  var name = p.arg;
  if (first) {
    $("view").innerHTML = '<h1>Task <span id="tname"></span> <span id="tstate"></span></h1>' +
      '<div class="actions"><button id="pause">Pause</button><button id="resume">Resume</button><button id="runnow">Run now</button><button id="remove" class="danger">Remove</button></div>' +
      '<details id="payloadbox"><summary>Run now with a payload</summary><textarea id="payload" aria-label="payload (JSON)" placeholder="{&quot;key&quot;: &quot;value&quot;}"></textarea><button id="runpayload">Run with this payload</button></details>' +
      '<div class="grid" id="facts"></div><h2>Next times</h2><div id="next"></div><h2>Dependencies</h2><div id="dag"></div><h2>History</h2><div id="history"></div>';
    $("pause").onclick = function () { act("task.pause", { task: name }); };
    $("resume").onclick = function () { act("task.resume", { task: name }); };
    $("runnow").onclick = function () { act("run", { task: name }, function (v) { flash("run " + v.runId + " started"); refresh(); }); };
    $("runpayload").onclick = function () {
      var txt = $("payload").value.trim(), payload;
      try { payload = txt ? JSON.parse(txt) : null; } catch (e) { flash("payload: not JSON (" + e.message + ")", true); return; }
      act("run", { task: name, payload: payload }, function (v) { flash("run " + v.runId + " started with the payload"); refresh(); });
    };
    $("remove").onclick = function () { if (confirm("Remove task " + name + "? Its schedule stops; its run history stays for the retention period.")) act("task.rm", { task: name }, function () { flash("task " + name + " removed"); location.hash = "#/tasks"; }); };
  }
  return Promise.all([api("task.show", { task: name, runs: 30 }), api("task.preview", { task: name, count: 5 }).catch(function () { return null; }), api("dag", { task: name })]).then(function (r) {
    var t = r[0], pv = r[1], dag = r[2];
    $("tname").textContent = t.name; $("tstate").innerHTML = badge(t.state);
    $("pause").disabled = t.state === "paused"; $("resume").disabled = t.state !== "paused";
    $("facts").innerHTML = [["executor", esc(t.executor)], ["triggers", esc(t.triggers.map(function (x) { return x.description; }).join("; ") || "only after its upstreams")],
      ["next due", when(t.nextDueAt) + (t.nextReason ? '<div class="muted">' + esc(t.nextReason) + "</div>" : "")], ["timeout · retries · backoff", esc(t.timeout + " · " + t.retries + " · " + t.backoff)],
      ["misfire · overlap", esc(t.misfire + " · " + t.overlap)], ["tags", esc((t.tags || []).join(", ") || "—")], ["last error", t.lastError ? '<span class="bad">' + esc(t.lastError) + "</span>" : "—"],
      ["payload", "<pre>" + esc(JSON.stringify(t.payload, null, 2)) + "</pre>"]].map(function (f) { return '<div class="card"><div class="muted">' + f[0] + "</div>" + f[1] + "</div>"; }).join("");
    $("next").innerHTML = !pv || !pv.triggers.length ? '<p class="muted">no schedule of its own</p>' : pv.triggers.map(function (tr) {
      return "<p>" + esc(tr.trigger) + ' <span class="muted">(' + esc(tr.tz) + ")</span></p>" + table(["in the task's zone", "UTC", "in your browser", "note"], tr.marks.map(function (m) {
        return "<tr>" + td("zone", esc(m.at || "—")) + td("UTC", esc(m.utc ? m.utc.replace(".000Z", "Z") : "—")) + td("local", when(m.utc)) + td("note", esc(m.note)) + "</tr>";
      }));
    }).join("");
    $("dag").innerHTML = dag.nodes.length > 1 ? layoutDag(dag) + '<p class="muted">upstreams: ' + (t.upstreams.map(function (u) { return taskLink(u.name); }).join(", ") || "none") + " · downstreams: " + (t.downstreams.map(function (u) { return taskLink(u.name); }).join(", ") || "none") + "</p>" : '<p class="muted">no upstreams or downstreams</p>';
    $("history").innerHTML = table(["run", "source", "state", "due", "late", "attempt", "error"], t.recentRuns.map(function (x) {
      return "<tr>" + td("run", runLink(x.id)) + td("source", esc(x.source)) + td("state", badge(x.state)) + td("due", when(x.dueAt)) +
        td("late", x.firedAt ? num((Date.parse(x.firedAt) - Date.parse(x.dueAt)) / 1000, 3) + " s" : "—") + td("attempt", esc(x.attempt)) + td("error", '<span class="bad">' + esc(x.error || "") + "</span>") + "</tr>";
    }));
  });
};

views.run = function (p, first) {
  var id = p.arg;
  if (first) {
    $("view").innerHTML = '<h1>Run <code id="rid"></code> <span id="rstate"></span></h1><div class="actions"><button id="retry">Retry (run the task now)</button></div>' +
      '<div class="grid" id="rfacts"></div><h2>Why it ran</h2><ul class="why" id="why"></ul><h2>Error</h2><div id="rerr"></div><h2>Attempts</h2><div id="attempts"></div><h2>Payload</h2><div id="rpayload"></div>';
  }
  return api("run.show", { run: id }).then(function (v) {
    var r = v.run;
    $("rid").textContent = r.id; $("rstate").innerHTML = badge(r.state);
    $("retry").onclick = function () { act("run", { task: r.task }, function (x) { flash("retry started: run " + x.runId); location.hash = "#/run/" + encodeURIComponent(x.runId); }); };
    $("rfacts").innerHTML = [["task", taskLink(r.task)], ["source", esc(r.source)], ["due", when(r.dueAt)], ["fired", when(r.firedAt)], ["started", when(r.startedAt)], ["finished", when(r.finishedAt)],
      ["late", r.firedAt ? num((Date.parse(r.firedAt) - Date.parse(r.dueAt)) / 1000, 3) + " s" : "—"], ["took", r.startedAt && r.finishedAt ? num((Date.parse(r.finishedAt) - Date.parse(r.startedAt)) / 1000, 3) + " s" : "—"],
      ["attempt", esc(r.attempt)], ["executor", esc(r.executor + (r.executorInstance ? " / " + r.executorInstance : ""))], ["node / shard / epoch", esc(r.node + " / " + r.shard + " / " + r.epoch)],
      ["caused by", r.causedBy ? runLink(r.causedBy) : "—"]].map(function (f) { return '<div class="card"><div class="muted">' + f[0] + "</div>" + f[1] + "</div>"; }).join("");
    $("why").innerHTML = v.sentences.map(function (s) { return "<li>" + esc(s) + "</li>"; }).join("");
    $("rerr").innerHTML = r.error || r.lateOutcome ? "<pre class=\"bad\">" + esc((r.error || "") + (r.lateOutcome ? "\nlate outcome: " + r.lateOutcome : "")) + "</pre>" : '<p class="muted">none</p>';
    $("attempts").innerHTML = table(["run", "attempt", "source", "state", "finished", "error"], v.attempts.map(function (a) {
      return "<tr>" + td("run", a.id === r.id ? "<strong><code>" + esc(a.id) + "</code></strong>" : runLink(a.id)) + td("attempt", esc(a.attempt)) + td("source", esc(a.source)) + td("state", badge(a.state)) + td("finished", when(a.finishedAt)) + td("error", esc(a.error || "")) + "</tr>";
    }));
    $("rpayload").innerHTML = v.task ? "<pre>" + esc(JSON.stringify(v.task.payload, null, 2)) + '</pre><p class="muted">the task\'s payload (a payload given to a manual run is not kept)</p>' : '<p class="muted">the task is gone</p>';
  });
};

views.failures = function (p, first) {
  var page = Math.max(1, Number(p.q.page) || 1), size = 50;
  if (first) $("view").innerHTML = '<h1>Failures</h1><p class="muted" id="fcount"></p><div id="flist"></div><div class="pager" id="fpager"></div><h2>Tasks now upstream_failed</h2><div id="uf"></div>';
  return api("failures", { since: p.q.since, executor: p.q.executor, limit: size, offset: (page - 1) * size }).then(function (r) {
    $("fcount").textContent = num(r.total, 0) + " failed or timed-out run(s) since " + new Date(r.since).toLocaleString();
    $("flist").innerHTML = table(["run", "task", "state", "finished", "attempt", "executor", "error"], r.items.map(function (x) {
      return "<tr>" + td("run", runLink(x.id)) + td("task", taskLink(x.task)) + td("state", badge(x.state)) + td("finished", when(x.finishedAt)) + td("attempt", esc(x.attempt)) + td("executor", esc(x.executor)) + td("error", '<span class="bad">' + esc(x.error || "") + "</span>") + "</tr>";
    }));
    var pages = Math.max(1, Math.ceil(r.total / size));
    $("fpager").innerHTML = pages > 1 ? '<button id="fprev"' + (page <= 1 ? " disabled" : "") + '>‹ prev</button><span>page ' + page + " of " + pages + '</span><button id="fnext"' + (page >= pages ? " disabled" : "") + ">next ›</button>" : "";
    if (pages > 1) { $("fprev").onclick = function () { setHashQuery(Object.assign({}, p.q, { page: page - 1 })); }; $("fnext").onclick = function () { setHashQuery(Object.assign({}, p.q, { page: page + 1 })); }; }
    $("uf").innerHTML = table(["task", "executor"], r.upstreamFailed.map(function (t) { return "<tr>" + td("task", taskLink(t.name)) + td("executor", esc(t.executor)) + "</tr>"; }));
  });
};

views.cluster = function (p, first) {
  if (first) $("view").innerHTML = "<h1>Cluster</h1><h2>Nodes</h2><div id=\"nodes\"></div><h2>Executors</h2><div id=\"execs\"></div><h2>Shards</h2><div id=\"shards\"></div>";
  return Promise.all([api("status"), api("shards.ls"), api("executors.inflight")]).then(function (r) {
    var s = r[0], shards = r[1], inflight = r[2], nodeIds = s.nodes.map(function (n) { return n.id; });
    $("nodes").innerHTML = table(["node", "shards", "fires/s", "in flight", "lag", "failing", ""], s.nodes.map(function (n) {
      var drained = s.drained.indexOf(n.id) >= 0, failing = Object.keys(n.failing || {});
      return "<tr>" + td("node", esc(n.id) + (drained ? ' <span class="badge warn">drained</span>' : "")) + td("shards", num(n.shards.length, 0)) + td("fires/s", num(n.load.firedPerSec)) + td("in flight", num(n.load.inFlight, 0)) +
        td("lag", num(n.load.lagMs / 1000, 3) + " s") + td("failing", failing.length ? '<span class="bad">' + esc(failing.join(", ")) + "</span>" : "—") +
        td("", '<button data-drain="' + esc(n.id) + '" data-on="' + (drained ? "0" : "1") + '">' + (drained ? "Undrain" : "Drain") + "</button>") + "</tr>";
    }));
    $("execs").innerHTML = table(["executor", "kind", "max in flight", "last seen", "in flight"], s.executors.map(function (e) {
      var stale = e.lastSeenMs == null || Date.now() - e.lastSeenMs > 120000;
      return "<tr>" + td("executor", esc(e.name)) + td("kind", esc(e.kind)) + td("max in flight", num(e.maxInFlight, 0)) +
        td("last seen", '<span class="' + (stale ? "warn" : "ok") + '" title="' + esc(e.lastSeenMs ? new Date(e.lastSeenMs).toISOString() + " UTC" : "") + '">' + esc(ago(e.lastSeenMs)) + "</span>") +
        td("in flight", num(inflight[e.name] || 0, 0)) + "</tr>";
    }));
    $("shards").innerHTML = table(["shard", "owner", "epoch", "tasks", "lag", "pinned to", "move to"], shards.map(function (x) {
      return "<tr>" + td("shard", esc(x.shard)) + td("owner", x.owner ? esc(x.owner) : '<span class="bad">none</span>') + td("epoch", esc(x.epoch)) + td("tasks", num(x.tasks, 0)) +
        td("lag", num(x.lagMs / 1000, 1) + " s") + td("pinned to", esc(x.pinnedTo || "—")) +
        td("move to", '<select aria-label="move shard ' + x.shard + ' to" data-shard-to="' + x.shard + '">' + nodeIds.map(function (n) { return "<option" + (n === x.owner ? " selected" : "") + ">" + esc(n) + "</option>"; }).join("") + '</select> <button data-move="' + x.shard + '">Move</button>' + (x.pinnedTo ? ' <button data-unpin="' + x.shard + '">Unpin</button>' : "")) + "</tr>";
    }));
    Array.prototype.forEach.call(document.querySelectorAll("[data-drain]"), function (b) { b.onclick = function () { var n = b.getAttribute("data-drain"); if (confirm((b.getAttribute("data-on") === "1" ? "Drain " : "Undrain ") + n + "?")) act(b.getAttribute("data-on") === "1" ? "node.drain" : "node.undrain", { node: n }); }; });
    Array.prototype.forEach.call(document.querySelectorAll("[data-move]"), function (b) { b.onclick = function () { var sh = Number(b.getAttribute("data-move")); act("shards.move", { shard: sh, node: document.querySelector('[data-shard-to="' + sh + '"]').value }); }; });
    Array.prototype.forEach.call(document.querySelectorAll("[data-unpin]"), function (b) { b.onclick = function () { act("shards.unpin", { shard: Number(b.getAttribute("data-unpin")) }); }; });
  });
};

function refresh(first) {
  var p = parseHash(), v = views[p.view] || views.tasks, key = location.hash;
  Array.prototype.forEach.call(document.querySelectorAll("[data-nav]"), function (a) { a.className = a.getAttribute("data-nav") === (views[p.view] ? p.view : "tasks") || (p.view === "task" && a.getAttribute("data-nav") === "tasks") || (p.view === "run" && a.getAttribute("data-nav") === "failures") ? "on" : ""; });
  return Promise.all([summary(), v(p, first)]).then(function () {
    if (key === location.hash) { $("live").textContent = "updated " + new Date().toLocaleTimeString(); document.body.setAttribute("data-ready", key); }
  }, function (e) { if (key === location.hash) flash(e.message, true); });
}
function route() { current = location.hash; document.body.removeAttribute("data-ready"); refresh(true); }
window.addEventListener("hashchange", route);
// Gentle polling: the visible view only, every 5 s, not while the tab is hidden or a field is being edited.
timer = setInterval(function () {
  if (document.hidden) return;
  var a = document.activeElement;
  if (a && (a.tagName === "TEXTAREA" || (a.tagName === "INPUT" && a.type !== "button") || a.tagName === "SELECT")) return;
  refresh(false);
}, 5000);
document.addEventListener("visibilitychange", function () { if (!document.hidden) refresh(false); });
route();
`;
