"""fasteagle.methods: one registry from a method name and typed settings to a drafter; the older
variant names are their method with a setting changed, and the CLI's flags are those settings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fasteagle.errors import FastEagleError
from fasteagle.methods import ALIASES, DEFAULT_EAGLE3, EQUAL_DRAFTER, METHODS, Settings, build
from tests.test_drafter import make


def test_settings_set_up_the_drafter_and_aliases_are_settings(tiny, tmp_path):
    make(tiny).save(tmp_path)
    s = Settings(tree_budget=9, tree_k=(4, 2), drafter=tmp_path)
    d = build("fasteagle", tiny, replace(s, step_mode="static", tree_on_device=True))
    assert (d.tree_k, d.tree_budget, d.tree_shape) == ([4, 2], 9, "product")
    assert d.state.mode() == "static" and d.tree_on_device is True
    assert build("fasteagle-eager", tiny, s).state.mode() == "dynamic"
    assert build("fasteagle-host-tree", tiny, s).tree_on_device is False
    assert build("fasteagle-all-layers", tiny, s).state.all_layers and not d.state.all_layers
    assert build("fasteagle-backbone", tiny, replace(s, tree_shape="product")).tree_shape == "backbone"
    joined = build("fasteagle+lookup", tiny, s)
    assert (joined.tree_k, joined.tree_budget, joined.drafter.tree_k) == ([4, 2], 9, [4, 2])
    assert build("vanilla", tiny) is None
    assert set(ALIASES).isdisjoint(METHODS) and {m for m, _ in ALIASES.values()} <= set(METHODS)


def test_unknown_methods_and_settings_are_refused(tiny):
    with pytest.raises(FastEagleError, match="unknown method 'fasteagle-turbo'"):
        build("fasteagle-turbo", tiny)
    with pytest.raises(FastEagleError, match="step mode"):
        Settings(step_mode="fast")
    with pytest.raises(FastEagleError, match="tree shape"):
        Settings(tree_shape="star")
    with pytest.raises(FastEagleError, match="tree-budget"):
        Settings(tree_budget=1)


def test_a_method_names_the_folder_it_loads():
    assert Settings().with_drafter("eagle3+lookup", "x") == Settings(eagle3_drafter=Path("x"))
    assert Settings().with_drafter("fasteagle-eager", "y") == Settings(drafter=Path("y"))
    assert Settings().with_drafter("lookup", "z") == Settings()
    # fasteagle-equal names its own drafter: the cascade trained as the eagle3 drafter was
    assert Settings(drafter=Path("x")).drafter_dir("fasteagle-equal") == EQUAL_DRAFTER
    assert Settings(drafter=Path("x")).drafter_dir("fasteagle") == Path("x")
    assert Settings().drafter_dir("eagle3") == DEFAULT_EAGLE3 and Settings().drafter_dir("vanilla") is None


def test_cli_flags_are_the_settings(tiny, tmp_path, monkeypatch):
    from fasteagle import cli, cli_bench

    args = cli.build_parser().parse_args(["generate", "--prompt", "hi", "--method", "fasteagle", "--step-mode",
                                          "dynamic", "--host-tree", "--tree-k", "4,2", "--no-full-vocab"])
    assert cli.method_settings(args) == Settings(tree_k=(4, 2), tree_shape="product", full_vocab=False,
                                                 step_mode="dynamic", tree_on_device=False)
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["bench"].format_help()
    assert "fasteagle-eager" not in help_text and "eagle3+lookup" in help_text  # real methods only

    import fasteagle.target
    seen = []

    def stop(method, target, a):
        seen.append(method)
        if method != "vanilla":
            raise FastEagleError("stop here")

    monkeypatch.setattr(fasteagle.target, "load_target", lambda *a, **k: tiny)
    monkeypatch.setattr(cli_bench, "make_drafter", stop)
    prompts = "assets/prompts/sharegpt_holdout.jsonl"
    assert cli.main(["bench", "--prompts", prompts, "--limit", "1", "--methods", "fasteagle-eager"]) == 2
    assert seen == ["vanilla", "fasteagle-eager"]  # an old name still runs, under its own name
