// The guided tour's script (fasteagle/app/tour.py puts CARDS before it): each card highlights a part of
// the page and moves the stage (viz/stage.js, window.feStage) to its phase; Esc or × closes it.
let at = -1, box = null, spot = null, answered = false;
const q = (s) => document.querySelector(s);
function close() {
  if (spot) spot.classList.remove('fe-tour-spot');
  if (box) box.remove();
  box = spot = null; at = -1;
  if (window.feStage) window.feStage.predict(null);
  document.removeEventListener('keydown', onKey, true);
}
function onKey(e) { if (e.key === 'Escape') { e.preventDefault(); close(); } }
function place(target) {  // beside the highlighted part, never over the screen's edge: below it if that fits,
  // else above, else to its right; on a phone (or when nothing fits) at the screen's bottom, the part at its top
  const r = target.getBoundingClientRect(), h = box.offsetHeight, w = box.offsetWidth;
  const vh = window.innerHeight, vw = window.innerWidth;
  let top, left = Math.max(8, Math.min(r.left, vw - w - 12));
  if (vw >= 640 && r.bottom + 10 + h <= vh - 8) top = r.bottom + 10;
  else if (vw >= 640 && r.top - 10 - h >= 8) top = r.top - 10 - h;
  else if (vw >= 640 && r.right + 12 + w <= vw - 8) { top = Math.max(8, Math.min(r.top, vh - h - 8)); left = r.right + 12; }
  else top = vh - h - 8;
  box.style.top = Math.max(8, Math.min(top, vh - h - 8)) + 'px';
  box.style.left = left + 'px';
}
function show(i) {
  at = i; answered = false;
  const c = CARDS[i];
  if (spot) spot.classList.remove('fe-tour-spot');
  spot = q(c.target) || q('#stage');
  const st = window.feStage;
  if (st && c.phase !== null) {
    const here = st.state();
    if (i === 1 || here.step === null || here.step === 0) st.goto(st.best(), c.phase); else st.phase(c.phase);
  }
  if (spot) {
    spot.classList.add('fe-tour-spot');
    const phone = window.innerWidth < 640;  // the card takes the screen's bottom: the part goes to its top
    spot.scrollIntoView({block: phone ? 'start' : 'nearest',
                         behavior: matchMedia('(prefers-reduced-motion: reduce)').matches ? 'auto' : 'smooth'});
  }
  if (!box) {
    box = document.createElement('div');
    box.id = 'fe-tour';
    box.setAttribute('role', 'dialog');
    box.setAttribute('aria-live', 'polite');
    document.body.appendChild(box);
    document.addEventListener('keydown', onKey, true);
  }
  const last = i === CARDS.length - 1;
  box.dataset.card = String(i);
  box.innerHTML = `<h3>${c.title}</h3><div>${c.text}</div><div class="fe-tour-verdict"></div>` +
    `<div class="fe-tour-bar"><button type="button" class="fe-tour-back" ${i ? '' : 'disabled'}>back</button>` +
    `<button type="button" class="fe-tour-next">${last ? 'done' : c.predict ? 'skip' : 'next'}</button>` +
    `<button type="button" class="fe-tour-close" aria-label="close the tour">×</button>` +
    `<span class="fe-tour-count">${i + 1} / ${CARDS.length}</span></div>`;
  box.querySelector('.fe-tour-back').onclick = () => show(Math.max(0, at - 1));
  box.querySelector('.fe-tour-next').onclick = () => {
    if (!last) { show(at + 1); return; }
    close();  // the learner's turn: the keyboard in the prompt box
    const f = q(c.target) && q(c.target).querySelector('textarea, input');
    if (f) f.focus();
  };
  box.querySelector('.fe-tour-close').onclick = close;
  if (c.predict && st) {
    st.predict((node, survived) => {
      answered = true;
      st.phase(2);
      box.querySelector('.fe-tour-verdict').textContent = survived
        ? '✓ Right: the target agreed with that branch.' : '✗ Not this time: watch which one survives.';
      const nxt = box.querySelector('.fe-tour-next');
      nxt.textContent = 'next';
      nxt.focus();
    });
  }
  requestAnimationFrame(() => { if (spot && box) place(spot); });
  setTimeout(() => { if (spot && box) place(spot); }, 450);  // again once a smooth scroll has ended
  if (c.focus && spot) { const f = spot.querySelector('textarea, input'); if (f) f.focus(); }
  else box.querySelector('.fe-tour-next').focus();
}
window.addEventListener('resize', () => { if (spot && box) place(spot); });
window.feTour = {start: () => show(0), close, at: () => at, cards: CARDS.length};
