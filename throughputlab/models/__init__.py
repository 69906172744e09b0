"""Model specs: shipped preset configs, local folders and hub ids, resolved to a ModelSpec."""

from __future__ import annotations

import difflib
import json
import os
import re
import socket
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

from throughputlab.errors import UserError
from throughputlab.models.spec import ModelSpec, spec_from_config

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class ResolvedModel:
    """Where a model comes from and how to build it; the backends turn this into a module."""

    spec: ModelSpec
    config: dict[str, Any]
    source: str  # preset | folder | hub
    path: Optional[str]  # folder path or hub id; None for presets
    random_weights: bool
    trust_remote_code: bool = False


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("throughputlab.models").joinpath("presets").iterdir()
                  if p.name.endswith(".json"))


def load_preset(name: str) -> dict[str, Any]:
    text = resources.files("throughputlab.models").joinpath("presets", f"{name}.json").read_text()
    return json.loads(text)


def preset_description(name: str) -> str:
    return str(load_preset(name).get("_description", ""))


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or os.sep in model and os.path.exists(model.split(os.sep)[0])


def resolve_model(model: str, *, random_weights: bool = False, trust_remote_code: bool = False) -> ResolvedModel:
    """Resolve ``--model``: a local folder, a preset name, or a hub id, in that order."""
    if not model or not model.strip():
        raise UserError("--model is empty: give a preset name (see `throughputlab models`), a model folder or a hub id")
    expanded = os.path.expanduser(model)
    if os.path.isdir(expanded):
        return _from_folder(expanded, random_weights, trust_remote_code)
    if os.path.exists(expanded):
        raise UserError(f"--model {model}: is a file, expected a model folder holding config.json")
    if _looks_like_path(model):
        raise UserError(f"--model {model}: no such model folder; check the path, or use a preset (`throughputlab models`)")
    names = preset_names()
    if model.lower() in names:
        cfg = load_preset(model.lower())
        spec = spec_from_config(cfg, model.lower(), "preset")
        return ResolvedModel(spec, spec.config, "preset", None, True, False)
    if _HUB_ID.match(model):
        return _from_hub(model, random_weights, trust_remote_code)
    close = difflib.get_close_matches(model.lower(), names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"presets are: {', '.join(names)}"
    raise UserError(f"--model {model}: unknown preset, {hint} (or give a model folder or a hub id org/name)")


def check_local_model(model: str, *, random_weights: bool = False, trust_remote_code: bool = False) -> None:
    """Resolve ``model`` now unless it is a hub id (that may need the network): a bad folder,
    config.json or preset name is its one-line error before a command prints anything."""
    hub_only = bool(_HUB_ID.match(model)) and not os.path.exists(os.path.expanduser(model)) \
        and not _looks_like_path(model) and model.lower() not in preset_names()
    if not hub_only:
        resolve_model(model, random_weights=random_weights, trust_remote_code=trust_remote_code)


def _from_folder(path: str, random_weights: bool, trust_remote_code: bool) -> ResolvedModel:
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"--model {path}: no config.json in that folder; point --model at a Hugging Face model folder")
    from throughputlab.files import expect_mapping, read_json

    source = f"--model {path}: its config.json"
    cfg = expect_mapping(read_json(cfg_path, "a Hugging Face model config (JSON)", source), source,
                         "a JSON object (a model config)")
    has_weights = any(any(Path(path).glob(p)) for p in WEIGHT_PATTERNS)
    if not random_weights and not has_weights:
        raise UserError(f"--model {path}: the folder has no weights; pass --random-weights to measure with random weights")
    spec = spec_from_config(cfg, Path(path).resolve().name, "folder")
    return ResolvedModel(spec, cfg, "folder", str(Path(path).resolve()), random_weights, trust_remote_code)


def hub_host() -> str:
    return urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def preset_for_hub_id(model_id: str) -> Optional[str]:
    """The preset whose config is the hub model's (its description opens with the hub id; an -Instruct or -Base
    release shares its base's architecture), else None."""
    def bare(hub: str) -> str:
        return re.sub(r"(-(instruct|base|hf|chat|it))+$", "", hub.lower())

    want = bare(model_id)
    for name in preset_names():
        desc = preset_description(name).split(" ", 1)[0]
        if "/" in desc and bare(desc) == want:
            return name
    return None


def _from_hub(model_id: str, random_weights: bool, trust_remote_code: bool) -> ResolvedModel:
    try:
        from transformers import AutoConfig
    except ImportError:
        raise UserError("reading a hub id needs transformers: pip install transformers") from None
    try:
        cfg = AutoConfig.from_pretrained(model_id, trust_remote_code=trust_remote_code, local_files_only=True).to_dict()
    except Exception:  # not in the cache: the hub, if it can be reached at all
        cfg = None
    if cfg is None and not os.environ.get("HF_HUB_OFFLINE"):
        host = hub_host()
        if not _resolves(host):  # no name service for the hub: fail now, not after the client's retries
            same = preset_for_hub_id(model_id)
            hint = (f"the preset {same} holds its config.json: --model {same}" if same
                    else "use a preset (`throughputlab models`)")
            raise UserError(f"--model {model_id}: not in the local Hugging Face cache, and the hub ({host}) cannot "
                            f"be reached from this machine; {hint}, or a local folder with config.json")
    try:
        if cfg is None:
            cfg = AutoConfig.from_pretrained(model_id, trust_remote_code=trust_remote_code).to_dict()
    except Exception as e:  # transformers raises OSError, ValueError, HTTP errors... all mean "not reachable/not found"
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise UserError(f"--model {model_id}: could not fetch its config from the hub ({first}); "
                        "use a preset (`throughputlab models`) or a local folder with config.json") from None
    spec = spec_from_config(cfg, model_id, "hub")
    return ResolvedModel(spec, cfg, "hub", model_id, random_weights, trust_remote_code)
