"""What bare-metal hosts receive for shared GPUs: host_leases per sharing mode (grant rows written as the
contract in notes has them), AgentBackend.sync waiting for exactly those keys, and a simulated MIG host's
agent taking the leases end to end (registration with its MIG devices, leases, env file)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from agent.__main__ import Agent
from agent.leases import LeaseStore
from agent.simulated import SimulatedBackend
from allocations.apply.backends.agent import AgentBackend, host_lease_report, host_leases
from allocations.apply.backends.base import BackendPending
from allocations.apply.selectors import cluster_desired
from allocations.models import Allocation, HostLeaseReport, Reservation
from inventory import services as inventory_services
from inventory.models import Gpu, Node
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, PoolFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def host():
    cluster = ClusterFactory(slug="lab")
    return NodeFactory(cluster=cluster, name="gpu-01", last_seen_at=timezone.now())


def book(pool, team, user, rows: list[dict], *, mode: str, gpus: int = 1) -> Reservation:
    """A reservation being applied with the given grant rows (columns as the grant-row contract says)."""
    start = timezone.now() - timedelta(minutes=1)
    reservation = Reservation.objects.create(team=team, pool=pool, requested_by=user, mode=mode, gpus=gpus,
                                             starts_at=start, ends_at=start + timedelta(hours=2),
                                             state=Reservation.State.APPLYING)
    for row in rows:
        Allocation.objects.create(reservation=reservation, starts_at=reservation.starts_at,
                                  ends_at=reservation.ends_at, mode=mode, **row)
    return reservation


def slot(gpu: Gpu, i: int, n: int, **extra) -> dict:
    size = 1000 // n
    return {"gpu": gpu, "share_from": i * size, "share_to": (i + 1) * size, "milli": size, "ge": 1 / n, **extra}


def test_shares_of_one_reservation_on_one_gpu_are_one_lease_with_their_count(host):
    pool = PoolFactory(slug="ts", sharing_mode="time_slicing", sharing_config={"replicas": 4})
    gpu = GpuFactory(node=host, pool=pool, index=0)
    team, user = TeamFactory(slug="ml"), UserFactory(username="ann")
    r = book(pool, team, user, [slot(gpu, 0, 4), slot(gpu, 1, 4)], mode="time_slicing")
    other = book(pool, team, user, [slot(gpu, 2, 4)], mode="time_slicing")
    leases = host_leases(host)
    assert [(lease["key"], lease["shares"], lease["replicas"], lease["mode"]) for lease in leases] == [
        (f"{r.pk}:{gpu.uuid}", 2, 4, "time_slicing"), (f"{other.pk}:{gpu.uuid}", 1, 4, "time_slicing")]
    assert "memory_mib" not in leases[0]


def test_an_mps_lease_sums_its_rows_caps(host):
    pool = PoolFactory(slug="mps", sharing_mode="mps", sharing_config={"replicas": 4})
    gpu = GpuFactory(node=host, pool=pool, index=0, memory_mib=81559)
    r = book(pool, TeamFactory(slug="ml"), UserFactory(username="ann"),
             [slot(gpu, i, 4, memory_mib=81559 // 4, cores_pct=25) for i in (0, 1, 2)], mode="mps")
    [lease] = host_leases(host)
    assert lease["key"] == f"{r.pk}:{gpu.uuid}"
    assert (lease["shares"], lease["replicas"], lease["memory_mib"], lease["cores_pct"]) == (3, 4, 3 * 20389, 75)


def test_mps_rows_without_caps_get_k_of_n_of_the_card(host):
    pool = PoolFactory(slug="mps", sharing_mode="mps", sharing_config={"replicas": 4})
    gpu = GpuFactory(node=host, pool=pool, index=0, memory_mib=80000)
    book(pool, TeamFactory(slug="ml"), UserFactory(username="ann"), [slot(gpu, 0, 4)], mode="mps")
    [lease] = host_leases(host)
    assert (lease["memory_mib"], lease["cores_pct"]) == (20000, 25)


def test_a_vgpu_lease_carries_memory_and_cores(host):
    pool = PoolFactory(slug="vgpu", sharing_mode="vgpu")
    gpus = [GpuFactory(node=host, pool=pool, index=i) for i in (0, 1)]
    r = book(pool, TeamFactory(slug="ml"), UserFactory(username="ann"),
             [{"gpu": g, "memory_mib": 20000, "cores_pct": 30, "milli": 300, "ge": 0.3} for g in gpus],
             mode="vgpu", gpus=2)
    leases = host_leases(host)
    assert [(lease["key"], lease["memory_mib"], lease["cores_pct"]) for lease in leases] == [
        (f"{r.pk}:{g.uuid}", 20000, 30) for g in gpus]


def test_an_exclusive_lease_is_as_before_plus_its_mode(host):
    pool = PoolFactory(slug="ex")
    gpu = GpuFactory(node=host, pool=pool, index=0)
    r = book(pool, TeamFactory(slug="ml"), UserFactory(username="ann"), [{"gpu": gpu}], mode="exclusive")
    [lease] = host_leases(host)
    assert lease == {"key": f"{r.pk}:{gpu.uuid}", "reservation": r.pk, "team": "ml", "user": "ann",
                     "gpu_uuid": gpu.uuid, "gpu_index": 0, "ends_at": r.ends_at.isoformat(), "mode": "exclusive"}


def mig_row(gpu: Gpu, profile: str, start: int, size: int, compute: int, memory: int) -> dict:
    return {"gpu": gpu, "mig_profile": profile, "mig_start": start, "share_from": start * 125,
            "share_to": (start + size) * 125, "milli": compute * 1000 // 7, "memory_mib": memory, "ge": compute / 7}


def test_each_mig_instance_is_a_lease_named_by_its_device_or_its_start(host):
    pool = PoolFactory(slug="mig", sharing_mode="mig", sharing_config={"mig_layout": "all-balanced"})
    reported = GpuFactory(node=host, pool=pool, index=0, model_name="NVIDIA A100-SXM4-80GB", memory_mib=81920,
                          mig_devices=[{"uuid": "MIG-aaaaaaaa-1111", "profile": "1g.10gb", "start": 2,
                                        "memory_mib": 10240}])
    unreported = GpuFactory(node=host, pool=pool, index=1, model_name="NVIDIA A100-SXM4-80GB", memory_mib=81920)
    r = book(pool, TeamFactory(slug="ml"), UserFactory(username="ann"),
             [mig_row(reported, "1g.10gb", 2, 1, 1, 10240), mig_row(unreported, "3g.40gb", 4, 4, 3, 40960)],
             mode="mig", gpus=2)
    leases = host_leases(host)
    assert [(lease["key"], lease["mig_uuid"], lease["mig_profile"], lease["mig_start"], lease["memory_mib"])
            for lease in leases] == [
        (f"{r.pk}:MIG-aaaaaaaa-1111", "MIG-aaaaaaaa-1111", "1g.10gb", 2, 10240),
        (f"{r.pk}:{unreported.uuid}/4", f"{unreported.uuid}/4", "3g.40gb", 4, 40960)]


def test_sync_waits_for_exactly_the_keys_host_leases_sends(host):
    pool = PoolFactory(slug="mig", sharing_mode="mig", sharing_config={"mig_layout": "all-1g.10gb"})
    gpu = GpuFactory(node=host, pool=pool, index=0, model_name="NVIDIA A100-SXM4-80GB", memory_mib=81920,
                     mig_devices=[{"uuid": f"MIG-0000000{s}-1111", "profile": "1g.10gb", "start": s,
                                   "memory_mib": 10240} for s in range(7)])
    ts_pool = PoolFactory(slug="ts", sharing_mode="time_slicing", sharing_config={"replicas": 2})
    ts_gpu = GpuFactory(node=host, pool=ts_pool, index=1)
    team, user = TeamFactory(slug="ml"), UserFactory(username="ann")
    book(pool, team, user, [mig_row(gpu, "1g.10gb", s, 1, 1, 10240) for s in (5, 6)], mode="mig")
    book(ts_pool, team, user, [slot(ts_gpu, 0, 2), slot(ts_gpu, 1, 2)], mode="time_slicing")
    keys = sorted(lease["key"] for lease in host_leases(host))
    assert len(keys) == 3
    backend = AgentBackend(host.cluster)
    with pytest.raises(BackendPending) as waiting:
        backend.sync(cluster_desired(host.cluster), teams=["ml"])
    assert all(key in str(waiting.value) for key in keys)
    host_lease_report(node=host, held=keys)
    backend.sync(cluster_desired(host.cluster), teams=["ml"])  # confirmed: done
    backend.sync(cluster_desired(host.cluster))  # and the reconcile sees no drift
    host_lease_report(node=host, held=[*keys, f"{keys[0].split(':')[0]}:{gpu.uuid}"])  # a stale per-GPU key
    report = backend.sync(cluster_desired(host.cluster))
    assert "still holds" in report.changes[0]


def test_a_simulated_mig_hosts_agent_gets_its_instances_in_cuda_visible_devices(tmp_path):
    """Registration stores the simulated host's MIG devices; a MIG grant on one of them becomes a lease naming
    the device's UUID; the agent takes it and writes the instance into the reservation's env file."""
    staff = UserFactory(username="root", is_staff=True)
    cluster = ClusterFactory(slug="lab")
    _, key = inventory_services.host_token_create(actor=staff, cluster=cluster, host_name="sim-01")
    backend = SimulatedBackend("1xA100-80GB:mig=all-1g.10gb", "sim-01")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Host {key}")
    inventory = [gpu.as_dict() for gpu in backend.inventory()]
    answer = client.post("/api/v1/agent/register/", {"hostname": "sim-01", "backend": "simulated",
                                                     "agent_version": "0.1.0", "gpus": inventory}, format="json")
    assert answer.status_code == 200, answer.content
    gpu = Gpu.objects.get()
    assert gpu.mig_devices == inventory[0]["mig_devices"] and len(gpu.mig_devices) == 7
    pool = gpu.pool
    pool.sharing_mode, pool.sharing_config = "mig", {"mig_layout": "all-1g.10gb"}
    pool.save()
    r = book(pool, TeamFactory(slug="ml"), UserFactory(username="ann"),
             [mig_row(gpu, "1g.10gb", s, 1, 1, 10240) for s in (0, 3)], mode="mig")
    node = Node.objects.get()

    class Portal:  # the agent's HTTP exchange, answered by the portal's own functions
        def leases(self, *, held, failed=None, unleased_in_use=None):
            host_lease_report(node=node, held=held, failed=failed or {})
            return {"leases": host_leases(node)}

    agent = Agent(Portal(), backend, "sim-01", heartbeat=1, leases=LeaseStore(tmp_path, simulated=True))
    agent.sync_leases()
    devices = {d["start"]: d["uuid"] for d in inventory[0]["mig_devices"]}
    env = (tmp_path / f"reservation-{r.pk}.env").read_text()
    assert f"CUDA_VISIBLE_DEVICES={devices[0]},{devices[3]}\n" in env
    assert sorted(HostLeaseReport.objects.get(node=node).held) == sorted(f"{r.pk}:{devices[s]}" for s in (0, 3))
    AgentBackend(cluster).sync(cluster_desired(cluster), teams=["ml"])  # the apply sees them held


def test_a_dynamic_mig_instance_is_carved_only_by_an_agent_that_opted_in(tmp_path):
    """A dynamic pool's grant names an instance the simulated host (MIG mode, no instances) lacks: the apply
    is refused with the agent's reason unless it was started with --allow-mig-reconfigure; with it, the agent
    carves the instance, registers again, and the portal's lease then names the new MIG device UUID."""
    from allocations.apply.backends.base import BackendRejected

    staff = UserFactory(username="root", is_staff=True)
    cluster = ClusterFactory(slug="lab")
    _, key = inventory_services.host_token_create(actor=staff, cluster=cluster, host_name="sim-02")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Host {key}")

    class Portal:  # the agent's HTTP exchange, answered by the portal itself
        def register(self, **body):
            answer = client.post("/api/v1/agent/register/", body, format="json")
            assert answer.status_code == 200, answer.content
            return answer.json()

        def leases(self, *, held, failed=None, unleased_in_use=None):
            host_lease_report(node=Node.objects.get(), held=held, failed=failed or {})
            return {"leases": host_leases(Node.objects.get())}

    def agent(backend, **options) -> Agent:
        agent = Agent(Portal(), backend, "sim-02", heartbeat=1, leases=LeaseStore(tmp_path, simulated=True), **options)
        agent.register()
        return agent

    plain = agent(SimulatedBackend("1xA100-80GB:mig=all-enabled", "sim-02"))
    gpu = Gpu.objects.get()
    assert gpu.mig_devices == []
    pool = gpu.pool
    pool.sharing_mode, pool.sharing_config = "mig", {"dynamic": True}
    pool.save()
    r = book(pool, TeamFactory(slug="ml"), UserFactory(username="ann"), [mig_row(gpu, "3g.40gb", 4, 4, 3, 40960)],
             mode="mig")
    plain.sync_leases()
    with pytest.raises(BackendRejected) as refused:
        AgentBackend(cluster).sync(cluster_desired(cluster), teams=["ml"])
    assert "--allow-mig-reconfigure" in str(refused.value) and f"{r.pk}:{gpu.uuid}/4" in str(refused.value)

    backend = SimulatedBackend("1xA100-80GB:mig=all-enabled", "sim-02")
    carving = agent(backend, allow_mig_reconfigure=True)
    carving.sync_leases()
    assert backend.mig_changes == [("create", gpu.uuid, "3g.40gb", 4)]
    assert not carving.registered
    carving.register()  # what its run loop does next: the portal learns the instance's UUID
    (device,) = Gpu.objects.get().mig_devices
    assert (device["profile"], device["start"]) == ("3g.40gb", 4) and device["uuid"].startswith("MIG-")
    carving.sync_leases()
    assert HostLeaseReport.objects.get().held == [f"{r.pk}:{device['uuid']}"]
    AgentBackend(cluster).sync(cluster_desired(cluster), teams=["ml"])  # confirmed: no refusal, no wait
    assert f"CUDA_VISIBLE_DEVICES={device['uuid']}\n" in (tmp_path / f"reservation-{r.pk}.env").read_text()
