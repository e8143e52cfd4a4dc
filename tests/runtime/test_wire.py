"""The agent control wire: typed frames that round-trip exactly and never run code, a channel
whose every wait ends by its deadline, and a handshake that proves the token both ways."""

import contextlib
import gc
import pickle
import socket
import threading
import time
import weakref

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenplex.ir.errors import TenplexError
from tenplex.runtime.agent import channel as ch
from tenplex.runtime.agent.wire import MAGIC, PREFIX, WireError, decode, encode


def roundtrip(value):
    header, buffers = encode(value)
    return decode(header, [memoryview(bytearray(b)) for b in buffers])


def same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float) and isinstance(b, float) and a != a:
        return b != b
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


CASES = {
    "scalars": [None, True, False, 0, -1, 2**100, 1.5, "ünï", ""],
    "non_finite": [float("inf"), float("-inf"), float("nan")],
    "tuple_keys": {("w/tp0", 3): 1, ("b", 0): [1, (2, 3)]},
    "dollar_keys": {"$a": 1, "$t": [1], "x": {"$m": 2}},
    "int_keys": {1: "a", 2: "b"},
    "bytes": b"\x00\xffworker-address",
    "arrays": [np.arange(12, dtype=np.float32).reshape(3, 4), np.zeros((0, 5), np.int64), np.array(3.5),
               (np.arange(6) % 3).astype(ml_dtypes.bfloat16).reshape(2, 3), np.asfortranarray(np.eye(3, dtype=np.int8)),
               np.array([True, False]), np.arange(4, dtype=np.complex64)],  # fmt: skip
    "numpy_scalars": [np.float32(1.25), np.int64(-7), np.bool_(True)],
    "plan_like": {"ops": [{"id": 0, "kind": "copy", "box": [[0, 4], [0, 4]]}], "stats": {"rounds": 1}},
}


@pytest.mark.parametrize("name", CASES)
def test_values_roundtrip_with_their_types(name):
    value = CASES[name]
    assert same(roundtrip(value), value)


json_leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=8)
values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4) | st.integers() | st.tuples(st.text(max_size=3), st.integers()), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


@given(values)
def test_any_nested_value_roundtrips(value):
    assert same(roundtrip(value), value)


@pytest.mark.parametrize("value, message", [
    (object(), "cannot send a builtins.object over the agent wire"),
    (np.array([object()]), "dtype 'object' is not a numeric dtype"),
    ({1, 2}, "cannot send a builtins.set"),
    (lambda: 0, "cannot send a builtins.function"),
])  # fmt: skip
def test_what_the_wire_does_not_carry_is_refused_before_sending(value, message):
    with pytest.raises(WireError, match=message):
        encode(value)


@pytest.mark.parametrize("header, buffers, message", [
    (b"not json", [], "malformed control frame"),
    (b'{"v": 1}', [], 'frame header must be'),
    (b'{"v": {"$b": 3}, "n": []}', [], "buffer index 3 outside the frame's 0 buffers"),
    (b'{"v": {"$a": 0, "dtype": "object", "shape": [1]}, "n": [8]}', [b"x" * 8], "dtype 'object' is not a numeric dtype"),
    (b'{"v": {"$a": 0, "dtype": "float32", "shape": [3]}, "n": [8]}', [b"x" * 8], r"float32\[3\] does not fit its 8 B buffer"),
    (b'{"v": {"$a": 0, "dtype": "float32", "shape": [-1]}, "n": [4]}', [b"x" * 4], "is not a list of non-negative integers"),
    (b'{"v": {"$f": "1e999"}, "n": []}', [], "float tag '1e999' is not inf, -inf or nan"),
    (b'{"v": NaN, "n": []}', [], "NaN is not a JSON number"),
    (b'{"v": {"$m": [[[1], 2]]}, "n": []}', [], "dict key \\[1\\] is not hashable"),
    (b"[" * 100000 + b"]" * 100000, [], "malformed control frame"),
])  # fmt: skip
def test_malformed_frames_raise_wire_errors(header, buffers, message):
    with pytest.raises(WireError, match=message):
        decode(header, [memoryview(b) for b in buffers])


@given(st.binary(max_size=200), st.lists(st.binary(max_size=16), max_size=3))
def test_random_frames_decode_or_raise_wire_errors(header, buffers):
    with contextlib.suppress(WireError):
        decode(header, [memoryview(b) for b in buffers])


class Boom:
    def __reduce__(self):
        return (exec, ("open('/tmp/tenplex-pwned', 'w').write('x')",))


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    left, right = ch.Channel(a, "left"), ch.Channel(b, "right")
    yield left, right
    left.close()
    right.close()


def test_a_pickle_on_the_wire_is_refused_and_never_run(pair, tmp_path):
    left, right = pair
    marker = "/tmp/tenplex-pwned"
    with contextlib.suppress(FileNotFoundError):
        __import__("os").unlink(marker)
    left.sock.sendall(pickle.dumps(Boom()))
    with pytest.raises(ch.ChannelError, match="not a tenplex control frame"):
        right.recv(2.0)
    assert not __import__("os").path.exists(marker)


def test_an_encoded_frame_holds_its_arrays_only_while_its_buffers_live():
    """Arrays sent over the wire are freed when the sender drops the frame, by reference counting
    alone: a reference cycle around the buffers (a recursive closure) kept every array of every
    load and fetch alive until the cyclic collector ran, ~1 GiB per Runtime in the agents bench."""
    class Owned(np.ndarray):  # a weakref-able array that owns its memory
        pass

    array = np.arange(1 << 16, dtype=np.float32).view(Owned)
    freed = weakref.ref(array)
    enabled = gc.isenabled()
    gc.disable()
    try:
        header, buffers = encode({"arrays": {"w": array}, "nested": [(array, 1)]})
        del array
        assert freed() is not None  # the buffers still reference it
        del buffers
        assert freed() is None, "the encoded frame's arrays outlived its buffers (a reference cycle)"
    finally:
        if enabled:
            gc.enable()


def test_frames_cross_a_socket_and_arrays_stay_exact(pair):
    left, right = pair
    state = {("w/tp0", 0): np.arange(1 << 16, dtype=np.float32), ("b", 1): np.ones(3, ml_dtypes.bfloat16)}
    threading.Thread(target=left.send, args=({"cmd": "load", "args": {"arrays": state}}, 5.0)).start()
    got = right.recv(5.0)
    assert got["cmd"] == "load" and same(got["args"]["arrays"], state)


def test_a_peer_that_never_reads_ends_send_by_its_deadline(pair):
    left, _ = pair
    start = time.monotonic()
    with pytest.raises(ch.ChannelError, match="took no bytes for 1 s"):
        left.send({"x": np.zeros(64 << 20, np.uint8)}, idle=1.0)
    assert time.monotonic() - start < 5 and left.closed


def test_a_peer_that_never_writes_ends_recv_by_its_deadline(pair):
    _, right = pair
    start = time.monotonic()
    with pytest.raises(ch.ChannelError, match="sent nothing for 1 s"):
        right.recv(idle=1.0)
    assert time.monotonic() - start < 5


def test_a_peer_that_stops_in_the_middle_of_a_frame_is_named(pair):
    left, right = pair
    left.sock.sendall(PREFIX.pack(MAGIC, 100, 0) + b'{"v"')
    left.close()
    with pytest.raises(ch.ChannelError, match="right: closed by the peer in the middle of a frame"):
        right.recv(2.0)


def _agent_side(listener, token, out):
    try:
        while (channel := ch.accept(listener, "h0", token)) is None:
            pass
        out["channel"] = channel
        out["request"] = channel.recv(5.0)
    except ch.ChannelError as e:
        out["error"] = str(e)


@pytest.mark.parametrize("agent_token, runtime_token, error", [
    ("s3cret", "s3cret", None),
    ("s3cret", "wrong", "rejected the connection"),
    ("s3cret", None, "needs a token"),
])  # fmt: skip
def test_the_handshake_proves_the_token(tmp_path, agent_token, runtime_token, error):
    listener = ch.listen("127.0.0.1:0", agent_token)
    port = listener.getsockname()[1]
    out = {}
    thread = threading.Thread(target=_agent_side, args=(listener, agent_token, out))
    thread.start()
    try:
        if error is None:
            channel, name = ch.dial(f"127.0.0.1:{port}", runtime_token, 5.0)
            channel.send({"cmd": "name", "args": {}}, 5.0)
            thread.join(10)
            assert name == "h0" and out["request"] == {"cmd": "name", "args": {}}
            channel.close()
        else:
            with pytest.raises(TenplexError, match=error):
                ch.dial(f"127.0.0.1:{port}", runtime_token, 5.0)
    finally:
        thread.join(10)
        listener.close()
        if "channel" in out:
            out["channel"].close()


def test_an_agent_that_does_not_know_the_token_cannot_fool_the_runtime():
    listener = ch.listen("127.0.0.1:0", "anything")
    port = listener.getsockname()[1]

    def impostor():
        sock, _ = listener.accept()
        fake = ch.Channel(sock, "runtime")
        fake.send({"hello": "tenplex-agent", "version": 1, "name": "h0", "challenge": b"c" * 32, "token": True}, 5.0)
        fake.recv(5.0)
        fake.send({"ok": True, "proof": "0" * 64}, 5.0)
        time.sleep(0.5)
        fake.close()

    thread = threading.Thread(target=impostor)
    thread.start()
    with pytest.raises(TenplexError, match="did not prove it knows the token"):
        ch.dial(f"127.0.0.1:{port}", "s3cret", 5.0)
    thread.join(10)
    listener.close()


def test_an_idle_client_is_dropped_after_the_handshake_deadline():
    listener = ch.listen("127.0.0.1:0", "s3cret")
    port = listener.getsockname()[1]
    idle = socket.create_connection(("127.0.0.1", port))
    start = time.monotonic()
    try:
        with pytest.raises(ch.ChannelError, match="sent nothing"):
            while ch.accept(listener, "h0", "s3cret") is None:
                pass
        assert ch.HANDSHAKE_S - 0.5 < time.monotonic() - start < ch.HANDSHAKE_S + 3
    finally:
        idle.close()
        listener.close()


def test_a_stale_unix_socket_is_replaced_and_a_live_one_is_refused(tmp_path):
    path = str(tmp_path / "run" / "h0.sock")
    dead = ch.listen(path, None)  # the directory is made
    dead.close()  # a killed agent leaves its socket file behind
    live = ch.listen(path, None)
    try:
        with pytest.raises(ch.ChannelError, match=f"control socket {path} is in use by another agent"):
            ch.listen(path, None)
    finally:
        live.close()


def test_heartbeats_come_only_while_a_command_runs_and_before_its_reply(pair, monkeypatch):
    """One beat thread per connection (not one per command): it beats every BEAT_S while a
    command is busy, never once it ended, and restarts its count for the next command."""
    from tenplex.runtime.agent import beat as heartbeat
    from tenplex.runtime.agent.agent import Agent

    monkeypatch.setattr(heartbeat, "BEAT_S", 0.2)
    agent_end, runtime_end = pair
    agent = Agent("h0")
    try:
        with heartbeat.Heartbeat(agent_end, agent) as beat:
            for _ in range(2):
                with beat.busy():
                    time.sleep(0.7)  # about three beats (fewer on a loaded machine)
                agent_end.send({"ok": "reply"}, 5.0)
                got = [runtime_end.recv(5.0, 5.0)]
                while "ok" not in got[-1]:
                    got.append(runtime_end.recv(5.0, 5.0))
                assert len(got) >= 2 and got[:-1] == [{"beat": n, "done": 0} for n in range(1, len(got))]
            time.sleep(0.5)  # idle: no beat
            runtime_end.sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                runtime_end.sock.recv(1)
    finally:
        agent.stop()


def test_a_beat_keeps_no_execution_alive(pair, monkeypatch):
    """A beat reads the execution's progress and lets go of it: the beat thread held the last
    beat's `Execution` until its next beat, and with it the views of the dst arena, so a dropped
    tag's arena could not go back to the pool and the next execution faulted a new one in."""
    from tenplex.runtime.agent import beat as heartbeat
    from tenplex.runtime.agent.agent import Agent

    class Running:  # what a beat reads of an `Execution`
        done = 1

    monkeypatch.setattr(heartbeat, "BEAT_S", 0.05)
    agent_end, runtime_end = pair
    agent = Agent("h0")
    try:
        with heartbeat.Heartbeat(agent_end, agent) as beat:
            agent.execution = Running()
            held = weakref.ref(agent.execution)
            with beat.busy():
                assert runtime_end.recv(5.0, 5.0) == {"beat": 1, "done": 1}
            agent.execution = None  # the commit forgets it
            assert held() is None
    finally:
        agent.stop()


def test_call_all_encodes_every_command_before_sending_any_and_fails_only_what_cannot_travel(monkeypatch):
    """`call_all` encodes all frames first (an agent that got its command would otherwise compete
    for the CPU with the encoding of the next ones); a host whose arguments the wire cannot carry
    fails alone, with the wire's reason, and the others run their command."""
    from tenplex.runtime.agent import client

    events = []
    frame, send_frame = client.frame, ch.Channel.send_frame
    monkeypatch.setattr(client, "frame", lambda value: events.append("encode") or frame(value))
    def sending(self, *args):
        if self.peer.startswith("agent"):  # the runtime's ends (the agents' threads answer through the others)
            events.append("send")
        send_frame(self, *args)

    monkeypatch.setattr(ch.Channel, "send_frame", sending)
    agents, ends, threads = {}, [], []
    for host in ("h0", "h1", "h2"):
        a, b = socket.socketpair()
        agents[host] = client.AgentHandle(host, None, ch.Channel(a, f"agent {host}"))
        ends.append(ch.Channel(b, "runtime"))

        def answer(end=ends[-1]):
            with contextlib.suppress(ch.ChannelError):
                request = end.recv(5.0, 5.0)
                end.send({"ok": [request["cmd"], request["args"]["n"]]}, 5.0)

        threads.append(threading.Thread(target=answer, daemon=True))
        threads[-1].start()
    calls = {"h0": ("name", {"n": 0}), "h1": ("name", {"n": object()}), "h2": ("name", {"n": 2})}
    try:
        with pytest.raises(client.AgentFailures) as failed:
            client.call_all(agents, calls, 10.0)
        assert [h for h, _ in failed.value.failures] == ["h1"]
        assert "cannot send a builtins.object" in failed.value.failures[0][1]
        # then one cancel frame, encoded once, to each host still running (`client._cancel`)
        assert events == ["encode"] * 3 + ["send"] * 2 + ["encode"] + ["send"] * 2
        agents["h1"].channel.close()  # h1 got nothing: its answer thread ends at the EOF
        for t in threads:
            t.join(5.0)
        assert agents["h0"].dead is None and agents["h2"].dead is None
    finally:
        for c in [*ends, *(a.channel for a in agents.values())]:
            c.close()


def test_call_all_returns_every_reply():
    from tenplex.runtime.agent import client

    agents, ends = {}, []
    for host in ("h0", "h1"):
        a, b = socket.socketpair()
        agents[host] = client.AgentHandle(host, None, ch.Channel(a, f"agent {host}"))
        end = ch.Channel(b, "runtime")
        ends.append(end)
        threading.Thread(target=lambda end=end: end.send({"ok": end.recv(5.0, 5.0)["args"]}, 5.0), daemon=True).start()
    try:
        assert client.call_all(agents, {"h0": ("name", {"n": 0}), "h1": ("name", {"n": 1})}, 10.0) == {
            "h0": {"n": 0}, "h1": {"n": 1}}  # fmt: skip
    finally:
        for c in [*ends, *(a.channel for a in agents.values())]:
            c.close()
