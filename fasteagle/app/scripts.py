"""The page's small scripts, each run by one event or component of app.py (the pictures' own
scripts are viz's)."""

# js_on_load of the speculative reply: a click on a token asks for its step (the `token` event), and
# the tokens of the step on the replay slider are outlined again whenever the reply is redrawn.
REPLY_JS = """
const mark = () => {
  const box = document.querySelector('#step-slider input[type=number]');
  const step = box ? box.value : '';
  element.querySelectorAll('.fe-tok').forEach((t) => t.classList.toggle('fe-sel', t.dataset.step === step));
};
element.addEventListener('click', (e) => {
  const t = e.target.closest('.fe-tok');
  if (t) trigger('token', {step: Number(t.dataset.step)});
});
watch('value', mark);
"""
# the replay slider moved: outline that step's tokens in the speculative reply
MARK_STEP_JS = """(step) => {
  if (window.feStage) window.feStage.goto(step);
  document.querySelectorAll('#spec-reply .fe-tok').forEach(
    (t) => t.classList.toggle('fe-sel', Number(t.dataset.step) === Number(step)));
}"""
# presentation mode on or off: the page's class, which the CSS's larger type and colours hang on
PRESENT_JS = """(on) => {
  document.body.classList.toggle('fe-present', Boolean(on));
  if (window.feStage) window.feStage.redraw();
}"""
# Run in presentation mode: the stage comes into view while the run starts
SCROLL_JS = """() => {
  if (document.body.classList.contains('fe-present'))
    document.querySelector('#stage')?.scrollIntoView({behavior: 'smooth', block: 'start'});
}"""
# All methods: their progress line and table come into view (they sit below the run's charts)
COMPARE_JS = "() => { document.querySelector('#compare-box')?.scrollIntoView({behavior: 'smooth', block: 'start'}); }"
