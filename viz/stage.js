// The stage's script: the js_on_load of the gr.HTML that shows viz.stepper.stage_html (Gradio gives it
// `element`, the component's root, and `watch`). The state is (step index, phase 0..4); the arrows move one
// phase (past a step's last phase to the next step), play walks on by itself, and the page's step slider
// and the stage follow each other. `window.feStage` is what the tour (fasteagle/app/tour.js) drives.
const NS = 'http://www.w3.org/2000/svg';
const reduce = window.matchMedia && window.matchMedia('(prefers-reduced-motion: reduce)').matches;
// sent: the steps the stage gave the page's slider, whose echoes (the slider's change events) it ignores
// inspect: the node whose sampling the inspector shows (viz/sampling.js), on this step
const S = {run: null, i: 0, phase: 4, sub: 99, timer: 0, playing: false, pick: null, sent: new Set(), inspect: null};
const el = (tag, attrs, parent) => {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
};
const root = () => element.querySelector('.fe-stage[data-run]');
const slider = () => document.querySelector('#step-slider input[type=range]');
const PHASE_MS = 1100, DEPTH_MS = 450;

function layout(st) {  // x = depth; y: the first child continues its parent's row, others open rows below
  const n = st.tok.length, kids = Array.from({length: n}, () => []);
  for (let i = 1; i < n; i++) kids[st.par[i]].push(i);
  const onPath = new Set(st.path);
  for (const k of kids) k.sort((a, b) => (onPath.has(b) - onPath.has(a)) || a - b);
  const row = new Array(n).fill(0);
  let next = 0;
  const walk = (v, r) => { row[v] = r; kids[v].forEach((c, j) => walk(c, j === 0 ? r : ++next)); };
  walk(0, 0);
  return {row, rows: next + 1, kids};
}

function pickDepth(st, kids) {  // what the learner predicts: the first depth where the tree branches
  let best = Infinity;
  for (let i = 0; i < st.tok.length; i++) if (kids[i].length > 1) best = Math.min(best, st.dep[i] + 1);
  return best === Infinity ? 1 : best;
}

function say(text) { root().querySelector('.fe-stage-say').textContent = text; }

function passes(st, run) {  // the drafter's forwards on one time axis, then the verify forward
  const box = root().querySelector('.fe-passes');
  box.replaceChildren();
  if (!st.tok) return;
  const kind = run.kind;
  const rows = [];
  if (!('passes' in st)) {
    rows.push(['draft (all passes)', st.dms, run.colors.draft]);
  } else if (st.passes.length === 0) {
    rows.push(['lookup: no forward', 0.01, run.colors.draft]);
  } else {
    // the first pass of step 1 is the drafter's read of the whole prompt (its prefill), which readied that draft
    st.passes.forEach((ms, j) => rows.push([j === 0 && st.s === 1 ? 'drafter prefill'
                                              : kind === 'cascade' ? 'cascade: 1 pass' : `pass ${j + 1} (depth ${j + 1})`,
                                            ms, run.colors.draft]));
  }
  rows.push([`verify: ${st.tok.length} nodes`, st.vms, run.colors.verify]);
  // one time axis: each forward starts where the one before it ended (a Gantt chart of the step)
  const total = Math.max(rows.reduce((t, r) => t + r[1], 0), 1e-6);
  let t = 0;
  for (const [name, ms, color] of rows) {
    const r = document.createElement('div');
    r.className = 'fe-pass-row';
    r.innerHTML = `<span class="fe-pass-name">${name}</span><span class="fe-pass-track">` +
      `<span class="fe-pass-bar" style="margin-left:${(100 * t / total).toFixed(2)}%;` +
      `width:${Math.max(100 * ms / total, 0.4).toFixed(2)}%;background:${color}"></span></span>` +
      `<span class="fe-pass-ms">${ms >= 0.1 ? ms.toFixed(1) + ' ms' : ''}</span>`;
    box.appendChild(r);
    t += ms;
  }
  if (st.top) {
    const lay = document.createElement('div');
    lay.className = 'fe-layers';
    lay.innerHTML = '<span>layers → depths:</span>' + st.top.map((cands, d) =>
      `<span class="fe-layer" tabindex="0" data-depth="${d + 1}">L${d + 1}: ` +
      cands.map(([t, p]) => `${t} ${(100 * p).toFixed(0)}%`).join(' · ') + '</span>').join('');
    box.appendChild(lay);
    lay.querySelectorAll('.fe-layer').forEach((x) => {
      for (const on of ['mouseenter', 'focus']) x.addEventListener(on, () => hl(Number(x.dataset.depth)));
      for (const off of ['mouseleave', 'blur']) x.addEventListener(off, () => hl(0));
    });
  }
}

function hl(depth) {
  const svg = root().querySelector('.fe-stage-tree');
  svg.querySelectorAll('.fe-col').forEach((c) => c.setAttribute('opacity', Number(c.dataset.depth) === depth ? '1' : '0'));
  root().querySelectorAll('.fe-layer').forEach((x) => x.classList.toggle('fe-hl', Number(x.dataset.depth) === depth));
}

function draw() {
  const r = root();
  if (!r || !S.run) return;
  const run = S.run, st = run.steps[S.i], n = run.steps.length;
  r.querySelector('.fe-stage-where').textContent = `step ${st.s} of ${n - 1}`;
  const range = r.querySelector('.fe-stage-steps');
  range.max = String(n - 1);
  range.value = String(S.i);
  r.querySelectorAll('.fe-phase').forEach((c) => c.classList.toggle('fe-on', st.tok && Number(c.dataset.phase) === S.phase));
  const svg = r.querySelector('.fe-stage-tree');
  svg.replaceChildren();
  const reply = r.querySelector('.fe-stage-reply');
  const before = run.steps.slice(0, S.i).map((x) => x.emit.join('')).join('');
  const after = run.steps.slice(S.i + 1).map((x) => x.emit.join('')).join('');  // the reply's rest, faint
  if (!st.tok) {  // the prefill
    svg.setAttribute('viewBox', '0 0 600 40');
    svg.setAttribute('height', '40');
    el('text', {x: 8, y: 24}, svg).textContent = `prefill: one target forward over the prompt; first token ${st.emit.join('')}`;
    reply.innerHTML = `<span class="fe-b">${esc(st.emit.join(''))}</span><span class="fe-later">${esc(after)}</span>`;
    say('Step 0 reads the prompt. The target picks the first token itself; the drafter reads the prompt too.');
    r.querySelector('.fe-inspect').replaceChildren();
    passes(st, run);
    return;
  }
  const {row, rows, kids} = layout(st);
  const maxd = Math.max(...st.dep) + 1;
  // columns for every depth and the bonus, with room for the last label on the right
  const big = document.body.classList.contains('fe-present');  // presentation mode: a projector's sizes
  const W = Math.max(r.clientWidth || 600, 300), colW = Math.min(big ? 260 : 120, (W - (big ? 150 : 110)) / maxd);
  const rowH = (rows > 10 ? 22 : 34) * (big ? 1.6 : 1), H = 40 + rows * rowH;
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  svg.setAttribute('height', String(H));
  const X = (d) => 24 + d * colW, Y = (k) => 22 + k * rowH;
  for (let d = 1; d <= maxd; d++) {  // a depth's column, lit when its layer is hovered
    const c = el('rect', {x: X(d) - colW / 2, y: 2, width: colW, height: H - 4, fill: '#dfe8f5', opacity: 0,
                          class: 'fe-col', 'data-depth': d, 'pointer-events': 'none'}, svg);
  }
  const P = S.phase, path = new Set(st.path);
  // the walk judges depth by depth: a node's verdict shows once the walk passed its depth (null: not yet)
  const judged = (i) => P > 2 || (P === 2 && st.dep[i] <= S.sub) ? st.st[i] : null;
  // during the draft, a node shows once its depth's pass ran: one per depth for EAGLE-3, all at once for the cascade
  const shown = (i) => P > 0 || i === 0 || (run.kind === 'eagle3' && !st.lk[i] ? st.dep[i] <= S.sub : S.sub >= 1);
  for (let i = 1; i < st.tok.length; i++) {
    const p = st.par[i];
    const line = el('path', {d: `M${X(st.dep[p])},${Y(row[p])} H${X(st.dep[i]) - colW / 2} V${Y(row[i])} H${X(st.dep[i])}`,
                             fill: 'none', stroke: judged(i) === 1 ? run.colors['1'] : '#c9ced6',
                             'stroke-width': judged(i) === 1 ? 5 : 1.5, class: 'fe-n'}, svg);
    if (!shown(i)) line.classList.add('fe-hide');
    if (judged(i) === 0) line.classList.add('fe-dim');
  }
  for (let i = 0; i < st.tok.length; i++) {
    const g = el('g', {class: 'fe-n', transform: `translate(${X(st.dep[i])},${Y(row[i])})`, 'data-node': i}, svg);
    const v = i === 0 ? 1 : judged(i);
    const color = i === 0 ? '#000000' : (v === null ? '#8c8c8c' : run.colors[String(v)]);
    const open = v === 0;
    if (st.lk[i]) el('rect', {x: -7, y: -7, width: 14, height: 14, transform: 'rotate(45)', fill: open ? '#fff' : color,
                              stroke: color, 'stroke-width': 2}, g);
    else el('circle', {r: i === 0 ? 8 : 7, fill: open ? '#fff' : color, stroke: color, 'stroke-width': 2,
                       class: P === 1 ? 'fe-scan' : ''}, g);
    if (v !== null && i > 0) el('text', {x: 0, y: 4, 'text-anchor': 'middle', fill: open ? color : '#fff',
                                     'font-size': 10, 'font-weight': 700}, g).textContent = run.marks[String(v)];
    el('text', {x: 10, y: -8}, g).textContent = st.tok[i];
    if (!shown(i)) g.classList.add('fe-hide');
    if (v === 0) g.classList.add('fe-dim');
    if (!S.pick && st.dists && i > 0 && st.draws[i] >= 0 && P >= 2) {  // sampled: a judged node opens the inspector
      g.classList.add('fe-insp');
      g.setAttribute('tabindex', '0');
      g.setAttribute('role', 'button');
      g.setAttribute('aria-label', `how ${st.tok[i]} was judged`);
      const open = () => { S.inspect = S.inspect === i ? null : i; draw(); };
      g.addEventListener('click', open);
      g.addEventListener('keydown', (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); open(); } });
    }
    if (S.pick && st.dep[i] === pickDepth(st, kids)) {
      g.classList.add('fe-pick');
      g.setAttribute('tabindex', '0');
      g.setAttribute('role', 'button');
      g.setAttribute('aria-label', `predict ${st.tok[i]}`);
      const choose = () => { const f = S.pick; S.pick = null; f(i, st.path.includes(i)); };
      g.addEventListener('click', choose);
      g.addEventListener('keydown', (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); choose(); } });
    }
  }
  if (P >= 4 && st.bonus !== null) {  // the bonus star after the accepted path's last node
    const last = st.path[st.path.length - 1];
    const bx = X(st.dep[last] + 1), by = Y(row[last]);
    el('path', {d: `M${X(st.dep[last])},${by} H${bx}`, stroke: run.colors.bonus, 'stroke-dasharray': '4 3', fill: 'none'}, svg);
    const g = el('g', {transform: `translate(${bx},${by})`, class: 'fe-n'}, svg);
    el('polygon', {points: star(9), fill: st.bk === 'resampled' ? run.colors.resampled : run.colors.bonus}, g);
    // below the star: above it would run into the label of the node it follows
    el('text', {x: -6, y: 24}, g).textContent = st.bk === 'resampled' ? `${st.bonus} (resampled)` : st.bonus;
  }
  const drafts = st.emit.filter((_, j) => st.kinds[j] === 'draft').join('');
  const last = st.emit.length && st.kinds[st.emit.length - 1] !== 'draft' ? st.emit[st.emit.length - 1] : '';
  reply.innerHTML = `<span class="fe-old">${esc(before)}</span>` +
    (P >= 3 && drafts ? `<span class="fe-new">${esc(drafts)}</span>` : '') +
    (P >= 4 && last ? `<span class="fe-b">${esc(last)}</span>` : '') +
    `<span class="fe-later">${esc(P >= 4 ? after : st.emit.join('') + after)}</span>`;
  say(caption(st, run));
  passes(st, run);
  const insp = r.querySelector('.fe-inspect');
  if (S.inspect !== null) inspector(insp, st, S.inspect, run);
  else if (run.sampled && !run.steps.some((x) => x.dists)) {
    insp.textContent = 'The sampling inspector is off: this trace has no sampling record (a version-1 file).';
  } else if (run.sampled && P >= 2 && !S.pick) insp.textContent = 'Sampling: tap a judged node to see its draw.';
  else insp.replaceChildren();
}

function caption(st, run) {
  const acc = st.path.length - 1, nodes = st.tok.length - 1, lk = st.lk.some(Boolean);
  const np = (st.passes || []).length;
  switch (S.phase) {
    case 0: return run.kind === 'cascade'
      ? `1 · Draft: the cascade's ${st.top ? st.top.length : ''} layers run once; each layer's output through the LM head gives one depth, so every depth appears at once (${st.dms.toFixed(0)} ms).` + (lk ? ' Diamonds: prompt lookup found a repeat in the text.' : '')
      : run.kind === 'eagle3'
      ? `1 · Draft: EAGLE-3 runs its one layer again for each depth: ${np || 'one'} passes, one after another (${st.dms.toFixed(0)} ms).`
      : `1 · Draft: prompt lookup copies what followed the last words where they occurred before: no forward at all.`;
    case 1: return `2 · Verify: one target forward reads all ${nodes} drafted nodes at once, a tree mask letting each see only its ancestors (${st.vms.toFixed(0)} ms).`;
    case 2: return `3 · Walk from the root: a child survives if the target agrees with it (✓); its siblings are rejected (✗) and everything below them is never reached (○). ${acc} of ${nodes} accepted.`;
    case 3: return acc === 1 ? '4 · Emit: the accepted token joins the reply, exactly as the target alone would have written it.'
      : `4 · Emit: the ${acc} accepted tokens join the reply, exactly as the target alone would have written them.`;
    default: return st.bonus === null ? '5 · The reply ended at a stop token.' : st.bk === 'resampled'
      ? `5 · Resampled: the target rejected its drafts here, so it draws its token from what is left of its distribution: ${st.bonus}.`
      : `5 · Bonus: the target's own next token at the path's end comes free with the same forward: ${st.bonus}. ${acc + 1} tokens for one forward.`;
  }
}

function star(r) {
  const p = [];
  for (let k = 0; k < 10; k++) {
    const a = Math.PI / 5 * k - Math.PI / 2, q = k % 2 ? r * 0.45 : r;
    p.push(`${(q * Math.cos(a)).toFixed(1)},${(q * Math.sin(a)).toFixed(1)}`);
  }
  return p.join(' ');
}
function esc(s) { return s.replace(/[&<>]/g, (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;'}[c])); }

function toSlider(i) {  // the page's step slider follows the stage (its change event redraws the detail tree)
  const s = slider();
  if (!s || Number(s.value) === i) return;
  S.sent.add(i);
  s.value = String(i);
  s.dispatchEvent(new Event('input', {bubbles: true}));
  s.dispatchEvent(new Event('change', {bubbles: true}));
}

function setStep(i, phase) {
  const to = Math.max(0, Math.min(i, S.run.steps.length - 1));
  if (to !== S.i) S.inspect = null;
  S.i = to;
  S.phase = phase;
  S.sub = phase === 0 || phase === 2 ? 0 : 99;
  draw();
  if (S.sub === 0) grow(phase);
}

function grow(phase) {  // motion inside a phase: the draft depth by depth (EAGLE-3) or at once (cascade); the walk depth by depth
  const st = S.run.steps[S.i];
  if (!st.tok) return;
  const maxd = Math.max(...st.dep), at = S.i;
  const tick = () => {
    if (S.phase !== phase || S.i !== at || S.sub >= maxd) return;
    S.sub = phase === 0 && S.run.kind !== 'eagle3' ? maxd : S.sub + 1;
    draw();
    setTimeout(tick, reduce ? 0 : DEPTH_MS);
  };
  setTimeout(tick, reduce ? 0 : DEPTH_MS);
}

function phaseMs(st) {  // how long play stays on a phase: the grown ones take a beat per depth
  const d = Math.max(...(st.dep || [0]));
  return PHASE_MS + ((S.phase === 0 && S.run.kind === 'eagle3') || S.phase === 2 ? DEPTH_MS * d : 0);
}

function move(by) {
  const st = S.run.steps[S.i];
  let i = S.i, p = S.phase + by;
  if (!st.tok) p = by > 0 ? 5 : -1;
  if (p > 4) { i += 1; p = 0; }
  if (p < 0) { i -= 1; p = 4; }
  if (i < 0 || i >= S.run.steps.length) return false;
  if (!S.run.steps[i].tok) p = 4;
  setStep(i, p);
  toSlider(S.i);
  return true;
}

function play(on) {
  S.playing = on;
  clearTimeout(S.timer);
  const b = root() && root().querySelector('.fe-stage-play');
  if (b) b.textContent = on ? '⏸ pause' : '▶ play';
  if (!on) return;
  if (S.i >= S.run.steps.length - 1 && S.phase === 4) setStep(0, 4);
  const go = () => {
    if (!S.playing) return;
    if (!move(1)) { play(false); return; }
    S.timer = setTimeout(go, phaseMs(S.run.steps[S.i]));
  };
  S.timer = setTimeout(go, 300);
}

function load() {
  play(false);
  const r = root();
  S.run = r ? JSON.parse(r.dataset.run) : null;
  S.sent.clear();
  if (!S.run) return;
  const s = slider();
  const want = Number(s ? s.value : r.dataset.at || 0);  // the page's slider, else (as the page loads) the run's own
  const at = S.run.steps.findIndex((x) => x.s === want);
  setStep(at >= 0 ? at : 0, 4);
}

element.addEventListener('click', (e) => {
  const b = e.target.closest('button');
  if (!b || !S.run) return;
  if (b.dataset.go === 'play') play(!S.playing);
  else if (b.dataset.go) { play(false); move(Number(b.dataset.go)); }
  else if (b.dataset.phase && S.run.steps[S.i].tok) { play(false); setStep(S.i, Number(b.dataset.phase)); }
});
element.addEventListener('input', (e) => {  // the stage's own replay slider: a whole step, at its end
  if (!S.run || !e.target.closest('.fe-stage-steps')) return;
  play(false);
  setStep(Number(e.target.value), 4);
  toSlider(S.run.steps[S.i].s);
});
element.addEventListener('keydown', (e) => {
  if (e.target.closest('.fe-stage-steps')) return;  // the slider's own arrows move whole steps
  if (!S.run || e.target.closest('.fe-pick') || e.target.closest('.fe-insp')) return;
  if (e.target.classList.contains('fe-stage')) {  // on the stage itself: Space plays, Home / End go to the ends
    if (e.key === ' ') { e.preventDefault(); play(!S.playing); }
    if (e.key === 'Home' || e.key === 'End') {
      e.preventDefault();
      play(false);
      setStep(e.key === 'Home' ? 0 : S.run.steps.length - 1, 4);
      toSlider(S.run.steps[S.i].s);
    }
  }
  if (e.key === 'ArrowRight') { e.preventDefault(); play(false); move(1); }
  if (e.key === 'ArrowLeft') { e.preventDefault(); play(false); move(-1); }
});
window.feStage = {
  goto: (step, phase) => {  // the slider moved (no phase: the step's end) or the tour (a phase)
    if (!S.run) return;
    if (phase === undefined && S.sent.delete(Number(step))) return;  // the echo of a step the stage sent
    const at = S.run.steps.findIndex((x) => x.s === Number(step));
    if (at >= 0 && (at !== S.i || (phase !== undefined && phase !== S.phase))) {
      play(false);
      setStep(at, phase === undefined ? 4 : phase);
    }
    if (at >= 0 && phase !== undefined) toSlider(S.run.steps[S.i].s);  // the tour's step: the page's slider follows
  },
  phase: (p) => { if (S.run && S.run.steps[S.i].tok) { play(false); setStep(S.i, p); } },
  predict: (done) => { S.pick = done; draw(); },
  redraw: () => draw(),
  inspect: (node) => { S.inspect = node; draw(); },  // the sampling inspector on a node (tests, the tour)  // the learner taps a depth-1 node: done(node, survived)
  state: () => ({step: S.run ? S.run.steps[S.i].s : null, phase: S.phase, playing: S.playing, kind: S.run && S.run.kind}),
  best: () => {  // the step the tour shows: the most accepted drafts
    if (!S.run) return 0;
    let b = 0, bi = 0;
    S.run.steps.forEach((x) => {  // a branch to guess at counts first, then the accepted length
      if (!x.path) return;
      const branches = new Set(x.par.slice(1)).size < x.par.length - 1 ? 100 : 0;
      if (branches + x.path.length > b) { b = branches + x.path.length; bi = x.s; }
    });
    return bi;
  },
};
let resized = 0;
window.addEventListener('resize', () => { clearTimeout(resized); resized = setTimeout(draw, 150); });
watch('value', load);
load();
