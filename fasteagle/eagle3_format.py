"""EAGLE-3 checkpoints in and out: the format the EAGLE repository, SGLang's SpecForge and vLLM share.

    load("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", target.model)  ->  an AutoregressiveDrafter (layout "eagle3")
    export(drafter, out)                                        ->  a folder vLLM serves with method "eagle3"

A checkpoint is a config.json whose `architectures` is `LlamaForCausalLMEagle3` (or vLLM's
`Eagle3LlamaForCausalLM`) and its weights (safetensors or pytorch_model.bin):

    fc.weight                 (W, F*H)   the target's F feature layers, concatenated, to the drafter's width
    midlayer.* | layers.i.*   decoder layers; layer 0's q/k/v read 2W: [input_layernorm(embed); hidden_norm(g)]
    norm.weight               the final norm
    lm_head.weight            (V_draft, W)   over the draft vocab
    d2t                       (V_draft,)  int offsets: target id = draft id + d2t[draft id]
    t2d                       (V,) bool   which target ids are draftable (not needed: d2t says it)
    embed_tokens.weight       optional; else the target's embedding

The target's feature layers are `eagle_aux_hidden_state_layer_ids` (top level or in `eagle_config`),
else (2, L//2, L-3): indices into the target's hidden states, as `DrafterConfig.feature_layers`.
Our own EAGLE-3-style drafter is this network when trained with `layout: "eagle3"`; the older
"proj" layout has no form in this format (docs/design.md, "EAGLE-3 checkpoints").
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from fasteagle.draftbase import finish_load
from fasteagle.draftconfig import DrafterConfig
from fasteagle.draftconfig import peek as peek_ours
from fasteagle.errors import FastEagleError
from fasteagle.files import atomic_path, write_text

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
WEIGHT_FILES = ("model.safetensors", "model-*.safetensors", "pytorch_model.bin", "pytorch_model-*.bin")
IGNORED_KEYS = ("t2d", "mask_hidden")  # t2d repeats d2t; mask_hidden is for vLLM's parallel drafting


def is_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a folder holding an EAGLE-3 checkpoint: by its config.json's architectures, or a
    `draft_vocab_size` (the EAGLE repository's own checkpoints say `LlamaForCausalLM`, as vLLM accepts)."""
    file = Path(path) / "config.json"
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(raw, dict) or "kind" in raw or "dflash_config" in raw:  # ours say their kind; DFlash's own
        return False
    return bool(set(raw.get("architectures") or []) & set(ARCHITECTURES)) or "draft_vocab_size" in raw


def resolve(spec: str | Path) -> Path:
    """A drafter folder: `spec` itself if it is one here, else a Hugging Face id, downloaded once (config and
    weights only) into the Hub's cache."""
    path = Path(spec).expanduser()
    if path.exists() or not re.fullmatch(r"[\w.-]+/[\w.-]+", str(spec)):
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(spec), allow_patterns=["config.json", "*.safetensors", "*.bin", "*.json"]))
    except Exception as exc:  # no network, a wrong id, a gated repository: one line, whichever it is
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FastEagleError(f"no drafter folder {spec} here, and it could not be fetched from the Hub: "
                             f"{detail[:200]}") from None


def read_config(path: str | Path, target_layers: int | None = None) -> tuple[dict, DrafterConfig]:
    """The checkpoint's config.json, raw and as our DrafterConfig (layout "eagle3"). `target_layers` (the
    target's layer count) gives the default feature layers when the config names none."""
    file = Path(path) / "config.json"
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FastEagleError(f"cannot read the EAGLE-3 config {file}: {exc}") from None
    eagle = raw.get("eagle_config") or {}

    def get(key, default=None):
        return raw.get(key, eagle.get(key, default))

    for key, ok in (("norm_output", lambda v: not v), ("use_aux_hidden_state", lambda v: v is None or v),
                    ("logit_scale", lambda v: v in (None, 1, 1.0)), ("hidden_act", lambda v: v in (None, "silu"))):
        if not ok(get(key)):
            raise FastEagleError(f"{file}: {key}={json.dumps(get(key))} is an EAGLE-3 variant fasteagle does not "
                                 "support")
    for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        if not isinstance(raw.get(key), int):
            raise FastEagleError(f"{file}: the EAGLE-3 config has no {key}")
    layers = get("eagle_aux_hidden_state_layer_ids")
    if layers is None:  # vLLM's and EAGLE-3's default; unknown (empty) until the target is known
        layers = [2, target_layers // 2, target_layers - 3] if target_layers else []
    w, heads = raw["hidden_size"], raw["num_attention_heads"]
    draft_vocab = int(raw.get("draft_vocab_size") or raw["vocab_size"])
    rope = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
    rope_theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    if rope.get("rope_type", rope.get("type", "default")) == "default":
        rope = {}
    cfg = DrafterConfig(
        target=str(raw.get("fasteagle_target", "")), target_hidden=int(get("target_hidden_size") or w),
        vocab_size=raw["vocab_size"], feature_layers=[int(i) for i in layers],
        num_layers=int(raw.get("num_hidden_layers", 1)), width=w, intermediate=raw["intermediate_size"],
        num_heads=heads, num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or w // heads), rope_theta=rope_theta, rope=rope,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), max_positions=int(raw.get("max_position_embeddings", 8192)),
        depth=int(raw.get("fasteagle_depth", 7)), draft_vocab=0 if draft_vocab == raw["vocab_size"] else draft_vocab,
        fingerprint=list(raw.get("fasteagle_fingerprint", [])), kind="eagle3",
        layout="eagle3", norm_before_residual=bool(get("norm_before_residual", False)),
        norm_before_fc=bool(get("norm_before_fc", False)), fc_norm=bool(get("fc_norm", False)),
        attention_bias=bool(get("attention_bias", False)),
    )
    if cfg.num_layers < 1:
        raise FastEagleError(f"{file}: num_hidden_layers must be at least 1")
    return raw, cfg


def peek(path: str | Path) -> None:
    """Check a drafter folder, ours or an EAGLE-3 checkpoint: its config, and that it has weights, without
    reading them (before a target loads)."""
    if not is_checkpoint(path):
        peek_ours(path)
        return
    read_config(path)
    weight_files(Path(path))


def weight_files(path: Path) -> list[Path]:
    files = sorted({f for pattern in WEIGHT_FILES for f in path.glob(pattern)})
    if not files:
        raise FastEagleError(f"no EAGLE-3 weights in {path}: expected model.safetensors or pytorch_model.bin")
    return files


def _read(file: Path) -> dict[str, torch.Tensor]:
    try:
        if file.suffix == ".bin":
            return torch.load(file, map_location="cpu", weights_only=True)
        from safetensors.torch import load_file

        return load_file(file)
    except Exception as exc:  # safetensors' and torch's errors for a truncated or foreign file differ
        detail = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise FastEagleError(f"the EAGLE-3 weights {file} are corrupt or truncated ({detail})") from None


def to_ours(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The format's weight names -> the drafter's (`midlayer.` is layer 0; `norm` the final norm; d2t is
    kept as is and turned into `vocab_ids` by the caller)."""
    out = {}
    for key, value in state.items():
        name = key.removeprefix("model.") if not key.startswith("lm_head") else key
        if name in IGNORED_KEYS:
            continue
        name = re.sub(r"^midlayer\.", "layers.0.", name)
        name = re.sub(r"^norm\.", "norms.0.", name)
        out[name] = value
    return out


def load(spec: str | Path, target_model: torch.nn.Module | None = None, int8: bool | None = None):
    """An EAGLE-3 checkpoint (folder or hub id) as an AutoregressiveDrafter; with `target_model`, attached
    to it, checked against it, moved and packed as `DrafterBase.load` does."""
    from fasteagle.eagle3 import AutoregressiveDrafter

    path = resolve(spec)
    n_target = getattr(getattr(target_model, "config", None), "num_hidden_layers", None)
    raw, cfg = read_config(path, n_target)
    state = to_ours({k: v for f in weight_files(path) for k, v in _read(f).items()})
    d2t = state.pop("d2t", None)
    cfg.own_head, cfg.own_embed = "lm_head.weight" in state, "embed_tokens.weight" in state
    if target_model is not None and cfg.own_embed:
        theirs = target_model.get_input_embeddings().weight
        mine = state["embed_tokens.weight"]
        if mine.shape == theirs.shape and torch.allclose(mine.float(), theirs.detach().float().cpu(), atol=1e-3):
            cfg.own_embed = False  # the target's own, saved again: share it, as vLLM does
            del state["embed_tokens.weight"]
    if cfg.draft_vocab and not cfg.own_head:
        raise FastEagleError(f"{path}: a draft vocab of {cfg.draft_vocab} needs lm_head.weight, and the weights "
                             "have none")
    if cfg.draft_vocab and d2t is None:
        raise FastEagleError(f"{path}: a draft vocab of {cfg.draft_vocab} needs d2t (draft -> target ids), and the "
                             "weights have none")
    try:
        drafter = AutoregressiveDrafter(cfg)
    except ValueError as exc:
        raise FastEagleError(f"{path}: {exc}") from None
    if d2t is not None:
        ids = torch.arange(d2t.numel()) + d2t.long()
        if d2t.numel() != drafter.vocab_ids.numel() or int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
            raise FastEagleError(f"{path}: d2t maps {d2t.numel()} draft ids outside the {cfg.vocab_size}-token "
                                 f"vocabulary of a {drafter.vocab_ids.numel()}-token draft vocab")
        state["vocab_ids"] = ids
    else:
        state["vocab_ids"] = drafter.vocab_ids.clone()
    want = drafter.state_dict()
    for key, value in state.items():
        if key not in want:
            raise FastEagleError(f"{path}: unexpected weight {key!r} for this config (an EAGLE-3 variant fasteagle "
                                 "does not support, or a config.json that does not match the weights)")
        if tuple(value.shape) != tuple(want[key].shape):
            raise FastEagleError(f"{path}: weight {key!r} has shape {tuple(value.shape)}, the config.json gives "
                                 f"{tuple(want[key].shape)}")
    if missing := [k for k in want if k not in state]:
        raise FastEagleError(f"{path}: the weights have no {_theirs(missing[0], cfg.num_layers)!r}")
    drafter.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    drafter.info, drafter.path = raw, str(path)
    return finish_load(drafter, target_model, int8)


def _theirs(name: str, num_layers: int) -> str:
    """Our weight name -> the format's (for messages and export)."""
    if num_layers == 1:
        name = re.sub(r"^layers\.0\.", "midlayer.", name)
    return re.sub(r"^norms\.0\.", "norm.", name)


def export(drafter, out: str | Path, target_name: str | None = None) -> Path:
    """Write an attached EAGLE-3-style drafter of layout "eagle3" as an EAGLE-3 checkpoint: config.json
    and model.safetensors (fp32), the LM head's draft-vocab rows and d2t/t2d included, so that vLLM,
    SGLang or `load` reads it without this package's help; a parallel EAGLE drafter adds its `mask_hidden` and
    `mask_token_id` (vLLM's `parallel_drafting`). A cascade goes to `export_cascade`, a DFlash drafter to
    `export_dflash` (vLLM's own DFlash format)."""
    cfg = drafter.cfg
    if cfg.kind == "fasteagle":
        return export_cascade(drafter, out, target_name)
    if cfg.kind == "dflash":
        return export_dflash(drafter, out, target_name)
    if cfg.layout != "eagle3":
        raise FastEagleError("this EAGLE-3-style drafter was trained in the 'proj' layout, which the EAGLE-3 "
                             "format cannot express (docs/design.md, \"EAGLE-3 checkpoints\"); train it with "
                             "layout eagle3")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for key, value in drafter.state_dict().items():
        if key == "vocab_ids" or key.startswith(("lm_head.", "embed_tokens.")):
            continue
        state[_theirs(key, cfg.num_layers)] = value
    if cfg.own_embed:
        state["embed_tokens.weight"] = drafter.embed_tokens.weight
    _write_weights(drafter, out, state)
    config = _config(cfg, "LlamaForCausalLMEagle3", drafter.vocab_ids.numel(), target_name) | {
        "norm_before_residual": cfg.norm_before_residual, "norm_before_fc": cfg.norm_before_fc,
        "fc_norm": cfg.fc_norm, "attention_bias": cfg.attention_bias}
    if cfg.kind == "peagle":  # vLLM's parallel drafting: k-1 rows of `mask_hidden` and this token after the bonus
        config |= {"mask_token_id": cfg.mask_token_id, "fasteagle_kind": cfg.kind, "fasteagle_depth": cfg.depth}
    write_text(out / "config.json", json.dumps(config, indent=2))
    return out


def export_cascade(drafter, out: str | Path, target_name: str | None = None) -> Path:
    """Write an attached cascade as a checkpoint for the vLLM plugin (`fasteagle.vllm_cascade`): the EAGLE-3
    format's names where they mean the same (fc over the target features, layers.i, lm_head, d2t), plus
    `embed_fc` (the fc's columns over the token embedding), `norms.i` (each depth's final norm), `proj`
    (if narrower than the target), `mask_hidden` (zeros) with `mask_token_id`: vLLM's parallel drafting, and for a
    token-conditioned cascade `tok_fc.i` with `token_conditioned` in the config."""
    from fasteagle.vllm_plugin import ARCHITECTURE

    cfg = drafter.cfg
    if drafter.attention_window:
        raise FastEagleError(f"this cascade attends within a window of {drafter.attention_window} positions, which the "
                             "vLLM plugin's layers cannot: they attend over the whole context")
    if cfg.current_token:
        raise FastEagleError("this cascade's rows read their own token too (current_token), which vLLM's draft rows "
                             "do not carry: it drafts in our engine only")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    feats = len(cfg.feature_layers) * cfg.target_hidden
    state = {k: v for k, v in drafter.state_dict().items() if k != "vocab_ids"}
    fc = state.pop("fc.weight")
    state |= {"fc.weight": fc[:, :feats], "embed_fc.weight": fc[:, feats:], "mask_hidden": torch.zeros(1, feats)}
    _write_weights(drafter, out, state)
    config = _config(cfg, ARCHITECTURE, drafter.vocab_ids.numel(), target_name) | {
        "mask_token_id": 0,  # any id: a mask row is also known by its zero hidden state (vllm_cascade)
        "fasteagle_kind": "fasteagle"} | ({"token_conditioned": True} if cfg.token_conditioned else {}) | {
        k: True for k in ("fc_norm", "norm_output", "kv_inject") if getattr(cfg, k)}
    write_text(out / "config.json", json.dumps(config, indent=2))
    return out


def export_dflash(drafter, out: str | Path, target_name: str | None = None) -> Path:
    """Write an attached DFlash drafter as vLLM 0.32 serves it (`method: "dflash"`): config.json
    (`DFlashDraftModel`, `dflash_config` with `mask_token_id` and `target_layer_ids`), model.safetensors under
    vLLM's names, with the head's rows and d2t where it drafts over part of the vocabulary (the embedding, and
    else the head, stay the target's, shared), and `mask_embedding.pt`, the trained mask row.

    vLLM's `target_layer_ids` count layer outputs from 0; our feature layers index the hidden states, where
    0 is the embeddings: layer j's output is hidden state j+1."""
    from fasteagle.dflash import ARCHITECTURE, DFlashDrafter

    cfg = drafter.cfg
    layers = list(cfg.feature_layers)
    if min(layers) < 1 or layers != sorted(set(layers)):
        raise FastEagleError(f"vLLM's DFlash reads target layer outputs once each, in ascending order; this drafter "
                             f"reads hidden states {layers} (0 is the embeddings), which it cannot be served with")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {key.replace("norms.0.", "norm."): value.clone() for key, value in drafter.state_dict().items()
             if key not in ("vocab_ids", "mask_embedding")}  # (clones: the shared k-norm is written per layer)
    # over the whole vocabulary vLLM shares the target's head (it has no d2t then); over a draft vocab, its rows
    _write_weights(drafter, out, state, head=drafter.vocab_ids.numel() < cfg.vocab_size)
    with atomic_path(out / "mask_embedding.pt") as tmp:
        torch.save({"embedding": drafter.mask_embedding.detach().to("cpu", torch.float32).clone(),
                    "mask_token_id": cfg.mask_token_id}, tmp)
    qc = DFlashDrafter.qwen3_config(cfg).to_dict()
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "num_hidden_layers", "rms_norm_eps", "max_position_embeddings", "vocab_size", "rope_parameters",
            "attention_bias", "layer_types", "hidden_act")
    config = {"architectures": [ARCHITECTURE], "model_type": "qwen3", **{k: qc[k] for k in keep},
              "rope_theta": cfg.rope_theta, "tie_word_embeddings": False, "target_hidden_size": cfg.target_hidden,
              "draft_vocab_size": drafter.vocab_ids.numel(), "torch_dtype": "float32",
              "dflash_config": {"mask_token_id": cfg.mask_token_id,
                                "target_layer_ids": [j - 1 for j in cfg.feature_layers]},
              "fasteagle_target": target_name or cfg.target, "fasteagle_fingerprint": list(cfg.fingerprint),
              "fasteagle_depth": cfg.depth, "fasteagle_kind": DFlashDrafter.KIND}
    write_text(out / "config.json", json.dumps(config, indent=2))
    return out


def _write_weights(drafter, out: Path, state: dict[str, torch.Tensor], head: bool = True) -> None:
    """model.safetensors (fp32): `state` plus, with `head`, the LM head's draft-vocab rows, d2t and t2d."""
    from safetensors.torch import save_file

    if head:
        ids = drafter.vocab_ids.detach().cpu().long()
        state["lm_head.weight"] = drafter.head_weight()
        state["d2t"] = ids - torch.arange(ids.numel())
        t2d = torch.zeros(drafter.cfg.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        state["t2d"] = t2d
    state = {k: v.detach().to("cpu", torch.float32 if v.is_floating_point() else v.dtype).contiguous()
             for k, v in state.items()}
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(state, str(tmp))


def _config(cfg: DrafterConfig, architecture: str, draft_vocab: int, target_name: str | None) -> dict:
    """The config.json fields both checkpoints share."""
    return {
        "architectures": [architecture], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": cfg.width, "intermediate_size": cfg.intermediate, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "num_hidden_layers": cfg.num_layers,
        "rms_norm_eps": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_positions,
        "rope_theta": cfg.rope_theta, "rope_scaling": ({"rope_theta": cfg.rope_theta} | cfg.rope) if cfg.rope else None,
        "vocab_size": cfg.vocab_size, "draft_vocab_size": draft_vocab, "target_hidden_size": cfg.target_hidden,
        "tie_word_embeddings": False,
        "torch_dtype": "float32", "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(cfg.feature_layers),
                                                   "use_aux_hidden_state": True},
        "fasteagle_target": target_name or cfg.target, "fasteagle_fingerprint": list(cfg.fingerprint),
        "fasteagle_depth": cfg.depth if cfg.kind == "eagle3" else cfg.num_layers,  # deepest draft (vLLM's k)
    }
