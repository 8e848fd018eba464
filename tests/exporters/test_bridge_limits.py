"""The tracker bridge's limits, served for real on 127.0.0.1 at a free port: OTLP/JSON bombs of
every value kind refused before they are parsed, bodies that stall answered in seconds, one
address's share of the request slots, senders that reset their connection summed up (no
tracebacks), the warning for a bridge listening beyond loopback without a token, and the cap on
runs (tracker folders). Every test bounds its own time with socket timeouts and deadlines."""

from __future__ import annotations

import gzip
import http.client
import io
import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from test_bridge import get, logs_request, make_bridge, post, restore_registry  # noqa: F401 - fixtures

from otel_rl import environment_variables as ENV
from otel_rl.bridge import BridgeConfig
from otel_rl.trackers.jsonl import read_jsonl

_JSON_BOMB_BYTES = 7 << 20  # inflated; under the 8 MiB OTLP/JSON limit, so the counting has to refuse it


def json_bomb(kind: str) -> bytes:
    """About 7 MiB of one JSON value kind inside an OTLP-shaped object, gzipped (~10-30 KB)."""
    n = _JSON_BOMB_BYTES
    if kind == "nested arrays":
        inner = b"[" * (n // 2) + b"]" * (n // 2)
    elif kind == "deep but small":
        inner = b"[" * 200 + b"]" * 200
    elif kind == "objects":
        inner = b"[" + b"{}," * (n // 3) + b"{}]"
    elif kind == "strings":
        inner = b"[" + b'"a",' * (n // 4) + b'"a"]'
    elif kind == "numbers":
        inner = b"[" + b"0," * (n // 2) + b"0]"
    elif kind == "literals":
        inner = b"[" + b"null,true," * (n // 10) + b"false]"
    else:
        raise ValueError(kind)
    return gzip.compress(b'{"resourceLogs":[],"padding":' + inner + b"}", compresslevel=9)


def post_from(source: str, port: int, body: bytes, headers: dict[str, str], timeout: float = 10.0) -> int:
    """POST /v1/logs to 127.0.0.1:port from the loopback address ``source`` (127.0.0.x): another "host"."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))
    try:
        conn.request("POST", "/v1/logs", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def stall_from(source: str, port: int, length: int = 1000, sent: bytes = b"") -> socket.socket:
    """A sender that announces ``length`` body bytes, sends ``sent`` of them, and stops."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    head = f"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: {length}\r\n\r\n"
    sock.sendall(head.encode() + sent)
    return sock


def status_of(sock: socket.socket) -> int | None:
    """The status of the answer on ``sock`` (None when the bridge closed without one)."""
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return None
        data += chunk
    return int(data.split(b" ", 2)[1])


PROTOBUF = {"Content-Type": "application/x-protobuf"}


@pytest.fixture(autouse=True)
def _no_token(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(ENV.OTEL_RL_BRIDGE_TOKEN, raising=False)
    yield


# ---- OTLP/JSON: every value kind counted before it is parsed --------------------------------------


@pytest.mark.parametrize("kind", ["nested arrays", "deep but small", "objects", "strings", "numbers", "literals"])
def test_a_json_bomb_of_each_value_kind_is_refused_with_413_before_it_is_parsed(make_bridge, kind: str) -> None:
    bridge = make_bridge({"track_with": "stdout"})
    bomb = json_bomb(kind)
    assert len(bomb) < 64 << 10
    me = psutil.Process()
    before = me.memory_info().rss
    start = time.monotonic()
    status, _, body = post(f"{bridge.url}/v1/logs", bomb, content_type="application/json", encoding="gzip", timeout=30)
    took = time.monotonic() - start
    grown_mb = (me.memory_info().rss - before) >> 20
    print(f"\n{kind}: {len(bomb)} B gzip -> {status} in {took:.2f} s, RSS +{grown_mb} MB")
    assert status == 413, body
    message = json.loads(body)["message"]
    assert ("limit of 128" if kind == "deep but small" else "over 1000000 values") in message, message
    assert took < 5, f"{took:.1f} s to refuse {kind}"  # counted in C-speed passes: well under a second alone
    assert grown_mb < 150, f"{grown_mb} MB for one {kind} bomb"
    # and a genuine OTLP/JSON request still goes through
    from google.protobuf import json_format

    genuine = json_format.MessageToJson(logs_request("after-bomb", range(1, 3))).encode()
    assert post(f"{bridge.url}/v1/logs", genuine, content_type="application/json")[0] == 200


def _walk(value: object, depth: int = 1) -> tuple[dict[str, int], int]:
    """Values by kind (object keys as strings) and the nesting depth of what json.loads built."""
    kinds = {"objects": 0, "arrays": 0, "strings": 0, "numbers": 0, "literals": 0}
    deepest = depth if isinstance(value, (dict, list)) else depth - 1
    if isinstance(value, dict):
        kinds["objects"] += 1
        kinds["strings"] += len(value)
        children = list(value.values())
    elif isinstance(value, list):
        kinds["arrays"] += 1
        children = value
    else:
        children = []
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")
        kinds["strings" if isinstance(value, str) else "numbers" if is_number else "literals"] += 1
    for child in children:
        child_kinds, child_depth = _walk(child, depth + 1)
        for kind, n in child_kinds.items():
            kinds[kind] += n
        deepest = max(deepest, child_depth)
    return kinds, deepest


@pytest.mark.parametrize(
    "text",
    [
        '{"resourceLogs":[{"resource":{"attributes":[{"key":"rl.run.id","value":{"stringValue":"r,1:[{"}}]}}]}',
        '["a\\"b", "c\\\\", "\\\\\\"", "\\u00e9\\n{", "é, [ü]: 1"]',
        '[1, -2.5e-3, 0, 1E+9, true, false, null, NaN, Infinity, [], {}, [[[{"x": [1, {"y": null}]}]]]]',
        '{"k": "true false null 123 {[,:]}", "n": [10, 20, 30], "t": [true, true], "e": {"": ""}}',
    ],
)
def test_the_json_counts_are_exactly_what_json_loads_builds(text: str) -> None:
    from otel_rl.bridge.json_scan import count_json

    body = text.encode()
    want_kinds, want_depth = _walk(json.loads(body))
    counts = count_json(body)
    kinds = {k: getattr(counts, k) for k in want_kinds}
    assert (kinds, counts.depth) == (want_kinds, want_depth)


# ---- a body that stops arriving ----------------------------------------------------------------


def wait_slots_free(bridge, deadline_s: float = 5.0) -> None:
    """The handler frees its slot right after its answer is sent: wait for that event, not a fixed time."""
    deadline = time.monotonic() + deadline_s
    while bridge.stats()["requests_in_flight"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bridge.stats()["requests_in_flight"] == 0


def test_a_body_that_stops_arriving_is_answered_408_within_body_timeout_s_and_frees_its_slot(make_bridge) -> None:
    assert BridgeConfig(track_with="stdout").body_timeout_s <= 10  # the default: seconds, not a minute
    bridge = make_bridge({"track_with": "stdout", "body_timeout_s": 1, "max_requests_in_flight": 1, "max_requests_per_client": 1})
    port = bridge.address[1]
    start = time.monotonic()
    stalled = stall_from("127.0.0.1", port, sent=b"\x0a")
    try:
        assert status_of(stalled) == 408
    finally:
        stalled.close()
    took = time.monotonic() - start
    print(f"\na stalled body held its slot {took:.2f} s (body_timeout_s 1)")
    assert took < 4
    wait_slots_free(bridge)
    # a trickle (a byte every 0.4 s, so never quiet for 1 s) is cut off too: too slow, not just quiet
    trickle = stall_from("127.0.0.1", port, length=1000)
    start = time.monotonic()
    try:
        answer = None
        for _ in range(25):
            try:
                trickle.sendall(b"\x0a")
            except OSError:
                break
            trickle.settimeout(0.4)
            try:
                answer = status_of(trickle)
                break
            except TimeoutError:
                continue
        assert answer == 408 and time.monotonic() - start < 5
    finally:
        trickle.close()
    wait_slots_free(bridge)
    assert post(f"{bridge.url}/v1/logs", logs_request("after-stall", range(1, 2)).SerializeToString())[0] == 200
    assert bridge.stats()["stalled_bodies"] == 2


# ---- one address's share of the request slots --------------------------------------------------


def test_one_address_cannot_hold_every_slot_and_a_freed_slot_goes_to_another_address(make_bridge) -> None:
    bridge = make_bridge({"track_with": "stdout", "max_requests_in_flight": 4, "body_timeout_s": 1.5})
    port = bridge.address[1]
    genuine = logs_request("genuine", range(1, 2)).SerializeToString()
    flood = [stall_from("127.0.0.2", port) for _ in range(4)]  # one host: only 2 of these get a slot
    try:
        time.sleep(0.3)
        assert bridge.stats()["client_share_refusals"] == 2
        start = time.monotonic()
        assert post_from("127.0.0.1", port, genuine, PROTOBUF) == 200
        assert time.monotonic() - start < 1  # free slots were left for other addresses: no wait
        # two hosts now hold every slot; a request from a third waits for the first slot freed
        flood += [stall_from("127.0.0.3", port) for _ in range(2)]
        time.sleep(0.3)
        assert bridge.stats()["requests_in_flight"] == 4
        start = time.monotonic()
        assert post_from("127.0.0.1", port, genuine, PROTOBUF) == 200
        assert time.monotonic() - start < 4
    finally:
        for sock in flood:
            sock.close()


def test_a_freed_slot_goes_to_the_address_holding_fewest() -> None:
    from otel_rl.bridge.admission import ClientSlots

    slots = ClientSlots(total=2, per_client=3, wait_s=5)
    held = [slots.acquire("busy").slot, slots.acquire("busy").slot]
    assert all(held)
    order: list[str] = []

    def wait(client: str) -> None:
        if slots.acquire(client).admitted:
            order.append(client)

    busy_again = threading.Thread(target=wait, args=("busy",))  # waits first, but its address holds two
    busy_again.start()
    time.sleep(0.2)
    quiet = threading.Thread(target=wait, args=("quiet",))
    quiet.start()
    time.sleep(0.2)
    slots.release(held[0])  # type: ignore[arg-type]
    quiet.join(5)
    assert order == ["quiet"]
    slots.release(held[1])  # type: ignore[arg-type]
    busy_again.join(5)
    assert order == ["quiet", "busy"]


def test_among_addresses_holding_nothing_a_freed_slot_goes_to_the_one_that_used_fewest_slot_seconds_lately() -> None:
    """A host that asks again the moment it is answered always has a request waiting, so it asked
    first; a sender with a small batch now and then still goes before it."""
    from otel_rl.bridge.admission import ClientSlots

    slots = ClientSlots(total=1, per_client=1, wait_s=5)
    heavy = slots.acquire("heavy").slot
    assert heavy is not None
    time.sleep(0.3)  # 0.3 slot-seconds used
    slots.release(heavy)
    other = slots.acquire("other").slot
    assert other is not None
    order: list[str] = []

    def wait(client: str) -> None:
        if slots.acquire(client).admitted:
            order.append(client)

    heavy_again = threading.Thread(target=wait, args=("heavy",))
    heavy_again.start()
    time.sleep(0.2)  # heavy waits first
    light = threading.Thread(target=wait, args=("light",))
    light.start()
    time.sleep(0.2)
    slots.release(other)
    light.join(5)
    assert order == ["light"]


def test_the_usage_remembered_stays_bounded_over_many_addresses_and_keeps_the_busiest() -> None:
    from otel_rl.bridge import admission
    from otel_rl.bridge.admission import ClientSlots

    slots = ClientSlots(total=1, per_client=1, wait_s=5)
    heavy = slots.acquire("heavy").slot
    assert heavy is not None
    time.sleep(0.05)
    slots.release(heavy)
    for n in range(3 * admission._USAGE_KEPT):  # one short request from each of many addresses
        slot = slots.acquire(f"10.0.{n // 256}.{n % 256}").slot
        assert slot is not None
        slots.release(slot)
    assert len(slots._usage) <= admission._USAGE_KEPT
    assert "heavy" in slots._usage


def test_a_slow_body_is_cut_off_for_a_waiting_address_and_a_fast_one_never() -> None:
    from otel_rl.bridge.admission import ClientSlots

    slots = ClientSlots(total=2, per_client=2, wait_s=3)
    slow, fast = slots.acquire("slow").slot, slots.acquire("slow").slot
    assert slow is not None and fast is not None
    cut: list[str] = []
    now = time.monotonic()
    slow.reading_since, slow.received, slow.cut = now - 3, 300_000, lambda: cut.append("slow")  # 100 KB/s
    fast.reading_since, fast.received, fast.cut = now - 3, 30 << 20, lambda: cut.append("fast")  # 10 MiB/s
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(slots.acquire("genuine")))
    waiter.start()
    time.sleep(slots.cut_after_s + 0.3)
    assert cut == ["slow"]  # once, the slow one only
    slots.release(slow)
    waiter.join(5)
    assert got and got[0].admitted  # type: ignore[attr-defined]
    # a body arriving fast enough is never cut, however long another waits
    busy = ClientSlots(total=1, per_client=1, wait_s=0.8)
    held = busy.acquire("x").slot
    assert held is not None
    held.reading_since, held.received, held.cut = time.monotonic() - 3, 10 << 20, lambda: cut.append("x")
    assert not busy.acquire("y").admitted
    assert cut == ["slow"]


def test_the_connection_table_caps_an_address_and_gives_an_idle_place_to_a_quieter_one() -> None:
    from otel_rl.bridge.connections import ConnectionTable

    class Sock:
        def __init__(self) -> None:
            self.shut = False

        def shutdown(self, how: int) -> None:
            self.shut = True

    table = ConnectionTable(total=4, per_client=3)
    hostile = [Sock() for _ in range(3)]
    assert all(table.admit("hostile", s) for s in hostile)
    assert not table.admit("hostile", Sock())  # over its address's share
    busy = Sock()
    assert table.admit("other", busy)
    table.busy(hostile[0], True)  # handling a request: never given up
    genuine = Sock()
    assert table.admit("genuine", genuine)  # every place taken: the busiest address's idle one gives way
    assert [s.shut for s in hostile] == [False, True, False]
    assert table.counts() == (4, 3)
    # an address as busy as the newcomer's would be gives nothing up
    assert not table.admit("other", Sock())
    table.close(genuine)
    assert table.counts() == (3, 2)


# ---- senders that reset their connection -------------------------------------------------------


def _reset_mid_body(port: int) -> None:
    sock = stall_from("127.0.0.1", port, length=10_000, sent=b"\x0a" * 100)
    time.sleep(0.01)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    sock.close()


def test_senders_that_reset_mid_body_are_counted_and_summed_up_not_each_a_traceback(
    make_bridge, capfd: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = make_bridge({"track_with": "stdout", "max_requests_in_flight": 8})
    port = bridge.address[1]
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        for _ in range(120):
            _reset_mid_body(port)
        deadline = time.monotonic() + 10
        while bridge.stats()["client_disconnects"] < 100 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert post(f"{bridge.url}/v1/logs", logs_request("after-resets", range(1, 2)).SerializeToString())[0] == 200
        during = [r.getMessage() for r in caplog.records if "left or stalled" in r.getMessage()]
        bridge.close()
    stats = bridge.stats()
    err = capfd.readouterr().err
    print(f"\n{stats['client_disconnects']} resets counted, {len(during)} line(s) printed while they came")
    assert "Traceback" not in err and "ConnectionResetError" not in err, err[-2000:]
    assert stats["client_disconnects"] >= 100
    assert len(during) == 1 and len(during[0]) < 300, during  # the first, then at most one a minute
    summaries = [r.getMessage() for r in caplog.records if "left or stalled" in r.getMessage()]
    assert len(summaries) == 2 and "reset" in summaries[1]  # the rest, summed up at shutdown


# ---- listening beyond loopback without a token --------------------------------------------------


def test_listening_beyond_loopback_without_a_token_warns_once_naming_the_variable(
    make_bridge, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def warnings_for(settings: dict, out: io.StringIO | None = None) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="otel_rl"):
            make_bridge({"track_with": "stdout", **settings}, out=out)
        return [r.getMessage() for r in caplog.records if ENV.OTEL_RL_BRIDGE_TOKEN in r.getMessage()]

    assert warnings_for({"listen": "127.0.0.1:0"}) == []
    (warning,) = warnings_for({"listen": "0.0.0.0:0"})
    assert "without a token" in warning and "beyond this machine" in warning
    token = "tok-" + "z" * 28
    monkeypatch.setenv(ENV.OTEL_RL_BRIDGE_TOKEN, token)
    out = io.StringIO()
    assert warnings_for({"listen": "0.0.0.0:0"}, out) == []
    assert token not in out.getvalue() and all(token not in r.getMessage() for r in caplog.records)


# ---- the cap on runs (tracker folders) -----------------------------------------------------------


def test_new_run_ids_past_max_runs_are_refused_with_507_never_acknowledged_and_nothing_is_deleted(make_bridge, tmp_path: Path) -> None:
    out = io.StringIO()
    bridge = make_bridge({"track_with": "jsonl", "tracker_kwargs": {"log_dir": str(tmp_path / "jl")}, "max_runs": 3}, out=out)
    url = f"{bridge.url}/v1/logs"
    statuses = []
    for n in range(8):
        statuses.append(post(url, logs_request(f"run-{n}", range(1, 3)).SerializeToString())[0])
        assert bridge.wait_idle()  # each request delivered before the next (the worker takes its run on)
    # the first three runs are taken on; the later ones are answered 507 (not retried as they are), never 200
    assert statuses == [200, 200, 200, 507, 507, 507, 507, 507], statuses
    assert post(url, logs_request("run-0", range(3, 4)).SerializeToString())[0] == 200  # a run taken on goes on
    assert bridge.wait_idle()
    bridge.close()
    assert sorted(p.name for p in (tmp_path / "jl").iterdir()) == ["run-0", "run-1", "run-2"]
    assert [s for s, _ in read_jsonl(tmp_path / "jl" / "run-0" / "metrics.jsonl")] == [1, 2, 3]
    stats = bridge.stats()
    assert stats["runs"] == 3 and stats["requests_over_max_runs"] == 5
    assert BridgeConfig(track_with="stdout").max_runs == 256


def test_a_run_idle_past_run_idle_timeout_gives_its_place_back(make_bridge, tmp_path: Path) -> None:
    import time

    bridge = make_bridge(
        {"track_with": "jsonl", "tracker_kwargs": {"log_dir": str(tmp_path / "jl")}, "max_runs": 2, "run_idle_timeout_s": 1.0}
    )
    url = f"{bridge.url}/v1/logs"
    for n in range(2):  # two runs of one record each (a flood of run ids) take every place
        assert post(url, logs_request(f"flood-{n}", range(1, 2)).SerializeToString())[0] == 200
    assert bridge.wait_idle()
    assert post(url, logs_request("genuine", range(1, 2)).SerializeToString())[0] == 507  # told, not dropped behind a 200
    deadline = time.monotonic() + 30
    status = 507
    while status == 507 and time.monotonic() < deadline:  # the flood's runs finish after 1 s idle and give their places back
        time.sleep(0.5)
        status = post(url, logs_request("genuine", range(1, 11)).SerializeToString())[0]
    assert status == 200
    assert bridge.wait_idle()
    bridge.close()
    assert [s for s, _ in read_jsonl(tmp_path / "jl" / "genuine" / "metrics.jsonl")] == list(range(1, 11))
    assert bridge.stats()["runs_given_back"] >= 1


def test_a_new_run_acknowledged_while_the_worker_is_busy_keeps_its_place(make_bridge, tmp_path: Path, restore_registry: None) -> None:
    """200 means delivered: a run answered 200 before the worker took it on is not pushed past
    max_runs by requests answered after it."""
    from test_bridge import MemoryTracker

    from otel_rl.trackers.base import register_tracker

    release = threading.Event()

    class Gated(MemoryTracker):
        name = "gated"

        def log(self, values, step=None):  # type: ignore[no-untyped-def]
            release.wait(30)  # the worker is held on the first run's first step
            super().log(values, step)

    register_tracker("gated", Gated)
    bridge = make_bridge({"track_with": ["gated", "jsonl"], "tracker_kwargs": {"jsonl": {"log_dir": str(tmp_path / "jl")}}, "max_runs": 2})
    url = f"{bridge.url}/v1/logs"
    statuses = [post(url, logs_request(f"run-{n}", range(1, 2)).SerializeToString())[0] for n in range(4)]
    release.set()
    assert statuses == [200, 200, 507, 507], statuses
    assert bridge.wait_idle()
    bridge.close()
    assert sorted(p.name for p in (tmp_path / "jl").iterdir()) == ["run-0", "run-1"]
    assert bridge.stats()["records_over_max_runs"] == 0  # nothing acknowledged was dropped


def test_a_run_past_max_run_mb_is_answered_507_and_what_it_wrote_stays(
    make_bridge, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = make_bridge({"track_with": "jsonl", "tracker_kwargs": {"log_dir": str(tmp_path / "jl")}, "max_run_mb": 0.05})
    url = f"{bridge.url}/v1/logs"
    statuses = []
    with caplog.at_level(logging.WARNING, logger="otel_rl"):
        for step in range(1, 60):
            statuses.append(post(url, logs_request("big", range(step, step + 1), keys=50).SerializeToString())[0])
            assert bridge.wait_idle()
        other = post(url, logs_request("other", range(1, 2)).SerializeToString())[0]
    first_refused = statuses.index(507)
    assert 10 < first_refused and set(statuses[first_refused:]) == {507}, statuses  # refused from then on, never acknowledged
    assert other == 200  # another run has its own budget
    bridge.close()
    written = [s for s, _ in read_jsonl(tmp_path / "jl" / "big" / "metrics.jsonl")]
    assert written == list(range(1, first_refused + 1))
    assert (tmp_path / "jl" / "big" / "metrics.jsonl").stat().st_size < 0.05 * 2**20 * 1.5
    stats = bridge.stats()
    assert stats["requests_over_max_runs"] == len(statuses) - first_refused and stats["records_bad"] == 0
    assert BridgeConfig(track_with="stdout").max_run_mb == 1024


def test_bodies_past_the_collectors_20_mib_are_refused_before_they_are_decoded(make_bridge) -> None:
    bridge = make_bridge({"track_with": "stdout"})
    body = gzip.compress(logs_request("big", range(1, 2)).SerializeToString() + b"\x00" * (21 << 20))
    status, _, answer = post(f"{bridge.url}/v1/logs", body, encoding="gzip")
    assert status == 413 and b"20971520" in answer, answer[:200]


def test_inflate_in_pieces_gives_the_body_back_whole_and_stops_past_the_limit() -> None:
    import zlib

    from otel_rl.bridge.request_decode import BadRequest, inflate

    data = bytes(range(256)) * 20_000 + b"tail"  # 5 MB: several 1 MiB pieces
    assert inflate(gzip.compress(data), "gzip", len(data)) == data
    assert inflate(zlib.compress(data), "deflate", len(data)) == data
    with pytest.raises(BadRequest) as refused:
        inflate(gzip.compress(data), "gzip", len(data) - 1)
    assert refused.value.status == 413


def test_the_bridge_command_tells_glibc_to_give_large_buffers_back() -> None:
    import platform

    from otel_rl.bridge.allocator import give_large_buffers_back

    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert give_large_buffers_back() is expected


def test_cutting_off_a_body_whose_sender_already_left_does_not_fail_the_waiting_request() -> None:
    from otel_rl.bridge.admission import ClientSlots

    slots = ClientSlots(total=1, per_client=1, wait_s=1.0)
    gone = slots.acquire("slow").slot
    assert gone is not None

    def closed_socket() -> None:
        raise OSError(9, "Bad file descriptor")

    gone.reading_since, gone.received, gone.cut = time.monotonic() - 3, 10, closed_socket
    assert slots.acquire("genuine").admitted is False  # refused after its wait, not raised into its handler
    assert gone.was_cut
