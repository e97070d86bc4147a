// The official OpenAI client (npm "openai") against expar serve: node client_test.mjs BASE_URL MODEL
// Prints one JSON object with what it saw; exits 1 with a message on the first thing that is not as the
// OpenAI API defines it.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0, timeout: 60000 });
const fail = (what) => {
  console.error("client_test: " + what);
  process.exit(1);
};
const check = (cond, what) => cond || fail(what);

const models = await client.models.list();
check(models.data.some((m) => m.id === model), `models.list has no ${model}: ${JSON.stringify(models.data)}`);

const params = { model, prompt: "In the beginning", max_tokens: 12, temperature: 0 };
const completion = await client.completions.create(params);
const choice = completion.choices[0];
check(typeof choice.text === "string", "completion text is not a string");
check(["length", "stop"].includes(choice.finish_reason), `finish_reason ${choice.finish_reason}`);
check(completion.usage.completion_tokens >= 1 && completion.usage.completion_tokens <= 12, "usage");
check(completion.usage.total_tokens === completion.usage.prompt_tokens + completion.usage.completion_tokens,
      "usage.total_tokens");

let streamed = "";
let streamFinish = null;
for await (const chunk of await client.completions.create({ ...params, stream: true })) {
  streamed += chunk.choices[0]?.text ?? "";
  streamFinish = chunk.choices[0]?.finish_reason ?? streamFinish;
}
check(streamed === choice.text, `stream ${JSON.stringify(streamed)} != ${JSON.stringify(choice.text)}`);
check(streamFinish === choice.finish_reason, "stream finish_reason");

const messages = [
  { role: "system", content: "be brief" },
  { role: "user", content: "hi" },
];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0 });
const reply = chat.choices[0].message;
check(reply.role === "assistant" && typeof reply.content === "string", "chat message");
let chatStreamed = "";
for await (const chunk of await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0, stream: true }))
  chatStreamed += chunk.choices[0]?.delta?.content ?? "";
check(chatStreamed === reply.content, `chat stream ${JSON.stringify(chatStreamed)} != ${JSON.stringify(reply.content)}`);

const seeded = { model, prompt: "And", max_tokens: 10, temperature: 0.9, top_p: 0.95, seed: 42 };
const a = await client.completions.create(seeded);
const b = await client.completions.create(seeded);
check(a.choices[0].text === b.choices[0].text, "the same seed gave different text");

const errors = {};
for (const [name, body, status] of [
  ["n", { ...params, n: 3 }, 400],
  ["model", { ...params, model: "no-such-model" }, 404],
  ["max_tokens", { ...params, max_tokens: 100000 }, 400],
]) {
  try {
    await client.completions.create(body);
    fail(`${name}: no error`);
  } catch (e) {
    check(e instanceof OpenAI.APIError, `${name}: not an APIError: ${e}`);
    check(e.status === status, `${name}: status ${e.status}, expected ${status}`);
    check(typeof e.message === "string" && e.message.length > 0, `${name}: no message`);
    errors[name] = e.message;
  }
}
console.log(JSON.stringify({ text: choice.text, chat: reply.content, errors }));
