"""bench/retry_booking.py end to end in its tiny mode (seconds of traffic):
both modes run the peak, the overload and the OpenAI SDK phases on the same
build, the figures are computed from the run's own records, and the JSON and
Markdown reports are written. No timing is asserted."""
import json
import os
import subprocess

import pytest

from conftest import BIN, MODEL_DIR

# Starts no server in the run's mode: run once, by the default-mode run.
pytestmark = pytest.mark.same_in_both_modes

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_retry_booking_benchmark_runs_both_modes_and_writes_the_report(tmp_path):
    run = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "retry_booking.py"), "--tiny",
                          "--binary", BIN, "--model-dir", MODEL_DIR, "--out-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "retry-booking.json").read_text())
    assert report["config"]["tiny"] is True
    on, off = report["results"]["on"], report["results"]["off"]
    assert on["mode"] == "on" and off["mode"] == "off"
    for r in (on, off):
        assert r["peak_goodput_rps"] > 0 and r["completed"] > 0, r
        assert r["goodput_ratio"] == r["overload_goodput_rps"] / r["peak_goodput_rps"]
        assert r["errors"] == {}, r["errors"]
        if r["first_retry_admitted_share"] is not None:
            assert 0 <= r["first_retry_admitted_share"] <= 1
        sdk = r["sdk"]
        assert sdk["calls"] >= 1 and sdk["succeeded"] + sdk["failed"] == sdk["calls"], sdk
        assert sdk["attempts"] >= sdk["calls"]
    # The baseline books nothing; with bookings the server counted its own.
    assert off["retry_bookings"]["booked"] == 0
    assert on["retry_bookings"]["booked"] >= on["retry_bookings"]["claimed"]
    # The n = 4 case: requests of 4 choices against requests of 1, same shape.
    choices = report["results"]["choices"]
    assert choices["1"]["n"] == 1 and choices["4"]["n"] == 4, choices
    for r in choices.values():
        assert r["completed"] > 0 and r["errors"] == {}, r
    md = (tmp_path / "retry-booking.md").read_text()
    assert "Requests of n = 4 choices" in md
    assert "Tiny smoke run" in md
    assert "retries admitted on their first retry" in md and "OpenAI JS SDK" in md


def test_proxy_case_runs_every_policy_and_writes_its_report(tmp_path):
    run = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "retry_booking.py"), "--proxy-case", "--tiny",
                          "--binary", BIN, "--model-dir", MODEL_DIR, "--out-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "retry-booking-proxy.json").read_text())
    results = report["results"]
    assert [r["sends_retry_count"] for r in results[:2]] == [False, True]  # before, after
    assert any("--trusted-proxy" in r["server_args"] for r in results)
    for r in results:
        assert r["completed"] > 0 and r["errors"] == {}, r
        if r["first_retry_admitted_share"] is not None:
            assert 0 <= r["first_retry_admitted_share"] <= 1
        assert r["retry_bookings"]["booked"] >= r["retry_bookings"]["claimed"]
    md = (tmp_path / "retry-booking-proxy.md").read_text()
    assert "Tiny smoke run" in md and "retries admitted on their first retry" in md
    assert not (tmp_path / "retry-booking.json").exists()  # only this case ran


def test_sustained_overload_benchmark_writes_both_cases(tmp_path):
    # bench/retry_sustained.py for seconds: n = 1 and n = 4, one build; the
    # figures come from the run's own records and the server's counters.
    run = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "retry_sustained.py"), "--seconds", "2",
                          "--clients", "8", "--binary", BIN, "--label", "this build", "--model-dir", MODEL_DIR,
                          "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads((tmp_path / "retry-sustained.json").read_text())["this build"]
    assert [r["n"] for r in rows] == [1, 4]
    for r in rows:
        assert r["completed"] > 0, r
        assert r["retried_with_token"] <= r["retried"], r
        if r["retried"]:
            assert 0 <= r["first_retry_admitted"] <= 1
        b = r["bookings"]
        assert b["booked"] >= b["claimed"] and b["reclaimed"] <= b["claimed"], b
    assert "| this build | 4 |" in (tmp_path / "retry-sustained.md").read_text()
