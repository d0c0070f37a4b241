"""Plain JSON values for reports: the one converter the breakdown, sessions, reports and aggregation share."""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import torch


def jsonable(obj):
    """Plain JSON types: NaN/inf -> None, numpy scalars -> numbers, DataFrames -> records, others -> str."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, pd.DataFrame):
        return jsonable(obj.to_dict(orient="records"))
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, torch.Tensor) and obj.numel() == 1 and obj.device.type == "cpu":
        return jsonable(obj.item())
    if obj is pd.NA or obj is pd.NaT:
        return None
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return str(obj)


def finite_or_none(x):
    """float(x), or None when it is not a finite number."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) or math.isinf(x) else x
