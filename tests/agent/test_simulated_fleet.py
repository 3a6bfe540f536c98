"""The simulated backend behaves like a fleet whose users book before they run: leased GPUs run jobs with a
realistic curve, unleased ones sit idle (bar a rare stray process), a few bookings idle on purpose, all
decided by the seed and the clock."""
from __future__ import annotations

import statistics
from datetime import datetime, timedelta, timezone

from agent.simulated import SimulatedBackend, idle_on_purpose

IDLE_PCT = 1  # the portal's default TELEMETRY_IDLE_UTIL_PCT


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _lease(backend, gpu: int, reservation: int, user: str = "bob", **mode) -> dict:
    ends = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    return {"key": f"{reservation}:{backend.uuids[gpu]}", "reservation": reservation, "team": "ml", "user": user,
            "gpu_uuid": backend.uuids[gpu], "gpu_index": gpu, "ends_at": ends, **mode}


def _busy_reservations(count: int) -> list[int]:
    return [r for r in range(1, 200) if not idle_on_purpose({"reservation": r})][:count]


def test_a_leased_gpu_runs_a_job_that_ramps_up_holds_steady_and_dips_now_and_then():
    clock = Clock()
    backend = SimulatedBackend("2xH100", "host-f", seed=3, clock=clock)
    (reservation,) = _busy_reservations(1)
    backend.lease_source = lambda: [_lease(backend, 0, reservation, "bob")]
    utils, memories = [], []
    for _ in range(30 * 60):  # half an hour, one sample a second
        leased, unleased = backend.sample()
        (process,) = leased.processes
        assert process.user == "bob" and 0 < process.used_memory_mib <= leased.memory_used_mib <= 81559
        assert leased.utilization_gpu_pct > IDLE_PCT  # a running job never reads as idle
        assert unleased.processes == [] or unleased.processes[0].user == ""
        utils.append(leased.utilization_gpu_pct)
        memories.append(leased.memory_used_mib)
        clock.now += 1
    steady = statistics.median(utils[300:])
    assert utils[0] < steady - 30  # ramp-up: it starts low
    assert memories[0] < statistics.median(memories[300:])  # memory fills while the job loads
    assert 60 <= steady <= 100
    assert statistics.pstdev(utils[300:]) > 1  # noise, not a flat line
    dips = sum(1 for u in utils[300:] if u < steady - 30)
    assert 0 < dips < len(utils[300:]) * 0.1  # occasional dips, not a sawtooth


def test_an_unleased_gpu_is_idle_except_for_a_rare_stray_process():
    clock = Clock()
    backend = SimulatedBackend("8xL40S", "host-f", seed=5, clock=clock)
    backend.lease_source = lambda: []
    samples = stray = 0
    for _ in range(24 * 360):  # a day, every 10 s
        for s in backend.sample():
            samples += 1
            if s.processes:
                stray += 1
                assert s.processes[0].user == "" and s.utilization_gpu_pct > IDLE_PCT
            else:
                assert s.utilization_gpu_pct == 0 and s.memory_used_mib <= 1
        clock.now += 10
    assert 0 < stray < samples * 0.01


def test_a_few_bookings_sit_idle_on_purpose_with_no_process():
    idle = [r for r in range(1, 1001) if idle_on_purpose({"reservation": r})]
    assert 20 <= len(idle) <= 60  # a few percent
    clock = Clock()
    backend = SimulatedBackend("1xH100", "host-f", seed=1, clock=clock)
    backend.lease_source = lambda: [_lease(backend, 0, idle[0])]
    for _ in range(120):
        (s,) = backend.sample()
        assert s.processes == [] and s.utilization_gpu_pct == 0
        clock.now += 1


def test_shares_and_mig_instances_each_run_their_own_job_within_their_cap():
    clock = Clock()
    backend = SimulatedBackend("2xH100", "host-f", seed=4, clock=clock)
    a, b, c = _busy_reservations(3)
    backend.lease_source = lambda: [
        _lease(backend, 0, a, "bob", mode="time_slicing", shares=1, replicas=4),
        _lease(backend, 0, b, "carol", mode="time_slicing", shares=2, replicas=4),
        _lease(backend, 1, c, "dave", mode="mig", mig_uuid="MIG-1111", mig_profile="1g.10gb", memory_mib=9984)]
    for _ in range(600):
        shared, carved = backend.sample()
        by_user = {p.user: p for p in shared.processes}
        assert by_user["bob"].used_memory_mib <= 81559 // 4 and by_user["carol"].used_memory_mib <= 81559 // 2
        (instance,) = carved.processes
        assert instance.mig_uuid == "MIG-1111" and instance.used_memory_mib <= 9984
        # A 1g instance is a seventh-ish of the card: its job cannot fill the whole GPU.
        assert IDLE_PCT < carved.utilization_gpu_pct <= 15
        assert shared.utilization_gpu_pct > IDLE_PCT
        clock.now += 1


def test_the_same_seed_and_clock_give_the_same_fleet():
    def run(seed):
        clock = Clock()
        backend = SimulatedBackend("4xL4", "host-f", seed=seed, clock=clock)
        reservation = _busy_reservations(1)[0]
        backend.lease_source = lambda: [_lease(backend, 1, reservation)]
        out = []
        for _ in range(300):
            out.append([(s.utilization_gpu_pct, s.memory_used_mib, s.temperature_c) for s in backend.sample()])
            clock.now += 1
        return out

    assert run(9) == run(9)
    assert run(9) != run(10)
