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


def test_connections_are_counted_on_the_port_a_process_listens_on() -> None:
    import os
    import socket

    from loadtest.experiments.host_cpu import ESTABLISHED, LISTENING, tcp_sockets, worker_connections

    with socket.socket() as server, socket.socket() as elsewhere:
        server.bind(("127.0.0.1", 0))
        server.listen()
        elsewhere.bind(("127.0.0.1", 0))
        elsewhere.listen()  # this process's connections to another port it listens on are not its clients
        port, other = server.getsockname()[1], elsewhere.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        outgoing = socket.create_connection(("127.0.0.1", other))
        accepted = [server.accept()[0] for _ in clients]
        try:
            held = tcp_sockets(os.getpid())
            assert (port, LISTENING) in {(p, s) for _, p, s in held}
            assert sum(1 for _, p, s in held if p == port and s == ESTABLISHED) == 3
            # its clients are the 3 accepted on `port`: not the client ends (ephemeral ports), not the connection
            # to `other` that was never accepted
            assert worker_connections([os.getpid()]) == {os.getpid(): 3}
            assert worker_connections([2 ** 22 + 1]) == {}  # no such process
        finally:
            for s in (*clients, *accepted, outgoing):
                s.close()


def test_a_stubs_threads_are_counted_by_kind() -> None:
    import os
    import threading

    from loadtest.experiments.host_cpu import stub_thread_kind, thread_ticks

    assert stub_thread_kind(7, 7, "triton_python_b") == "stubs: main threads"
    assert stub_thread_kind(7, 9, "cuda-EvtHandlr") == "stubs: threads cuda-EvtHandlr"
    # a pool's numbered threads add up under one name
    assert stub_thread_kind(7, 10, "pool-12") == stub_thread_kind(7, 11, "pool-3") == "stubs: threads pool"
    assert stub_thread_kind(7, 12, "42") == "stubs: threads unnamed"

    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, name="helper")
    helper.start()
    try:
        ticks = thread_ticks([os.getpid()], stub_thread_kind)
    finally:
        stop.set()
        helper.join()
    kinds = [kind for kind, _ in ticks.values()]
    assert kinds.count("stubs: main threads") == 1  # this process's main thread; the helper is one of the others
    assert len(kinds) >= 2 and all(ticks_ >= 0 for _, ticks_ in ticks.values())
