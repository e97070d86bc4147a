// The reference side of expar's tokenizer and chat-template tests and of `expar bench tokenize`:
// @huggingface/tokenizers and @huggingface/jinja run on the same inputs as expar; results go to stdout as JSON.
//   node reference.mjs encode MODEL_DIR CORPUS.json   -> [{ids, ids_plain, text, text_skip}] per corpus string
//   node reference.mjs chat CASES.json                 -> [rendered string] per case {template, context}
//   node reference.mjs bench MODEL_DIR TEXT_FILE REPEATS -> {seconds: [...], tokens}
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";

const [mode, ...args] = process.argv.slice(2);
const readJson = (path) => JSON.parse(readFileSync(path, "utf8"));
const load = (dir) => new Tokenizer(readJson(join(dir, "tokenizer.json")), readJson(join(dir, "tokenizer_config.json")));

if (mode === "encode") {
  const tokenizer = load(args[0]);
  const out = readJson(args[1]).map((text) => {
    const ids = tokenizer.encode(text).ids;
    const ids_plain = tokenizer.encode(text, { add_special_tokens: false }).ids;
    return {
      ids,
      ids_plain,
      text: ids.length ? tokenizer.decode(ids) : "",
      text_skip: ids.length ? tokenizer.decode(ids, { skip_special_tokens: true }) : "",
    };
  });
  process.stdout.write(JSON.stringify(out));
} else if (mode === "chat") {
  const out = readJson(args[0]).map(({ template, context }) => {
    try {
      return new Template(template).render(context);
    } catch (e) {
      return { error: String(e.message ?? e) };
    }
  });
  process.stdout.write(JSON.stringify(out));
} else if (mode === "bench") {
  const tokenizer = load(args[0]);
  const text = readFileSync(args[1], "utf8");
  const repeats = Number(args[2]);
  const seconds = [];
  let tokens = 0;
  tokenizer.encode(text.slice(0, 100000));  // warm the JIT on a prefix, as expar is warmed
  for (let r = 0; r < repeats; ++r) {
    const start = process.hrtime.bigint();
    tokens = tokenizer.encode(text, { add_special_tokens: false }).ids.length;
    seconds.push(Number(process.hrtime.bigint() - start) / 1e9);
  }
  process.stdout.write(JSON.stringify({ seconds, tokens }));
} else {
  process.stderr.write(`unknown mode ${mode}: use encode, chat or bench\n`);
  process.exit(2);
}
