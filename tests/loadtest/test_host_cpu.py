"""host_cpu's process groups: each process of a benchmark on the GPU host is counted where it belongs."""

from __future__ import annotations

import pytest

from loadtest.experiments.host_cpu import group_of


@pytest.mark.parametrize(("cmdline", "group"), [
    # the load generator named after what it measures (gateway_ab.sh spy) stays the load generator
    ("python3 -m loadtest bench7 --name gateway-spy --parts scheduler --steps single text c=256", "load generator"),
    ("python3 -m loadtest.experiments.host_cpu --seconds 60 --out /tmp/gateway-spy/host-cpu.json", "load generator"),
    ("/usr/bin/python3 -m gateway", "gateway"),
    ("/tmp/ts/pytriton/tritonserver/bin/tritonserver --model-repository /tmp/i20g/loadtest/repository", "tritonserver"),
    ("/tmp/ts/pytriton/tritonserver/backends/python/triton_python_backend_stub /tmp/tritonserver/models/bench_onnx "
     "/bench_onnx_0_0 loadtest", "stubs"),
    ("python3 -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)", "other"),
])
def test_each_process_is_counted_in_its_own_group(cmdline: str, group: str) -> None:
    assert group_of(cmdline) == group


def test_gpu_utilization_is_given_per_gpu_where_there_are_several() -> None:
    from loadtest.experiments.host_cpu import gpu_utilization

    assert gpu_utilization("0, 90\n0, 70\n") == {"gpu utilization %": 80.0}
    assert gpu_utilization("0, 90\n1, 10\n0, 70\n1, 30\n[N/A]\n") == {
        "gpu utilization %": 50.0, "gpu 0 utilization %": 80.0, "gpu 1 utilization %": 20.0}
    assert gpu_utilization("") == {"gpu utilization %": -1.0}
