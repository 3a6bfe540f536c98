"""The MIG table in allocations/placement/mig.py against what NVML reported on real hardware.

tests/placement/data/nvml-probe-h100-80gb-hbm3.json is `python -m agent.probe` run on an
NVIDIA H100 80GB HBM3 (driver 580.159.04, MIG mode off; NVML lists the profiles and their
legal placements all the same). Another model joins by adding its probe file here.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocations.placement.mig import canonical_model, profiles_for

PROBES = sorted((Path(__file__).parent / "data").glob("nvml-probe-*.json"))


def _profiles(probe_path: Path):
    gpu = json.loads(probe_path.read_text())["gpus"][0]
    return gpu["name"], gpu["mig_profiles"]


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.stem)
def test_every_profile_the_hardware_offers_has_its_real_starts_size_and_memory(probe):
    name, reported = _profiles(probe)
    ours = profiles_for(canonical_model(name))
    assert reported, "the probe listed no MIG profile"
    for real in reported:
        profile = ours.get(real["name"])
        assert profile is not None, f"{name} offers {real['name']}, which the table lacks"
        assert list(profile.starts) == [p["start"] for p in real["placements"]], real["name"]
        assert {profile.size} == {p["size"] for p in real["placements"]}, real["name"]
        assert profile.memory_mib == real["memory_mib"], real["name"]
        assert profile.compute_slices == int(real["name"].split("g.")[0]), real["name"]


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.stem)
def test_the_table_offers_no_profile_the_hardware_lacks(probe):
    name, reported = _profiles(probe)
    assert set(profiles_for(canonical_model(name))) == {real["name"] for real in reported}


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.stem)
def test_single_instance_profiles_are_the_media_engine_ones(probe):
    name, reported = _profiles(probe)
    ours = profiles_for(canonical_model(name))
    for real in reported:
        assert ours[real["name"]].single_per_gpu == real["name"].endswith("+me"), real["name"]
