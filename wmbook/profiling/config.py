"""Profiling configuration: the seed's YAML keys as a validated dataclass, presets shipped as YAML files.

    load_config("development")                 # a preset shipped in wmbook/profiling/configs/
    load_config("my_profiling.yaml")           # a YAML file, keys under `profiling:` or at the top level
    load_config({"gpu_monitor_interval": 0.2})  # a dict of overrides on the defaults
    load_config(cfg)                           # a ProfilingConfig passes through

Unknown keys and bad values raise ValueError naming the key and what is allowed, before any work.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
REPORT_FORMATS = ("json", "html", "both")
# keys of the seed's YAML that have no effect here (every labelled stage is timed already): accepted with a warning
SEED_KEYS_WITHOUT_EFFECT = ("profile_inference_steps", "profile_vae_decode", "profile_text_encoding")


@dataclass(frozen=True)
class ProfilingConfig:
    """What a ProfilingSession monitors, times and writes (seed key names)."""

    enabled: bool = True
    real_time_display: bool = False  # print one status line every display_interval s
    display_interval: float = 3.0  # s
    gpu_monitor_interval: float = 0.5  # s between NVML samples
    cpu_monitor_interval: float = 1.0  # s between psutil samples
    monitor_gpu_memory: bool = True
    monitor_gpu_utilization: bool = True
    monitor_gpu_temperature: bool = True
    monitor_gpu_power: bool = True
    monitor_gpu_clocks: bool = False
    monitor_cpu_usage: bool = True
    monitor_system_memory: bool = True  # system memory and this process's RSS
    generate_final_report: bool = True  # write the report when the session ends
    report_format: str = "both"  # json | html | both
    output_dir: str = "profiling_reports"
    max_data_points: int = 10_000  # ring buffer size per monitored metric (and for events)
    save_raw_data: bool = False  # monitor samples in the JSON report
    session_tags: dict = field(default_factory=dict)
    time_labels: bool = True  # time every wmbook label() entered inside the session

    def __post_init__(self):
        _validate(self)

    def replace(self, **changes) -> "ProfilingConfig":
        """A copy with some keys changed (validated)."""
        _check_keys(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["session_tags"] = dict(self.session_tags)
        return d


_BOOL_KEYS = tuple(f.name for f in fields(ProfilingConfig) if f.type in ("bool", bool))
_INTERVAL_KEYS = ("display_interval", "gpu_monitor_interval", "cpu_monitor_interval")


def _check_keys(d: dict) -> None:
    known = {f.name for f in fields(ProfilingConfig)}
    for k in d:
        if k not in known:
            raise ValueError(f"unknown profiling config key {k!r}; allowed keys: {sorted(known)}")


def _validate(c: ProfilingConfig) -> None:
    for k in _BOOL_KEYS:
        v = getattr(c, k)
        if not isinstance(v, bool):
            raise ValueError(f"profiling config {k!r} must be true or false, got {v!r}")
    for k in _INTERVAL_KEYS:
        v = getattr(c, k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.001 <= v <= 3600:
            raise ValueError(f"profiling config {k!r} must be a number of seconds in [0.001, 3600], got {v!r}")
        object.__setattr__(c, k, float(v))
    if c.report_format not in REPORT_FORMATS:
        raise ValueError(f"profiling config 'report_format' must be one of {list(REPORT_FORMATS)}, "
                         f"got {c.report_format!r}")
    m = c.max_data_points
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"profiling config 'max_data_points' must be an int >= 1, got {m!r}")
    if not isinstance(c.output_dir, (str, os.PathLike)) or not str(c.output_dir):
        raise ValueError(f"profiling config 'output_dir' must be a non-empty path, got {c.output_dir!r}")
    object.__setattr__(c, "output_dir", str(c.output_dir))
    tags = c.session_tags if c.session_tags is not None else {}
    if not isinstance(tags, dict) or not all(isinstance(k, str) for k in tags):
        raise ValueError(f"profiling config 'session_tags' must be a mapping of str to values, got {tags!r}")
    for k, v in tags.items():
        if not isinstance(v, (str, int, float, bool)) and v is not None:
            raise ValueError(f"profiling config 'session_tags' value of {k!r} must be a str, number, bool or "
                             f"null, got {type(v).__name__}")
    object.__setattr__(c, "session_tags", dict(tags))


def presets() -> list[str]:
    """Names of the shipped presets (YAML files in wmbook/profiling/configs)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def _from_mapping(d, source: str) -> ProfilingConfig:
    if not isinstance(d, dict):
        raise ValueError(f"profiling config from {source} must be a mapping, got {type(d).__name__}")
    if "profiling" in d:
        if set(d) != {"profiling"}:
            extra = sorted(set(d) - {"profiling"})
            raise ValueError(f"profiling config from {source}: keys {extra} beside 'profiling:'; put every key "
                             f"under 'profiling:' or none")
        d = d["profiling"] or {}
        if not isinstance(d, dict):
            raise ValueError(f"profiling config from {source}: 'profiling:' must hold a mapping")
    d = dict(d)
    for k in SEED_KEYS_WITHOUT_EFFECT:
        if k in d:
            d.pop(k)
            warnings.warn(f"profiling config key {k!r} (from {source}) has no effect in wmbook: every labelled "
                          f"stage is timed; remove it", stacklevel=3)
    _check_keys(d)
    if d.get("session_tags") is None:
        d.pop("session_tags", None)
    return ProfilingConfig(**d)


def load_config(config=None) -> ProfilingConfig:
    """A ProfilingConfig from a preset name, YAML path, dict, ProfilingConfig, or None (the defaults)."""
    if config is None:
        return ProfilingConfig()
    if isinstance(config, ProfilingConfig):
        return config
    if isinstance(config, dict):
        return _from_mapping(config, "a dict")
    if isinstance(config, (str, os.PathLike)):
        text = str(config)
        path = Path(config)
        if text in presets():
            path = CONFIG_DIR / f"{text}.yaml"
        elif not (path.suffix in (".yaml", ".yml") or path.exists()):
            raise ValueError(f"profiling config {text!r} is neither a preset {presets()} nor a YAML file path")
        if not path.is_file():
            raise ValueError(f"profiling config file {str(path)!r} does not exist")
        with open(path) as f:
            data = yaml.safe_load(f)
        return _from_mapping(data or {}, str(path))
    raise ValueError(f"config must be None, a preset name {presets()}, a YAML path, a dict or a ProfilingConfig, "
                     f"got {type(config).__name__}")
