"""The Plotly charts of a method comparison (an .html beside its result), and a result's .md table
and charts drawn again from its JSON."""

from __future__ import annotations

from pathlib import Path

from fasteagle.bench.reports import MIN_JUDGED, judged_depths, markdown_table, per_prompt, read_result
from fasteagle.files import atomic_path, write_text


def charts(doc: dict, path: str | Path) -> None:
    """Plotly HTML: speedup and tau per method, per-depth acceptance of the drafters, (with
    `--tree auto`) each drafter's expected speedup against the tree budget it was chosen from, and
    below, every method's speedup prompt by prompt (tau in the hover). A vLLM batch sweep has its own
    (`fasteagle.bench.batches.chart`)."""
    if "batches" in doc:
        from fasteagle.bench.batches import chart

        return chart(doc, path)
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    names = list(doc["methods"])
    auto = doc.get("settings", {}).get("tree_auto") or {}
    prompts = per_prompt(doc)
    cols = 3 + bool(auto)
    titles = ["speedup vs vanilla", "tau (tokens / target forward)", "per-depth acceptance"]
    titles += ["--tree auto: expected speedup vs budget"] * bool(auto)
    specs = [[{}] * cols] + ([[{"colspan": cols}] + [None] * (cols - 1)] if prompts else [])
    fig = make_subplots(rows=1 + bool(prompts), cols=cols, specs=specs, vertical_spacing=0.18,
                        subplot_titles=titles + ["speedup vs vanilla, prompt by prompt"] * bool(prompts))
    palette = qualitative.Plotly
    color = {n: palette[i % len(palette)] for i, n in enumerate(names)}  # one colour per method, every panel
    shown = set()

    def legend(n: str) -> dict:
        first = n not in shown
        shown.add(n)
        return {"name": n, "legendgroup": n, "showlegend": first, "marker_color": color[n]}

    for col, key in ((1, "speedup_vs_vanilla"), (2, "tau")):
        fig.add_bar(x=names, y=[doc["methods"][n].get(key) for n in names], row=1, col=col, showlegend=False,
                    marker_color=[color[n] for n in names])
    for n in names:
        acc = doc["methods"][n].get("depth_acceptance") or []
        if acc:
            fig.add_scatter(x=list(range(1, len(acc) + 1)), y=acc, mode="lines+markers", row=1, col=3,
                            line_color=color[n], **legend(n))
    for n, choice in auto.items():
        curve = choice.get("speedup_vs_decode_step") or {}
        fig.add_scatter(x=[int(b) for b in curve], y=list(curve.values()), mode="lines+markers", row=1, col=4,
                        name=f"{n} (picked {choice['budget']})", line_color=color.get(n), line_dash="dot")
    if auto:
        fig.update_xaxes(type="log", title_text="tree nodes", row=1, col=4)
    for n, rs in prompts.items():
        hover = f"{n}<br>%{{x}}: %{{y:.2f}}x" + ("<br>tau %{customdata:.2f}" if rs[0]["tau"] is not None else "")
        fig.add_bar(x=[f"{r['category']}/{r['id']}" for r in rs], y=[r["speedup"] for r in rs],
                    customdata=[r["tau"] for r in rs], row=2, col=1, hovertemplate=hover + "<extra></extra>",
                    **legend(n))
    if prompts:
        fig.update_layout(barmode="group")
        fig.add_hline(y=1.0, line_dash="dot", line_color="gray", row=2, col=1)
    fig.update_layout(title=f"{doc['target']} on {doc['device']}", height=420 + 380 * bool(prompts),
                      template="plotly_white")
    with atomic_path(path) as tmp:
        fig.write_html(str(tmp), include_plotlyjs="cdn", div_id=Path(path).stem)  # a fixed id: a redraw changes nothing


def equal_training_charts(doc: dict, path: str | Path) -> None:
    """Plotly HTML of a recipe's curves: tau (at the auto and the paper tree) and speed-up against the
    tokens each drafter trained on, and per-depth acceptance at each drafter's largest budget."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    points = doc["equal_training"]
    fig = make_subplots(rows=1, cols=3, subplot_titles=["τ against training tokens", "speed-up vs vanilla",
                                                        "per-depth acceptance, largest budget"])
    for i, (name, pts) in enumerate(points.items()):
        color = qualitative.Plotly[i % len(qualitative.Plotly)]
        x = [p.get("tokens_trained") or p["steps"] for p in pts]
        for key, dash in (("auto_tree", "solid"), ("paper_tree", "dot")):
            fig.add_scatter(x=x, y=[(p.get(key) or {}).get("tau") for p in pts], mode="lines+markers", row=1, col=1,
                            name=f"{name} ({'auto' if key == 'auto_tree' else 'paper'} tree)", line_color=color,
                            line_dash=dash, legendgroup=name)
        fig.add_scatter(x=x, y=[(p.get("auto_tree") or {}).get("speedup_vs_vanilla") for p in pts],
                        mode="lines+markers", row=1, col=2, line_color=color, legendgroup=name, showlegend=False)
        last = (pts[-1].get("auto_tree") or {}).get("depth_acceptance") if pts else None
        if last:
            fig.add_scatter(x=list(range(1, len(last) + 1)), y=last, mode="lines+markers", row=1, col=3,
                            line_color=color, legendgroup=name, showlegend=False)
    for col in (1, 2):
        fig.update_xaxes(title_text="reply tokens trained on", row=1, col=col)
    fig.update_xaxes(title_text="draft depth", row=1, col=3)
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray", row=1, col=2)
    fig.update_layout(title=f"Equal training on {doc.get('device', '?')}", height=460, template="plotly_white")
    with atomic_path(path) as tmp:
        fig.write_html(str(tmp), include_plotlyjs="cdn", div_id=Path(path).stem)


def side_by_side_chart(doc: dict, path: str | Path) -> None:
    """Plotly HTML of a recipe's compare stage: acceptance against depth, a line per drafter, a panel per
    prompt set and tree."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    panels = [(p, t) for p, trees in doc["side_by_side"].items() for t in trees]
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, subplot_titles=[f"{p}, {t}" for p, t in panels])
    names = list(dict.fromkeys(n for p, t in panels for n in doc["side_by_side"][p][t]["methods"] if n != "vanilla"))
    for col, (p, t) in enumerate(panels, start=1):
        for i, name in enumerate(names):
            acc = judged_depths(doc["side_by_side"][p][t]["methods"].get(name) or {})
            fig.add_scatter(x=list(range(1, len(acc) + 1)), y=acc, mode="lines+markers", name=name, legendgroup=name,
                            line_color=qualitative.Plotly[i % len(qualitative.Plotly)], showlegend=col == 1,
                            row=1, col=col)
        fig.update_xaxes(title_text="draft depth", dtick=1, row=1, col=col)
    fig.update_yaxes(title_text="acceptance", range=[0, 1], row=1, col=1)
    at = f"at {doc['steps']} steps of equal training" if doc.get("steps") else "(unequal training)"
    fig.update_layout(title=f"Acceptance by depth {at} ({doc.get('device', '?')}; "
                            f"depths judged at least {MIN_JUDGED} times)",
                      height=420, template="plotly_white")
    with atomic_path(path) as tmp:
        fig.write_html(str(tmp), include_plotlyjs="cdn", div_id=Path(path).stem)


def redraw(result_file: str | Path) -> None:
    """The .md table (and the .html charts, for the results that have them) of a result JSON, drawn again."""
    path = Path(result_file)
    draw(read_result(path), path)


def draw(doc: dict, path: str | Path) -> str:
    """Write the .md table of result `doc` beside its JSON at `path`, and its .html charts where its kind has
    them; returns the table."""
    path = Path(path)
    table = markdown_table(doc)
    write_text(path.with_suffix(".md"), table)
    if "batches" in doc or ("methods" in doc and "rows" in doc):
        charts(doc, path.with_suffix(".html"))
    if "equal_training" in doc:
        equal_training_charts(doc, path.with_suffix(".html"))
    if "side_by_side" in doc:
        side_by_side_chart(doc, path.with_suffix(".html"))
    if "moe_study" in doc:
        from fasteagle.bench.moe import chart

        chart(doc, path.with_suffix(".html"))
    return table
