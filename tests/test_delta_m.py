"""Δm reproduces the paper's reported columns (spec fedhca2.md §7) and a NumPy reference."""

import numpy as np
import pytest

from fedjax_mtl.metrics.delta_m import TASK_DIRECTIONS, delta_m, is_lower_better, task_of

# Scenario 1 column order (Tab. 1, Tab. 3): 5 PASCAL ST clients, 1 NYUD MT client.
S1_KEYS = [
    "pascal_semseg/semseg",
    "pascal_parts/human_parts",
    "pascal_sal/sal",
    "pascal_normals/normals",
    "pascal_edge/edge",
    "nyud_mt/semseg",
    "nyud_mt/depth",
    "nyud_mt/normals",
    "nyud_mt/edge",
]
# Scenario 2 column order (Tab. 2): 4 NYUD ST clients, 1 PASCAL MT client.
S2_KEYS = [
    "nyud_semseg/semseg",
    "nyud_depth/depth",
    "nyud_normals/normals",
    "nyud_edge/edge",
    "pascal_mt/semseg",
    "pascal_mt/human_parts",
    "pascal_mt/sal",
    "pascal_mt/normals",
    "pascal_mt/edge",
]

TAB1 = {  # method: (9 task values, reported Δm)
    "Local": ([51.69, 49.94, 80.91, 15.76, 71.95, 41.86, 0.6487, 20.59, 76.46], 0.00),
    "FedAvg": ([39.98, 37.33, 77.56, 18.27, 69.17, 38.94, 0.7858, 21.62, 75.77], -11.76),
    "FedProx": ([44.42, 38.10, 77.26, 18.03, 69.39, 39.19, 0.8068, 21.52, 76.03], -10.68),
    "FedPer": ([54.51, 46.56, 78.85, 16.95, 71.00, 44.02, 0.6467, 21.19, 76.61], -1.11),
    "Ditto": ([46.23, 39.69, 77.99, 17.52, 69.77, 41.49, 0.6508, 20.60, 76.45], -5.57),
    "FedAMP": ([55.98, 52.05, 80.79, 15.74, 72.02, 41.67, 0.6428, 20.54, 76.40], 1.47),
    "MaT-FL": ([57.45, 48.63, 79.26, 17.26, 71.23, 40.99, 0.6352, 20.65, 76.59], -0.46),
    "FedHCA2": ([57.55, 52.30, 80.71, 15.60, 72.08, 41.47, 0.6281, 20.53, 76.50], 2.18),
}

TAB2 = {
    "Local": ([33.59, 0.7129, 23.22, 75.02, 65.80, 55.01, 83.23, 14.21, 71.89], 0.00),
    "FedAvg": ([25.80, 0.8295, 24.85, 75.31, 64.63, 52.88, 81.08, 15.56, 68.95], -7.56),
    "FedProx": ([25.96, 0.8316, 25.20, 75.34, 64.97, 50.78, 81.29, 15.83, 69.81], -8.12),
    "FedPer": ([35.93, 0.7460, 23.75, 75.53, 67.78, 54.75, 82.50, 14.75, 71.90], -0.16),
    "Ditto": ([28.15, 0.7482, 23.96, 75.42, 65.99, 51.45, 81.74, 15.29, 69.96], -4.67),
    "FedAMP": ([34.75, 0.7103, 23.31, 75.03, 66.08, 54.10, 83.35, 14.20, 71.88], 0.27),
    "MaT-FL": ([35.05, 0.7504, 23.39, 75.33, 67.90, 54.78, 82.84, 14.58, 71.94], -0.16),
    "FedHCA2": ([34.95, 0.7018, 23.19, 75.03, 65.81, 55.01, 83.18, 14.08, 71.97], 0.75),
}

TAB3 = {  # ablation, scenario 1 column order
    "+Enc": ([58.38, 51.64, 80.44, 15.65, 72.09, 41.21, 0.6377, 20.55, 76.50], 1.89),
    "+Dec": ([57.39, 51.65, 80.75, 15.69, 72.06, 41.48, 0.6344, 20.56, 76.41], 1.80),
    "+Enc+Dec": ([57.55, 52.30, 80.71, 15.60, 72.08, 41.47, 0.6281, 20.53, 76.50], 2.18),
}

# Tab. 4: NYUD ST clients only (N = 4).
TAB4_KEYS = ["n_semseg/semseg", "n_depth/depth", "n_normals/normals", "n_edge/edge"]
TAB4_LOCAL = [33.59, 0.7129, 23.22, 75.02]
TAB4 = {"ST+Ours": ([34.71, 0.7170, 23.25, 74.98], 0.64), "ST+MT+Ours": ([34.95, 0.7018, 23.19, 75.03], 1.44)}

# Tab. 5: MT-only clients (N = 5).
TAB5_KEYS = ["pascal/semseg", "pascal/human_parts", "pascal/normals", "nyud/semseg", "nyud/normals"]
TAB5_LOCAL = [64.87, 53.34, 14.07, 39.81, 20.65]
TAB5_OURS = ([64.17, 54.25, 14.01, 40.26, 20.55], 0.53)

# Supp. Tab. 2: PASCAL ST clients only (N = 5).
STAB2_KEYS = ["p_semseg/semseg", "p_parts/human_parts", "p_sal/sal", "p_normals/normals", "p_edge/edge"]
STAB2_LOCAL = [51.69, 49.94, 80.91, 15.76, 71.95]
STAB2 = {"ST+Ours": ([57.76, 51.38, 80.75, 15.66, 72.08], 3.05), "ST+MT+Ours": ([57.55, 52.30, 80.71, 15.60, 72.08], 3.40)}


def _row(keys, values):
    return dict(zip(keys, values, strict=True))


@pytest.mark.parametrize("name", list(TAB1))
def test_tab1_delta_m_column(name):
    values, reported = TAB1[name]
    got = delta_m(_row(S1_KEYS, values), _row(S1_KEYS, TAB1["Local"][0]))
    assert round(got, 2) == pytest.approx(reported, abs=1e-9), (name, got)


@pytest.mark.parametrize("name", list(TAB2))
def test_tab2_delta_m_column(name):
    values, reported = TAB2[name]
    got = delta_m(_row(S2_KEYS, values), _row(S2_KEYS, TAB2["Local"][0]))
    assert round(got, 2) == pytest.approx(reported, abs=1e-9), (name, got)


@pytest.mark.parametrize("name", list(TAB3))
def test_tab3_ablation_delta_m(name):
    values, reported = TAB3[name]
    got = delta_m(_row(S1_KEYS, values), _row(S1_KEYS, TAB1["Local"][0]))
    assert round(got, 2) == pytest.approx(reported, abs=1e-9), (name, got)


@pytest.mark.parametrize("name", list(TAB4))
def test_tab4_st_only_delta_m(name):
    values, reported = TAB4[name]
    got = delta_m(_row(TAB4_KEYS, values), _row(TAB4_KEYS, TAB4_LOCAL))
    assert round(got, 2) == pytest.approx(reported, abs=1e-9), (name, got)


def test_tab5_mt_only_delta_m():
    values, reported = TAB5_OURS
    got = delta_m(_row(TAB5_KEYS, values), _row(TAB5_KEYS, TAB5_LOCAL))
    assert round(got, 2) == pytest.approx(reported, abs=1e-9), got


@pytest.mark.parametrize("name", list(STAB2))
def test_supp_tab2_delta_m(name):
    values, reported = STAB2[name]
    got = delta_m(_row(STAB2_KEYS, values), _row(STAB2_KEYS, STAB2_LOCAL))
    assert round(got, 2) == pytest.approx(reported, abs=1e-9), (name, got)


def test_numpy_reference_random():
    rng = np.random.default_rng(0)
    tasks = ["semseg", "human_parts", "sal", "normals", "edge", "depth", "custom_task"]
    for _ in range(20):
        n = int(rng.integers(1, 15))
        keys = [f"client{i}/{rng.choice(tasks)}" for i in range(n)]
        fed = rng.uniform(0.1, 100.0, n)
        loc = rng.uniform(0.1, 100.0, n)
        sign = np.array([-1.0 if k.endswith(("/normals", "/depth")) else 1.0 for k in keys])
        expected = 100.0 * np.mean(sign * (fed - loc) / loc)
        got = delta_m(dict(zip(keys, fed)), dict(zip(keys, loc)))
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_identical_runs_give_zero():
    row = _row(S1_KEYS, TAB1["FedHCA2"][0])
    assert delta_m(row, row) == 0.0


def test_direction_of_lower_is_better_tasks():
    local = {"a/depth": 1.0, "a/semseg": 50.0}
    better_depth = {"a/depth": 0.5, "a/semseg": 50.0}  # depth RMSE halves: +50% / 2 tasks
    assert delta_m(better_depth, local) == pytest.approx(25.0)
    assert is_lower_better("normals") and is_lower_better("depth")
    assert not any(is_lower_better(t) for t in ("semseg", "human_parts", "sal", "edge", "unknown"))
    assert {t for t, d in TASK_DIRECTIONS.items() if d < 0} == {"normals", "depth"}
    assert task_of("client3/depth") == "depth" and task_of("depth") == "depth"


def test_custom_directions():
    local = {"c/x": 10.0, "c/y": 10.0}
    method = {"c/x": 12.0, "c/y": 12.0}
    assert delta_m(method, local) == pytest.approx(20.0)  # unknown tasks: higher is better
    assert delta_m(method, local, lower_is_better={"y": True}) == pytest.approx(0.0)
    assert delta_m(method, local, lower_is_better={"c/x": True, "y": True}) == pytest.approx(-20.0)
    assert delta_m(method, local, lower_is_better={"x": -1, "y": 1}) == pytest.approx(0.0)
    assert delta_m(method, local, lower_is_better=lambda task: task == "x") == pytest.approx(0.0)


def test_key_mismatch_raises_with_names():
    with pytest.raises(ValueError, match="client2/depth"):
        delta_m({"client1/semseg": 1.0}, {"client1/semseg": 1.0, "client2/depth": 1.0})
    with pytest.raises(ValueError, match="extra/edge"):
        delta_m({"client1/semseg": 1.0, "extra/edge": 2.0}, {"client1/semseg": 1.0})
    with pytest.raises(ValueError):
        delta_m({}, {})
    with pytest.raises(ValueError, match="zero"):
        delta_m({"a/semseg": 1.0}, {"a/semseg": 0.0})
