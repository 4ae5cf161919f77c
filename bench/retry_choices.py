"""bench/retry_booking.py's n = 4 case: Retry-After promises for requests of
4 choices against requests of 1, on one server shape (--max-batch 4
--max-queue 1, 40-token requests, bookings on), each run with 3x the
requests the batch holds. A request counts once in the drain rate behind the
promise whatever its n, so admitted - promised should be about the same for
both. Used by retry_booking.py (not run on its own)."""
import retry_booking as rb
from common import Server, percentile

SHAPE = {"max_batch": 4, "max_queue": 1, "max_tokens": 40}


class ChoicesLoop(rb.Loop):
    """rb.Loop's closed-loop clients, each request asking for `n` choices."""

    def __init__(self, url, max_tokens, end, tag, n):
        super().__init__(url, max_tokens, end, tag)
        self.body_extra = {"n": n}


def run(args, n):
    """One server, `n` choices a request, for args.choices_s seconds."""
    server = Server(args.binary, "--model-dir", args.model_dir, "--threads", "1",
                    "--max-batch", str(SHAPE["max_batch"]), "--max-queue", str(SHAPE["max_queue"]),
                    "--test-step-delay-ms", str(args.step_delay_ms), "--retry-bookings", "on")
    clients = 3 * max(1, SHAPE["max_batch"] // n)
    try:
        start = rb.time.monotonic()
        loop = ChoicesLoop(server.url, args.choices_tokens, start + args.choices_s, f"n={n}", n)
        loop.run(clients)
        goodput = rb.goodput(loop, start + args.warmup_s, start + args.choices_s)
    finally:
        server.stop()
    first, late = loop.first_retry, loop.lateness
    return {
        "n": n,
        "clients": clients,
        "completed": len(loop.done),
        "goodput_rps": goodput,
        "refused_then_retried": len(first),
        "first_retry_admitted_share": sum(first) / len(first) if first else None,
        "admitted_minus_promised_p50_s": percentile(late, 50),
        "admitted_minus_promised_p99_s": percentile(late, 99),
        "admitted_minus_promised_mean_abs_s": sum(abs(x) for x in late) / len(late) if late else None,
        "errors": loop.errors,
    }


def run_both(args):
    return {str(n): run(args, n) for n in (1, 4)}


def report_lines(args, choices):
    one, four = choices["1"], choices["4"]
    lines = [
        "## Requests of n = 4 choices",
        "",
        f"`--max-batch {SHAPE['max_batch']} --max-queue {SHAPE['max_queue']} --test-step-delay-ms "
        f"{args.step_delay_ms}`, bookings on, {args.choices_tokens}-token requests for {args.choices_s} s: n = 1 "
        f"with {one['clients']} closed-loop clients, n = 4 with {four['clients']} (3x the requests the batch holds, "
        "each). A request counts once in the drain rate behind the promise, whatever its n.",
        "",
        "| | n = 1 | n = 4 |",
        "| --- | --- | --- |",
    ]
    rows = [
        ("retries admitted on their first retry",
         lambda r: f"{rb.pct(r['first_retry_admitted_share'])} ({r['refused_then_retried']} retried)"),
        ("admitted - promised, p50", lambda r: f"{rb.fmt(r['admitted_minus_promised_p50_s'])} s"),
        ("admitted - promised, p99", lambda r: f"{rb.fmt(r['admitted_minus_promised_p99_s'])} s"),
        ("mean abs(admitted - promised)", lambda r: f"{rb.fmt(r['admitted_minus_promised_mean_abs_s'])} s"),
        ("completed (goodput)", lambda r: f"{r['completed']} ({rb.fmt(r['goodput_rps'], '{:.2f}')} req/s)"),
    ]
    lines += [f"| {label} | {cell(one)} | {cell(four)} |" for label, cell in rows]
    return lines + [""]
