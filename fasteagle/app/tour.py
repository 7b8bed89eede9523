"""The guided tour: a handful of short cards that drive the live page.

Each card highlights one part of the page and moves the stage (viz.stepper) to the step and phase it
talks about; one asks the learner to predict (tap the branch you think survives) before it reveals;
the last hands the prompt box over to the learner. It all runs in the browser (`TOUR_JS`, part of
the page's script), so a class of thirty costs the server nothing; Esc or × leaves it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Card:
    title: str
    text: str
    target: str  # CSS selector of the part it highlights
    phase: int | None = None  # the stage's phase to show (0 draft .. 4 bonus), None: leave it
    predict: bool = False  # wait for the learner to tap a depth-1 node before going on
    focus: bool = False  # put the keyboard in the highlighted part (the last card: the prompt)


CARDS = [
    Card("What you are looking at",
         "A small language model (the target) wrote the reply below twice: once alone, one token per forward "
         "pass, and once with a drafter guessing ahead. Both replies are identical; the second needed fewer "
         "forwards.", "#race"),
    Card("1 · The draft",
         "Each step starts with a guess. A small drafter proposes a tree of likely next tokens. FastEagle's "
         "cascade gives every depth from one pass; EAGLE-3 needs one pass per depth.", "#stage", phase=0),
    Card("2 · One verification forward",
         "The big model reads every node of the tree in a single forward, each node seeing only its own "
         "ancestors. That one forward is the step's main cost, however many nodes it checks.", "#stage", phase=1),
    Card("Your guess",
         "Where the tree branches, which token will the target keep? Tap it (or Tab to it and press Enter).",
         "#stage", phase=1, predict=True),
    Card("3 · The walk from the root",
         "The target keeps a child only where it agrees with it (✓). Its siblings are rejected (✗) and "
         "nothing below a rejection counts (○).", "#stage", phase=2),
    Card("4, 5 · The emitted tokens, then the bonus",
         "The accepted tokens join the reply, and the same forward gives the target's own next token for "
         "free (★). So a step always emits at least one token: speculation never loses tokens, only time.",
         "#stage", phase=4),
    Card("Where the time goes",
         "Bars: the drafter's forwards and the target's verify forward, measured on this machine. Speculation "
         "pays when the drafts are cheap and often right.", "#stage .fe-passes", phase=4),
    Card("Your turn",
         "Type a prompt of your own and press Run. Try a list, some code, or a sentence to translate: which "
         "kinds let the drafter run ahead?", "#prompt", focus=True),
]

TOUR_CSS = """
#fe-tour { position:fixed; z-index:1000; max-width:min(380px, calc(100vw - 24px)); background:#fff; color:#111;
  border:2px solid #0072B2; border-radius:10px; padding:12px 14px; box-shadow:0 6px 24px rgba(0,0,0,.25);
  font-size:15px; line-height:1.45; }
#fe-tour h3 { margin:0 0 6px; font-size:16px; }
#fe-tour .fe-tour-bar { display:flex; gap:8px; align-items:center; margin-top:10px; }
#fe-tour button { padding:4px 12px; border:1px solid #b9c6d8; border-radius:6px; background:#eef2f8; min-height:32px; }
#fe-tour button.fe-tour-next { background:#0072B2; color:#fff; border-color:#0072B2; }
#fe-tour button:focus-visible { outline:3px solid #E69F00; outline-offset:1px; }
#fe-tour .fe-tour-count { margin-left:auto; opacity:.7; font-size:90%; }
#fe-tour .fe-tour-verdict { margin-top:6px; font-weight:600; }
.fe-tour-spot { outline:4px solid #E69F00 !important; outline-offset:3px; border-radius:6px;
  transition: outline-color .2s; }
@media (prefers-reduced-motion: reduce) { .fe-tour-spot { transition:none; } }
body.fe-present #fe-tour { font-size:20px; max-width:520px; }
"""


def tour_js() -> str:
    """The tour's script (part of the page's `js`): `window.feTour.start()` opens it at its first card."""
    cards = json.dumps([asdict(c) for c in CARDS], ensure_ascii=False)
    return "(() => {\nconst CARDS = " + cards + ";\n" + _TOUR_BODY + "\n})();"


_TOUR_BODY = (Path(__file__).with_name("tour.js")).read_text(encoding="utf-8")
