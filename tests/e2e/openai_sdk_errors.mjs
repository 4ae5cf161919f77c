// Sends requests that vramgate refuses through the official OpenAI JS SDK
// (npm `openai`) and prints, as JSON, what the SDK's error object carries for
// each: its class, status, type, code, param and message.
//   node tests/e2e/openai_sdk_errors.mjs '[{"url": "http://127.0.0.1:PORT", "route": "completions", "body": {...}}]'
import OpenAI from "openai";

const out = [];
for (const c of JSON.parse(process.argv[2])) {
  const client = new OpenAI({ baseURL: c.url + "/v1", apiKey: "unused", maxRetries: 0 });
  try {
    if (c.route === "chat") await client.chat.completions.create(c.body);
    else await client.completions.create(c.body);
    out.push({ refused: false });
  } catch (e) {
    out.push({
      refused: true, class: e.constructor.name, status: e.status, type: e.type, code: e.code, param: e.param,
      message: e.error?.message ?? e.message,
    });
  }
}
console.log(JSON.stringify(out));
