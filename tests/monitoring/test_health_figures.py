"""SM clock, ECC error counts and the last XID error: sent by agents (and XID by the DCGM reader), kept with the
newest sample, pushed live and shown in the pool page's GPU table; a bad or absent figure never costs the sample."""
from __future__ import annotations

import pytest
from django.test import Client

from monitoring import hot, ingest
from monitoring.models import Sample
from tests.monitoring.conftest import batch, payload, post, sample

pytestmark = pytest.mark.django_db

HEALTH = {"sm_clock_mhz": 1980, "ecc_corrected": 3, "ecc_uncorrected": 1, "xid": 79}


def _latest(host, i: int):
    return hot.latest_get([(host.gpus[i].pk, host.node.pk)])[host.gpus[i].pk]


def test_the_health_figures_an_agent_sends_are_kept_with_the_newest_sample(world, host):
    response = post(host, payload(batch([sample(host.uuids[0], **HEALTH), sample(host.uuids[1])])))
    assert response.json()["accepted"] == 2
    first, second = _latest(host, 0), _latest(host, 1)
    assert (first.sm_clock, first.ecc_corrected, first.ecc_uncorrected, first.xid) == (1980, 3, 1, 79)
    assert (second.sm_clock, second.ecc_corrected, second.ecc_uncorrected, second.xid) == (None,) * 4
    # ... and stored in the history, null where the agent sent none.
    health = {gpu_id: row for gpu_id, *row in Sample.objects.values_list(
        "gpu_id", "sm_clock", "ecc_corrected", "ecc_uncorrected", "xid")}
    assert health == {host.gpus[0].pk: [1980, 3, 1, 79], host.gpus[1].pk: [None, None, None, None]}


def test_a_bad_health_figure_is_left_out_and_the_sample_kept(world, host):
    # A string, a negative count and a float clock: each figure alone is dropped (the plain-JSON path).
    response = post(host, payload(batch([sample(host.uuids[0], sm_clock_mhz=1410.5, ecc_corrected=-1,
                                               ecc_uncorrected="0", xid=48)])))
    assert response.json()["accepted"] == 1
    latest = _latest(host, 0)
    assert (latest.sm_clock, latest.ecc_corrected, latest.ecc_uncorrected, latest.xid) == (None, None, None, 48)


def test_the_live_message_carries_the_figures_a_gpu_has(world, host):
    refs = ingest.host_gpus(host.token)
    body = ingest.decode_body(ingest.orjson.dumps(payload(batch([sample(host.uuids[0], **HEALTH),
                                                                 sample(host.uuids[1])]))))
    newest = {}
    for raw in body.batches[0].gpus:
        ref, values, procs, health = ingest._parse_sample(raw, refs, ingest.IngestResult())
        newest[ref.gpu_id] = (ref, (1.0, *values, (), (), *health))
    items = {s["gpu"]: s for s in ingest._group_payloads(newest)[f"pool.{world.pool.pk}"]["samples"]}
    assert {k: items[host.gpus[0].pk][k] for k in HEALTH} == HEALTH
    assert not set(HEALTH) & set(items[host.gpus[1].pk])  # absent, not null: the message stays small


def test_the_pool_page_shows_sm_clock_ecc_and_xid_per_gpu(world, host):
    post(host, payload(batch([sample(host.uuids[0], **HEALTH), sample(host.uuids[1])])))
    client = Client()
    client.force_login(world.member)
    html = client.get("/pools/a100/").content.decode()
    rows = html.split('<tr data-gpu="')[1:]
    assert '<td class="num" data-f="sm_clock">1980</td>' in rows[0]
    assert '<td class="num warn" data-f="ecc">3 / 1</td>' in rows[0]
    assert '<td class="num warn" data-f="xid">79</td>' in rows[0]
    assert '<td class="num" data-f="ecc">–</td>' in rows[1] and '<td class="num" data-f="xid">–</td>' in rows[1]
