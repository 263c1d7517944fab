"""Multi-task performance gain Δm relative to a reference (Local) run [FedHCA² §4.1].

  Δm = 100/N · Σ_i (-1)^{l_i} (M_fed,i - M_local,i) / M_local,i

where i runs over all (client, task) pairs and l_i = 1 for lower-is-better tasks
(normals mErr, depth RMSE), else 0.  Keys are "client/task" strings (e.g.
"pascal/semseg", "client3/depth"); the task name is the last '/'-separated part.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

# +1: higher is better, -1: lower is better.  Tasks not listed are higher-is-better.
TASK_DIRECTIONS: dict[str, int] = {
    "semseg": 1,  # mIoU
    "human_parts": 1,  # mIoU
    "sal": 1,  # maxF
    "edge": 1,  # odsF
    "normals": -1,  # mean angular error
    "depth": -1,  # RMSE
}

DirectionSpec = Callable[[str], bool] | Mapping[str, bool | int] | None


def task_of(key: str) -> str:
    """Returns the task name of a "client/task" key (its last '/'-separated part)."""
    return key.rsplit("/", 1)[-1]


def is_lower_better(task: str) -> bool:
    """Returns True for tasks whose metric is lower-is-better (normals, depth)."""
    return TASK_DIRECTIONS.get(task, 1) < 0


def _lower_fn(lower_is_better: DirectionSpec) -> Callable[[str], bool]:
    """Turns the user's direction spec into a key -> lower-is-better predicate."""
    if lower_is_better is None:
        return lambda key: is_lower_better(task_of(key))
    if isinstance(lower_is_better, Mapping):
        table = lower_is_better

        def as_lower(value: bool | int | float) -> bool:
            # bool = "lower is better"; a number is a direction as in TASK_DIRECTIONS (-1 = lower).
            return bool(value) if isinstance(value, (bool, np.bool_)) else float(value) < 0

        def lookup(key: str) -> bool:
            # A full key overrides the task-level entry; unknown tasks fall back to defaults.
            if key in table:
                return as_lower(table[key])
            task = task_of(key)
            if task in table:
                return as_lower(table[task])
            return is_lower_better(task)

        return lookup
    if callable(lower_is_better):
        # The callable receives the task name, consistent with TASK_DIRECTIONS.
        return lambda key: bool(lower_is_better(task_of(key)))
    raise TypeError(f"lower_is_better must be a callable, a mapping or None, got {type(lower_is_better)!r}")


def delta_m(
    method: Mapping[str, float],
    local: Mapping[str, float],
    lower_is_better: DirectionSpec = None,
) -> float:
    """Returns Δm in percent of `method` relative to `local` over all shared (client, task) keys."""
    missing_in_method = sorted(set(local) - set(method))
    missing_in_local = sorted(set(method) - set(local))
    if missing_in_method or missing_in_local:
        raise ValueError(
            "delta_m: keys of method and local differ; "
            f"missing in method: {missing_in_method}, missing in local: {missing_in_local}"
        )
    if not local:
        raise ValueError("delta_m: no (client, task) entries given")
    lower = _lower_fn(lower_is_better)
    keys = sorted(local)
    fed = np.array([float(method[k]) for k in keys], dtype=np.float64)
    ref = np.array([float(local[k]) for k in keys], dtype=np.float64)
    if np.any(ref == 0.0):
        zero = [k for k, r in zip(keys, ref) if r == 0.0]
        raise ValueError(f"delta_m: local reference is zero for {zero}; relative change undefined")
    sign = np.array([-1.0 if lower(k) else 1.0 for k in keys])
    return float(100.0 * np.mean(sign * (fed - ref) / ref))
