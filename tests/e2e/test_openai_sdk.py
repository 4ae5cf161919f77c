"""The official OpenAI JS SDK (npm `openai`, a dev dependency installed by
scripts/install-deps --test) against the real binary: completions with
logprobs and n, echo scoring, chat with logprobs, a streamed chat with n and
usage; its parsed objects carry the values. Skipped only where node or the
package is missing (CI installs both)."""
import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SDK = os.path.join(ROOT, "node_modules", "openai", "package.json")


@pytest.mark.skipif(not shutil.which("node") or not os.path.exists(SDK),
                    reason="node or node_modules/openai missing: run scripts/install-deps --test")
def test_openai_js_sdk_parses_logprobs_choices_and_stream_usage(server):
    run = subprocess.run(["node", os.path.join(ROOT, "tests", "e2e", "openai_sdk_client.mjs"), server.url],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    out = json.loads(run.stdout)

    c = out["completion"]
    assert [ch["index"] for ch in c["choices"]] == [0, 1]
    for ch in c["choices"]:
        assert len(ch["tokens"]) == len(ch["token_logprobs"]) == len(ch["text_offset"]) >= 1
        assert "".join(ch["tokens"]) == ch["text"]
        assert all(lp <= 0 for lp in ch["token_logprobs"])
        assert all(2 <= n <= 3 for n in ch["top"])
    assert c["usage"]["completion_tokens"] >= 2

    assert out["echo"]["text"] == "The cat"
    assert out["echo"]["token_logprobs"][0] is None and len(out["echo"]["token_logprobs"]) == 7

    chat = out["chat"]
    assert len(chat["logprobs"]) == chat["usage"]["completion_tokens"]
    assert "".join(bytes(e["bytes"]).decode() for e in chat["logprobs"]) == chat["content"]
    assert all(e["top"] == 2 for e in chat["logprobs"])

    s = out["chat_stream"]
    assert set(s["finish"]) == {"0", "1"}
    assert s["text"]["0"] == s["text"]["1"]  # greedy choices agree
    assert s["usage"]["completion_tokens"] >= 2 and s["logprob_entries"] >= 2

    assert out["refused"]["status"] == 400 and "best_of" in out["refused"]["message"]

    assert out["model"] == {"id": "tinylm", "object": "model", "context_length": 256}
    assert out["missing_model"] == {"status": 404, "type": "not_found"}
    d = out["developer"]
    assert d["finish_reason"] == "length" and d["usage"]["total_tokens"] == 256, d
