#!/usr/bin/python3
"""Load generator for a running vramgate: closed-loop or open-loop traffic on
one asyncio loop (aiohttp), with a sampler of /v1/admission, writing one JSON
file with a record per request and a summary.

Traffic is a mix of request classes, each with a weight, a prompt length range
and a max_tokens range (tokens; tinylm's tokenizer is byte-level, so a prompt
of N ASCII characters is N tokens) and a streaming fraction. Every request
sets ignore_eos, so it generates exactly max_tokens tokens and the work is the
same whatever serves it. The request list is drawn from a seeded generator
before the run: the same seed gives the same traffic against any server.

  closed loop: `--users N --requests M`: N users send the M requests back to
               back, each user taking the next one when its last one ended.
  open loop:   `--rate R --duration D`: Poisson arrivals at R requests/s for
               D seconds (R*D requests on average), whatever the server does.

Client side: a timeout per request (`--timeout`), and optional retries
(`--retries K`) of 503 answers after their Retry-After (header, or the
`retry_after_s` of an SSE error event), capped at `--max-retry-wait`.

    bench/loadgen.py --url http://127.0.0.1:8000 --users 16 --requests 200 \\
        --mix '[{"weight":1,"prompt":[8,64],"max_tokens":[16,128],"stream":0.5}]' --out /tmp/run.json

Record fields: status (HTTP status, or "stream_error" when a 200 stream ended
in an error event, "timeout" for the client timeout, "client_error" for a
connection failure), error (the server's error type), latency_s (send to last
byte, retries included), ttft_s (streams: send to first token), tokens
(completion tokens of a success), queue_wait_ms (X-Queue-Wait-Ms of plain
responses; a stream's headers go out before its wait ends, so streams carry
null), queue_position (X-Queue-Position), retries.
"""
import argparse
import asyncio
import collections
import json
import random
import sys
import time

import aiohttp

from traffic import draw_requests, percentile


def _retry_after(headers, error):
    if error and error.get("retry_after_s") is not None:
        return float(error["retry_after_s"])
    h = headers.get("Retry-After") if headers is not None else None
    try:
        return float(h) if h is not None else None
    except ValueError:
        return None


async def _attempt(session, url, spec, timeout, rec, t0):
    """One HTTP exchange; fills rec and returns (status, error dict, headers)."""
    body = dict(spec["body"], stream=spec["stream"])
    async with session.post(url + "/v1/completions", json=body,
                            timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        rec["queue_position"] = _int_or_none(r.headers.get("X-Queue-Position"))
        if r.status != 200:
            try:
                err = (await r.json(content_type=None))["error"]
            except (ValueError, KeyError, TypeError, aiohttp.ContentTypeError):
                err = {"type": "unparsed"}
            return r.status, err, r.headers
        if not spec["stream"]:
            data = await r.json(content_type=None)
            rec["queue_wait_ms"] = _int_or_none(r.headers.get("X-Queue-Wait-Ms"))
            rec["tokens"] = data.get("usage", {}).get("completion_tokens", 0)
            return 200, None, r.headers
        # SSE: parse only what is needed (first token, usage, error) to keep the client cheap.
        err = None
        async for raw in r.content:
            if not raw.startswith(b"data: "):
                continue
            if raw.startswith(b"data: [DONE]"):
                break
            if rec["ttft_s"] is None and b'"text":""' not in raw and b'"error"' not in raw:
                rec["ttft_s"] = time.perf_counter() - t0
            if b'"usage"' in raw or b'"error"' in raw:
                chunk = json.loads(raw[6:])
                if "error" in chunk:
                    err = chunk["error"]
                elif chunk.get("usage"):
                    rec["tokens"] = chunk["usage"]["completion_tokens"]
        return ("stream_error" if err else 200), err, r.headers


def _int_or_none(v):
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


async def one_request(session, url, spec, timeout, retries, max_retry_wait, t_origin):
    t0 = time.perf_counter()
    rec = {"class": spec["class"], "stream": spec["stream"], "prompt_tokens": spec["prompt_tokens"],
           "max_tokens": spec["body"]["max_tokens"], "start_s": t0 - t_origin, "status": None, "error": None,
           "latency_s": None, "ttft_s": None, "tokens": 0, "queue_wait_ms": None, "queue_position": None,
           "retries": 0}
    while True:
        rec["ttft_s"] = None
        try:
            left = timeout - (time.perf_counter() - t0)
            if left <= 0:
                raise asyncio.TimeoutError()
            status, err, headers = await _attempt(session, url, spec, left, rec, t0)
        except asyncio.TimeoutError:
            status, err, headers = "timeout", None, None
        except aiohttp.ClientError as e:
            status, err, headers = "client_error", {"type": type(e).__name__}, None
        rec["status"], rec["error"] = status, (err or {}).get("type")
        wait = _retry_after(headers, err) if status in (503, "stream_error") else None
        if (wait is None or rec["retries"] >= retries or rec["error"] != "overloaded"
                or time.perf_counter() - t0 + min(wait, max_retry_wait) >= timeout):
            break
        rec["retries"] += 1
        await asyncio.sleep(min(wait, max_retry_wait))
    if rec["status"] != 200:
        rec["tokens"] = 0
    rec["latency_s"] = time.perf_counter() - t0
    return rec


async def sample_admission(session, url, interval, samples, t_origin, stop):
    while not stop.is_set():
        try:
            async with session.get(url + "/v1/admission", timeout=aiohttp.ClientTimeout(total=10)) as r:
                s = await r.json()
            d = s["devices"][0]
            samples.append({"t_s": time.perf_counter() - t_origin, "reserved_bytes": d["reserved_bytes"],
                            "used_bytes": d["used_bytes"], "peak_bytes": d["peak_bytes"],
                            "peak_reserved_bytes": d["peak_reserved_bytes"], "budget_bytes": d["budget_bytes"],
                            "effective_budget_bytes": d.get("effective_budget_bytes"),
                            "capacity_bytes": d["capacity_bytes"], "queue_depth": s["queue_depth"],
                            "running": s["running"]})
        except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError):
            pass
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except asyncio.TimeoutError:
            pass


async def admission_state(session, url):
    async with session.get(url + "/v1/admission", timeout=aiohttp.ClientTimeout(total=30)) as r:
        return await r.json()


async def run_async(url, mix, *, users=None, requests=None, rate=None, duration=None, seed=1, timeout=60.0,
                    retries=0, max_retry_wait=5.0, sample_interval=0.05):
    """Runs one load; returns {"config", "records", "samples", "summary"}."""
    closed = users is not None
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        before = await admission_state(session, url)
        t_origin, cpu_origin = time.perf_counter(), time.process_time()
        samples, stop = [], asyncio.Event()
        sampler = asyncio.create_task(sample_admission(session, url, sample_interval, samples, t_origin, stop))
        if closed:
            specs = draw_requests(mix, requests, seed)
            it = iter(specs)

            async def user():
                out = []
                for spec in it:
                    out.append(await one_request(session, url, spec, timeout, retries, max_retry_wait, t_origin))
                return out

            records = [r for rs in await asyncio.gather(*(user() for _ in range(users))) for r in rs]
        else:
            rng = random.Random(seed ^ 0x5EED)
            arrivals, t = [], rng.expovariate(rate)
            while t < duration:
                arrivals.append(t)
                t += rng.expovariate(rate)
            specs = draw_requests(mix, len(arrivals), seed)
            tasks = []
            for at, spec in zip(arrivals, specs):
                delay = at - (time.perf_counter() - t_origin)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(
                    one_request(session, url, spec, timeout, retries, max_retry_wait, t_origin)))
            records = list(await asyncio.gather(*tasks))
        wall = time.perf_counter() - t_origin
        client_cpu = time.process_time() - cpu_origin
        stop.set()
        await sampler
        after = await admission_state(session, url)
    config = {"url": url, "mix": mix, "seed": seed, "timeout_s": timeout, "retries": retries,
              "mode": "closed" if closed else "open"}
    config.update({"users": users, "requests": requests} if closed else {"rate": rate, "duration_s": duration})
    return {"config": config, "records": records, "samples": samples,
            "summary": dict(summarize(records, samples, before, after, wall, config), client_cpu_s=client_cpu)}


def summarize(records, samples, before, after, wall, config):
    ok = [r for r in records if r["status"] == 200]
    statuses = collections.Counter(str(r["status"]) + (f" {r['error']}" if r["error"] else "") for r in records)
    dev = after["devices"][0]
    lat = [r["latency_s"] for r in ok]
    ttft = [r["ttft_s"] for r in ok if r["stream"]]
    sampled_used = max((s["used_bytes"] for s in samples), default=None)
    sampled_reserved = max((s["reserved_bytes"] for s in samples), default=None)
    return {
        "mode": config["mode"], "offered": config.get("users") or config.get("rate"),
        "requests": len(records), "succeeded": len(ok), "wall_s": wall,
        "goodput_rps": len(ok) / wall, "goodput_tokens_per_s": sum(r["tokens"] for r in ok) / wall,
        "statuses": dict(statuses),
        "out_of_memory_failures": sum(1 for r in records if r["error"] == "out_of_memory"),
        "server_out_of_memory_events": after["out_of_memory"] - before["out_of_memory"],
        "retries": sum(r["retries"] for r in records),
        "latency_s": {f"p{q}": percentile(lat, q) for q in (50, 95, 99)},
        "ttft_s": {f"p{q}": percentile(ttft, q) for q in (50, 95, 99)},
        "queue_wait_ms_p50": percentile([r["queue_wait_ms"] for r in ok], 50),
        "policy": after.get("policy"), "device": dev.get("name"),
        "capacity_bytes": dev["capacity_bytes"], "budget_bytes": dev["budget_bytes"],
        # Server peaks cover the server's life; start a fresh server per run to read them per run.
        "peak_device_bytes": dev["peak_bytes"], "peak_reserved_bytes": dev["peak_reserved_bytes"],
        "sampled_peak_used_bytes": sampled_used, "sampled_peak_reserved_bytes": sampled_reserved,
        "resident_bytes": dev["resident_bytes"], "workspace_bytes": dev["workspace_bytes"],
        "samples": len(samples),
    }


def run(url, mix, **kw):
    return asyncio.run(run_async(url, mix, **kw))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--mix", default='[{"weight":1,"prompt":[8,64],"max_tokens":[16,128],"stream":0.5}]',
                    help="JSON list of classes: weight, prompt [lo,hi], max_tokens [lo,hi], stream fraction, name")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--users", type=int, help="closed loop: concurrent users")
    g.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    ap.add_argument("--requests", type=int, default=100, help="closed loop: requests in all")
    ap.add_argument("--duration", type=float, default=10.0, help="open loop: seconds of arrivals")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0, help="client timeout per request (s), retries included")
    ap.add_argument("--retries", type=int, default=0, help="retries of 503 overloaded after Retry-After")
    ap.add_argument("--max-retry-wait", type=float, default=5.0, help="cap on one Retry-After wait (s)")
    ap.add_argument("--sample-interval", type=float, default=0.05, help="seconds between /v1/admission samples")
    ap.add_argument("--out", default="-", help="JSON file to write ('-': stdout gets the summary only)")
    args = ap.parse_args()
    kw = dict(seed=args.seed, timeout=args.timeout, retries=args.retries, max_retry_wait=args.max_retry_wait,
              sample_interval=args.sample_interval)
    if args.users:
        kw.update(users=args.users, requests=args.requests)
    else:
        kw.update(rate=args.rate, duration=args.duration)
    result = run(args.url, json.loads(args.mix), **kw)
    if args.out != "-":
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    json.dump(result["summary"], sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
