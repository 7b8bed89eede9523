// The prompt-set explorer's script: the js_on_load of the gr.HTML that shows viz.explorer.explorer_html
// (Gradio gives it `element`, `trigger` and `watch`). It sorts, filters and draws in the browser; a click on
// a request with a trace asks the server to open it in the main view (the `open` event).
const E = {data: null, key: 'tau', dir: 1, filter: '', cat: ''};
const esc = (s) => String(s === null || s === undefined ? '' : s).replace(/[&<>"]/g,
  (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c]));
const num = (x, d) => (x === null || x === undefined || x === '' ? '–' : Number(x).toFixed(d));
const COLS = [['id', 'request'], ['category', 'kind'], ['tokens', 'tokens'], ['tau', 'tau'],
  ['mean_acceptance_length', "server's"], ['first', 'accepted at 1'], ['ttft_ms', 'TTFT ms'], ['tokens_per_s', 'tok/s']];

function load() {
  const box = element.querySelector('.fe-explorer');
  if (!box || !box.dataset.ex) { E.data = null; return; }
  const t0 = performance.now();
  E.data = JSON.parse(box.dataset.ex);
  for (const r of E.data.a.rows) r.first = r.drafted && r.drafted[0] ? r.accepted[0] / r.drafted[0] : null;
  E.filter = ''; E.cat = '';
  build(box);
  draw();
  box.dataset.ready = '1';
  box.dataset.openMs = String(performance.now() - t0);
}

function build(box) {
  const d = E.data, agg = d.a.aggregates, cats = Object.keys(agg.by_category);
  box.innerHTML =
    `<p><b>${esc(d.a.name)}</b>: ${esc(d.a.source)} · ${agg.requests} requests, tau ${num(agg.tau, 3)}` +
    (agg.lowest_categories.length ? ` · lowest: ${agg.lowest_categories.map(esc).join(', ')}` : '') + '</p>' +
    `<div class="fe-ex-charts">${d.a.charts}</div>` +  // drawn by the server (fasteagle.inspection.charts_html)
    (Object.keys(agg.rejected_tokens || {}).length ? '<p>Drafted tokens rejected most often: ' +
      Object.entries(agg.rejected_tokens).map(([t, n]) => `<code>${esc(JSON.stringify(t))}</code> ×${n}`).join(', ') +
      '</p>' : '') +
    '<div class="fe-ex-bar"><label>Filter <input type="search" class="fe-ex-filter" placeholder="id or prompt text"></label>' +
    '<label>Kind <select class="fe-ex-cat"><option value="">all</option>' +
    cats.map((c) => `<option>${esc(c)}</option>`).join('') + '</select></label>' +
    '<span class="fe-ex-count" aria-live="polite"></span></div>' +
    '<div class="fe-ex-scroll"><table class="fe-ex-table"><thead><tr>' +
    COLS.map(([k, lab]) => `<th aria-sort="none"><button data-key="${k}">${esc(lab)}</button></th>`).join('') +
    '</tr></thead><tbody></tbody></table></div>' +
    (d.compare ? '<h4>Prompt by prompt: ' + esc(d.b.name) + ` (tau ${num(d.b.aggregates.tau, 3)}) against ` +
      esc(d.a.name) + ` (tau ${num(agg.tau, 3)}), who loses most first</h4>` +
      '<div class="fe-ex-scroll"><table class="fe-ex-cmp"><thead><tr><th>request</th><th>kind</th><th>tau ' +
      esc(d.a.name) + '</th><th>tau ' + esc(d.b.name) + '</th><th>change</th></tr></thead><tbody>' +
      d.compare.map((c) => `<tr><td>${esc(c.id)}</td><td>${esc(c.category)}</td><td>${num(c.tau_a, 3)}</td>` +
        `<td>${num(c.tau_b, 3)}</td><td>${c.delta > 0 ? '+' : ''}${num(c.delta, 3)}</td></tr>`).join('') +
      '</tbody></table></div>' : '');
  box.querySelector('.fe-ex-filter').addEventListener('input', (e) => { E.filter = e.target.value.toLowerCase(); draw(); });
  box.querySelector('.fe-ex-cat').addEventListener('change', (e) => { E.cat = e.target.value; draw(); });
  box.querySelectorAll('th button').forEach((b) => b.addEventListener('click', () => sortBy(b.dataset.key)));
  box.querySelector('.fe-ex-table tbody').addEventListener('click', (e) => open(e.target.closest('tr')));
  box.querySelector('.fe-ex-table tbody').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); open(e.target.closest('tr')); }
  });
}

function open(tr) {
  if (!tr || !tr.dataset.trace) return;
  trigger('open', {trace: tr.dataset.trace, side: 'a'});
}

function sortBy(key) {
  E.dir = E.key === key ? -E.dir : 1;
  E.key = key;
  draw();
}

function draw() {
  const d = E.data;
  if (!d) return;
  const box = element.querySelector('.fe-explorer');
  const t0 = performance.now();
  let rows = d.a.rows.filter((r) => (!E.cat || r.category === E.cat) && (!E.filter ||
    String(r.id).toLowerCase().includes(E.filter) || String(r.prompt || '').toLowerCase().includes(E.filter)));
  const k = E.key, dir = E.dir;
  rows = rows.slice().sort((x, y) => {
    const a = x[k], b = y[k];
    if (a === null || a === undefined) return 1;
    if (b === null || b === undefined) return -1;
    return (typeof a === 'number' ? a - b : String(a).localeCompare(String(b))) * dir;
  });
  box.querySelector('.fe-ex-table tbody').innerHTML = rows.map((r) =>
    `<tr${r.trace ? ` class="fe-ex-open" tabindex="0" data-trace="${esc(r.trace)}" title="open its steps"` : ''}>` +
    `<td>${esc(r.id)}</td><td>${esc(r.category)}</td><td>${r.tokens}</td><td>${num(r.tau, 3)}</td>` +
    `<td>${num(r.mean_acceptance_length, 3)}</td><td>${num(r.first, 2)}</td><td>${num(r.ttft_ms, 0)}</td>` +
    `<td>${num(r.tokens_per_s, 1)}</td></tr>`).join('');
  box.querySelectorAll('th').forEach((th) => {
    const b = th.querySelector('button');
    th.setAttribute('aria-sort', b.dataset.key === k ? (dir > 0 ? 'ascending' : 'descending') : 'none');
  });
  box.querySelector('.fe-ex-count').textContent = `${rows.length} of ${d.a.rows.length} requests` +
    (rows.some((r) => r.trace) ? ' · click one to open its steps above' : '');
  box.dataset.sortMs = String(performance.now() - t0);
}

window.feExplorer = {sort: sortBy, state: () => (E.data ? {key: E.key, dir: E.dir, n: E.data.a.rows.length} : null)};
watch('value', load);
load();
