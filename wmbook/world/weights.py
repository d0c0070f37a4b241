"""Shipped weights of the world presets: one `.pt` per preset under data/weights/ with a JSON beside it.

The file (torch.save of plain containers and tensors; read with weights_only=True) holds
  format    "wmbook-world-weights/1"
  workload  the name of the workload the preset belongs to;  preset  the preset name
  model     the trained model's state dict (bf16: each file stays under 20 MB)
  encoders  the frozen, randomly initialised encoders the model was trained against, so that a library whose random
            init differs cannot silently change the model's inputs: "clip" (both workloads) and, for wma, "text"
            (the text tower; of its 49408-row token table only the rows the byte-level tokenizer can produce are
            stored, under "text_token_rows" / "text_token_ids": the other rows are never read).
Loading is strict: every key and shape must match (wmbook.models.checkpoint.load_checked), before anything is copied.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from ..atomic import atomic_open, atomic_write_many
from ..models.checkpoint import CheckpointFileError, load_checked, read_checkpoint_file
from ..paths import DATA_DIR
from ..presets import ALL_PRESETS, WorldCausalPreset, WorldWMAPreset

FORMAT = "wmbook-world-weights/1"
WEIGHTS_DIR = DATA_DIR / "weights"


def is_world_preset(preset) -> bool:
    """True for a world preset (a name or a preset object): the small models trained on wmbook.world."""
    if isinstance(preset, str):
        preset = ALL_PRESETS.get(preset)
    return isinstance(preset, (WorldCausalPreset, WorldWMAPreset))


def _world_preset(preset):
    """The preset object of a world preset (a name or the object); ValueError naming the world presets otherwise."""
    p = ALL_PRESETS.get(preset) if isinstance(preset, str) else preset
    if not is_world_preset(p):
        names = [k for k, v in ALL_PRESETS.items() if is_world_preset(v)]
        raise ValueError(f"preset={getattr(p, 'name', preset)!r} is not a world preset; allowed values: {names}")
    return p


def _check_owner(workload, preset) -> str:
    """The name of `workload` (a Workload object: it, not this module, knows its presets) after checking that the
    world preset `preset` is one of its own."""
    if isinstance(workload, str) or not hasattr(workload, "presets"):
        raise TypeError(f"workload={workload!r} is not allowed here; pass the Workload object "
                        f"(wmbook.workloads.get(name))")
    if not workload.owns_preset(preset):
        raise ValueError(f"preset={preset.name!r} does not belong to workload {workload.name!r}; allowed values: "
                         f"{[k for k, v in workload.presets.items() if is_world_preset(v)]}")
    return workload.name


def weights_path(preset) -> Path:
    """data/weights/<preset.weights> of a world preset."""
    p = _world_preset(preset)
    return WEIGHTS_DIR / (p.weights or f"{p.name}.pt")


def _text_token_ids() -> torch.Tensor:
    from ..models.wma.conditioning import EOT_TOKEN, SOT_TOKEN  # noqa: PLC0415  heavy: transformers (WMA text encoder)

    return torch.tensor([0, *range(256, 512), SOT_TOKEN, EOT_TOKEN], dtype=torch.long)


def _token_key(sd: dict) -> str:
    keys = [k for k in sd if k.endswith("token_embedding.weight")]
    if len(keys) != 1:
        raise ValueError(f"expected one token_embedding.weight in the text tower's state dict, found {keys}")
    return keys[0]


def pipeline_state(pipe, workload, dtype=torch.bfloat16) -> dict:
    """The weights file's content for a pipeline of a world preset of `workload` (a Workload; model in `dtype`,
    encoders as they are: the CLIP tower, and the text tower where the pipeline has one)."""
    name = _check_owner(workload, _world_preset(pipe.preset))
    model = {k: (v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu())
             for k, v in pipe.model.state_dict().items()}
    enc = {"clip": {k: v.detach().cpu() for k, v in pipe.clip.state_dict().items()}}
    if getattr(pipe, "text", None) is not None:
        text = {k: v.detach().cpu() for k, v in pipe.text.state_dict().items()}
        key = _token_key(text)
        ids = _text_token_ids()
        enc["text_token_ids"] = ids
        enc["text_token_rows"] = text.pop(key)[ids].clone()
        enc["text"] = text
    return {"format": FORMAT, "workload": name, "preset": pipe.preset.name, "model": model, "encoders": enc}


def save_weights(pipe, workload, path, meta: dict | None = None) -> Path:
    """Write the weights file atomically (and `meta` as JSON beside it, `<path>.json`, when given)."""
    path = Path(path)
    state = pipeline_state(pipe, workload)
    with atomic_open(path, "wb") as f:
        torch.save(state, f)
    if meta is not None:
        with atomic_open(path.with_suffix(path.suffix + ".json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2, sort_keys=True)
            f.write("\n")
    return path


def read_weights(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"world-model weights {str(path)!r} not found; train them with `python -m "
                                "wmbook.train --workload WORKLOAD --minutes M --ship` (README: world models)")
    state = read_checkpoint_file(path)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointFileError(f"{str(path)!r} is not a wmbook world-weights file (format {FORMAT!r})")
    return state


def run_files(path) -> list[Path]:
    """A training run's files: its weights, their provenance JSON and the loss curve the JSON names."""
    path = Path(path)
    meta = path.with_name(path.name + ".json")
    loss = path.with_suffix(".loss.csv")
    if meta.is_file():
        loss = path.with_name(json.loads(meta.read_text()).get("loss_csv") or loss.name)
    return [path, meta, loss]


def ship_weights(path, target) -> list[Path]:
    """Copy a run's files (run_files) over the shipped ones: the weights to `target` (data/weights/<preset>.pt), their
    JSON to `<target>.json`, the loss curve to `<target stem>.loss.csv` (the JSON's `loss_csv` naming it). Every copy
    is written and synced beside its target before the first rename (atomic_write_many), so a failure while copying
    leaves the shipped set as it was. The caller decides that the run ships (wmbook.world.eval.shipping_failures)."""
    path, target = Path(path), Path(target)
    src_pt, src_meta, src_loss = run_files(path)
    if not src_pt.is_file():
        raise FileNotFoundError(f"weights {str(path)!r} not found: nothing to ship")
    dst_loss = target.with_suffix(".loss.csv")
    files = {target: src_pt.read_bytes()}
    if src_meta.is_file():
        meta = json.loads(src_meta.read_text())
        if "loss_csv" in meta:
            meta["loss_csv"] = dst_loss.name
        files[target.with_name(target.name + ".json")] = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
    if src_loss.is_file():
        files[dst_loss] = src_loss.read_bytes()
    return atomic_write_many(files)


def file_sha256(path) -> str:
    """The SHA-256 of a weights file (what a results row records of the weights a run used)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_weights_file(path, preset, workload) -> dict:
    """read_weights(path) for a world preset of `workload` (a Workload): ValueError (FileNotFoundError when missing)
    saying why when the file is not there, not a world-weights file, or holds another preset's weights. The callers
    name their parameter."""
    p = _world_preset(preset)
    name = _check_owner(workload, p)
    state = read_weights(path)
    if state.get("preset") != p.name or state.get("workload") != name:
        raise ValueError(f"it holds {state.get('workload')}/{state.get('preset')} weights")
    return state


def load_weights(pipe, workload, path=None) -> dict:
    """Load a weights file into a pipeline of a world preset of `workload` (a Workload), strictly (keys, shapes,
    preset name); returns the file's content. path=None: the preset's shipped file (FileNotFoundError naming it
    when missing)."""
    name = _check_owner(workload, _world_preset(pipe.preset))
    path = weights_path(pipe.preset) if path is None else Path(path)
    state = read_weights(path)
    if state["workload"] != name or state["preset"] != pipe.preset.name:
        raise ValueError(f"{str(path)!r} holds weights of {state['workload']}/{state['preset']}; this pipeline is "
                         f"{name}/{pipe.preset.name}")
    enc = state["encoders"]
    load_checked(pipe.model, state["model"], strict=True, what=f"world weights {path.name} (model)")
    load_checked(pipe.clip, enc["clip"], strict=True, what=f"world weights {path.name} (clip)")
    if ("text" in enc) != (getattr(pipe, "text", None) is not None):
        raise ValueError(f"{str(path)!r} and this pipeline disagree on a text encoder")
    if "text" in enc:
        text = dict(enc["text"])
        full = pipe.text.state_dict()
        key = _token_key(full)
        table = full[key].clone()
        table[enc["text_token_ids"].to(table.device)] = enc["text_token_rows"].to(table.device, table.dtype)
        text[key] = table
        load_checked(pipe.text, text, strict=True, what=f"world weights {path.name} (text)")
    return state


def build_world_pipeline(workload, preset, device="auto", dtype="auto", vae_dtype="auto", weights=True):
    """A pipeline of a world preset of `workload` (a Workload): frozen encoders from the preset's encoder seed, then
    (weights=True) the shipped weights loaded strictly (checked to exist before anything is built); weights=False:
    random weights; a path: that file."""
    p = _world_preset(preset)
    _check_owner(workload, p)
    path = None
    if weights is True:
        path = weights_path(p)
    elif weights not in (False, None):
        path = Path(weights)
    if path is not None and not path.is_file():
        read_weights(path)  # raises FileNotFoundError naming the file
    pipe = workload.new_pipeline(p, device, dtype, vae_dtype, seed=p.encoder_seed)
    if path is not None:
        load_weights(pipe, workload, path)
    return pipe
