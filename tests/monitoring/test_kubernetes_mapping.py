"""How a DCGM series names the workload on a GPU (monitoring.kubernetes.Reading.add_dating), as each way
of scraping the exporter labels it. Pure: no Prometheus, no database."""
from __future__ import annotations

from monitoring.kubernetes import Reading

GPU = {"UUID": "GPU-1", "gpu": "0", "Hostname": "node-1"}


def test_honor_labels_true_keeps_the_exporters_labels_as_they_are():
    reading = Reading(exporter_namespace="gpu-operator")
    reading.add_dating({**GPU, "namespace": "gpupool-vision", "pod": "train-0", "container": "main"}, 100.0)
    assert reading.pods["GPU-1"] == [("gpupool-vision", "train-0", "main", "")]
    assert reading.ts["GPU-1"] == 100.0 and reading.hostname["GPU-1"] == "node-1"


def test_honor_labels_false_reads_the_exported_labels_and_not_the_exporter_pod():
    reading = Reading(exporter_namespace="gpu-operator")
    target = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x2k", "container": "nvidia-dcgm-exporter"}
    reading.add_dating({**GPU, **target, "exported_namespace": "gpupool-vision", "exported_pod": "train-0",
                        "exported_container": "main"}, 100.0)
    # A GPU with no workload: only the exporter's own pod, which is nobody's workload.
    reading.add_dating({**GPU, "UUID": "GPU-2", **target}, 100.0)
    assert reading.pods["GPU-1"] == [("gpupool-vision", "train-0", "main", "")]
    assert "GPU-2" not in reading.pods and reading.ts["GPU-2"] == 100.0


def test_mig_instances_keep_their_instance_and_the_newest_time_dates_the_card():
    reading = Reading()
    reading.add_dating({**GPU, "GPU_I_ID": "1", "namespace": "a", "pod": "p1"}, 100.0)
    reading.add_dating({**GPU, "GPU_I_ID": "2", "namespace": "b", "pod": "p2"}, 101.5)
    assert reading.pods["GPU-1"] == [("a", "p1", "", "1"), ("b", "p2", "", "2")] and reading.ts["GPU-1"] == 101.5


def test_a_mig_cards_instances_add_up_into_the_card():
    from monitoring.kubernetes import _gpu_values

    card = _gpu_values({"1": {"used": 1000.0, "gr_active": 0.5, "temp": 40.0, "power": 200.0},
                        "2": {"used": 3000.0, "gr_active": 0.9, "temp": 40.0, "power": 200.0}})
    assert card == {"used": 4000.0, "gr_active": 0.9, "temp": 40.0, "power": 200.0}
    assert _gpu_values({"": {"used": 5.0, "util": 7.0}}) == {"used": 5.0, "util": 7.0}


def test_the_last_xid_error_dcgm_reports_rides_with_the_gpus_sample():
    from monitoring.ingest import GpuRef
    from monitoring.kubernetes import outcome_of

    reading = Reading()
    for uuid, xid in (("GPU-1", 79.0), ("GPU-2", None)):
        reading.add_dating({**GPU, "UUID": uuid}, 100.0)
        for key, value in (("used", 1000.0), ("free", 7000.0), ("temp", 50.0), ("util", 10.0), ("xid", xid)):
            if value is not None:
                reading.add_value(key, {**GPU, "UUID": uuid}, value)
    refs = {u: GpuRef(i, u, None, 1, None) for i, u in enumerate(("GPU-1", "GPU-2"))}
    samples = {s.uuid: s for s in outcome_of(reading, refs, {}, {}, {}, {}).samples}
    assert samples["GPU-1"].xid == 79 and samples["GPU-2"].xid is None  # no series: no XID error reported
