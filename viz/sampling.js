// The sampling inspector, part of the stage's script (viz/stepper.py joins it after viz/stage.js): a click
// on a judged node of a sampled run shows, at its parent, the target's distribution p as bars, each draft
// tried there in order with its uniform draw u against the residual p'(x), and what the rejections left.
// "Draw 1,000 times" replays the same rule on the same p and shows that its output follows p.
// The rule is fasteagle/verify.py's: try the children in draft order, accept x if u < p'(x), else set
// p'(x) = 0 and renormalise; if every child fails, draw the token from what is left.

function seeded(seed) {  // a small deterministic generator (mulberry32), so a replay draws the same
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// The distribution at a node as the trace keeps it: its top tokens and the rest's mass as one more
// outcome ("other"). `tried`: the children's tokens in draft order, with their probabilities (a draft
// outside the top tokens is its own outcome, its p taken out of the rest).
function outcomes(dist, tried) {
  const [ids, probs, rest] = dist;
  const labels = ids.slice(), p = probs.slice();
  let other = rest;
  for (const [tok, prob] of tried) {
    if (!labels.includes(tok)) { labels.push(tok); p.push(prob); other = Math.max(0, other - prob); }
  }
  labels.push('other'); p.push(other);
  const z = p.reduce((a, b) => a + b, 0);
  return {labels, p: p.map((x) => x / z)};
}

// One application of the rule: the outcome index it emits. `broken`: accept every draft (what a test
// shows fails to keep p).
function sampleOnce(p, tried, rnd, broken = false) {
  const q = p.slice();
  for (const i of tried) {
    if (broken) return i;
    const z = q.reduce((a, b) => a + b, 0);
    if (rnd() < q[i] / z) return i;
    q[i] = 0;
  }
  let u = rnd() * q.reduce((a, b) => a + b, 0);
  for (let i = 0; i < q.length; i++) { u -= q[i]; if (u <= 0 && q[i] > 0) return i; }
  return q.length - 1;
}

function drawMany(p, tried, n, seed) {
  const rnd = seeded(seed), counts = new Array(p.length).fill(0);
  for (let k = 0; k < n; k++) counts[sampleOnce(p, tried, rnd)] += 1;
  return counts;
}

function inspector(box, st, node, run) {
  box.replaceChildren();
  if (node === null || node === undefined) return;
  const parent = st.par[node];
  const dist = (st.dists || {})[parent];
  const say = (html) => { const d = document.createElement('div'); d.innerHTML = html; box.appendChild(d); return d; };
  if (!dist) {
    say(st.dists ? 'Greedy: the target\'s most probable token decides each node; nothing is drawn.'
      : 'The sampling inspector is off: this trace has no sampling record (made before version 2, or greedy).');
    return;
  }
  const kids = [];
  for (let c = 1; c < st.tok.length; c++) if (st.par[c] === parent) kids.push(c);
  const judged = kids.filter((c) => st.draws && st.draws[c] >= 0);
  const {labels, p} = outcomes(dist, judged.map((c) => [st.tok[c], st.tp[c]]));
  const index = (tok) => labels.indexOf(tok);
  say(`<b>At ${esc(st.tok[parent])}</b>, the target's distribution p (after temperature and top-p); ` +
      'drafts tried there in order:');
  let left = 1, lines = [];
  for (const c of judged) {
    const pp = st.tp[c] / left, u = st.draws[c], ok = st.st[c] === 1;
    lines.push(`${ok ? '✓' : '✗'} ${esc(st.tok[c])}: u = ${u.toFixed(3)} ${ok ? '<' : '≥'} p'(x) = ` +
               `${st.tp[c].toFixed(3)}${left < 1 ? ` ÷ ${left.toFixed(3)} = ${pp.toFixed(3)}` : ''} → ` +
               `${ok ? 'accepted' : 'rejected: its p goes to 0, the rest renormalised'}`);
    if (ok) break;
    left -= st.tp[c];
  }
  if (judged.length && judged.every((c) => st.st[c] !== 1)) {
    const last = st.path[st.path.length - 1] === parent && st.bonus !== null;
    lines.push(last ? `every draft rejected: ${esc(st.bonus)} drawn from the residual (★ resampled)`
                    : 'every draft rejected: the token came from the residual');
  }
  say(lines.join('<br>'));
  const bars = document.createElement('div');
  bars.className = 'fe-dist';
  box.appendChild(bars);
  const tried = judged.map((c) => index(st.tok[c]));
  // the bars: p, or the residual after the first k rejections (their p set to 0, the rest renormalised)
  const rejected = judged.filter((c) => st.st[c] !== 1).map((c) => index(st.tok[c]));
  let view = 0;
  const residual = (k) => {
    const q = p.slice();
    for (const i of rejected.slice(0, k)) q[i] = 0;
    const z = q.reduce((a, b) => a + b, 0) || 1;
    return q.map((x) => x / z);
  };
  const show = (counts) => {
    const p = residual(view);
    const order = p.map((_, i) => i).sort((a, b) => p[b] - p[a]).slice(0, 10);
    for (const i of tried) if (!order.includes(i)) order.push(i);
    const n = counts ? counts.reduce((a, b) => a + b, 0) : 0;
    bars.innerHTML = order.map((i) => {
      const mark = tried.includes(i) ? ` <span class="fe-try">draft ${tried.indexOf(i) + 1}</span>` : '';
      const seen = counts ? `<span class="fe-dist-bar fe-seen" style="width:${(100 * counts[i] / n * 0.6).toFixed(1)}%"></span>` : '';
      return `<div class="fe-dist-row"><span class="fe-dist-tok">${esc(labels[i])}</span>` +
        `<span class="fe-dist-track"><span class="fe-dist-bar" style="width:${(100 * p[i] * 0.6).toFixed(1)}%"></span>` +
        `${seen}</span><span class="fe-dist-p">${(100 * p[i]).toFixed(1)}%${counts ? ` · ${(100 * counts[i] / n).toFixed(1)}%` : ''}</span>${mark}</div>`;
    }).join('');
  };
  show(null);
  if (rejected.length) {  // one button per stage of the walk at this parent
    const views = document.createElement('div');
    views.className = 'fe-views';
    views.innerHTML = '<span>show: </span>' + ['p'].concat(rejected.map((i, k) =>
      `residual after ✗ ${esc(labels[i])}${k ? ' too' : ''}`)).map((t, k) =>
      `<button type="button" data-view="${k}" aria-pressed="${k === 0}">${t}</button>`).join(' ');
    views.addEventListener('click', (e) => {
      const b = e.target.closest('button[data-view]');
      if (!b) return;
      view = Number(b.dataset.view);
      views.querySelectorAll('button').forEach((x) => x.setAttribute('aria-pressed', String(x === b)));
      show(null);
    });
    box.appendChild(views);
  }
  const again = document.createElement('button');
  again.type = 'button';
  again.className = 'fe-draw-many';
  again.textContent = 'draw 1,000 times';
  const verdict = document.createElement('span');
  verdict.className = 'fe-draw-verdict';
  again.addEventListener('click', () => {
    view = 0;
    const counts = drawMany(p, tried, 1000, 1 + node + 97 * st.s);
    show(counts);
    box.dataset.counts = JSON.stringify(counts);
    box.dataset.p = JSON.stringify(p);
    verdict.textContent = ` 1,000 draws by the same rule (upper bars: p; lower: the draws' shares). The drafts ` +
      `change how often each token is tried first, not how often it comes out.`;
  });
  const row = document.createElement('div');
  row.append(again, verdict);
  box.appendChild(row);
}
