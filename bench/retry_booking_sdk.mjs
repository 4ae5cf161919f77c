// Closed-loop clients driven by the official OpenAI JS SDK with its default
// retry policy (maxRetries 2; it reads retry-after-ms, then Retry-After, and
// obeys x-should-retry), for bench/retry_booking.py. A counting fetch tells
// how many HTTP attempts each call took. Prints one JSON object.
//
//   node bench/retry_booking_sdk.mjs URL MODEL CLIENTS SECONDS MAX_TOKENS
import OpenAI from "openai";

const [url, model, clientsArg, secondsArg, maxTokensArg] = process.argv.slice(2);
const clients = Number(clientsArg);
const seconds = Number(secondsArg);
const maxTokens = Number(maxTokensArg);

let attempts = 0;
const countingFetch = (input, init) => {
  attempts += 1;
  return fetch(input, init);
};

const sdk = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", fetch: countingFetch });

const result = { calls: 0, succeeded: 0, failed: 0, attempts: 0, statuses: {}, latencies_s: [] };
const end = Date.now() + seconds * 1000;

async function client(id) {
  let seq = 0;
  while (Date.now() < end) {
    seq += 1;
    const t0 = Date.now();
    result.calls += 1;
    try {
      await sdk.completions.create({
        model,
        prompt: `sdk client ${id} call ${seq}`,
        max_tokens: maxTokens,
        ignore_eos: true,
      });
      result.succeeded += 1;
      result.latencies_s.push((Date.now() - t0) / 1000);
    } catch (e) {
      result.failed += 1;
      const status = String(e?.status ?? e?.name ?? "error");
      result.statuses[status] = (result.statuses[status] ?? 0) + 1;
    }
  }
}

await Promise.all(Array.from({ length: clients }, (_, i) => client(i)));
result.attempts = attempts;
process.stdout.write(JSON.stringify(result) + "\n");
