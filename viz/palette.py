"""The colours, marks and shapes every picture gives a node's verdict and source, in one place.

Colours come from the Okabe–Ito set (safe under the common colour-vision deficiencies), and never
carry meaning alone: each verdict has a mark of its own (✓ accepted, ✗ rejected, ○ never reached) and
each source a shape (circle: the drafter, diamond: prompt lookup, star: the target's bonus token).
`cvd_distances` checks the palette the way tests/test_palette.py does: CIEDE2000 distances between
the verdict colours under simulated deutan, protan and tritan vision (Machado et al. 2009, severity 1).
"""

from __future__ import annotations

import math
from itertools import combinations

from fasteagle.trace import ACCEPTED, NEVER_REACHED, REJECTED

# Okabe & Ito, "Color Universal Design" (2008): the eight colours of their set
OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky blue": "#56B4E9", "bluish green": "#009E73",
             "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "reddish purple": "#CC79A7"}
NEUTRAL = "#A8A8A8"  # never reached: a grey (no hue to confuse), told apart from the others by lightness too

VERDICT_COLORS = {ACCEPTED: OKABE_ITO["bluish green"], REJECTED: OKABE_ITO["vermillion"], NEVER_REACHED: NEUTRAL}
BONUS_COLOR = OKABE_ITO["blue"]
RESAMPLED_COLOR = OKABE_ITO["reddish purple"]  # a token drawn from the residual after rejections
LOOKUP_COLOR = OKABE_ITO["orange"]  # what only prompt lookup proposed (legends, the pass strip)
MARKS = {ACCEPTED: "✓", REJECTED: "✗", NEVER_REACHED: "○"}
# Plotly marker symbols: the source's shape, filled when accepted, crossed when rejected, open when never reached
SYMBOL_SUFFIX = {ACCEPTED: "", REJECTED: "-x", NEVER_REACHED: "-open"}

# Machado, Oliveira & Fernandes (2009), severity 1.0: linear RGB -> simulated linear RGB
CVD = {
    "protan": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216), (-0.003882, -0.048116, 1.051998)),
    "deutan": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413), (-0.011820, 0.042940, 0.968881)),
    "tritan": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602), (0.004733, 0.691367, 0.303900)),
}


def _linear(c: float) -> float:
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _srgb(c: float) -> float:
    c = min(max(c, 0.0), 1.0)
    return 12.92 * c if c <= 0.0031308 else 1.055 * c ** (1 / 2.4) - 0.055


def rgb(hex_color: str) -> tuple[float, float, float]:
    h = hex_color.lstrip("#")
    return tuple(int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))


def simulate(hex_color: str, kind: str) -> tuple[float, float, float]:
    """The sRGB colour (0..1) a viewer with `kind` ("protan", "deutan", "tritan") sees for `hex_color`."""
    lin = [_linear(c) for c in rgb(hex_color)]
    return tuple(_srgb(sum(m * c for m, c in zip(row, lin))) for row in CVD[kind])


def lab(srgb: tuple[float, float, float]) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB colour (0..1)."""
    r, g, b = (_linear(c) for c in srgb)
    xyz = (0.4124 * r + 0.3576 * g + 0.1805 * b, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           0.0193 * r + 0.1192 * g + 0.9505 * b)
    f = [t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116
         for t in (xyz[0] / 0.95047, xyz[1], xyz[2] / 1.08883)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def ciede2000(lab1: tuple[float, float, float], lab2: tuple[float, float, float]) -> float:
    """The CIEDE2000 colour difference (Sharma, Wu & Dalal 2005), kL = kC = kH = 1."""
    (l1, a1, b1), (l2, a2, b2) = lab1, lab2
    c_bar = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_bar ** 7 / (c_bar ** 7 + 25 ** 7)))
    a1p, a2p = a1 * (1 + g), a2 * (1 + g)
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360 if c1p else 0.0
    h2p = math.degrees(math.atan2(b2, a2p)) % 360 if c2p else 0.0
    dl, dc = l2 - l1, c2p - c1p
    dh = h2p - h1p if abs(h2p - h1p) <= 180 else h2p - h1p - 360 * math.copysign(1, h2p - h1p)
    dh = dh if c1p * c2p else 0.0
    d_h = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dh / 2))
    l_bar, cp_bar = (l1 + l2) / 2, (c1p + c2p) / 2
    if not c1p * c2p:
        h_bar = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        h_bar = (h1p + h2p) / 2
    else:
        h_bar = (h1p + h2p + 360) / 2 if h1p + h2p < 360 else (h1p + h2p - 360) / 2
    t = (1 - 0.17 * math.cos(math.radians(h_bar - 30)) + 0.24 * math.cos(math.radians(2 * h_bar))
         + 0.32 * math.cos(math.radians(3 * h_bar + 6)) - 0.20 * math.cos(math.radians(4 * h_bar - 63)))
    s_l = 1 + 0.015 * (l_bar - 50) ** 2 / math.sqrt(20 + (l_bar - 50) ** 2)
    s_c, s_h = 1 + 0.045 * cp_bar, 1 + 0.015 * cp_bar * t
    r_t = (-2 * math.sqrt(cp_bar ** 7 / (cp_bar ** 7 + 25 ** 7))
           * math.sin(math.radians(60 * math.exp(-(((h_bar - 275) / 25) ** 2)))))
    return math.sqrt((dl / s_l) ** 2 + (dc / s_c) ** 2 + (d_h / s_h) ** 2 + r_t * (dc / s_c) * (d_h / s_h))


def cvd_distances(colors: list[str]) -> dict[str, float]:
    """The smallest pairwise CIEDE2000 distance among `colors`, seen normally and under each simulated
    deficiency."""
    views = {"normal": lambda c: rgb(c)} | {k: (lambda c, k=k: simulate(c, k)) for k in CVD}
    return {name: min(ciede2000(lab(see(a)), lab(see(b))) for a, b in combinations(colors, 2))
            for name, see in views.items()}


def palette_css() -> str:
    """The verdict colours as CSS variables, for the page's own HTML pictures."""
    return (f":root {{ --fe-acc:{VERDICT_COLORS[ACCEPTED]}; --fe-rej:{VERDICT_COLORS[REJECTED]}; "
            f"--fe-never:{VERDICT_COLORS[NEVER_REACHED]}; --fe-bonus:{BONUS_COLOR}; "
            f"--fe-resampled:{RESAMPLED_COLOR}; --fe-lookup:{LOOKUP_COLOR}; }}\n")
