"""The shipped CPU profiles (bfloat16; float32 for CPUs that emulate bfloat16): their CSVs
reproduce the errors they report, they meet the accuracy target on replay steps the fit
never saw, and `servesim run` refuses a profile for another model or dtype."""

import json
from pathlib import Path

import pandas as pd
import pytest

from calibration.fit import refit_profile, replay_errors
from simulator.cli import main
from simulator.cost_model import PROFILES_DIR, RooflineConstants, build_cost_model, load_profile
from simulator.scenario import load_scenario

NAME = "cpu-llama-tiny-56m-bfloat16"
SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml"
# name, dtype, bytes per element
SHIPPED = [(NAME, "bfloat16", 2), ("cpu-llama-tiny-56m-float32", "float32", 4)]


@pytest.fixture(scope="module", params=SHIPPED, ids=[d for _, d, _ in SHIPPED])
def profile(request):
    name, dtype, size = request.param
    prof = load_profile(PROFILES_DIR / f"{name}.yaml")
    assert (prof.name, prof.dtype) == (name, dtype)
    return prof


def test_shipped_profile_is_a_measurement_of_the_tiny_model(profile):
    assert profile.measured and profile.engine.startswith("servesim-torch ")
    assert (profile.model.name, profile.device.kind) == ("llama-tiny-56m", "cpu")
    # 2 (K, V) x 8 layers x 4 kv heads x 64 x bytes per element; 2 GiB budget / (16 x that)
    size = {d: b for _, d, b in SHIPPED}[profile.dtype]
    assert profile.kv.bytes_per_token == 2 * 8 * 4 * 64 * size
    assert profile.kv.num_gpu_blocks == (2 << 30) // (16 * 2 * 8 * 4 * 64 * size)
    assert (PROFILES_DIR / profile.provenance.measurements_csv).is_file()
    assert profile.noise.relative_residuals and profile.efficiencies.mbu > 0



def test_a_csv_of_too_few_cells_is_an_input_error_when_refitted(tmp_path):
    # its header only (a calibration killed before its first row): read without an error
    # (calibrate resumes it), but no fit: said so, naming the file
    from simulator.errors import InputError
    src = PROFILES_DIR / f"{NAME}.yaml"
    prof = load_profile(src)
    (tmp_path / src.name).write_text(src.read_text())
    csv = tmp_path / prof.provenance.measurements_csv
    text = (PROFILES_DIR / prof.provenance.measurements_csv).read_text()
    csv.write_text("".join(text.splitlines(keepends=True)[:2]))
    with pytest.raises(InputError) as e:
        refit_profile(load_profile(tmp_path / src.name))
    assert str(e.value) == f"{csv}: need at least 4 measured cells to fit and hold out, got 0"

def test_csv_reproduces_the_reported_heldout_error(profile):
    # rel 1e-6: the fit's linear algebra rounds differently on another CPU's BLAS kernels
    # (the float32 profile, fitted on an AVX2 host, refits to 9e-9 of its error on AVX512)
    refit = refit_profile(profile)
    assert refit.form == profile.cost.form
    for key in ("mape", "p90", "max", "n"):
        assert refit.heldout[key] == pytest.approx(getattr(profile.error.heldout, key),
                                                   rel=1e-6)
    for name, v in profile.cost.coefficients.items():
        assert refit.coefficients[name] == pytest.approx(v, rel=1e-6)


def test_replay_error_meets_the_target(profile):
    steps = pd.read_csv(PROFILES_DIR / f"{profile.name}.replay.csv", comment="#",
                        keep_default_na=False, dtype={"prefills": str})
    k = RooflineConstants.of(profile.model_shape, profile.dtype)
    err = replay_errors(profile.cost.form, profile.cost.coefficients, k, steps)
    assert err == pytest.approx(profile.error.replay.model_dump(), rel=1e-9)
    # The targets: MAPE <= 10% and p90 <= 20% on steps the fit never saw.
    assert err["mape"] <= 0.10 and err["p90"] <= 0.20


def test_cpu_tiny_scenario_prices_steps_with_the_profile(profile):
    sc = load_scenario(SCENARIO, [] if profile.name == NAME else [
        f"dtype={profile.dtype}", f"hardware.profile={profile.name}"])
    cost = build_cost_model(sc)
    assert cost.measured and cost.profile.name == profile.name
    assert cost.num_gpu_blocks == profile.kv.kv_cache_memory_bytes // (
        sc.engine.block_size * profile.kv.bytes_per_token)


@pytest.mark.parametrize("override, shown", [
    ("model=llama-test", "the scenario runs llama-test (bfloat16)"),
    ("dtype=float32", "the scenario runs llama-tiny-56m (float32)")])
def test_run_refuses_profile_of_another_model_or_dtype(override, shown, tmp_path, capsys):
    rc = main(["run", str(SCENARIO), "--set", override, "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert f"profile {NAME} was measured for model llama-tiny-56m (bfloat16" in err[0]
    assert shown in err[0] and "hardware.profile" in err[0]
    assert not any(tmp_path.iterdir())


def test_run_with_the_profile(tmp_path, capsys):
    rc = main(["run", str(SCENARIO), "--set", "workload.num_requests=20", "--out",
               str(tmp_path), "--quiet"])
    assert rc == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["cost_kind"] == "measured" and NAME in s["cost_model"]
