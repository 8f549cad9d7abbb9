"""The dSB request service: many small solves against resident models, over UDP and TCP.

A server holds models in slots by id. A request names a model, optionally replaces its field h
(int16 per spin), and asks for B replicas of `steps` dSB steps with a given dt and seed; the reply
carries the best energy, the best spins and the time the request spent in the server. Replica b
of a request is exactly replica b of ``solve(model_with_h, agents=B, steps, dt, seed)``, so every
reply can be checked against the library (`reference`).

Wire format (little-endian; the C++ header ``cuscikit/dsb_protocol.hpp`` is the reference):

- request, 48 bytes then the payload: u32 magic 0x31425344 ("DSB1"), u16 version 1, u16 flags
  (bit 0 LOAD), u64 request_id, u32 model_id, u32 n, u32 steps, u16 replicas, u16 payload_type
  (0 none, 1 h as int16[n]; for LOAD 2 binary couplings as the upper triangle's +1 bits in u32
  words, 3 int8 couplings as the upper triangle's bytes), f32 dt, u64 seed, u32 payload_len;
- reply, 32 bytes then ceil(n/32) u32 spin words when the status is OK: u32 magic, u16 version,
  u16 status, u64 request_id, i64 energy, u32 residence_ns, u32 n.

Statuses: 0 OK, 1 BUSY (the queue is full: the request was not run; ask again), 2 BAD_MAGIC,
3 BAD_VERSION, 4 BAD_LENGTH, 5 TOO_LARGE, 6 BAD_PARAM, 7 NO_MODEL. A request is limited to
B * n_p <= 4096 (n_p: n rounded up to 32) and a model to 4096 spins (512 KiB over the wire).
Over TCP every message is framed by a u32 length.

Example (a 4-cycle, served on an ephemeral port):
    >>> from cuscikit.ising import IsingModel
    >>> from cuscikit.ising.service import IsingServer, Client
    >>> m = IsingModel.from_edges(4, [(0, 1, 1), (1, 2, 1), (2, 3, 1), (3, 0, 1)])
    >>> with IsingServer(port=0, workers=1) as server:
    ...     server.load_model(7, m)
    ...     with Client(port=server.port) as client:
    ...         reply = client.solve(7, n=4, steps=50, replicas=4, seed=1)
    >>> reply.status, reply.energy
    ('OK', -4)
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass, field

import numpy as np

from cuscikit.ising.model import IsingModel

__all__ = [
    "Client",
    "IsingServer",
    "LoadReport",
    "Reply",
    "STATUS",
    "decode_reply",
    "encode_load",
    "encode_request",
    "load_test",
    "reference",
]

MAGIC = 0x31425344
VERSION = 1
FLAG_LOAD = 1
REQUEST = struct.Struct("<IHHQIIIHHfQI")  # 48 bytes
REPLY = struct.Struct("<IHHQqII")  # 32 bytes
STATUS = ("OK", "BUSY", "BAD_MAGIC", "BAD_VERSION", "BAD_LENGTH", "TOO_LARGE", "BAD_PARAM",
          "NO_MODEL")  # fmt: skip
MAX_N = 4096
MAX_PAIRS = 4096
DEFAULT_PORT = 47600
PAYLOAD_NONE, PAYLOAD_H, PAYLOAD_BINARY, PAYLOAD_INT8 = 0, 1, 2, 3

assert REQUEST.size == 48 and REPLY.size == 32


def _field_payload(h, n: int) -> tuple[int, bytes]:
    if h is None:
        return PAYLOAD_NONE, b""
    h = np.asarray(h)
    if h.shape != (n,):
        raise ValueError(f"h must have shape ({n},), got {h.shape}")
    if not np.all(np.isfinite(h)) or np.any(h != np.round(h)):
        raise ValueError("h must be integers")
    if np.abs(h).max(initial=0) > 32767:
        raise ValueError("h must fit in int16 (|h_i| <= 32767)")
    return PAYLOAD_H, h.astype("<i2").tobytes()


def encode_request(
    model_id: int,
    n: int,
    steps: int,
    replicas: int = 1,
    dt: float = 0.5,
    seed: int = 0,
    h=None,
    request_id: int = 0,
) -> bytes:
    """The bytes of one solve request (h: None for the model's own field, else n integers).

    Example:
        >>> len(encode_request(1, n=64, steps=100, h=[0] * 64))
        176
    """
    ptype, payload = _field_payload(h, n)
    head = REQUEST.pack(
        MAGIC, VERSION, 0, request_id, model_id, n, steps, replicas, ptype, dt, seed, len(payload)
    )
    return head + payload


def encode_load(model_id: int, model: IsingModel, request_id: int = 0) -> bytes:
    """The bytes of a LOAD request that puts `model` (binary or int8 couplings, zero field)
    into slot `model_id`.

    Raises:
        ValueError: a field, couplings outside [-127, 127], or a model too large for the wire.
    """
    n = model.n
    if not model.exact or np.any(model.h):
        raise ValueError("LOAD carries integer couplings with |J| <= 127 and no field")
    iu = np.triu_indices(n, 1)
    upper = np.asarray(model.J.toarray()[iu])
    if model.kind == "binary":
        bits = np.zeros(32 * ((upper.size + 31) // 32), np.uint8)
        bits[: upper.size] = upper > 0
        payload, ptype = np.packbits(bits, bitorder="little").tobytes(), PAYLOAD_BINARY
    else:
        payload, ptype = upper.astype(np.int8).tobytes(), PAYLOAD_INT8
    if len(payload) > 512 * 1024:
        raise ValueError(f"the model needs {len(payload)} bytes, above the 512 KiB of a slot")
    head = REQUEST.pack(MAGIC, VERSION, FLAG_LOAD, request_id, model_id, n, 0, 0, ptype, 0.0, 0,
                        len(payload))  # fmt: skip
    return head + payload


@dataclass
class Reply:
    """A decoded reply: status name, request id, best energy, server residence (ns), and the
    best spins (+1/-1, n of them) when the status is OK."""

    status: str
    request_id: int
    energy: int
    residence_ns: int
    spins: np.ndarray | None


def decode_reply(data: bytes) -> Reply:
    """Parse the bytes of a reply.

    Raises:
        ValueError: too short, a wrong magic or version, or spin words missing.
    """
    if len(data) < REPLY.size:
        raise ValueError(f"a reply has at least {REPLY.size} bytes, got {len(data)}")
    magic, version, status, rid, energy, residence, n = REPLY.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise ValueError("not a dSB service reply (magic or version)")
    spins = None
    if status == 0:
        words = (n + 31) // 32
        if len(data) != REPLY.size + 4 * words:
            raise ValueError(f"a reply for n = {n} has {REPLY.size + 4 * words} bytes")
        w = np.frombuffer(data, "<u4", words, REPLY.size)
        bits = np.unpackbits(w.view(np.uint8), bitorder="little")[:n]
        spins = (2 * bits.astype(np.int8) - 1).astype(np.int8)
    name = STATUS[status] if status < len(STATUS) else f"STATUS_{status}"
    return Reply(name, rid, energy, residence, spins)


def reference(model: IsingModel, steps: int, replicas: int = 1, dt: float = 0.5, seed: int = 0,
              h=None) -> tuple[int, np.ndarray]:  # fmt: skip
    """What the service answers for a request, computed with the library's own CPU kernel:
    (best energy, best spins) of ``solve`` with `replicas` agents on the model with field h.

    Example:
        >>> m = IsingModel.from_edges(3, [(0, 1, 1), (1, 2, 1)])
        >>> reference(m, steps=20, replicas=2, seed=3)[0]
        -2
    """
    from cuscikit.ising.solver import run_kernel, unpack_signs

    if h is not None:
        _field_payload(h, model.n)  # the same checks as the wire
        model = IsingModel(model.J, h=np.asarray(h), source=model.source)
    _, _, best_e, best_words, _, _ = run_kernel(model, replicas, steps, dt, seed, 1.0, "cpu")
    b = int(np.argmin(best_e))
    return int(best_e[b]), unpack_signs(best_words[b : b + 1], model.n)[0]


SHARE_PARTS = {"read": 1, "collect": 2, "feed": 4}


def share_parts(share) -> int:
    """The server's work-sharing mask for `share`: True (every part), False / None / "" (none),
    or parts of ``SHARE_PARTS`` as a comma-separated string ("all" for every part) or a
    sequence.

    >>> share_parts(True), share_parts(False), share_parts("read,collect"), share_parts(["feed"])
    (7, 0, 3, 4)
    """
    if share is None or share is False or share == "":
        return 0
    if share is True or share == "all":
        return sum(SHARE_PARTS.values())
    parts = share.split(",") if isinstance(share, str) else list(share)
    mask = 0
    for part in parts:
        part = part.strip() if isinstance(part, str) else part
        if part not in SHARE_PARTS:
            raise ValueError(
                f"share: unknown part {part!r} (parts: {', '.join(SHARE_PARTS)}, or True / 'all')"
            )
        mask |= SHARE_PARTS[part]
    return mask


def _core_ising():
    from cuscikit.backends.loader import core

    ext = core().ising
    if not hasattr(ext, "Server"):
        raise RuntimeError("this build of cuscikit has no dSB service (it needs Linux sockets)")
    return ext


class IsingServer:
    """The dSB request service: UDP on `port`, TCP on `tcp_port` (default: the same number), a
    queue of `depth` requests beyond which requests are answered BUSY at once, and a backend:

    - ``device="cpu"``: `workers` threads, each running the C++ reference on one request
      (``mode="echo"``: the workers answer at once with energy 0 and no solve, a measurement of
      the sockets and the load generator alone);
    - ``device="cuda", mode="resident"`` (default on the GPU): a persistent kernel, one warp per
      small request (binary or ternary couplings, B * n_p <= 256) and one thread block per
      other request, fed through two rings in mapped host memory (4096 slots for the warp-sized
      requests, 1024 for the others; `blocks`
      persistent blocks, 0 = as many as fit on the GPU at once; `collectors` reply threads);
    - ``device="cuda", mode="launch"``: the baseline, one kernel launch per request on each of
      `streams` threads.

    Every backend gives the same reply bytes (those of `reference`).

    Args:
        host: IPv4 address to bind (default loopback).
        port: UDP port (0: any free port; read it back from `port`).
        tcp_port: TCP port (None: the UDP port's number, or any free port when port is 0;
            -1: no TCP).
        workers: CPU solver threads (default: the cores this process may use, less one).
        depth: queue depth.
        device, mode, blocks, streams: the backend (above).
        receivers: UDP sockets on the same port (SO_REUSEPORT), each with a receiver thread;
            a datagram goes to receiver (low byte of its request id) mod `receivers` (where
            the kernel refuses that filter: by the hash of the client's address).
        collectors: resident GPU mode: threads that scan the rings for finished requests and
            send their replies.
        spin_us: receivers and workers waiting for work spin this many microseconds before
            they block (no wake-up latency under load, a core each; 0: block at once).
        offload: UDP segmentation offload: the replies of one batch to one client leave as one
            UDP_SEGMENT send (the client still receives separate datagrams), and a run of
            requests a client sent that way is read in one piece (UDP_GRO). Falls back to
            datagram by datagram where the kernel refuses it.
        pin: pin each receiver and worker thread to its own CPU (of those the process may use,
            in order: receivers, then workers).
        trace: record each request's stage times (socket: waiting in the receive socket
            since the kernel's arrival stamp, recv: the read call, read, admit, queue, feed,
            kernel, device, reply) and break down those slower than `slow_us` in `stats()`
            (``trace_*``; ``trace_arrival_hist*``: time from arrival to reply); the per-thread
            stall counters (``thread_<name>_*``) are kept either way.
        slow_us: the time since arrival (where the kernel stamped it; else the residence)
            above which a traced request counts as slow.
        rx_batch: the most datagrams (with `offload`: runs of them) one read of a receiver
            takes, 1 .. 1024.
        share: work sharing, so that one stalled thread holds few requests back: True (all
            parts), False, or some of the parts "read", "collect", "feed" (a comma-separated
            string or a sequence). read: a receiver also reads a peer's socket that nobody
            read for 50 us; collect (resident GPU mode): a collector also scans the slots of a
            peer that has not made a pass for 50 us (each finished slot claimed once); feed
            (resident GPU mode): feeding is taken by a try-lock, 16 requests at a time, by the
            feeder or (after 50 us without it) a collector.
        isolate: with `pin`, move every other thread of the process (the caller's, the TCP
            threads, the GPU runtime's) onto the CPUs that no pinned thread uses, if any.

    Use it as a context manager, or call `start` and `close`. While a resident GPU server runs,
    its kernel occupies the GPU: other CUDA work of the process must use non-default streams.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        tcp_port: int | None = None,
        workers: int | None = None,
        depth: int = 4096,
        device: str = "cpu",
        mode: str | None = None,
        blocks: int = 0,
        streams: int = 4,
        receivers: int = 1,
        collectors: int = 4,
        spin_us: float = 0.0,
        offload: bool = False,
        pin: bool = False,
        trace: bool = False,
        slow_us: float = 200.0,
        share: bool | str | tuple = False,
        isolate: bool = False,
        rx_batch: int = 64,
    ):
        if workers is None:
            workers = max(1, len(os.sched_getaffinity(0)) - 1)
        for name, v, least in (("workers", workers, 1), ("depth", depth, 1),
                               ("blocks", blocks, 0), ("streams", streams, 1),
                               ("receivers", receivers, 1),
                               ("collectors", collectors, 1)):  # fmt: skip
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {v!r}")
        for name, p in (("port", port), ("tcp_port", tcp_port)):
            if p is not None and not (isinstance(p, int) and -1 <= p <= 65535):
                raise ValueError(f"{name} must be a port number, got {p!r}")
        if not isinstance(spin_us, int | float) or not 0 <= spin_us <= 1e6:
            raise ValueError(f"spin_us must be a number in [0, 1e6], got {spin_us!r}")
        if not isinstance(rx_batch, int) or isinstance(rx_batch, bool) or not 1 <= rx_batch <= 1024:
            raise ValueError(f"rx_batch must be an integer in [1, 1024], got {rx_batch!r}")
        if not isinstance(slow_us, int | float) or not 0 < slow_us <= 1e7:
            raise ValueError(f"slow_us must be a number in (0, 1e7], got {slow_us!r}")
        share_mask = share_parts(share)
        if device == "cpu":
            if mode not in (None, "cpu", "echo"):
                raise ValueError(f"the CPU service has no mode {mode!r}")
            ext, mode, param = _core_ising(), mode or "cpu", workers
        elif device == "cuda":
            mode = mode or "resident"
            if mode not in ("resident", "launch"):
                raise ValueError(f"mode must be 'resident' or 'launch' on the GPU, got {mode!r}")
            from cuscikit.backends.loader import cuda

            ext = cuda().ising
            param = blocks if mode == "resident" else streams
        else:
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        tcp = port if tcp_port is None else tcp_port
        try:
            self._server = ext.Server(host, port, tcp, depth, mode, param, receivers, collectors,
                                      float(spin_us), bool(offload), bool(pin), bool(trace),
                                      float(slow_us), share_mask, bool(isolate),
                                      rx_batch)  # fmt: skip
        except RuntimeError as exc:
            raise OSError(f"cannot serve on {host}:{port}: {exc}") from None
        self.host = host
        self.device = device
        self.mode = mode
        self.workers = workers if device == "cpu" else None
        self.depth = depth
        self.models: dict[int, IsingModel] = {}

    @property
    def info(self) -> str:
        """The backend, in words."""
        return self._server.info

    @property
    def port(self) -> int:
        """The UDP port served."""
        return self._server.udp_port

    @property
    def tcp_port(self) -> int:
        """The TCP port served (-1: none)."""
        return self._server.tcp_port

    def load_model(self, model_id: int, model: IsingModel) -> None:
        """Put `model` (exact couplings, at most 4096 spins) into slot `model_id`, replacing
        what was there; requests already queued finish with the model they were given."""
        if not isinstance(model, IsingModel):
            raise ValueError(f"model must be an IsingModel, got {type(model).__name__}")
        if not model.exact:
            raise ValueError("the service takes integer couplings (|J| <= 127) only")
        if model.n > MAX_N:
            raise ValueError(f"the service takes models of at most {MAX_N} spins, got {model.n}")
        if not 0 <= model_id < 2**32:
            raise ValueError(f"model_id must fit in 32 bits, got {model_id}")
        a = model.coupling_arrays()
        jnorm2 = model.jnorm2
        self._server.load_model(
            model_id, a["kind"], model.n, a["plus"], a["minus"], a["degree"], a["j8"], a["h"],
            jnorm2,
        )  # fmt: skip
        self.models[model_id] = model

    def start(self) -> IsingServer:
        """Start serving (the receiver, the TCP listener and the workers)."""
        self._server.start()
        return self

    def stats(self) -> dict:
        """Counters: requests received, replies by status, LOADs, the queue's peak depth."""
        return dict(self._server.stats())

    def close(self) -> None:
        """Stop serving (requests in the queue are finished first) and release the ports."""
        self._server.stop()

    def __enter__(self) -> IsingServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class Client:
    """A simple blocking client (one request at a time) over UDP, or TCP with ``tcp=True``.

    Args:
        host, port: the server.
        timeout: seconds to wait for a reply (UDP replies can be lost: raise TimeoutError).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, tcp: bool = False,
                 timeout: float = 5.0):  # fmt: skip
        self.tcp = tcp
        kind = socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM
        self.sock = socket.socket(socket.AF_INET, kind)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self._next_id = 1

    def send(self, data: bytes) -> Reply:
        """Send raw request bytes and wait for the reply."""
        if self.tcp:
            self.sock.sendall(struct.pack("<I", len(data)) + data)
            (size,) = struct.unpack("<I", self._recv_exact(4))
            return decode_reply(self._recv_exact(size))
        self.sock.send(data)
        return decode_reply(self.sock.recv(65536))

    def _recv_exact(self, size: int) -> bytes:
        buf = b""
        while len(buf) < size:
            chunk = self.sock.recv(size - len(buf))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buf += chunk
        return buf

    def solve(self, model_id: int, n: int, steps: int, replicas: int = 1, dt: float = 0.5,
              seed: int = 0, h=None) -> Reply:  # fmt: skip
        """One request; see `encode_request`."""
        rid, self._next_id = self._next_id, self._next_id + 1
        return self.send(encode_request(model_id, n, steps, replicas, dt, seed, h, rid))

    def load(self, model_id: int, model: IsingModel) -> Reply:
        """Load or replace a model over the wire (use TCP for models above ~64 KiB)."""
        rid, self._next_id = self._next_id, self._next_id + 1
        return self.send(encode_load(model_id, model, rid))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class LoadReport:
    """What `load_test` measured. Times in microseconds; rates per second.

    send_s: from the schedule's start to the last send; sent_per_s = sent / send_s, the rate
    the generator offered in fact (open loop: the Poisson schedule's own, within a few tenths of
    a per cent of `offered` over 10^5 requests and more, plus any lateness of the sender).
    completed_per_s: OK replies / the time from the schedule's start to the last OK reply (a
    window that begins before the first request and ends with the last reply, so a run with
    nothing lost reads slightly below sent_per_s)."""

    offered: float | None
    in_flight: int | None
    sent: int
    completed: int
    busy: int
    errors: int
    lost: int
    send_s: float
    completed_per_s: float
    rtt_us: dict = field(default_factory=dict)
    residence_us: dict = field(default_factory=dict)
    energies: np.ndarray | None = None
    # per sending thread (spin only): passes of its loop more than 50 us apart, as
    # (count, total us, longest us): the generator's own stalls
    generator_stalls: np.ndarray | None = None
    # per request: when it was sent (ns since the start) and its round trip (ns; -1: none)
    sent_ns: np.ndarray | None = None
    rtt_ns: np.ndarray | None = None

    @property
    def loss(self) -> float:
        return self.lost / self.sent if self.sent else 0.0

    @property
    def sent_per_s(self) -> float:
        return self.sent / self.send_s if self.send_s > 0 else 0.0

    def row(self) -> dict:
        return {
            "offered_per_s": self.offered,
            "in_flight": self.in_flight,
            "sent": self.sent,
            "completed": self.completed,
            "sent_per_s": round(self.sent_per_s, 1),
            "completed_per_s": round(self.completed_per_s, 1),
            "busy": self.busy,
            "errors": self.errors,
            "lost": self.lost,
            "loss": self.loss,
            **{f"rtt_{k}_us": v for k, v in self.rtt_us.items()},
            **{f"residence_{k}_us": v for k, v in self.residence_us.items()},
        }


def _percentiles(ns: np.ndarray) -> dict:
    if ns.size == 0:
        return {"p50": None, "p99": None, "p999": None}
    q = np.percentile(ns / 1e3, [50, 99, 99.9])
    return {"p50": round(float(q[0]), 1), "p99": round(float(q[1]), 1),
            "p999": round(float(q[2]), 1)}  # fmt: skip


def load_test(
    model_id: int,
    n: int,
    steps: int,
    replicas: int = 1,
    dt: float = 0.5,
    seed: int = 0,
    h=None,
    count: int = 10000,
    rate: float | None = None,
    in_flight: int | None = None,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    drain_s: float = 1.0,
    senders: int = 1,
    spin: bool = False,
    offload: bool = False,
    pin: bool = False,
) -> LoadReport:
    """Load a server with `count` requests (request i has seed ``seed + i``) from a C++ sender
    and receiver: open loop with Poisson arrivals at `rate` per second (request i due at the
    i-th arrival of one Poisson process, whichever socket sends it), or closed loop with
    `in_flight` requests outstanding, from `senders` sockets (each with one thread that sends
    and receives; request i on socket i % senders). A request still without a reply once
    nothing has been sent or received on its socket for `drain_s` seconds is lost. Completed =
    OK replies; BUSY and error replies are counted apart. spin: the threads spin on
    non-blocking reads instead of sleeping between sends (a core each; no wake-up latency in
    the round trip). offload: the requests due at once leave as one UDP_SEGMENT send, and
    replies sent that way are read in one piece (UDP_GRO). pin: each thread on its own CPU.

    Example (closed loop against a CPU server):
        >>> m = IsingModel.from_edges(3, [(0, 1, 1), (1, 2, 1)])
        >>> with IsingServer(port=0, workers=1, tcp_port=-1) as s:
        ...     s.load_model(1, m)
        ...     rep = load_test(1, 3, steps=10, count=50, in_flight=4, port=s.port)
        >>> rep.completed, rep.lost
        (50, 0)

    Raises:
        ValueError: neither or both of rate and in_flight, or bad request fields.
    """
    if (rate is None) == (in_flight is None):
        raise ValueError("give exactly one of rate (open loop) and in_flight (closed loop)")
    if rate is not None and not (np.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be positive, got {rate!r}")
    if in_flight is not None and (not isinstance(in_flight, int) or in_flight < 1):
        raise ValueError(f"in_flight must be a positive integer, got {in_flight!r}")
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive integer, got {count!r}")
    if not isinstance(senders, int) or senders < 1:
        raise ValueError(f"senders must be a positive integer, got {senders!r}")
    request = encode_request(model_id, n, steps, replicas, dt, seed, h)
    sent, rtt, status, residence, energy, send_s, stalls = _core_ising().loadgen(
        host, port, request, count, float(rate or 0.0), int(in_flight or 0), drain_s, seed,
        senders, bool(spin), bool(offload), bool(pin),
    )  # fmt: skip
    answered = rtt >= 0
    ok = answered & (status == 0)
    completed = int(ok.sum())
    span_ns = float((sent[ok] + rtt[ok]).max()) if completed else 0.0
    return LoadReport(
        offered=rate,
        in_flight=in_flight,
        sent=int((sent >= 0).sum()),
        completed=completed,
        busy=int((answered & (status == 1)).sum()),
        errors=int((answered & (status > 1)).sum()),
        lost=int((~answered).sum()),
        send_s=float(send_s),
        completed_per_s=completed / (span_ns / 1e9) if span_ns > 0 else 0.0,
        rtt_us=_percentiles(rtt[ok]),
        residence_us=_percentiles(residence[ok].astype(np.float64)),
        energies=np.where(ok, energy, np.iinfo(np.int64).max),
        generator_stalls=stalls * np.array([1, 1e-3, 1e-3]),
        sent_ns=sent,
        rtt_ns=np.where(ok, rtt, -1),
    )
