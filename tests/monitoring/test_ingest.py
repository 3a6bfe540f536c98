"""The telemetry ingest: good samples land in history, the hot cache and the live groups; bad ones are
rejected or clamped with a counted reason, and nothing answers 500."""
from __future__ import annotations

import time

import pytest
from django.test import override_settings

from monitoring import hot
from monitoring.models import Sample
from tests.monitoring.conftest import batch, payload, post, sample

pytestmark = pytest.mark.django_db


def test_a_batch_is_stored_kept_hot_and_acknowledged(host):
    t = time.time()
    response = post(host, payload(batch([sample(u, util=10 * i) for i, u in enumerate(host.uuids)], t=t, seq=7)))
    assert response.status_code == 200, response.content
    assert response.json() == {"accepted": 4, "ack": 7, "rejected": {}, "clamped": {}}
    assert Sample.objects.count() == 4
    assert sorted(Sample.objects.values_list("util", flat=True)) == [0, 10, 20, 30]
    latest = hot.latest_get((g.pk, g.node_id) for g in host.gpus)
    assert latest[host.gpus[3].pk].util == 30 and latest[host.gpus[3].pk].processes == ((4242, 40000),)
    assert hot.counters(["accepted"]) == {"accepted": 4}


def test_a_resent_batch_is_acknowledged_but_not_stored_twice(host):
    body = payload(batch([sample(host.uuids[0])], seq=1), batch([sample(host.uuids[1])], seq=2))
    assert post(host, body).json()["ack"] == 2
    again = post(host, body).json()
    assert again["ack"] == 2 and again["accepted"] == 0 and again["rejected"] == {"duplicate": 2}
    assert Sample.objects.count() == 2


@pytest.mark.parametrize("bad, reason", [
    ({"memory_used_mib": -5}, "negative_memory"),
    ({"memory_total_mib": 0}, "negative_memory"),
    ({"memory_total_mib": 3_000_000_000}, "memory_out_of_range"),  # past a 32-bit column: failed the INSERT
    ({"uuid": "GPU-00000000-0000-0000-0000-000000000000"}, "unknown_gpu"),
    ({"utilization_gpu_pct": "lots"}, "malformed"),
    ({"temperature_c": None}, "malformed"),
    ({"utilization_gpu_pct": True}, "malformed"),
    ({"temperature_c": 900}, "temperature_out_of_range"),
    ({"power_w": -1}, "power_out_of_range"),
])
def test_a_bad_sample_is_rejected_with_its_reason_and_the_rest_kept(host, bad, reason):
    response = post(host, payload(batch([sample(host.uuids[0], **bad), sample(host.uuids[1])])))
    assert response.status_code == 200
    assert response.json()["accepted"] == 1 and response.json()["rejected"] == {reason: 1}
    assert hot.counters([reason])[reason] == 1
    assert list(Sample.objects.values_list("gpu_id", flat=True)) == [host.gpus[1].pk]


def test_a_gpu_of_another_host_counts_as_unknown(host, world):
    other = world.pool.gpus.exclude(node=host.node).first()
    response = post(host, payload(batch([sample(other.uuid)])))
    assert response.json()["rejected"] == {"unknown_gpu": 1}


@pytest.mark.parametrize("overrides, field, value", [
    ({"utilization_gpu_pct": 140}, "util", 100),
    ({"utilization_gpu_pct": -3}, "util", 0),
    ({"memory_used_mib": 90000}, "mem_used", 81559),
])
def test_out_of_range_values_are_clamped_and_counted(host, overrides, field, value):
    response = post(host, payload(batch([sample(host.uuids[0], **overrides)])))
    reason = "memory_clamped" if field == "mem_used" else "utilization_clamped"
    assert response.json()["clamped"] == {reason: 1} and response.json()["accepted"] == 1
    assert getattr(Sample.objects.get(), field) == value
    assert hot.counters([reason])[reason] == 1


def test_timestamps_far_in_the_future_or_past_retention_are_rejected(host):
    now = time.time()
    response = post(host, payload(batch([sample(host.uuids[0])], t=now + 3600),
                                  batch([sample(host.uuids[1])], t=now - 2 * 86400),
                                  batch([sample(host.uuids[2])], t=now)))
    assert response.json()["rejected"] == {"future_timestamp": 1, "too_old": 1}
    assert Sample.objects.count() == 1


@pytest.mark.parametrize("body", [[], {"batches": "x", "stream": "s"}, {"stream": "s"}, {"batches": []},
                                  {"stream": "s", "batches": [None, {"seq": "a", "t": 1, "gpus": []}]}])
def test_a_malformed_envelope_is_a_4xx_or_counted_never_a_500(host, body):
    response = post(host, body)
    assert response.status_code in (200, 400)
    if response.status_code == 400:
        assert response.json()["errors"][0]["rule"] == "malformed"
    else:
        assert response.json()["rejected"] == {"malformed": 1}
    assert hot.counters(["malformed"])["malformed"] >= 1


@override_settings(TELEMETRY_MAX_SAMPLES_PER_REQUEST=5)
def test_an_oversized_request_is_refused_with_413(host):
    response = post(host, payload(batch([sample(u) for u in host.uuids]), batch([sample(u) for u in host.uuids])))
    assert response.status_code == 413
    assert response.json()["errors"][0] == {"field": "batches", "rule": "too_large",
                                            "message": "8 samples in one request; at most 5."}
    assert not Sample.objects.exists()
    assert hot.counters(["oversized_batch"])["oversized_batch"] == 8


@override_settings(TELEMETRY_MAX_SAMPLES_PER_AGENT_MINUTE=10)
def test_a_flooding_agent_is_throttled_and_other_agents_still_served(host, world):
    from rest_framework.test import APIClient

    from inventory import services
    from inventory.models import Node

    codes = [post(host, payload(batch([sample(u) for u in host.uuids]))).status_code for _ in range(4)]
    assert codes[:2] == [200, 200] and codes[-1] == 429
    assert hot.counters(["flood"])["flood"] >= 4
    node_b = Node.objects.get(name="node-b")
    _, key = services.host_token_create(actor=world.staff, cluster=node_b.cluster, host_name="node-b")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Host {key}")
    uuid = node_b.gpus.first().uuid
    assert other.post("/api/v1/agent/telemetry/", payload(batch([sample(uuid)])), format="json").status_code == 200


def test_only_host_tokens_may_send_telemetry(host, api, world):
    body = payload(batch([sample(host.uuids[0])]))
    assert api(world.staff).post("/api/v1/agent/telemetry/", body, format="json").status_code in (401, 403)
    assert api().post("/api/v1/agent/telemetry/", body, format="json").status_code in (401, 403)
    assert not Sample.objects.exists()


def test_a_busy_database_answers_503_so_the_agent_resends(host, monkeypatch):
    from django.db import OperationalError

    from monitoring import ingest

    def locked(rows):
        raise OperationalError("database is locked")

    monkeypatch.setattr(ingest, "_store_raw", locked)
    response = post(host, payload(batch([sample(host.uuids[0])])))
    assert response.status_code == 503 and response.json()["errors"][0]["rule"] == "busy"


def test_typed_and_field_by_field_reading_store_the_same_values(host):
    """Agents' bodies are decoded into typed structs; one value of the wrong type sends the whole body
    through the field-by-field reading. Both must keep exactly the same values."""
    import json

    from monitoring.ingest import WirePayload, decode_body

    good = [sample(u, util=7 * i + 0.4, power_w=150.25, temperature_c=41.6) for i, u in enumerate(host.uuids[:3])]
    typed = payload(batch(good, seq=1))
    assert isinstance(decode_body(json.dumps(typed).encode()), WirePayload)
    assert post(host, typed).json()["accepted"] == 3
    stored_typed = list(Sample.objects.order_by("gpu_id").values_list(
        "gpu_id", "util", "mem_util", "mem_used", "mem_total", "temp", "power"))
    Sample.objects.all().delete()

    mixed = payload(batch([*good, sample(host.uuids[3], temperature_c="hot")], seq=2))
    assert isinstance(decode_body(json.dumps(mixed).encode()), dict)
    answer = post(host, mixed).json()
    assert answer["accepted"] == 3 and answer["rejected"] == {"malformed": 1}
    assert list(Sample.objects.order_by("gpu_id").values_list(
        "gpu_id", "util", "mem_util", "mem_used", "mem_total", "temp", "power")) == stored_typed


@pytest.fixture(params=["redis", "locmem"])
def either_cache(request, settings):
    """The hot cache as production keeps it (Redis, the suite's cache) and as the embedded mode does (local memory)."""
    if request.param == "locmem":
        settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                       "LOCATION": "hot-cache-test"}}
        from django.core.cache import caches
        from django.core.cache.backends.locmem import LocMemCache

        assert isinstance(caches["default"], LocMemCache)
        caches["default"].clear()


def _hot(host) -> dict:
    """gpu index → (its hot sample's timestamp, util)."""
    latest = hot.latest_get((g.pk, g.node_id) for g in host.gpus)
    return {i: (latest[g.pk].ts, latest[g.pk].util) for i, g in enumerate(host.gpus) if g.pk in latest}


def test_a_gpu_whose_sample_is_rejected_keeps_its_previous_hot_sample(host, either_cache):
    t = time.time() - 5
    assert post(host, payload(batch([sample(u, util=70) for u in host.uuids], t=t))).json()["accepted"] == 4
    bad = sample(host.uuids[0], util=99, memory_total_mib=3_000_000_000)
    answer = post(host, payload(batch([bad] + [sample(u, util=20) for u in host.uuids[1:]], t=t + 1))).json()
    assert answer["rejected"] == {"memory_out_of_range": 1}
    # GPU 0's last good sample is 1 s older than the others' and still fresh: it stays, the others move on.
    assert _hot(host) == {0: (t, 70), 1: (t + 1, 20), 2: (t + 1, 20), 3: (t + 1, 20)}


def test_an_older_sample_never_replaces_a_newer_one_in_the_hot_cache(host, either_cache):
    """A backlog that arrives after newer samples (an agent's earlier run draining its buffer on another
    stream) lands in history but leaves the hot values alone."""
    t = time.time() - 2
    post(host, payload(batch([sample(u, util=80) for u in host.uuids], t=t), stream="agent-now"))
    old = post(host, payload(batch([sample(u, util=10) for u in host.uuids[:2]], t=t - 60), stream="agent-before"))
    assert old.json()["accepted"] == 2 and Sample.objects.count() == 6
    assert _hot(host) == {i: (t, 80) for i in range(4)}


def test_two_requests_of_one_node_racing_keep_the_newest_hot_sample(host, either_cache, monkeypatch):
    """An agent whose request timed out resends it with the next batch while the first is still being
    handled: the older request, writing last, must not put its older values back."""
    from monitoring import live

    t = time.time() - 2
    send, raced = live.send, []

    def send_then_race(groups):
        send(groups)
        if not raced:  # the older request has stored its rows; the newer one runs to the end meanwhile
            raced.append(None)
            raced[0] = post(host, payload(batch([sample(u, util=90) for u in host.uuids], t=t + 1, seq=2)))

    monkeypatch.setattr(live, "send", send_then_race)
    assert post(host, payload(batch([sample(u, util=30) for u in host.uuids], t=t, seq=1))).status_code == 200
    assert raced[0].json()["accepted"] == 4
    assert _hot(host) == {i: (t + 1, 90) for i in range(4)}


@pytest.mark.parametrize("seq, rule", [(10**30, "max_value"), (2**63, "max_value"), (-1, "min_value")])
@pytest.mark.parametrize("reading", ["typed", "field_by_field"])
def test_a_seq_outside_63_bits_is_refused_and_later_batches_still_count(host, seq, rule, reading):
    """A seq of 10**30 once became the stream's position, and every later batch was dropped as held."""
    extra = [sample(host.uuids[1], temperature_c="hot")] if reading == "field_by_field" else []
    refused = post(host, payload(batch([sample(host.uuids[0]), *extra], seq=seq)))
    assert refused.status_code == 400, refused.content
    assert refused.json()["errors"][0]["field"] == "seq" and refused.json()["errors"][0]["rule"] == rule
    answer = post(host, payload(batch([sample(host.uuids[0])], seq=5)))
    assert answer.json()["accepted"] == 1 and answer.json()["ack"] == 5
    assert Sample.objects.count() == 1


def test_the_largest_seq_is_accepted(host):
    answer = post(host, payload(batch([sample(host.uuids[0])], seq=2**63 - 1))).json()
    assert answer["accepted"] == 1 and answer["ack"] == 2**63 - 1


def test_the_same_gpu_twice_in_one_batch_is_stored_once_and_counted_as_a_duplicate(host):
    t = time.time()
    answer = post(host, payload(batch([sample(host.uuids[0], util=10), sample(host.uuids[0], util=90),
                                       sample(host.uuids[1])], t=t))).json()
    assert answer["accepted"] == 2 and answer["rejected"] == {"duplicate": 1}
    assert hot.counters(["accepted", "duplicate"]) == {"accepted": 2, "duplicate": 1}
    # The first one sent is kept, in history and in the hot cache alike.
    assert Sample.objects.get(gpu_id=host.gpus[0].pk).util == 10
    assert _hot(host)[0] == (t, 10)


def test_two_batches_in_one_second_store_one_sample_per_gpu(host):
    t = int(time.time()) - 1
    answer = post(host, payload(batch([sample(host.uuids[0], util=10)], t=t + 0.1),
                                batch([sample(host.uuids[0], util=20)], t=t + 0.6))).json()
    assert answer["accepted"] == 1 and answer["rejected"] == {"duplicate": 1}
    assert Sample.objects.count() == 1


def test_an_overlapping_resend_counts_its_samples_once_and_never_moves_the_ack_back(host, either_cache,
                                                                                       monkeypatch):
    """An agent resends a request that timed out (seq 1-2) with its next batch (seq 3) while the first is
    still being handled. Before, the first request, finishing last, wrote position 2 over 3 (a lower ack)
    and both requests counted seq 1-2 as accepted."""
    from monitoring import live

    t = time.time() - 10
    first = [batch([sample(u) for u in host.uuids], t=t, seq=1), batch([sample(u) for u in host.uuids], t=t + 1, seq=2)]
    third = batch([sample(u) for u in host.uuids], t=t + 2, seq=3)
    send, raced = live.send, []

    def send_then_race(groups):
        send(groups)
        if not raced:  # the first request has stored its rows but not yet moved the position
            raced.append(None)
            raced[0] = post(host, payload(*first, third))

    monkeypatch.setattr(live, "send", send_then_race)
    answer = post(host, payload(*first)).json()
    resend = raced[0].json()
    assert resend["accepted"] == 4 and resend["rejected"] == {"duplicate": 8} and resend["ack"] == 3
    assert answer["accepted"] == 8 and answer["ack"] == 3
    assert Sample.objects.count() == 12 and hot.counters(["accepted"]) == {"accepted": 12}
    again = post(host, payload(third)).json()
    assert again["ack"] == 3 and again["accepted"] == 0 and again["rejected"] == {"duplicate": 4}
