"""Booked retries end to end (docs/admission-and-memory.md "Booked retries"): a request refused as
overloaded books a place for its retry; the retry is recognised by its
X-Retry-Token, its Idempotency-Key or (same client, same body) its body, and
takes its place ahead of later arrivals; early retries are told the time left,
late ones find the booking released; keys, and clients behind a trusted proxy,
get fair shares; a fresh request (x-stainless-retry-count: 0) never takes a
booking by its body; every refusal says whether a retry can help. One sequence at a time (--max-batch 1) and a step
delay make device time, not CPU, bound throughput; the test waits on the
server's own state, never on sleeps."""
import concurrent.futures
import json
import math

from conftest import wait_until

KEYS = """sk-alpha-0001
sk-beta-0002
"""

SLOW = ("--max-batch", "1", "--test-step-delay-ms", "20")


def auth(key):
    return {"Authorization": f"Bearer {key}"}


def blocker(tokens=100):
    return dict(prompt="block", max_tokens=tokens, ignore_eos=True)


def small(text):
    return dict(prompt=text, max_tokens=2)


def bookings(server, headers=None):
    return server.get("/v1/admission", headers=headers or {}).json()["retry_bookings"]


def request_log(server):
    out = []
    for line in server.logs().splitlines():
        i = line.find(" request {")
        if i >= 0:
            out.append(json.loads(line[i + len(" request "):]))
    return out


def logged_claims(server, n):
    """How the claimed retries were recognised, sorted, once the request log
    holds `n` of them (a request's line is written as it ends, which may be
    after its client has the answer)."""
    claims = lambda: sorted(l["retry"] for l in request_log(server) if l.get("retry"))  # noqa: E731
    wait_until(lambda: len(claims()) >= n, what=f"{n} claimed retries in the request log")
    return claims()


def check_overloaded(r, booked=True):
    """A 503 with the four headers, its body repeating the promise and place."""
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["type"] == "overloaded"
    ms = int(r.headers["retry-after-ms"])
    assert ms >= 1
    assert int(r.headers["Retry-After"]) == max(1, math.ceil(ms / 1000))
    assert r.headers["x-should-retry"] == "true"
    assert err["retry_after_ms"] == ms
    assert err["retry_position"] >= 1
    assert err["retry_booked"] is booked
    if booked:
        assert r.headers["X-Retry-Token"] == err["retry_token"]
        assert err["retry_token"].startswith("rt_")
    else:
        assert "X-Retry-Token" not in r.headers
        assert "retry_token" not in err
    return err


def fill(server, pool, queued=1, headers=None):
    """One blocker running and `queued` more waiting: the queue is full."""
    running = [pool.submit(server.post, "/v1/completions", blocker(50), headers=headers)]
    wait_until(lambda: server.get("/v1/admission", headers=headers or {}).json()["running"] == 1,
               what="the blocker running")
    for i in range(queued):
        running.append(pool.submit(server.post, "/v1/completions", blocker(40), headers=headers))
        wait_until(lambda: server.get("/v1/admission", headers=headers or {}).json()["queue_depth"] == i + 1,
                   what=f"{i + 1} waiting")
    return running


def test_retry_by_token_takes_its_held_place_ahead_of_later_arrivals(make_server, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text(KEYS)
    # --retry-early 60: the booked place is held from the refusal on, and a
    # retry sent at any time before its promise is inside its window.
    server = make_server(*SLOW, "--max-queue", "1", "--retry-early", "60", "--api-keys", str(keys))
    alpha, beta = auth("sk-alpha-0001"), auth("sk-beta-0002")
    admission = lambda: server.get("/v1/admission", headers=alpha).json()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        work = fill(server, pool, headers=alpha)
        err = check_overloaded(server.post("/v1/completions", small("c"), headers=alpha))
        assert err["retry_position"] == 2  # behind the waiting request
        assert "retry booked" in err["message"]
        token = err["retry_token"]
        # The waiting request starts: its queue place is free, but held for
        # the booked retry, so a later arrival is refused and promised the
        # place after it.
        wait_until(lambda: admission()["queue_depth"] == 0 and admission()["completed"] >= 1,
                   what="the waiting request started")
        later = check_overloaded(server.post("/v1/completions", small("d"), headers=beta))
        assert "1 places booked for retries" in later["message"], later["message"]
        assert later["retry_position"] == 2
        # A token sent with another body is a bad request, not a place.
        wrong = server.post("/v1/completions", small("other"), headers={**beta, "X-Retry-Token": later["retry_token"]})
        assert wrong.status_code == 400, wrong.text
        assert wrong.headers["x-should-retry"] == "false"
        assert "X-Retry-Token" in wrong.json()["error"]["message"]
        # Another key with the token (and the same body) is the retry: the
        # token, not the client, recognises it; it takes the held place.
        retry = server.post("/v1/completions", small("c"), headers={**beta, "X-Retry-Token": token})
        assert retry.status_code == 200, retry.text
        assert [f.result().status_code for f in work] == [200, 200]
    state = bookings(server, alpha)
    assert state["claimed"] == 1 and state["booked"] == 2
    assert logged_claims(server, 1) == ["token"]


def test_retry_by_idempotency_key_and_by_body(make_server):
    server = make_server(*SLOW, "--max-queue", "1", "--retry-early", "60")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        work = fill(server, pool)
        keyed = check_overloaded(server.post("/v1/completions", small("k"), headers={"Idempotency-Key": "job-7"}))
        plain = check_overloaded(server.post("/v1/completions", small("b")))
        assert plain["retry_position"] == keyed["retry_position"] + 1
        # Neither retry sends the token: one is known by its key, the other
        # (as the OpenAI SDKs send it) by the same client and body.
        by_key = pool.submit(server.post, "/v1/completions", small("k"), headers={"Idempotency-Key": "job-7"})
        by_body = pool.submit(server.post, "/v1/completions", small("b"))
        assert by_key.result().status_code == 200, by_key.result().text
        assert by_body.result().status_code == 200, by_body.result().text
        [f.result() for f in work]
    assert bookings(server)["claimed"] == 2
    assert logged_claims(server, 2) == ["body", "idempotency_key"]


def test_early_retry_is_told_the_time_left_and_a_late_one_finds_the_booking_released(make_server):
    server = make_server(*SLOW, "--max-queue", "0", "--retry-early", "0.1", "--retry-grace", "0.2")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        work = pool.submit(server.post, "/v1/completions", blocker(60))
        wait_until(lambda: server.admission()["running"] == 1, what="the blocker running")
        first = check_overloaded(server.post("/v1/completions", small("x")))
        token = first["retry_token"]
        early = server.post("/v1/completions", small("x"), headers={"X-Retry-Token": token})
        err = check_overloaded(early)
        assert err["retry_token"] == token  # the booking is kept
        assert err["retry_after_ms"] <= first["retry_after_ms"]
        assert "before its booked place" in err["message"]
        assert bookings(server)["early"] == 1
        # Not claimed by promise + grace: released.
        wait_until(lambda: bookings(server)["expired"] == 1, what="the booking released")
        assert bookings(server)["held"] == 0
        assert work.result().status_code == 200
    late = server.post("/v1/completions", small("x"), headers={"X-Retry-Token": token})
    assert late.status_code == 200, late.text  # served as a new request
    assert bookings(server)["claimed"] == 0
    assert not [l for l in request_log(server) if l.get("retry")]


def test_each_key_gets_its_share_of_bookings(make_server, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text(KEYS)
    server = make_server(*SLOW, "--max-queue", "0", "--max-retry-bookings", "2", "--api-keys", str(keys))
    alpha, beta = auth("sk-alpha-0001"), auth("sk-beta-0002")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        work = pool.submit(server.post, "/v1/completions", blocker(), headers=alpha)
        wait_until(lambda: server.get("/v1/admission", headers=alpha).json()["running"] == 1, what="running")
        first = check_overloaded(server.post("/v1/completions", small("a1"), headers=alpha))
        # Nothing has completed yet: the promise comes from the profile's step
        # time and the ~100 tokens still to run (>= 20 ms each), not a constant.
        assert first["retry_after_ms"] >= 1500, first
        # Alpha alone may hold one of the two (one share is kept for a newcomer).
        over = check_overloaded(server.post("/v1/completions", small("a2"), headers=alpha), booked=False)
        assert "share" in over["message"], over["message"]
        check_overloaded(server.post("/v1/completions", small("b1"), headers=beta))
        state = bookings(server, alpha)
        assert state["held"] == 2 and state["refused"] == 1
        assert work.result().status_code == 200


def test_every_refusal_says_whether_a_retry_can_help(make_server, tmp_path):
    from scenario_util import body_for_tokens, budget_server
    server = budget_server(make_server)
    cases = [
        server.post("/v1/completions", None, data="{not json", headers={"Content-Type": "application/json"}),
        server.post("/v1/completions", dict(prompt="x", model="no-such-model")),
        server.post("/no/such/route", {}),
        server.post("/v1/completions", body_for_tokens(server.never_fits)),
    ]
    assert [r.status_code for r in cases] == [400, 404, 404, 413]
    assert cases[3].json()["error"]["type"] == "exceeds_device_memory"
    for r in cases:
        assert r.headers["x-should-retry"] == "false", (r.status_code, r.headers)
        assert "retry-after-ms" not in r.headers and "X-Retry-Token" not in r.headers
    # 422: the same Idempotency-Key with another body while the first runs.
    slow = make_server(*SLOW)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(slow.post, "/v1/completions", blocker(40), headers={"Idempotency-Key": "k-1"})
        wait_until(lambda: slow.admission()["running"] == 1, what="running")
        reused = slow.post("/v1/completions", small("other"), headers={"Idempotency-Key": "k-1"})
        assert reused.status_code == 422, reused.text
        assert reused.headers["x-should-retry"] == "false"
        assert first.result().status_code == 200
    # 503 in the baseline too: whole seconds, nothing booked.
    base = make_server(*SLOW, "--max-queue", "0", "--retry-bookings", "off")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        work = pool.submit(base.post, "/v1/completions", blocker(40))
        wait_until(lambda: base.admission()["running"] == 1, what="running")
        err = check_overloaded(base.post("/v1/completions", small("z")), booked=False)
        assert err["retry_after_ms"] % 1000 == 0
        assert bookings(base)["held"] == 0
        assert work.result().status_code == 200


def test_queue_depth_never_exceeds_max_queue_in_a_burst(make_server):
    server = make_server("--max-batch", "2", "--max-queue", "3", "--test-step-delay-ms", "20")
    seen = []
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(server.post, "/v1/completions", dict(prompt=f"b{i}", max_tokens=20, ignore_eos=True))
                   for i in range(16)]
        while not all(f.done() for f in futures):
            seen.append(server.admission()["queue_depth"])
        codes = [f.result().status_code for f in futures]
    assert set(codes) <= {200, 503} and 200 in codes and 503 in codes
    assert max(seen) <= 3, seen


def behind(address, attempt=None):
    """Headers of a request a proxy on 127.0.0.1 forwards for `address`; `attempt`:
    the OpenAI SDKs' x-stainless-retry-count (0 on a first attempt)."""
    headers = {"X-Forwarded-For": address}
    if attempt is not None:
        headers["x-stainless-retry-count"] = str(attempt)
    return headers


def test_clients_behind_a_trusted_proxy_get_their_own_shares(make_server):
    # --max-retry-bookings 3 with two clients holding bookings: a share of one each.
    args = (*SLOW, "--max-queue", "0", "--max-retry-bookings", "3")
    for trusted, second_booked in (("127.0.0.1", True), ("192.0.2.1", False)):
        server = make_server(*args, "--trusted-proxy", trusted)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            work = pool.submit(server.post, "/v1/completions", blocker())
            wait_until(lambda: server.admission()["running"] == 1, what="the blocker running")
            check_overloaded(server.post("/v1/completions", small("same"), headers=behind("10.0.0.1", 0)))
            # The same body from another client behind the proxy: its own share
            # when the proxy is trusted; else the header is ignored and both are
            # one address, whose share is held.
            other = check_overloaded(server.post("/v1/completions", small("same"), headers=behind("10.0.0.2", 0)),
                                     booked=second_booked)
            if second_booked:
                again = check_overloaded(server.post("/v1/completions", small("same"), headers=behind("10.0.0.1", 0)),
                                         booked=False)
                assert "share" in again["message"], again["message"]
            else:
                assert "share" in other["message"], other["message"]
            assert bookings(server)["held"] == (2 if second_booked else 1)
            assert work.result().status_code == 200


def test_identical_bodies_behind_a_trusted_proxy_claim_their_own_bookings(make_server):
    # --retry-early/--retry-grace 60: every booking is claimable for the whole test.
    args = (*SLOW, "--max-queue", "1", "--retry-early", "60", "--retry-grace", "60")
    for trusted, reclaimed in (("127.0.0.1", 0), ("192.0.2.1", 1)):
        server = make_server(*args, "--trusted-proxy", trusted)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            work = fill(server, pool)
            a = check_overloaded(server.post("/v1/completions", small("same"), headers=behind("10.0.0.1", 0)))
            check_overloaded(server.post("/v1/completions", small("same"), headers=behind("10.0.0.2", 0)))
            # B retries by body, then A with its token. Behind a trusted proxy
            # B takes its own booking and A's token finds A's. With the header
            # ignored both are one client: B's body retry takes the oldest
            # booking (A's), and A's token still claims it (reclaimed: the
            # promise was made to A), while B's own booking goes unclaimed.
            b_retry = server.post("/v1/completions", small("same"), headers=behind("10.0.0.2", 1))
            assert b_retry.status_code == 200, b_retry.text
            a_retry = server.post("/v1/completions", small("same"),
                                  headers={**behind("10.0.0.1", 1), "X-Retry-Token": a["retry_token"]})
            assert a_retry.status_code == 200, a_retry.text
            [f.result() for f in work]
        assert bookings(server)["claimed"] == 2 - reclaimed and bookings(server)["reclaimed"] == reclaimed
        assert logged_claims(server, 2) == ["body", "token"]


def test_a_fresh_identical_request_does_not_take_a_booking(make_server):
    server = make_server(*SLOW, "--max-queue", "1", "--retry-early", "60", "--retry-grace", "60")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        work = fill(server, pool)
        check_overloaded(server.post("/v1/completions", small("same"), headers={"x-stainless-retry-count": "0"}))
        # The same body from the same address, said to be a first attempt: a
        # new request (refused or served), never the booked retry.
        fresh = server.post("/v1/completions", small("same"), headers={"x-stainless-retry-count": "0"})
        assert fresh.status_code in (200, 503), fresh.text
        assert bookings(server)["claimed"] == 0
        # The retry (count 1, no token) takes the booking by its body.
        retry = server.post("/v1/completions", small("same"), headers={"x-stainless-retry-count": "1"})
        assert retry.status_code == 200, retry.text
        assert bookings(server)["claimed"] == 1
        [f.result() for f in work]
    assert logged_claims(server, 1) == ["body"]
