// Claude's tokens per o200k token, by kind of text (docs/context-guard.md): the legacy Claude
// tokenizer (npm @anthropic-ai/tokenizer, the one Anthropic published) against o200k (npm
// tiktoken, which it depends on) on this repository's own files and a build log.
//
// Run from an empty directory:
//   npm install @anthropic-ai/tokenizer@0.0.4 && node /path/to/sluice/benches/claude_ratio.js /path/to/sluice
const { countTokens } = require('@anthropic-ai/tokenizer');
const { get_encoding } = require('tiktoken');
const fs = require('fs');
const path = require('path');

const root = process.argv[2] || '.';
const o200k = get_encoding('o200k_base');
const kinds = {};
const add = (kind, text) => (kinds[kind] ||= []).push(text);

function walk(dir, ext, kind, limit) {
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) walk(p, ext, kind, limit);
    else if (p.endsWith(ext) && (kinds[kind]?.length ?? 0) < limit) add(kind, fs.readFileSync(p, 'utf8'));
  }
}

walk(path.join(root, 'src'), '.rs', 'Rust source', 60);
walk(path.join(root, 'docs'), '.md', 'English docs', 30);
walk(path.join(root, 'tests'), '.py', 'Python', 10);
walk(path.join(root, 'deploy'), '.yaml', 'YAML', 20);
add('JSON-like lock file', fs.readFileSync(path.join(root, 'Cargo.lock'), 'utf8').slice(0, 200000));
for (let i = 0; i < 20; i++) {
  const lines = [];
  for (let j = 0; j < 60; j++) {
    lines.push(`src/module_${i}/file_${j}.rs:${(i * 7 + j * 13) % 997}:${j % 80}: warning: unused variable \`value_${i * 31 + j}\` in step ${i}`);
  }
  add('build log', lines.join('\n'));
}

const total = [0, 0];
for (const [kind, texts] of Object.entries(kinds)) {
  let claude = 0, openai = 0, low = Infinity, high = 0;
  for (const text of texts) {
    const a = countTokens(text);
    const b = o200k.encode(text, 'all').length;
    claude += a; openai += b;
    low = Math.min(low, a / b); high = Math.max(high, a / b);
  }
  total[0] += claude; total[1] += openai;
  console.log(`${kind}: ${texts.length} texts, claude ${claude}, o200k ${openai}, ratio ${(claude / openai).toFixed(3)} (per text ${low.toFixed(2)}-${high.toFixed(2)})`);
}
console.log(`all: ratio ${(total[0] / total[1]).toFixed(3)}`);
