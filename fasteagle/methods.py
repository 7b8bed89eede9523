"""The one registry from a decoding method's name and its settings to the drafter that decodes with it.

    build("fasteagle", target, Settings(tree_budget=24))  ->  a loaded CascadedDrafter, set up
    build("vanilla", target)                              ->  None (plain decoding)

The CLI (`cli.make_drafter`, from its flags), the app and the benchmark all build drafters here, so
a setting means the same everywhere and a default (`Settings`, `default_budget`) is chosen once per
device. A few more names (`ALIASES`) are a method with one setting changed, so that a run times both
side by side: `fasteagle-equal` is the cascade trained as the `eagle3` drafter was. `load_drafter` loads
whichever kind of trained drafter a folder holds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from fasteagle.errors import FastEagleError

DEFAULT_DRAFTER = Path(__file__).resolve().parent.parent / "assets" / "drafters" / "smollm2-135m-fasteagle"
DEFAULT_EAGLE3 = DEFAULT_DRAFTER.with_name("smollm2-135m-eagle3")
# The cascade trained by the same recipe, on the same tokens, as DEFAULT_EAGLE3 (docs/training.md, "Recipe"):
# the shipped pair that compares the two architectures at equal training.
EQUAL_DRAFTER = DEFAULT_DRAFTER.with_name("smollm2-135m-fasteagle-equal")
# A DFlash drafter (block diffusion, `fasteagle.dflash`) trained beside that pair, on the same data and steps.
DEFAULT_DFLASH = DEFAULT_DRAFTER.with_name("smollm2-135m-dflash")
# Parallel EAGLE (EAGLE-3's layer drafting k in one pass, `fasteagle.peagle`), the same recipe's fourth arm.
DEFAULT_PEAGLE = DEFAULT_DRAFTER.with_name("smollm2-135m-peagle")

# Node budgets `python -m fasteagle bench --tree auto` picked for the shipped drafters on a 2-core CPU, where
# a big tree's verify costs several decode steps, so small trees win (docs/design.md, "Small trees on a CPU,
# big ones on a GPU", links the measurements); a drafter joined with lookup takes its drafter's.
CPU_BUDGETS = {"fasteagle": 6, "eagle3": 5, "fasteagle+lookup": 6, "eagle3+lookup": 5}
# On a GPU a one-token step is launch-bound, so a big tree verifies for little more than a step and `--tree
# auto` picked 128 for both FastEagle methods; the earlier EAGLE-3-style drafter accepted so little that its
# curve was flat there, so that method keeps the paper's ~60 until a GPU measures the current one.
GPU_BUDGETS = {"fasteagle": 128, "fasteagle+lookup": 128}
PAPER_BUDGET = 60  # the paper's tree size: a GPU's default for the others, and what `bench` verifies unless told
MAX_BUDGET = 192  # the largest tree `bench --tree auto` tries on a GPU

# The cascade's own prefill reads only a prompt's last this many tokens, at their true positions, so a long
# document costs it no more than this (`CascadedDrafter.prefill_tail`). Replayed on the held-out kinds it
# costs no acceptance (docs/results.md, "Prompts nobody tuned for"); `fasteagle-whole` reads everything.
DEFAULT_PREFILL_TAIL = 256

STEP_MODES = ("dynamic", "static", "graph")  # `drafter.CascadeState.step_mode`


@dataclass(frozen=True)
class Settings:
    """How a method's drafter is set up. None leaves the choice to the device the target is on (or,
    where said, to the drafter); settings a method has no use for are ignored."""

    tree_budget: int | None = None  # tree nodes verified per step, root included (None: `default_budget`)
    tree_k: tuple[int, ...] | None = None  # top-k, one for every depth or one per depth (None: the drafter's own)
    tree_shape: str | None = None  # fasteagle's tree: "product" or "backbone" (None: the drafter's own, product)
    full_vocab: bool | None = None  # fasteagle drafts over the whole vocabulary, not its compact one (None: on a GPU)
    draft_int8: bool | None = None  # int8 weights for CPU-packed drafters (None: yes unless FASTEAGLE_DRAFT_INT8=0)
    step_mode: str | None = None  # fasteagle's decode step, one of STEP_MODES (None: "graph" on a GPU, else "dynamic")
    tree_on_device: bool | None = None  # fasteagle's fixed step builds its own tree (None: in a CUDA graph)
    all_layers: bool = False  # fasteagle runs every cascade layer, even those the tree is too small to use
    prefill_tail: int = DEFAULT_PREFILL_TAIL  # fasteagle reads only a prompt's last this many tokens (0: all)
    drafter: Path | None = None  # the FastEagle drafter folder (None: DEFAULT_DRAFTER)
    eagle3_drafter: Path | None = None  # the EAGLE-3-style drafter folder (None: DEFAULT_EAGLE3)
    dflash_drafter: Path | None = None  # the DFlash drafter folder (None: DEFAULT_DFLASH)
    peagle_drafter: Path | None = None  # the parallel EAGLE drafter folder (None: DEFAULT_PEAGLE)
    named: tuple[tuple[str, Path], ...] = ()  # more methods, each a label for a drafter folder (`--drafters`)

    def __post_init__(self):
        from fasteagle.tree import TREE_SHAPES

        if self.tree_budget is not None and self.tree_budget < 2:
            raise FastEagleError("--tree-budget must be at least 2 (the root and one drafted node)")
        if self.tree_k is not None and (not self.tree_k or min(self.tree_k) < 1):
            raise FastEagleError(f"every --tree-k value must be at least 1 (got {self.tree_k})")
        if self.tree_shape not in (None, *TREE_SHAPES):
            raise FastEagleError(f"unknown tree shape {self.tree_shape!r}; choose one of {', '.join(TREE_SHAPES)}")
        if self.step_mode not in (None, *STEP_MODES):
            raise FastEagleError(f"unknown step mode {self.step_mode!r}; choose one of {', '.join(STEP_MODES)}")

    def budget(self, method: str, device) -> int:
        """The tree budget `method` drafts with on `device`."""
        return default_budget(method, device.type == "cuda") if self.tree_budget is None else self.tree_budget

    def wants_full_vocab(self, device) -> bool:
        """`full_vocab`, else on a GPU only: there the bigger head costs next to nothing and the drafter
        can draft every reply token; on a CPU the whole head costs more draft time than it brings
        (docs/design.md, "A compact draft vocabulary"), so there a drafter drafts over its compact vocab (the
        one it was trained with, the one it grew from, or one `fasteagle.train.vocab` set) unless asked."""
        return device.type == "cuda" if self.full_vocab is None else bool(self.full_vocab)

    def drafter_dir(self, method: str) -> Path | None:
        """The folder of the trained drafter `method` loads (None: it loads none)."""
        method, s = resolve(method, self)
        name = PATH_SETTING.get(method)
        return (getattr(s, name) or DEFAULT_FOLDERS[name]) if name else None

    def with_drafter(self, method: str, path: str | Path | None) -> Settings:
        """These settings with `path` as the folder of the trained drafter `method` loads (if it loads one)."""
        name = PATH_SETTING.get(canonical(method))
        return replace(self, **{name: Path(path)}) if name and path is not None else self


def default_budget(method: str, on_gpu: bool) -> int:
    """Tree nodes per step where none is asked for (generate, the app): the paper's 60 would make a CPU
    decode slower than plain decoding, since there a 60-node forward costs about three one-token steps."""
    key = ALIASES.get(method, (method,))[0]
    return GPU_BUDGETS.get(key, PAPER_BUDGET) if on_gpu else CPU_BUDGETS.get(key, 8)


def check_tree_budget(target, budget: int | None) -> None:
    """A tree the target cannot verify on this device is refused before decoding starts."""
    from fasteagle.generate import max_tree_nodes

    if budget is not None and budget > (cap := max_tree_nodes(target)):
        raise FastEagleError(f"--tree-budget {budget} is more than {target.name} can verify in one forward here "
                             f"(at most {cap}: its positions and this device's free memory); the paper's tree "
                             f"has {PAPER_BUDGET} nodes")


def build(method: str, target, settings: Settings | None = None):
    """The drafter `method` decodes with on `target`, set up by `settings` (None for vanilla)."""
    method, settings = resolve(method, settings or Settings())
    if method != "vanilla":
        check_tree_budget(target, settings.tree_budget)
    return REGISTRY[method](target, settings)


def resolve(method: str, settings: Settings) -> tuple[str, Settings]:
    """The method an alias or a named drafter stands for, with its setting applied (a method is itself)."""
    folder = dict(settings.named).get(method)
    if folder is not None:  # a label for a trained drafter: decoded by the method of the kind it holds
        kind = drafter_kind(folder)
        return kind, replace(settings, named=()).with_drafter(kind, folder)
    if method in ALIASES:
        return ALIASES[method][0], replace(settings, **ALIASES[method][1])
    return canonical(method), settings


def canonical(method: str) -> str:
    """The method an alias stands for (a method's own name for itself)."""
    if method in ALIASES:
        return ALIASES[method][0]
    if method not in REGISTRY:
        raise FastEagleError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    return method


def _lookup(target, s: Settings):
    from fasteagle.lookup import LookupDrafter

    return LookupDrafter()


def _fasteagle(target, s: Settings):
    from fasteagle.drafter import CascadedDrafter

    d = _one_forward_drafter(CascadedDrafter.load(s.drafter_dir("fasteagle"), target.model, s.draft_int8),
                             "fasteagle", target, s)
    d.step_mode, d.tree_on_device = s.step_mode, s.tree_on_device
    d.state.all_layers = s.all_layers
    d.prefill_tail = s.prefill_tail
    return d


def _dflash(target, s: Settings):
    return _one_forward_drafter(load_drafter(s.drafter_dir("dflash"), target.model, s.draft_int8, kind="dflash"),
                                "dflash", target, s)


def _peagle(target, s: Settings):
    return _one_forward_drafter(load_drafter(s.drafter_dir("peagle"), target.model, s.draft_int8, kind="peagle"),
                                "peagle", target, s)


def _one_forward_drafter(d, method: str, target, s: Settings):
    """A drafter whose one forward gives every depth (the cascade, DFlash, parallel EAGLE) set up alike: its draft
    vocab for the device, per-depth top-k and budget, and the tree shape its candidates build (None: its own)."""
    if s.wants_full_vocab(target.device):
        d.grow_vocab(d.cfg.vocab_size)  # a drafter with the whole vocabulary already keeps it
    elif d.compact_vocab is not None:
        d.shrink_vocab()
    _set_tree(d, method, target, s, per_depth=True)
    if s.tree_shape:
        d.tree_shape = s.tree_shape
    return d


def _eagle3(target, s: Settings):
    d = load_drafter(s.drafter_dir("eagle3"), target.model, s.draft_int8, kind="eagle3")
    _set_tree(d, "eagle3", target, s, per_depth=False)  # its dynamic tree takes one k
    return d


def _set_tree(d, method: str, target, s: Settings, per_depth: bool) -> None:
    """The tree's top-k (capped by the draft vocab) and budget."""
    if s.tree_k is not None:
        ks = list(s.tree_k)
        if max(ks) > d.vocab_ids.numel():
            raise FastEagleError(f"--tree-k {max(ks)} is more than the {d.vocab_ids.numel()} tokens this drafter "
                                 "drafts from; give at most that")
        d.tree_k = ks[0] if len(ks) == 1 or not per_depth else ks
    d.tree_budget = s.budget(method, target.device)


def _with_lookup(method: str):
    """A builder of `method`'s drafter joined with prompt lookup (`fasteagle.hybrid`)."""
    def joined(target, s: Settings):
        from fasteagle.hybrid import WithLookup

        return WithLookup(REGISTRY[method](target, s))
    return joined


REGISTRY = {
    "vanilla": lambda target, s: None,
    "lookup": _lookup,
    "fasteagle": _fasteagle,
    "eagle3": _eagle3,
    "dflash": _dflash,  # block diffusion: one forward drafts a block (`fasteagle.dflash`)
    "peagle": _peagle,  # parallel EAGLE: EAGLE-3's layer over k-1 mask rows, one forward (`fasteagle.peagle`)
    "fasteagle+lookup": _with_lookup("fasteagle"),  # the trained drafter's tree joined with lookup's
    "eagle3+lookup": _with_lookup("eagle3"),
}
METHODS = tuple(REGISTRY)
ALIASES = {  # fasteagle with one setting changed, to time the two side by side in one run
    "fasteagle-equal": ("fasteagle", {"drafter": EQUAL_DRAFTER}),  # the cascade trained as eagle3's drafter was
    "fasteagle-backbone": ("fasteagle", {"tree_shape": "backbone"}),  # the paper's tree, whatever tree_shape says
    "fasteagle-eager": ("fasteagle", {"step_mode": "dynamic"}),  # op by op where fasteagle replays a CUDA graph
    "fasteagle-host-tree": ("fasteagle", {"tree_on_device": False}),  # the graph's tree built on the host
    "fasteagle-all-layers": ("fasteagle", {"all_layers": True}),  # no layer skipped at small trees
    "fasteagle-whole": ("fasteagle", {"prefill_tail": 0}),  # its own prefill over the whole prompt, not its tail
}
# the Settings field naming the folder a method loads, and the folder where that field is None
PATH_SETTING = {"fasteagle": "drafter", "fasteagle+lookup": "drafter", "eagle3": "eagle3_drafter",
                "eagle3+lookup": "eagle3_drafter", "dflash": "dflash_drafter",
                "peagle": "peagle_drafter"}
DEFAULT_FOLDERS = {"drafter": DEFAULT_DRAFTER, "eagle3_drafter": DEFAULT_EAGLE3, "dflash_drafter": DEFAULT_DFLASH,
                   "peagle_drafter": DEFAULT_PEAGLE}


def drafter_kind(path: str | Path) -> str:
    """"fasteagle", "eagle3", "dflash" or "peagle": the kind of drafter a folder holds (ours by config.json's
    "kind", an
    EAGLE-3 checkpoint of the EAGLE / SpecForge / vLLM format by its architectures)."""
    from fasteagle import eagle3_format
    from fasteagle.draftconfig import read_config

    if eagle3_format.is_checkpoint(path):
        return "eagle3"
    return read_config(path)[0].get("kind", "fasteagle") if (Path(path) / "config.json").is_file() else "fasteagle"


def load_drafter(path: str | Path, target_model=None, int8: bool | None = None, kind: str | None = None):
    """Load whichever kind of drafter `path` holds (FastEagle cascade, our EAGLE-3 style, or an EAGLE-3
    checkpoint); with `target_model`, attached to it (`DrafterBase.load`). With `kind`, refuse any other."""
    from fasteagle import eagle3_format
    from fasteagle.dflash import DFlashDrafter
    from fasteagle.drafter import CascadedDrafter
    from fasteagle.eagle3 import AutoregressiveDrafter
    from fasteagle.peagle import ParallelEagleDrafter

    if eagle3_format.is_checkpoint(path):
        if kind not in (None, "eagle3"):
            raise FastEagleError(f"{path} is an EAGLE-3 checkpoint: decode with it as --method eagle3")
        return eagle3_format.load(path, target_model, int8)
    found = drafter_kind(path)
    cls = {c.KIND: c for c in (CascadedDrafter, AutoregressiveDrafter, DFlashDrafter,
                                       ParallelEagleDrafter)}.get(kind or found)
    if cls is None:
        raise FastEagleError(f"{path} holds an unknown drafter kind {found!r}")
    return cls.load(path, target_model, int8)


def check_fits(path: str | Path, target_model) -> None:
    """Refuse (one line) a drafter folder trained for another target, from its config alone (no weights read)."""
    from fasteagle import eagle3_format
    from fasteagle.draftconfig import check_fingerprint, read_config

    if eagle3_format.is_checkpoint(path):
        cfg = eagle3_format.read_config(path, target_model.config.num_hidden_layers)[1]
    else:
        cfg = read_config(path)[1]
    check_fingerprint(cfg, target_model)
