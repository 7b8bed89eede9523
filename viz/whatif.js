// The what-if panel's script: the js_on_load of the gr.HTML that shows viz.whatif.whatif_html (Gradio
// gives it `element` and `watch`). The numbers are the server's (fasteagle.whatif, computed for every
// preset, depth and budget): this only looks them up and draws, so every slider answers at once.
const NS = 'http://www.w3.org/2000/svg';
const W = {data: null, preset: 0, depth: 0, bi: 0};
const mk = (tag, attrs, parent, text) => {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
};
const fmt = (x, d) => (x === null || x === undefined ? '–' : Number(x).toFixed(d));

function load() {
  const box = element.querySelector('.fe-whatif');
  if (!box || !box.dataset.wi) { W.data = null; return; }
  W.data = JSON.parse(box.dataset.wi);
  const d = W.data;
  W.preset = 0;
  W.depth = d.depths[d.depths.length - 1];
  const p = d.presets[0];
  W.bi = Math.max(0, p.budgets.indexOf(d.run.budget));
  build(box);
  draw();
}

function build(box) {
  const d = W.data;
  box.innerHTML = '';
  const ctl = document.createElement('div');
  ctl.className = 'fe-wi-controls';
  ctl.innerHTML =
    '<label>Node budget <input type="range" class="fe-wi-budget" min="0" step="1" aria-label="node budget">' +
    '<b class="fe-wi-bval"></b></label>' +
    `<label>Depth <input type="range" class="fe-wi-depth" min="1" max="${d.depths[d.depths.length - 1]}" step="1" ` +
    'aria-label="largest depth"><b class="fe-wi-dval"></b></label>' +
    '<span role="radiogroup" aria-label="costs">' + d.presets.map((p, i) =>
      `<label><input type="radio" name="fe-wi-preset" value="${i}"${i === 0 ? ' checked' : ''}> ${p.label}</label>`)
      .join(' ') + '</span>';
  box.appendChild(ctl);
  box.appendChild(mk('svg', {class: 'fe-wi-plot', viewBox: '0 0 760 300', role: 'img'}));
  const read = document.createElement('p');
  read.className = 'fe-wi-read';
  read.setAttribute('aria-live', 'polite');
  box.appendChild(read);
  const note = document.createElement('p');
  note.className = 'fe-wi-note';
  box.appendChild(note);
  const table = document.createElement('table');
  table.className = 'fe-wi-ranks';
  box.appendChild(table);
  const b = ctl.querySelector('.fe-wi-budget'), dep = ctl.querySelector('.fe-wi-depth');
  b.addEventListener('input', () => { W.bi = Number(b.value); draw(); });
  dep.addEventListener('input', () => { W.depth = Number(dep.value); draw(); });
  ctl.querySelectorAll('input[type=radio]').forEach((r) => r.addEventListener('change', () => {
    const budget = d.presets[W.preset].budgets[W.bi];
    W.preset = Number(r.value);
    const bs = d.presets[W.preset].budgets;
    W.bi = Math.max(0, bs.filter((x) => x <= budget).length - 1);
    draw();
  }));
  box.dataset.ready = '1';
}

function draw() {
  const d = W.data;
  if (!d) return;
  const box = element.querySelector('.fe-whatif');
  const p = d.presets[W.preset], row = p.by_depth[String(W.depth)], bs = p.budgets;
  const b = box.querySelector('.fe-wi-budget');
  b.max = String(bs.length - 1);
  b.value = String(W.bi);
  box.querySelector('.fe-wi-depth').value = String(W.depth);
  box.querySelectorAll('input[type=radio]').forEach((r) => { r.checked = Number(r.value) === W.preset; });
  box.querySelector('.fe-wi-bval').textContent = bs[W.bi];
  box.querySelector('.fe-wi-dval').textContent = W.depth;
  // the plot: speed-up over plain decoding against the node budget (log axis), tree and chain
  const svg = box.querySelector('.fe-wi-plot');
  svg.innerHTML = '';
  const L = 58, R = 740, T = 16, B = 256;
  const lo = Math.log(2), hi = Math.log(bs[bs.length - 1]);
  const x = (n) => L + (R - L) * (Math.log(Math.max(n, 2)) - lo) / (hi - lo);
  const chainX = d.depths.map((k) => k + 1);
  const ys = [...row.speedup_vs_decode_step, ...p.chain.speedup_vs_decode_step, 1, d.run.speedup || 1];
  const ymax = Math.max(...ys) * 1.1, ymin = Math.min(0.5, Math.min(...ys) * 0.9);
  const y = (v) => B - (B - T) * (v - ymin) / (ymax - ymin);
  for (const n of [2, 4, 8, 16, 32, 64, 128].filter((n) => n <= bs[bs.length - 1])) {
    mk('line', {x1: x(n), x2: x(n), y1: T, y2: B, stroke: 'currentColor', 'stroke-opacity': 0.12}, svg);
    mk('text', {x: x(n), y: B + 16, 'text-anchor': 'middle', 'font-size': 12, fill: 'currentColor'}, svg, n);
  }
  mk('text', {x: (L + R) / 2, y: B + 36, 'text-anchor': 'middle', 'font-size': 12, fill: 'currentColor'}, svg,
     'tree nodes verified per step (log scale)');
  const step = (ymax - ymin) > 2 ? 0.5 : 0.25;
  for (let v = Math.ceil(ymin / step) * step; v <= ymax; v += step) {
    mk('text', {x: L - 8, y: y(v) + 4, 'text-anchor': 'end', 'font-size': 12, fill: 'currentColor'}, svg, v.toFixed(2) + '×');
  }
  mk('line', {x1: L, x2: R, y1: y(1), y2: y(1), stroke: 'currentColor', 'stroke-dasharray': '2 4'}, svg);
  mk('text', {x: R, y: y(1) - 5, 'text-anchor': 'end', 'font-size': 11, fill: 'currentColor'}, svg, 'plain decoding');
  const line = (xs, vs, attrs) => mk('polyline', Object.assign({fill: 'none', 'stroke-width': 3,
    points: xs.map((n, i) => `${x(n).toFixed(1)},${y(vs[i]).toFixed(1)}`).join(' ')}, attrs), svg);
  const from = bs.indexOf(2);
  line(bs.slice(from), row.speedup_vs_decode_step.slice(from), {stroke: 'var(--fe-acc, #0072b2)'});
  line(chainX, p.chain.speedup_vs_decode_step, {stroke: 'var(--fe-lookup, #e69f00)', 'stroke-dasharray': '7 5'});
  mk('text', {x: L + 6, y: T + 12, 'font-size': 12, fill: 'currentColor'}, svg, '— tree (depth ≤ ' + W.depth + ')   - - chain');
  const sel = bs[W.bi], v = row.speedup_vs_decode_step[W.bi];
  if (sel >= 2) mk('circle', {cx: x(sel), cy: y(v), r: 7, fill: 'var(--fe-acc, #0072b2)', stroke: 'white', 'stroke-width': 2}, svg);
  if (W.preset === 0 && d.run.speedup) {  // the run itself, as measured
    const rx = x(d.run.budget), ry = y(d.run.speedup);
    mk('rect', {x: rx - 6, y: ry - 6, width: 12, height: 12, fill: 'none', stroke: 'currentColor', 'stroke-width': 2.5}, svg);
    mk('text', {x: rx + 10, y: ry + 18, 'font-size': 12, fill: 'currentColor'}, svg, 'this run, measured');
  }
  // the read-out: what the model says at the sliders, tree and chain side by side
  const ci = Math.min(Math.max(sel - 1, 1), W.depth) - 1;
  const read = box.querySelector('.fe-wi-read');
  read.innerHTML = `<b>Tree, ${sel} nodes, depth ≤ ${W.depth}:</b> ${fmt(row.tau[W.bi], 2)} tokens per step · draft ` +
    `${fmt(row.draft_ms[W.bi], 1)} ms + verify ${fmt(row.verify_ms[W.bi], 1)} ms (${fmt(row.tree_size[W.bi], 0)} tokens)` +
    (p.other_ms ? ` + ${fmt(p.other_ms, 1)} ms other` : '') + ` → <b>${fmt(row.tokens_per_s[W.bi], 1)} tok/s, ` +
    `${fmt(v, 2)}×</b> plain decoding.<br><b>Chain of ${ci + 1}:</b> ${fmt(p.chain.tau[ci], 2)} tokens per step → ` +
    `${fmt(p.chain.tokens_per_s[ci], 1)} tok/s, ${fmt(p.chain.speedup_vs_decode_step[ci], 2)}×.`;
  box.querySelector('.fe-wi-note').textContent =
    `tokens/s = tokens per step ÷ (draft + verify + other ms). Tokens per step: this run's ${d.run.steps} steps ` +
    `replayed at each size from the drafter's candidate lists (its run: ${d.run.budget} nodes, ${fmt(d.run.tau, 2)} ` +
    `tokens per step). Costs: ${p.label}${p.source ? ' (' + p.source + ')' : ''}; plain decoding's step ` +
    `${fmt(p.step_ms, 1)} ms. The run drafted ${d.depths.length} depths, so no deeper tree is replayed.` +
    (d.run.listed < 8 ? ` Its file lists only ${d.run.listed} candidates per depth (an older file): bigger trees choose among those.` : '');
  const t = box.querySelector('.fe-wi-ranks');
  const n = d.ranks.length ? d.ranks[0].length - 1 : 0;
  t.innerHTML = '<caption>How often the target\'s token was the drafter\'s candidate of each rank</caption><tr><th>depth</th>' +
    Array.from({length: n}, (_, r) => `<th>${['1st', '2nd', '3rd', '4th', '5th'][r] || (r + 1) + 'th'}</th>`).join('') +
    '<th>lower / none</th></tr>' + d.ranks.map((rowr, i) => `<tr><th>${i + 1}</th>` + rowr.map((f) =>
      `<td style="background: rgba(0,114,178,${(0.08 + 0.6 * f).toFixed(2)})">${Math.round(100 * f)}%</td>`).join('') + '</tr>').join('');
}

window.feWhatIf = {
  set: (budget, depth, preset) => {  // tests and the tour: move the sliders as a user would
    if (!W.data) return;
    if (preset !== undefined) W.preset = preset;
    const bs = W.data.presets[W.preset].budgets;
    if (budget !== undefined) W.bi = Math.max(0, bs.filter((x) => x <= budget).length - 1);
    if (depth !== undefined) W.depth = depth;
    draw();
  },
  state: () => (W.data ? {budget: W.data.presets[W.preset].budgets[W.bi], depth: W.depth, preset: W.preset} : null),
};
watch('value', load);
load();
