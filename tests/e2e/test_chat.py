"""POST /v1/chat/completions end to end: tinylm copied next to a
tokenizer_config.json whose chat_template is ChatML. tinylm's byte vocabulary
has no special tokens, so the template is rendered as plain text and each
byte is one prompt token: usage.prompt_tokens tells exactly what was rendered."""
import json
import re
import shutil

import pytest

from conftest import MODEL_DIR, Server, sse_events

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello"}]
CHATML_PROMPT = ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                 "<|im_start|>assistant\n")
ZEPHYR_PROMPT = "<|system|>\nYou are terse.</s>\n<|user|>\nHello</s>\n<|assistant|>\n"
LLAMA2_PROMPT = "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHello [/INST]"


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    model = tmp_path_factory.mktemp("tinylm-chat")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{MODEL_DIR}/{name}", model / name)
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML_TEMPLATE, "eos_token": "<|im_end|>"}))
    s = Server(model_dir=str(model))
    yield s
    assert s.stop() == 0, s.logs()


def chat(server, **body):
    return server.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, **body})


def test_chat_completion_renders_the_models_template(chat_server):
    r = chat(chat_server)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    assert body["usage"]["prompt_tokens"] == len(CHATML_PROMPT.encode())
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    assert re.search(r"chat format of '[^']+': chatml", chat_server.logs())
    # The same prompt through /v1/completions (greedy) gives the same text.
    plain = chat_server.post("/v1/completions", {"prompt": CHATML_PROMPT, "max_tokens": 12, "temperature": 0,
                                                 "stop": ["<|im_end|>"]})
    assert plain.status_code == 200, plain.text
    assert plain.json()["choices"][0]["text"] == choice["message"]["content"]


def test_chat_stream_sends_deltas_then_usage(chat_server):
    whole = chat(chat_server).json()["choices"][0]["message"]["content"]
    with chat(chat_server, stream=True) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = list(sse_events(r))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] in ("stop", "length")
    assert last["usage"]["prompt_tokens"] == len(CHATML_PROMPT.encode())
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole


def test_request_chat_template_and_content_parts(chat_server):
    parts = [{"role": "system", "content": [{"type": "text", "text": "You are "}, {"type": "text", "text": "terse."}]},
             {"role": "user", "content": "Hello"}]
    r = chat_server.post("/v1/chat/completions", {"messages": parts, "max_tokens": 4, "chat_template": "zephyr"})
    assert r.status_code == 200, r.text
    # Zephyr ends turns with the model's EOS text, here tokenizer_config.json's "<|im_end|>".
    assert r.json()["usage"]["prompt_tokens"] == len(ZEPHYR_PROMPT.replace("</s>", "<|im_end|>").encode())


def test_a_chat_without_max_tokens_runs_to_the_end_of_the_context(chat_server):
    """As OpenAI: no max_tokens (nor max_completion_tokens) generates until
    end-of-sequence or the context; with ignore_eos, exactly the context."""
    r = chat_server.post("/v1/chat/completions", {"messages": MESSAGES, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["total_tokens"] == 256, usage  # tinylm's context length
    assert usage["completion_tokens"] == 256 - len(CHATML_PROMPT.encode())
    assert r.json()["choices"][0]["finish_reason"] == "length"
    # Greedy without ignore_eos: the same tokens up to the first end-of-sequence (if any).
    free = chat_server.post("/v1/chat/completions", {"messages": MESSAGES, "temperature": 0, "max_tokens": None})
    assert free.status_code == 200, free.text
    text = free.json()["choices"][0]["message"]["content"]
    assert r.json()["choices"][0]["message"]["content"].startswith(text)
    # A prompt that fills the context leaves no token: 400, not an empty answer.
    full = chat_server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 250}]})
    assert full.status_code == 400, full.text
    assert "context length" in full.json()["error"]["message"]


def test_the_developer_role_is_system_instructions(chat_server):
    developer = [{"role": "developer", "content": "You are terse."}, {"role": "user", "content": "Hello"}]
    r = chat_server.post("/v1/chat/completions", {"messages": developer, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(CHATML_PROMPT.encode())
    assert r.json()["choices"][0]["message"] == chat(chat_server).json()["choices"][0]["message"]


@pytest.mark.parametrize("body, words", [
    ({}, "messages is required"),
    ({"messages": []}, "messages must be a non-empty array"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
    ({"messages": MESSAGES, "chat_template": "vicuna"}, "not a known format"),
    ({"messages": MESSAGES, "max_tokens": -1}, "max_tokens"),
    ({"messages": MESSAGES, "temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 4}, "context length"),
])
def test_bad_chat_requests_are_400_streaming_or_not(chat_server, body, words):
    plain = chat_server.post("/v1/chat/completions", body)
    streamed = chat_server.post("/v1/chat/completions", {**body, "stream": True})
    for r in (plain, streamed):
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request"
        assert words in r.json()["error"]["message"]
    assert plain.json() == streamed.json()


def test_default_model_chats_without_extra_fields(make_server):
    """A stock OpenAI chat call to models/tinylm: its tokenizer_config.json carries ChatML."""
    s = make_server()
    r = s.post("/v1/chat/completions", {"model": "tinylm", "messages": MESSAGES, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"
    assert r.json()["usage"]["prompt_tokens"] == len(CHATML_PROMPT.encode())
    assert re.search(r"chat format of 'tinylm': chatml", s.logs())


def test_model_without_a_known_template(make_server, tmp_path):
    model = tmp_path / "tinylm-plain"  # tinylm's weights without its tokenizer_config.json
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{MODEL_DIR}/{name}", model / name)
    s = make_server(model_dir=str(model))
    r = s.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request"
    assert "chat template" in r.json()["error"]["message"]
    r = s.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "chat_template": "llama-2"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(LLAMA2_PROMPT.encode())


def test_chat_template_flag(make_server):
    s = make_server("--chat-template", "zephyr")
    r = s.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(ZEPHYR_PROMPT.encode())
