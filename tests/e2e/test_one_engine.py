"""--one-engine: one engine process for all --devices, with one admission
queue over them (the default is one process per device: test_multi_device.py
and test_engine_per_device.py). test_multi_device's tests again in this mode,
and that there is one engine."""
import pytest

import test_multi_device as multi
from conftest import IN_PROCESS

pytestmark = pytest.mark.skipif(IN_PROCESS, reason="engine processes: the default mode only")


@pytest.fixture
def make_server(make_server):
    """conftest's, with --one-engine."""
    return lambda *args, **kw: make_server("--one-engine", *args, **kw)


test_concurrent_requests_spread_over_both_devices = multi.test_concurrent_requests_spread_over_both_devices
test_a_busy_device_sends_the_next_request_to_the_free_one = \
    multi.test_a_busy_device_sends_the_next_request_to_the_free_one
test_a_device_that_fails_at_start_up_is_left_out_and_shown_unhealthy = \
    multi.test_a_device_that_fails_at_start_up_is_left_out_and_shown_unhealthy
test_a_request_that_fits_on_no_device_is_413 = multi.test_a_request_that_fits_on_no_device_is_413


def test_there_is_one_engine_process_for_both_devices(make_server):
    server = make_server("--device", "virt:0=64MiB", "--device", "virt:1=64MiB")
    data = server.engines()
    assert len(data) == 1 and data[0]["device"] == "virt:0=64MiB,virt:1=64MiB", data
    assert [d["name"] for d in server.admission()["devices"]] == ["virt:0", "virt:1"]
    r = server.post("/v1/completions", {"prompt": "Hi", "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert 'vramgate_requests_resumed_total{reason="moved"} 0' in multi.metric_lines(server)
