"""The shape of the code, kept by tests: modules import only downward (no loops), no function
outside tests runs past ~80 lines, and each metric has one definition."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [*sorted((ROOT / "fasteagle").rglob("*.py")), *sorted((ROOT / "viz").rglob("*.py")), ROOT / "app.py"]
MAX_LINES = 80

# Lower layers first; a module may import its own layer's and lower ones, never a higher one.
LAYERS = [
    {"fasteagle", "fasteagle.env", "fasteagle.errors", "fasteagle.fields", "fasteagle.files", "fasteagle.trace",
     "fasteagle.whatif", "fasteagle.treeorder", "fasteagle.inspection", "fasteagle.vllm_inspect",
     "fasteagle.packing", "fasteagle.tree", "fasteagle.vllm_plugin", "fasteagle.vllm_cascade"},
    {"fasteagle.paths", "fasteagle.kvcache", "fasteagle.fused", "fasteagle.lookup", "fasteagle.draftconfig"},
    {"fasteagle.target", "fasteagle.verify", "fasteagle.draftgraph", "fasteagle.draftbase"},
    {"fasteagle.drafter", "fasteagle.eagle3", "fasteagle.dflash", "fasteagle.peagle", "fasteagle.generate"},
    {"fasteagle.hybrid", "fasteagle.eagle3_format", "fasteagle.vllm_engine", "fasteagle.vllm_traces"},
    {"fasteagle.methods"},
    {"fasteagle.profile", "fasteagle.train", "fasteagle.train.teacher", "fasteagle.train.data",
     "fasteagle.train.sharegpt", "fasteagle.train.config", "fasteagle.train.holdout",
     "fasteagle.train.save"},
    {"fasteagle.train.tasks"},
    {"fasteagle.train.fast_replies"},
    {"fasteagle.train.trainer", "fasteagle.train.vocab", "fasteagle.train.moefy", "fasteagle.bench",
     "fasteagle.bench.prompts", "fasteagle.bench.timing", "fasteagle.bench.costs", "fasteagle.bench.tune",
     "fasteagle.bench.reports",
     "fasteagle.bench.plots", "fasteagle.bench.serving", "fasteagle.bench.batches", "fasteagle.bench.rerun",
     "fasteagle.bench.vllm_costs", "fasteagle.bench.distill", "fasteagle.bench.routing", "fasteagle.bench.moe",
     "fasteagle.bench.diagnose", "fasteagle.bench.heldout",
     "fasteagle.bench.heldout_text", "fasteagle.bench.predict", "fasteagle.cli_args"},
    {"fasteagle.train.compare"},
    {"fasteagle.cli", "fasteagle.cli_bench", "fasteagle.cli_vllm", "fasteagle.cli_inspect", "fasteagle.__main__",
     "fasteagle.train.recipe",
     "fasteagle.train.steps"},
    # the app's glue, above the library it serves (it also reads viz/, which reads only fasteagle.trace)
    {"fasteagle.app", "fasteagle.app.turns", "fasteagle.app.engine", "fasteagle.app.tour"},
    {"fasteagle.app.text", "fasteagle.app.examples", "fasteagle.app.costs", "fasteagle.app.scripts",
     "fasteagle.app.explorer"},
    {"fasteagle.app.screen"},
    {"fasteagle.app.handlers"},
    {"fasteagle.app.loadtest"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    name = ".".join(parts)
    return name.removesuffix(".__init__")


def imports(path: Path) -> set[str]:
    """Every fasteagle module `path` imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fasteagle"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("fasteagle"))
    return out


def package_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in (ROOT / "fasteagle").rglob("*.py")}
    return {m: {d for d in imports(p) if d in files and d != m} for m, p in files.items()}


def test_every_module_has_a_layer():
    layered = set().union(*LAYERS)
    assert set(package_graph()) <= layered, f"place these in LAYERS: {sorted(set(package_graph()) - layered)}"


def test_modules_import_only_their_own_layer_or_lower():
    level = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    wrong = [(m, d) for m, deps in package_graph().items() for d in deps if level[d] > level[m]]
    assert not wrong, f"imports from a higher layer: {wrong}"


def test_no_import_loops():
    graph = package_graph()
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in graph[m]:
            assert state.get(d) != 1, f"import loop: {' -> '.join([*stack, m, d])}"
            if d not in state:
                visit(d, [*stack, m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def test_no_function_runs_past_80_lines():
    long = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these into named steps: " + "; ".join(long)


def test_viz_stays_pure():
    """viz/ draws traces: it imports no model, no web framework and nothing of the app's glue, so the
    app's modules can read it without a loop."""
    banned = ("torch", "gradio", "transformers", "fasteagle.app", "app")
    for path in sorted((ROOT / "viz").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            wrong = [n for n in names if any(n == b or n.startswith(b + ".") for b in banned)]
            assert not wrong, f"{path.relative_to(ROOT)} imports {wrong}"


def test_the_app_module_stays_the_page():
    """app.py keeps the layout and the wiring; handlers and engine glue live in fasteagle/app/."""
    assert len((ROOT / "app.py").read_text().splitlines()) <= 400


def test_the_readme_module_map_names_every_module():
    """The README's map of modules lists each module of fasteagle/ (a package as one row) and nothing
    that is not there."""
    import re

    rows = set(re.findall(r"^\| `(fasteagle/[\w/.]+)` \|", (ROOT / "README.md").read_text(), re.M))
    have = {f"fasteagle/{p.name}" + ("/" if p.is_dir() else "") for p in (ROOT / "fasteagle").iterdir()
            if (p.suffix == ".py" and p.stem not in ("__init__", "__main__")) or (p / "__init__.py").exists()}
    assert rows == have, f"missing from the README: {sorted(have - rows)}; gone from the code: {sorted(rows - have)}"
