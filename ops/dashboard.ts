/** A single-page dashboard: reads the same /api the CLI uses, refreshes every 2 s. */
export const DASHBOARD_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ax dashboard</title>
<style>
 body{font:14px system-ui,sans-serif;margin:24px;color:#222;background:#fafafa}
 h1{font-size:20px;margin:0 0 4px} h2{font-size:15px;margin:20px 0 6px}
 table{border-collapse:collapse;background:#fff;min-width:600px} td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;font-size:13px}
 th{background:#f0f0f0} .ok{color:#17803d} .bad{color:#b42318} .muted{color:#777} code{font-size:12px}
 .shards{display:flex;flex-wrap:wrap;gap:3px;max-width:900px} .shard{width:34px;height:22px;font-size:11px;display:flex;align-items:center;justify-content:center;border-radius:3px;color:#fff}
</style></head><body>
<h1>ax — Auto eXecution</h1><div id="summary" class="muted">loading…</div>
<form id="login" style="display:none;margin:12px 0;padding:10px;background:#fff;border:1px solid #ddd;max-width:600px" onsubmit="return saveToken()">
 <div id="loginmsg" class="bad"></div><label>Bearer token (name.secret): <input id="tok" type="password" autocomplete="off" size="40"></label> <button>Use</button></form>
<h2>Nodes</h2><table id="nodes"></table>
<h2>Shards</h2><div id="shards" class="shards"></div>
<h2>Tasks</h2><table id="tasks"></table>
<h2>Recent runs of <span id="sel">(click a task)</span></h2><table id="runs"></table>
<script>
const palette=["#2563eb","#16a34a","#d97706","#9333ea","#dc2626","#0891b2","#4d7c0f","#be185d"];
const color={}; let selected=null;
// With AX_HTTP_TOKENS_FILE the node asks for a bearer token: asked once, kept for this tab only.
let token=sessionStorage.getItem('axToken')||'';
function askToken(msg){const f=document.getElementById('login');f.style.display='block';document.getElementById('loginmsg').textContent=msg;}
function saveToken(){token=document.getElementById('tok').value.trim();sessionStorage.setItem('axToken',token);document.getElementById('login').style.display='none';refresh();return false}
async function api(op,q){const r=await fetch('/api/'+op+(q?'?'+new URLSearchParams(q):''),{headers:token?{authorization:'Bearer '+token}:{}});
 const j=await r.json();if(r.status===401||r.status===403){askToken(j.error.message);throw new Error(j.error.message)}if(!j.ok)throw new Error(j.error.message);return j.value}
function esc(s){return String(s??'').replace(/[&<>]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;'}[c]))}
function cls(st){return st==='success'?'ok':(st==='failed'||st==='timed_out'||st==='upstream_failed')?'bad':''}
async function refresh(){
 try{
  const s=await api('status');
  document.getElementById('summary').textContent=s.namespace+' · '+s.nodes.length+' node(s) · '+s.shardCount+' shards · '+s.tasks+' tasks · '+s.running+' running · '+s.firedPerSec+' fires/s';
  s.nodes.forEach((n,i)=>color[n.id]=palette[i%palette.length]);
  document.getElementById('nodes').innerHTML='<tr><th>node</th><th>shards</th><th>fires/s</th><th>in flight</th><th>lag ms</th></tr>'+s.nodes.map(n=>'<tr><td><span style="color:'+color[n.id]+'">■</span> '+esc(n.id)+'</td><td>'+n.shards.length+'</td><td>'+n.load.firedPerSec+'</td><td>'+n.load.inFlight+'</td><td>'+n.load.lagMs+'</td></tr>').join('');
  const sh=await api('shards.ls');
  document.getElementById('shards').innerHTML=sh.map(x=>'<div class="shard" title="shard '+x.shard+' owner '+esc(x.owner)+' epoch '+x.epoch+' tasks '+x.tasks+'" style="background:'+(color[x.owner]||'#999')+'">'+x.shard+'</div>').join('');
  const ts=await api('task.ls',{limit:200});
  document.getElementById('tasks').innerHTML='<tr><th>task</th><th>state</th><th>trigger</th><th>next due</th><th>executor</th></tr>'+ts.map(t=>'<tr style="cursor:pointer" onclick="selected=\\''+esc(t.name)+'\\';refresh()"><td>'+esc(t.name)+'</td><td class="'+cls(t.state)+'">'+t.state+'</td><td>'+esc(t.triggers.map(x=>x.description).join('; ')||'after '+t.upstreams.length+' upstream(s)')+'</td><td>'+(t.nextDueAt||'—')+'</td><td>'+esc(t.executor)+'</td></tr>').join('');
  if(!selected&&ts[0])selected=ts[0].name;
  if(selected){document.getElementById('sel').textContent=selected;const rs=await api('runs',{task:selected,limit:15});
   document.getElementById('runs').innerHTML='<tr><th>run</th><th>source</th><th>state</th><th>due</th><th>late ms</th><th>attempt</th><th>node/shard/epoch</th><th>error</th></tr>'+rs.map(r=>'<tr><td><code>'+r.id+'</code></td><td>'+r.source+'</td><td class="'+cls(r.state)+'">'+r.state+'</td><td>'+r.dueAt+'</td><td>'+(r.firedAt?(Date.parse(r.firedAt)-Date.parse(r.dueAt)):'')+'</td><td>'+r.attempt+'</td><td>'+esc(r.node)+' / '+r.shard+' / '+r.epoch+'</td><td>'+esc(r.error||'')+'</td></tr>').join('');}
 }catch(e){document.getElementById('summary').textContent='error: '+e.message}
}
refresh();setInterval(refresh,2000);
</script></body></html>`;
