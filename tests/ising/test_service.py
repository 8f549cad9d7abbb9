"""The dSB request service on the CPU: every reply equals the library's own solve of the same
request, bad requests get their error status (and the server keeps serving), a full queue
answers BUSY instead of dropping, models load and are replaced over the wire."""

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from cuscikit.cli.ising_service import random_model
from cuscikit.ising import IsingModel, solve
from cuscikit.ising.service import (
    MAGIC,
    REQUEST,
    Client,
    IsingServer,
    decode_reply,
    encode_load,
    encode_request,
    load_test,
    reference,
    share_parts,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sockets")


@pytest.fixture
def server():
    with IsingServer(port=0, workers=2, depth=64) as s:
        yield s


@pytest.mark.parametrize("kind", ["binary", "ternary", "int8"])
def test_replies_equal_the_library_solve(server, kind):
    n = 70  # not a multiple of 32: padding words
    model = random_model(n, kind, seed=3)
    assert model.kind == kind
    server.load_model(5, model)
    h = np.random.default_rng(1).integers(-40, 41, n)
    with Client(port=server.port) as udp, Client(port=server.tcp_port, tcp=True) as tcp:
        for client in (udp, tcp):
            for field in (None, h):
                r = client.solve(5, n=n, steps=60, replicas=4, dt=0.4, seed=11, h=field)
                e, spins = reference(model, 60, 4, 0.4, 11, field)
                assert (r.status, r.energy) == ("OK", e)
                assert np.array_equal(r.spins, spins)
                with_h = IsingModel(model.J, h=np.zeros(n) if field is None else field)
                assert with_h.energy(r.spins) == r.energy
    # and the reference is `solve` itself: the best of B agents
    sol = solve(IsingModel(model.J, h=h), agents=4, steps=60, dt=0.4, seed=11)
    assert sol.energy == reference(model, 60, 4, 0.4, 11, h)[0]


def _raw(server, data: bytes):
    with Client(port=server.port) as c:
        return c.send(data)


def test_bad_requests_get_their_status_and_serving_goes_on(server):
    n = 40
    server.load_model(1, random_model(n, seed=0))
    good = encode_request(1, n, steps=10, replicas=2, seed=3, request_id=77)
    assert _raw(server, good).status == "OK"
    bad_magic = struct.pack("<I", 0xDEADBEEF) + good[4:]
    bad_version = good[:4] + struct.pack("<H", 9) + good[6:]
    cases = {
        "BAD_MAGIC": [bad_magic, b"xy"],
        "BAD_VERSION": [bad_version],
        "BAD_LENGTH": [good[:40], good + b"\0", encode_request(1, n, 10, h=[1] * n)[:-2]],
        "TOO_LARGE": [
            encode_request(1, 5000, 10),  # n above the limit
            encode_request(1, n, 10, replicas=129),  # 129 x 32 pairs > 4096
        ],
        "BAD_PARAM": [
            encode_request(1, n, steps=0),
            encode_request(1, n, steps=10, dt=-1.0),
            encode_request(1, n, steps=10, dt=float("nan")),
            encode_request(1, n + 1, steps=10),  # n is not the model's
            good[:30] + struct.pack("<H", 9) + good[32:],  # unknown payload type
        ],
        "NO_MODEL": [encode_request(2, n, steps=10)],
    }
    for status, requests in cases.items():
        for data in requests:
            r = _raw(server, data)
            assert r.status == status, (status, data[:48].hex())
            assert r.spins is None
    assert _raw(server, good).request_id == 77  # still serving
    stats = server.stats()
    for status, requests in cases.items():
        assert stats[status.lower()] == len(requests)
    assert stats["ok"] == 2


def test_a_full_queue_answers_busy_and_nothing_is_lost():
    n = 256
    with IsingServer(port=0, workers=1, depth=2) as s:
        s.load_model(1, random_model(n, seed=1))
        rep = load_test(1, n, steps=400, replicas=8, count=300, rate=1e6, port=s.port)
        stats = s.stats()
    assert rep.lost == 0
    assert rep.busy > 0 and rep.completed > 0
    assert rep.busy + rep.completed == rep.sent == 300
    assert stats["busy"] == rep.busy and stats["queue_peak"] <= 2


def test_load_generator_closed_loop_and_every_energy(server):
    n, steps = 64, 30
    model = random_model(n, "int8", seed=2)
    server.load_model(9, model)
    rep = load_test(9, n, steps, replicas=2, seed=1000, count=200, in_flight=8, port=server.port)
    assert (rep.completed, rep.lost, rep.busy, rep.errors) == (200, 0, 0, 0)
    assert rep.completed_per_s > 0 and rep.rtt_us["p50"] > 0
    for i in range(0, 200, 37):  # request i ran with seed 1000 + i
        assert rep.energies[i] == reference(model, steps, 2, 0.5, 1000 + i)[0]


def test_models_load_and_are_replaced_over_tcp(server):
    n = 50
    a, b = random_model(n, "binary", seed=4), random_model(n, "int8", seed=5)
    with Client(port=server.tcp_port, tcp=True) as c:
        for model in (a, b, a):
            assert c.load(3, model).status == "OK"
            r = c.solve(3, n=n, steps=40, replicas=3, seed=8)
            assert r.energy == reference(model, 40, 3, 0.5, 8)[0]
    assert server.stats()["loads"] == 3
    # over UDP too, while it fits in a datagram
    with Client(port=server.port) as c:
        assert c.load(4, b).status == "OK"
        assert c.solve(4, n=n, steps=40, seed=2).energy == reference(b, 40, 1, 0.5, 2)[0]


def test_protocol_layout_and_client_side_checks():
    data = encode_request(6, 33, 100, replicas=3, dt=0.25, seed=2**63, h=range(33), request_id=5)
    fields = REQUEST.unpack_from(data)
    assert fields == (MAGIC, 1, 0, 5, 6, 33, 100, 3, 1, 0.25, 2**63, 66)
    assert data[:4] == b"DSB1" and len(data) == 48 + 66
    with pytest.raises(ValueError, match="int16"):
        encode_request(1, 2, 10, h=[40000, 0])
    with pytest.raises(ValueError, match="shape"):
        encode_request(1, 3, 10, h=[1, 2])
    with pytest.raises(ValueError, match="no field"):
        encode_load(1, IsingModel(np.array([[0, 1], [1, 0]]), h=[1, 0]))
    with pytest.raises(ValueError, match="exactly one"):
        load_test(1, 4, 10, rate=100.0, in_flight=2)
    with pytest.raises(ValueError, match="at least 32"):
        decode_reply(b"\0" * 8)
    with pytest.raises(ValueError, match="float|integer"):
        IsingServer(port=0).load_model(1, IsingModel(np.array([[0, 0.5], [0.5, 0]])))


def test_port_in_use_is_a_clear_error():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    try:
        with pytest.raises(OSError, match="cannot serve"):
            IsingServer(port=s.getsockname()[1], tcp_port=-1)
    finally:
        s.close()


def test_cli_serve_and_load(tmp_path):
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cuscikit",
            "ising",
            "serve",
            "--random",
            "64",
            "--port",
            "0",
            "--duration",
            "20",
            "--workers",
            "1",
            "--json",
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = serve.stdout.readline()
        port = int(first.split("UDP ")[1].split()[0])
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "cuscikit",
                "ising",
                "load",
                "--port",
                str(port),
                "--n",
                "64",
                "--steps",
                "20",
                "--in-flight",
                "4",
                "--count",
                "50",
                "--spin",
                "--json",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        (row,) = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
        assert row["completed"] == 50 and row["lost"] == 0
        serve.stdout.readline()  # the backend line
        serve.send_signal(signal.SIGUSR1)  # the counters so far, as one line
        stats = json.loads(serve.stdout.readline().removeprefix("stats "))
        assert stats["ok"] == 50 and stats["received"] == 50
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    bad = subprocess.run(
        [sys.executable, "-m", "cuscikit", "ising", "load", "--n", "8", "--json"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "closed loop" in json.loads(bad.stdout)["error"]
    serve_cmd = [sys.executable, "-m", "cuscikit", "ising", "serve", "--random", "8:binary"]
    bad = subprocess.run(
        serve_cmd + ["--rx-batch", "2000", "--json"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--rx-batch" in json.loads(bad.stdout)["error"]
    bad = subprocess.run(serve_cmd + ["--share", "reads", "--json"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--share: unknown part" in json.loads(bad.stdout)["error"]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["resident", "resident-generic", "launch"])
def test_gpu_service_replies_equal_the_cpu_reference(mode, monkeypatch):
    # block-sized (B n_p > 256 or int8) and warp-sized requests (W = 1 .. 8 words, B <= 8 / W;
    # one replica at every W: 20, 64, 96, 128, 160, 180, 200, 256 spins);
    # resident-generic: one-replica warp-sized requests on the solver for any replica count
    # instead of the one specialised for them (both must give the reference's bytes)
    if mode == "resident-generic":
        monkeypatch.setenv("CUSCIKIT_DSB_GENERIC_SOLVER", "1")
        mode = "resident"
    cases = [("binary", 64, 16), ("ternary", 100, 8), ("int8", 256, 4), ("binary", 1024, 4),
             ("int8", 33, 64), ("binary", 64, 1), ("binary", 64, 4), ("ternary", 100, 2),
             ("binary", 256, 1), ("ternary", 7, 8), ("binary", 200, 1), ("ternary", 160, 1),
             ("int8", 64, 1), ("binary", 20, 1), ("ternary", 96, 1), ("binary", 128, 1),
             ("ternary", 180, 1)]  # fmt: skip
    with IsingServer(port=0, device="cuda", mode=mode, depth=256) as s:
        models = {}
        for i, (kind, n, _) in enumerate(cases):
            models[i] = random_model(n, kind, seed=i)
            s.load_model(i, models[i])
        rng = np.random.default_rng(0)
        with Client(port=s.port) as udp, Client(port=s.tcp_port, tcp=True) as tcp:
            for i, (kind, n, B) in enumerate(cases):
                h = rng.integers(-60, 61, n)
                for client, field in ((udp, None), (tcp, h)):
                    r = client.solve(i, n=n, steps=80, replicas=B, dt=0.45, seed=31 + i, h=field)
                    e, spins = reference(models[i], 80, B, 0.45, 31 + i, field)
                    assert (r.status, r.energy) == ("OK", e), (mode, kind, n, B)
                    assert np.array_equal(r.spins, spins), (mode, kind, n, B)
        # a closed-loop burst: every reply right (sampled), nothing lost, and the server keeps
        # answering after a model is replaced under load
        rep = load_test(3, 1024, 50, replicas=1, seed=500, count=2000, in_flight=256,
                        port=s.port)  # fmt: skip
        assert (rep.completed, rep.lost) == (2000, 0)
        for i in range(0, 2000, 211):
            assert rep.energies[i] == reference(models[3], 50, 1, 0.5, 500 + i)[0]
        replaced = random_model(1024, "binary", seed=99)
        s.load_model(3, replaced)
        with Client(port=s.port) as udp:
            r = udp.solve(3, n=1024, steps=50, seed=7)
        assert r.energy == reference(replaced, 50, 1, 0.5, 7)[0]
        assert "cuda" in s.info
        if mode == "resident":
            generic = os.environ.get("CUSCIKIT_DSB_GENERIC_SOLVER", "0") not in ("", "0")
            assert ("generic warp solver" in s.info) == generic
        # warp-sized requests under load, with several collectors
        rep = load_test(5, 64, 60, replicas=1, seed=900, count=3000, in_flight=128,
                        port=s.port)  # fmt: skip
        assert (rep.completed, rep.lost) == (3000, 0)
        for i in range(0, 3000, 307):
            assert rep.energies[i] == reference(models[5], 60, 1, 0.5, 900 + i)[0]
        if mode == "resident":
            st = s.stats()
            assert st["device_solved"] >= 3000 and st["device_solve_ns"] > 0


@pytest.mark.gpu
def test_gpu_resident_service_with_offload_and_pinning():
    # the resident kernel behind receivers and collectors that read and send runs (UDP_GRO /
    # UDP_SEGMENT), pinned: every sampled reply right, nothing lost, runs in and out, and the
    # host-side timings counted for every request
    models = {1: random_model(64, "binary", seed=21), 2: random_model(512, "ternary", seed=22)}
    with IsingServer(port=0, device="cuda", receivers=2, spin_us=20, offload=True,
                     pin=True) as s:  # fmt: skip
        for i, m in models.items():
            s.load_model(i, m)
        for i, n, count in ((1, 64, 4000), (2, 512, 1000)):
            rep = load_test(i, n, 40, seed=60, count=count, in_flight=256, senders=2,
                            port=s.port, offload=True, spin=True)  # fmt: skip
            assert (rep.completed, rep.lost, rep.errors) == (count, 0, 0)
            for k in range(0, count, 331):
                assert rep.energies[k] == reference(models[i], 40, 1, 0.5, 60 + k)[0]
        st = s.stats()
    assert st["runs_in"] > 0 and st["runs_out"] > 0
    assert st["fed"] == st["device_solved"] == 5000
    assert st["feed_wait_ns"] > 0 and st["reply_ns"] > st["device_solve_ns"]


@pytest.mark.gpu
@pytest.mark.parametrize("share", [True, "read,collect"])
def test_gpu_resident_service_sharing_and_tracing(share):
    # work sharing on (all: feeding by try-lock, collectors claiming slots and helping a stalled
    # peer, receivers reading a stalled peer's socket; or without the feeding), tracing and
    # isolation: every sampled reply right, each request answered once, fed == solved, every
    # answer traced
    model = random_model(64, "binary", seed=31)
    with IsingServer(port=0, device="cuda", receivers=2, collectors=3, spin_us=20, offload=True,
                     pin=True, trace=True, share=share, isolate=True) as s:  # fmt: skip
        s.load_model(1, model)
        rep = load_test(1, 64, 40, seed=80, count=6000, rate=200000.0, senders=2, port=s.port,
                        offload=True, spin=True)  # fmt: skip
        closed = load_test(1, 64, 40, seed=80, count=3000, in_flight=256, senders=2,
                           port=s.port)  # fmt: skip
        st = s.stats()
    assert rep.completed + rep.busy == 6000 and rep.lost == 0 and rep.errors == 0
    assert (closed.completed, closed.lost) == (3000, 0)
    for k in range(0, 3000, 271):
        assert closed.energies[k] == reference(model, 40, 1, 0.5, 80 + k)[0]
    assert st["fed"] == st["device_solved"] == st["ok"] == rep.completed + 3000
    assert st["trace_answered"] == st["ok"]
    assert sum(st[f"trace_hist{b}"] for b in range(8)) == st["ok"]
    assert sum(st[f"trace_arrival_hist{b}"] for b in range(8)) == st["trace_stamped"]
    assert {"thread_feed_stalls", "thread_coll2_stalls", "thread_rx1_stalls"} <= st.keys()
    assert st["share"] == (7 if share is True else 3)
    if share is not True:
        assert st["helped_feeds"] == 0


def test_tracing_sharing_and_isolation_on_the_cpu():
    # the echo and CPU workers behind two receivers with work sharing and isolation: nothing
    # lost, energies right; tracing counts every answer in the residence histogram and (the
    # kernel's receive stamps) in the histogram of the time since arrival, which is never
    # shorter; the slow ones (a 1 us threshold: nearly all of them) are broken down by stage;
    # reads of one datagram at most (rx_batch 1) lose nothing
    n = 32
    model = random_model(n, "binary", seed=12)
    for mode in ("echo", "cpu"):
        with IsingServer(port=0, workers=2, receivers=2, mode=mode, tcp_port=-1, spin_us=20,
                         pin=True, trace=True, slow_us=1.0, share=True, isolate=True,
                         rx_batch=1 if mode == "cpu" else 64) as s:  # fmt: skip
            s.load_model(1, model)
            rep = load_test(1, n, 10, seed=3, count=500, in_flight=16, senders=2, port=s.port,
                            spin=True)  # fmt: skip
            st = s.stats()
        assert (rep.completed, rep.lost) == (500, 0)
        if mode == "cpu":
            for i in (0, 1, 250, 499):
                assert rep.energies[i] == reference(model, 10, 1, 0.5, 3 + i)[0]
        assert st["trace_answered"] == 500 and 400 <= st["trace_slow"] <= 500
        assert sum(st[f"trace_hist{b}"] for b in range(8)) == 500
        assert st["trace_stamped"] == 500 and st["rx_batch"] == (1 if mode == "cpu" else 64)
        arrival = [st[f"trace_arrival_hist{b}"] for b in range(8)]
        residence = [st[f"trace_hist{b}"] for b in range(8)]
        assert sum(arrival) == 500 and np.all(np.cumsum(arrival) <= np.cumsum(residence))
        stages = ("socket", "recv", "read", "admit", "queue", "feed")
        dominant = sum(st[f"trace_dominant_{g}"] for g in stages)
        assert dominant == st["trace_slow"]
        assert st["trace_slow_feed_ns"] > 0 and st["trace_slow_us"] == 1
        assert rep.generator_stalls.shape == (2, 3)
        assert st["share"] == 7 and st["thread_rx0_stall_cpu_ns"] <= st["thread_rx0_stall_ns"]
    # sharing the reads only: a receiver also reads its peer's socket when that one stalls
    with IsingServer(port=0, workers=2, receivers=2, tcp_port=-1, spin_us=20, pin=True,
                     share="read") as s:  # fmt: skip
        s.load_model(1, model)
        rep = load_test(1, n, 10, seed=5, count=400, rate=20000.0, senders=2, port=s.port,
                        spin=True)  # fmt: skip
        st = s.stats()
    assert rep.completed + rep.busy == 400 and rep.lost == 0 and st["share"] == 1
    assert rep.energies[7] == reference(model, 10, 1, 0.5, 5 + 7)[0]
    assert (share_parts(True), share_parts(False), share_parts("collect,feed")) == (7, 0, 6)
    with pytest.raises(ValueError, match="share: unknown part"):
        IsingServer(port=0, share="reads")
    with pytest.raises(ValueError, match="slow_us"):
        IsingServer(port=0, slow_us=0)
    with pytest.raises(ValueError, match="rx_batch"):
        IsingServer(port=0, rx_batch=0)


def test_echo_answers_without_solving():
    with IsingServer(port=0, workers=1, mode="echo", tcp_port=-1, spin_us=10) as s:
        s.load_model(1, random_model(40, "binary", seed=1))
        rep = load_test(1, 40, 10, seed=1, count=200, in_flight=8, port=s.port)
        assert "echo" in s.info
    assert (rep.completed, rep.lost) == (200, 0) and np.all(rep.energies == 0)
    with pytest.raises(ValueError, match="spin_us"):
        IsingServer(port=0, spin_us=-1)
    with pytest.raises(ValueError, match="no mode"):
        IsingServer(port=0, mode="resident")


def test_open_loop_is_one_schedule_over_the_sockets():
    # open loop from several sockets: request i is due at the i-th arrival of one Poisson
    # process, so the requests leave in id order whichever socket sends them (apart from
    # arrivals closer together than a thread's wake-up), and the rate sent is the one asked for.
    # One Poisson process per socket would interleave them at random (about half of the
    # neighbours out of order with 3 sockets) and end when the slowest socket does.
    model = random_model(16, "binary", seed=2)
    with IsingServer(port=0, workers=1, tcp_port=-1) as s:
        s.load_model(1, model)
        rep = load_test(1, 16, 5, seed=7, count=600, rate=2000.0, senders=3, port=s.port)
    assert (rep.completed, rep.lost) == (600, 0)
    order = np.diff(rep.sent_ns)
    assert (order < 0).mean() < 0.25
    assert rep.sent_per_s == pytest.approx(600 / rep.send_s)
    assert rep.row()["sent_per_s"] == round(rep.sent_per_s, 1)
    assert 0.8 * 2000 < rep.sent_per_s < 1.25 * 2000
    assert rep.completed_per_s <= rep.sent_per_s


def test_several_receivers_and_senders():
    n = 48
    model = random_model(n, "ternary", seed=6)
    with IsingServer(port=0, workers=2, receivers=3, tcp_port=-1, spin_us=20) as s:
        s.load_model(1, model)
        rep = load_test(1, n, 20, seed=40, count=600, in_flight=12, senders=3, port=s.port)
        open_loop = load_test(1, n, 20, seed=40, count=300, rate=3000.0, senders=2, port=s.port,
                              spin=True)  # fmt: skip
    assert (rep.completed, rep.lost) == (600, 0)
    assert open_loop.completed + open_loop.busy == 300 and open_loop.lost == 0
    for i in (0, 1, 2, 301, 599):  # every socket's requests, right seeds
        assert rep.energies[i] == reference(model, 20, 1, 0.5, 40 + i)[0]
    with IsingServer(port=0, workers=2, receivers=3, tcp_port=-1) as s:
        s.load_model(1, model)
        one = load_test(1, n, 5, count=300, in_flight=8, port=s.port)  # one socket
        # a receiver counts a read after queueing its requests, so the last replies can reach
        # the client before their read is counted (seen on a loaded 2-core machine)
        deadline = time.monotonic() + 5.0
        while True:
            stats = s.stats()
            got = sum(stats[f"received_udp{r}"] for r in range(3))
            if got >= 300 or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    # spread by request id, not by the sender's address: one socket's requests reach all three
    assert one.completed == 300 and stats["spread_by_id"] == 1
    expect = np.bincount((np.arange(300) & 0xFF) % 3)  # the id's low byte modulo 3
    assert [stats[f"received_udp{r}"] for r in range(3)] == expect.tolist()
    with pytest.raises(ValueError, match="receivers"):
        IsingServer(port=0, receivers=0)


SOL_UDP, UDP_SEGMENT = 17, 103


def _send_run(sock, payloads, addr):
    """One UDP_SEGMENT send of equal-sized datagrams (the receiver sees them one by one, or as
    one run with UDP_GRO)."""
    size = len(payloads[0])
    assert all(len(p) == size for p in payloads)
    sock.sendmsg([b"".join(payloads)], [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", size))], 0, addr)


@pytest.mark.parametrize("offload", [False, True])
def test_a_run_of_requests_is_answered_one_by_one(offload):
    # A client's run of datagrams (one UDP_SEGMENT send) reaches a server with offload as one
    # piece (UDP_GRO) and one without as separate datagrams: either way every request gets its
    # own reply, the malformed one its error status.
    n, steps = 40, 25
    model = random_model(n, "binary", seed=3)
    reqs = [encode_request(1, n, steps, 2, 0.5, 70 + i, request_id=i) for i in range(5)]
    bad = bytearray(reqs[2])
    bad[0] ^= 0xFF  # magic
    reqs[2] = bytes(bad)
    with IsingServer(port=0, workers=2, tcp_port=-1, offload=offload) as s:
        s.load_model(1, model)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
            c.settimeout(10)
            _send_run(c, reqs, ("127.0.0.1", s.port))
            replies = {}
            while len(replies) < 5:  # one datagram a reply (this socket has no UDP_GRO)
                r = decode_reply(c.recv(65536))
                replies[r.request_id] = r
        stats = s.stats()
    assert stats["runs_in"] == (1 if offload else 0)  # read as one run, or five datagrams
    assert replies[2].status == "BAD_MAGIC" and stats["bad_magic"] == 1
    for i in (0, 1, 3, 4):
        assert replies[i].status == "OK"
        assert replies[i].energy == reference(model, steps, 2, 0.5, 70 + i)[0]
    assert stats["received"] == 5 and stats["ok"] == 4


@pytest.mark.parametrize(("server_offload", "client_offload"), [(True, True), (True, False),
                                                                (False, True)])  # fmt: skip
def test_offload_on_either_side_loses_nothing(server_offload, client_offload):
    # Replies sent as runs reach a client with or without UDP_GRO; requests sent as runs reach
    # a server with or without it; the load generator's sockets and the server's receivers and
    # workers pinned to CPUs; every sampled energy is the library's.
    n, steps = 64, 20
    model = random_model(n, "ternary", seed=8)
    with IsingServer(port=0, workers=2, receivers=2, tcp_port=-1, spin_us=20,
                     offload=server_offload, pin=True) as s:  # fmt: skip
        s.load_model(1, model)
        closed = load_test(1, n, steps, seed=5, count=400, in_flight=32, senders=2, port=s.port,
                           offload=client_offload, pin=True)  # fmt: skip
        opened = load_test(1, n, steps, seed=5, count=400, rate=20000.0, senders=2, port=s.port,
                           offload=client_offload, spin=True)  # fmt: skip
        stats = s.stats()
    assert (closed.completed, closed.lost, closed.errors) == (400, 0, 0)
    assert opened.completed + opened.busy == 400 and opened.lost == 0 and opened.errors == 0
    assert stats["received"] == 800
    if client_offload and server_offload:
        assert stats["runs_in"] > 0  # some of the closed loop's requests came as runs
    if server_offload:
        assert stats["runs_out"] > 0  # and some replies left as runs
    for i in (0, 1, 77, 398, 399):
        assert closed.energies[i] == reference(model, steps, 1, 0.5, 5 + i)[0]


def test_overload_with_offload_answers_busy_for_every_request_of_a_run():
    # A queue of depth 2 behind one slow worker: the requests of a run beyond the room get
    # BUSY, each its own; busy + completed = sent, nothing lost.
    n = 256
    with IsingServer(port=0, workers=1, depth=2, tcp_port=-1, offload=True) as s:
        s.load_model(1, random_model(n, seed=1))
        rep = load_test(1, n, steps=400, replicas=8, count=300, rate=1e6, port=s.port,
                        offload=True)  # fmt: skip
        stats = s.stats()
    assert rep.lost == 0 and rep.busy > 0 and rep.completed > 0
    assert rep.busy + rep.completed == rep.sent == 300
    assert stats["busy"] == rep.busy and stats["queue_peak"] <= 2
