// Drives a running vramgate with the official OpenAI JS SDK (npm `openai`)
// and prints what its parsed objects carry, as JSON, for test_openai_sdk.py:
// completions with logprobs and n, chat with logprobs, streams with usage,
// models.retrieve, and a chat with a developer message and no max_tokens.
//   node tests/e2e/openai_sdk_client.mjs http://127.0.0.1:PORT
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "unused", maxRetries: 0 });
const out = {};

const completion = await client.completions.create({
  model: "tinylm", prompt: "Once upon a time", max_tokens: 6, n: 2, seed: 3, logprobs: 2, temperature: 0.9,
});
out.completion = {
  choices: completion.choices.map((c) => ({
    index: c.index, text: c.text, finish_reason: c.finish_reason,
    tokens: c.logprobs.tokens, token_logprobs: c.logprobs.token_logprobs,
    top: c.logprobs.top_logprobs.map((t) => Object.keys(t).length), text_offset: c.logprobs.text_offset,
  })),
  usage: completion.usage,
};

const echo = await client.completions.create({
  model: "tinylm", prompt: "The cat", max_tokens: 0, echo: true, logprobs: 1,
});
out.echo = { text: echo.choices[0].text, token_logprobs: echo.choices[0].logprobs.token_logprobs };

const chat = await client.chat.completions.create({
  model: "tinylm", messages: [{ role: "user", content: "Hello" }], max_tokens: 5, temperature: 0,
  logprobs: true, top_logprobs: 2,
});
out.chat = {
  content: chat.choices[0].message.content,
  logprobs: chat.choices[0].logprobs.content.map((e) => ({
    token: e.token, logprob: e.logprob, bytes: e.bytes, top: e.top_logprobs.length,
  })),
  usage: chat.usage,
};

const stream = await client.chat.completions.create({
  model: "tinylm", messages: [{ role: "user", content: "Hello" }], max_tokens: 5, temperature: 0, n: 2,
  stream: true, stream_options: { include_usage: true }, logprobs: true,
});
const streamed = { text: {}, finish: {}, logprob_entries: 0, usage: null, chunks: 0 };
for await (const chunk of stream) {
  streamed.chunks += 1;
  if (chunk.usage) streamed.usage = chunk.usage;
  for (const c of chunk.choices) {
    streamed.text[c.index] = (streamed.text[c.index] ?? "") + (c.delta?.content ?? "");
    if (c.finish_reason) streamed.finish[c.index] = c.finish_reason;
    streamed.logprob_entries += c.logprobs?.content?.length ?? 0;
  }
}
out.chat_stream = streamed;

const model = await client.models.retrieve("tinylm");
out.model = { id: model.id, object: model.object, context_length: model.context_length };
try {
  await client.models.retrieve("no-such-model");
  out.missing_model = null;
} catch (e) {
  out.missing_model = { status: e.status, type: e.error?.type ?? e.type };
}

// What current SDK users send: system instructions as `developer`, no max_tokens.
const developer = await client.chat.completions.create({
  model: "tinylm", messages: [{ role: "developer", content: "Be terse." }, { role: "user", content: "Hello" }],
  temperature: 0, ignore_eos: true,
});
out.developer = { finish_reason: developer.choices[0].finish_reason, usage: developer.usage };

try {
  await client.completions.create({ model: "tinylm", prompt: "x", best_of: 3 });
  out.refused = null;
} catch (e) {
  out.refused = { status: e.status, type: e.error?.type ?? e.type, message: e.error?.message ?? e.message };
}
console.log(JSON.stringify(out));
