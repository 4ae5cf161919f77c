"""Helpers for the admission scenarios: a server whose budget is set to the
exact cost of a chosen number of tokens, using the costs the server itself
reports (/v1/models memory profile, /v1/admission budget)."""
import json
import socket

from conftest import Server

DEVICE = "virt:0=12MiB"
BUDGET_TOKENS = 200  # the budget B equals the cost of this many tokens


def cost_of(profile, tokens):
    """The server's worst-case cost of a request of `tokens` (prompt +
    max_tokens, max_tokens >= 1), in integers: with a paged KV cache
    (profile["kv_blocks"], from /v1/admission) whole blocks of the positions
    it fills (the last token generated takes none; admission/kv_reservation.hpp),
    else the per-token formula (admission/memory_profile.hpp)."""
    kv = profile.get("kv_blocks")
    if kv:
        return -(-(tokens - 1) // kv["block_tokens"]) * kv["block_bytes"]
    raw = tokens * profile["kv_bytes_per_token"] + profile["sequence_overhead_bytes"]
    millionths = round(profile["safety_factor"] * 1_000_000)
    return (raw * millionths + 999_999) // 1_000_000


def never_fits(profile, budget):
    """The fewest tokens whose cost is over `budget`."""
    return next(t for t in range(2, 1 << 20) if cost_of(profile, t) > budget)


def kv_pool_bytes(device):
    """Bytes of a device's KV block pool (0 without one), from /v1/admission."""
    kv = device.get("kv_blocks")
    return kv["total"] * kv["block_bytes"] if kv else 0


def within_pool(device, budget):
    """What a device's effective budget is at `budget`: the whole blocks of
    its pool that fit in it, when it has one."""
    kv = device.get("kv_blocks")
    return budget // kv["block_bytes"] * kv["block_bytes"] if kv else budget


def profile_of(server, device=0):
    """The model's memory profile (/v1/models) with the device's KV blocks."""
    profile = server.get("/v1/models").json()["data"][0]
    profile["kv_blocks"] = server.admission()["devices"][device].get("kv_blocks")
    return profile


def budget_server(make_server, *extra):
    """Starts a server whose budget is exactly cost_of(BUDGET_TOKENS)."""
    probe = Server("--device", DEVICE, *extra)
    try:
        profile = profile_of(probe)
        b0 = probe.admission()["devices"][0]["budget_bytes"]
    finally:
        probe.stop()
    target = cost_of(profile, BUDGET_TOKENS)
    assert b0 > target, f"device too small for the scenarios: budget {b0} < {target}"
    server = make_server("--device", DEVICE, "--memory-reserve", str(b0 - target), *extra)
    server.profile = profile
    server.budget = server.admission()["devices"][0]["budget_bytes"]
    server.never_fits = never_fits(profile, server.budget)
    assert server.budget == target
    return server


def body_for_tokens(tokens, prompt_len=4, **kw):
    """A request whose prompt + max_tokens is `tokens` (byte-level model)."""
    return dict({"prompt": "x" * prompt_len, "max_tokens": tokens - prompt_len, "ignore_eos": True}, **kw)


def open_request(port, body):
    """Sends a completion on a raw socket and returns it unread."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def read_status(sock):
    buf = b""
    while b"\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
    return int(buf.split(b" ", 2)[1]) if buf.startswith(b"HTTP/1.1 ") else None


def idle(server):
    """Nothing running, queued or reserved."""
    a = server.admission()
    return a["running"] == 0 and a["queued"] == 0 and a["devices"][0]["reserved_bytes"] == 0


def check_invariants(server):
    """I1 and I2 once all clients are done (callers wait for idleness first)."""
    a = server.admission()
    d = a["devices"][0]
    assert d["peak_reserved_bytes"] <= d["budget_bytes"], a           # I1
    assert a["out_of_memory"] == 0, a                                    # I1
    assert a["running"] == 0 and a["queued"] == 0, a                # I2
    assert d["reserved_bytes"] == 0, a                                   # I2
    r = server.post("/v1/completions", body_for_tokens(20))            # I2: a new small one runs
    assert r.status_code == 200, r.text
    assert server.get("/health").status_code == 200                     # I3
