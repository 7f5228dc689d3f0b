// The sluice inspector page (docs/inspector.md). Static: everything it shows comes from the
// session API, asked with the key the user enters, which stays in this tab's session storage.
// Data is written with textContent only, never as HTML.
"use strict";

const KEY = "sluice-inspector-key";
const $ = (sel) => document.querySelector(sel);
const state = { key: sessionStorage.getItem(KEY) || "", blobs: new Map(), texts: new Map() };

/** An element with attributes (`class`, `data-*`, properties) and children (nodes or text). */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name.startsWith("data-") || name.startsWith("aria-") || name === "role") node.setAttribute(name, value);
    else node[name] = value;
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const fmt = (n) => Math.round(Number(n) || 0).toLocaleString("en-US");
/** `to` against `from` as a change: a saving in green ("−16 %"), a loss in red ("+16 %"). */
function change(from, to) {
  if (!(from > 0)) return el("span", { class: "help" }, "–");
  const d = Math.round((to / from - 1) * 100);
  return d <= 0
    ? el("span", { class: "saved", title: "less than the agent's own" }, `−${-d} %`)
    : el("span", { class: "lost", title: "more than the agent's own" }, `+${d} %`);
}
/** A bill by kind: read, written, uncached (the exact cache model, docs/cache.md). */
const billed = (b) => b
  ? `read ${fmt(b.read)} · written ${fmt(b.write_short + b.write_long)} · uncached ${fmt(b.uncached)}`
  : "–";
const when = (ms) => new Date(ms).toLocaleString();
const say = (text) => { $("#status").textContent = text; };

async function api(path, as = "json") {
  const response = await fetch(path, { headers: { Authorization: `Bearer ${state.key}` } });
  if (response.status === 401) throw new Error("sluice needs a key to show sessions.");
  if (response.status === 404 && path.endsWith("/sessions")) {
    throw new Error("The inspector is off on this sluice ([inspector] enabled = true turns it on).");
  }
  if (!response.ok) throw new Error(`sluice answered ${response.status} for ${path}.`);
  return as === "json" ? response.json() : as === "blob" ? response.blob() : response.text();
}

/** An artifact's text, fetched once. */
function artifactText(id) {
  if (!state.texts.has(id)) state.texts.set(id, api(`/v1/sluice/artifacts/${encodeURIComponent(id)}`, "text"));
  return state.texts.get(id);
}

/** An image artifact as an object URL, fetched once. */
function artifactBlob(id) {
  if (!state.blobs.has(id)) {
    state.blobs.set(id, api(`/v1/sluice/artifacts/${encodeURIComponent(id)}`, "blob").then((b) => URL.createObjectURL(b)));
  }
  return state.blobs.get(id);
}

async function showSessions() {
  say("Loading sessions…");
  const { sessions } = await api("/v1/sluice/sessions");
  const body = $("#sessions tbody");
  body.replaceChildren();
  for (const s of sessions) {
    const t = s.totals;
    const open = el("button", { type: "button", "data-session": s.id, onclick: () => showSession(s.id) },
      s.label || `session ${s.id.slice(0, 12)}`);
    body.append(el("tr", { "data-session": s.id },
      el("td", {}, open),
      el("td", {}, s.model, el("br"), el("span", { class: "help" }, `${s.dialect} · route ${s.route}`)),
      el("td", { class: "num" }, fmt(s.turns)),
      el("td", {}, when(s.last_ms)),
      el("td", { class: "num" }, `${fmt(t.received_tokens)} → ${fmt(t.forwarded_tokens)} `,
        change(t.received_tokens, t.forwarded_tokens)),
      el("td", { class: "num" }, `${fmt(t.received_cost)} → ${fmt(t.forwarded_cost)} `,
        change(t.received_cost, t.forwarded_cost))));
  }
  $("#sessions-section").hidden = false;
  $("#forget").hidden = false;
  say(sessions.length ? `${sessions.length} session(s).` : "No sessions recorded for this key yet.");
  const wanted = location.hash.slice(1);
  if (wanted && sessions.some((s) => s.id === wanted)) await showSession(wanted);
}

function fact(key, label, value, shown = fmt(value), extra = null) {
  return el("div", {}, el("dt", {}, label),
    el("dd", { "data-key": key, "data-value": String(value) }, shown, extra ? " " : null, extra));
}

function savings(t, turns) {
  const kept = turns.filter((turn) => turn.complete && turn.usage);
  const cached = kept.reduce((sum, turn) => sum + turn.usage.cached, 0);
  const estimated = kept.reduce((sum, turn) => sum + turn.prefix.forwarded_tokens, 0);
  $("#savings dl").replaceChildren(
    fact("completed", "Turns completed (failed)", t.completed, `${fmt(t.completed)} (${fmt(t.failed)})`),
    fact("received_tokens", "Input tokens the agent sent", t.received_tokens),
    fact("forwarded_tokens", "Input tokens the model got", t.forwarded_tokens, fmt(t.forwarded_tokens),
      change(t.received_tokens, t.forwarded_tokens)),
    fact("received_cost", "Billed input, as the agent sent it (uncached tokens)", t.received_cost),
    fact("forwarded_cost", "Billed input, as forwarded (uncached tokens)", t.forwarded_cost, fmt(t.forwarded_cost),
      change(t.received_cost, t.forwarded_cost)),
    fact("provider_cached", "Provider: cached input tokens", t.provider_cached),
    fact("provider_input", "Provider: all input tokens", t.provider_input),
    fact("estimate_vs_provider", "Cacheable prefix, estimate vs provider (kept turns)",
      `${estimated}/${cached}`, `${fmt(estimated)} vs ${fmt(cached)}`),
    fact("spilled", "Tool results spilled", t.spilled),
    fact("retired", "Tool results retired (context guard)", t.retired),
    fact("images", "Images shown / placeholders", `${t.images_embedded}/${t.images_placeholders}`,
      `${fmt(t.images_embedded)} / ${fmt(t.images_placeholders)}`),
    fact("reads", "Read calls sluice answered", t.reads));
}

/** A `<details>` whose content is loaded when first opened. */
function lazy(summary, load) {
  const body = el("pre", {}, "Loading…");
  const details = el("details", {}, el("summary", {}, summary), body);
  let loaded = false;
  details.addEventListener("toggle", async () => {
    if (!details.open || loaded) return;
    loaded = true;
    try { body.textContent = await load(); } catch (e) { body.textContent = e.message; }
  });
  return details;
}

const FATES = {
  untouched: "as sent",
  spilled: "its first page and a notice; the rest is in the artifact",
  retired: "one line: retired by the context guard",
  media: "its text, with its images or audio taken out",
};

function resultRow(r, i) {
  const sent = el("div", {},
    el("strong", {}, r.tool || "tool"), " ", el("span", { class: "help" }, r.source), el("br"),
    `${fmt(r.bytes)} bytes`,
    r.artifact ? lazy("whole output", () => artifactText(r.artifact)) : null);
  const got = el("div", {},
    el("span", { class: `fate ${r.fate}` }, r.fate), FATES[r.fate] || "", el("br"),
    `${fmt(r.shown_bytes)} bytes`,
    r.fate === "spilled" && r.artifact
      ? lazy(`page: lines 1–${fmt(r.shown_lines)} and the notice`, async () => {
          const text = await artifactText(r.artifact);
          return `${text.split("\n").slice(0, r.shown_lines || 0).join("\n")}\n${r.notice}`;
        })
      : null,
    r.fate === "retired" && r.notice ? el("pre", { class: "notice" }, r.notice) : null);
  return el("div", { class: "pair row", "data-result": String(i), "data-fate": r.fate }, sent, got);
}

function imageFigure(img) {
  const caption = `${img.fate}${img.reason ? ` (${img.reason})` : ""}${img.width ? ` ${img.width}×${img.height}` : ""}${img.downscaled ? ", downscaled" : ""}`;
  const figure = el("figure", { "data-fate": img.fate }, el("figcaption", {}, caption));
  if (img.artifact) {
    const picture = el("img", { alt: `image, ${caption}`, "data-artifact": img.artifact });
    figure.prepend(picture);
    artifactBlob(img.artifact).then((url) => { picture.src = url; }, () => { picture.alt = "image expired"; });
  }
  return figure;
}

function audioFigure(a) {
  const length = a.millis ? ` ${(a.millis / 1000).toFixed(1)} s` : "";
  const caption = `${a.fate}${a.reason ? ` (${a.reason})` : ""}${length}`;
  const figure = el("figure", { "data-fate": a.fate, "data-audio-fate": a.fate }, el("figcaption", {}, caption));
  if (a.artifact) {
    const player = el("audio", { controls: true, preload: "metadata", "data-artifact": a.artifact });
    figure.prepend(player);
    artifactBlob(a.artifact).then((url) => { player.src = url; }, () => { figure.append(" (expired)"); });
  }
  return figure;
}

function turnView(turn, n) {
  const failed = !turn.complete;
  const usage = turn.usage
    ? `provider: ${fmt(turn.usage.cached)} cached of ${fmt(turn.usage.input + turn.usage.cached + turn.usage.cache_creation)} input`
    : "provider usage: not reported";
  const header = el("header", {},
    el("strong", {}, `Turn ${n}`),
    el("span", {}, when(turn.at_ms)),
    el("span", {}, failed ? `status ${turn.status || "none"}, not completed` : `status ${turn.status}`),
    el("span", { class: "facts" }, `${turn.model} · ${turn.dialect} · ${turn.stream ? "streamed" : "whole"}`),
    el("span", { class: "facts" }, `tokens ${fmt(turn.received.tokens)} → ${fmt(turn.forwarded.tokens)}`),
    el("span", { class: "facts" }, `cacheable prefix ${fmt(turn.prefix.forwarded_tokens)} · ${usage}`),
    el("span", { class: "facts", "data-bill": "forwarded" },
      `billed: ${billed(turn.bill && turn.bill.forwarded)} (agent alone: ${billed(turn.bill && turn.bill.received)}) · `,
      change(turn.cost.received, turn.cost.forwarded)),
    turn.cache_break
      ? el("span", { class: "facts lost", "data-break": turn.cache_break.cause },
        `cache broke at block ${fmt(turn.cache_break.block)}: ${{
          ttl: "idle past the cache's lifetime",
          client: "the agent changed its own history",
          sluice: "sluice's edit (an image pruned, a result retired, a tool added)",
        }[turn.cache_break.cause] || turn.cache_break.cause}; ${fmt(turn.cache_break.rewritten)} tokens written again`)
      : null,
    el("span", { class: "facts" }, `sluice ${turn.ms.sluice.toFixed(2)} ms · upstream ${turn.ms.upstream.toFixed(1)} ms`),
    el("span", { class: "facts" }, turn.projection));
  const rows = turn.results.map(resultRow);
  const extras = [];
  if (turn.results_unlisted) extras.push(el("div", { class: "extra" }, `${turn.results_unlisted} more tool results not listed.`));
  if (turn.images.length) {
    extras.push(el("div", { class: "extra", "data-images": String(turn.images.length) },
      el("h4", {}, "Images"), el("div", { class: "thumbs" }, turn.images.map(imageFigure))));
  }
  if (turn.audio && turn.audio.length) {
    extras.push(el("div", { class: "extra", "data-audio": String(turn.audio.length) },
      el("h4", {}, "Audio (stored; sent to the model when embedded)"),
      el("div", { class: "thumbs" }, turn.audio.map(audioFigure))));
  }
  if (turn.reads.length) {
    extras.push(el("div", { class: "extra", "data-reads": String(turn.reads.length) },
      `Read calls sluice answered within this request (hidden from the agent): `,
      turn.reads.map((r) => `${r.outcome}${r.artifact ? ` of ${r.artifact}` : ""}`).join(", ")));
  }
  if (turn.hidden_rounds) {
    extras.push(el("div", { class: "extra", "data-hidden": String(turn.hidden_rounds) },
      `Hidden read rounds of earlier turns spliced back: ${turn.hidden_rounds} edit(s).`));
  }
  if (turn.context) {
    const c = turn.context;
    extras.push(el("div", { class: "extra" },
      `Context guard: about ${fmt(c.estimated)} tokens against ${fmt(c.limit)}; ${c.retired} result(s) retired` +
      `${c.batch ? `, ${c.batch} in this turn` : ""}${c.overflow ? "; still over the window" : ""}.`));
  }
  return el("li", { class: `turn${failed ? " failed" : ""}`, "data-turn": String(n) },
    header,
    rows.length ? el("div", { class: "pair head" }, el("div", {}, "What the agent sent"), el("div", {}, "What the model got")) : null,
    rows, extras);
}

async function showSession(id) {
  say("Loading the session…");
  const record = await api(`/v1/sluice/sessions/${encodeURIComponent(id)}`);
  const head = record.session;
  location.hash = id;
  $("#session-title").textContent = `Session ${head.label || id.slice(0, 12)} · ${head.model}`;
  savings(head.totals, record.turns);
  // Turns are numbered from the session's first, though only the last `keep_turns` are kept.
  const first = head.turns - record.turns.length + 1;
  $("#turns").replaceChildren(...record.turns.map((turn, i) => turnView(turn, first + i)));
  $("#session-section").hidden = false;
  say(`Turns ${first} to ${head.turns} of session ${head.label || id.slice(0, 12)}.`);
  $("#session-title").focus();
}

function run(task) {
  task().catch((e) => say(e.message));
}

$("#key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.key = $("#key").value.trim();
  sessionStorage.setItem(KEY, state.key);
  $("#key").value = "";
  run(showSessions);
});

$("#forget").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  state.key = "";
  $("#sessions-section").hidden = true;
  $("#session-section").hidden = true;
  $("#forget").hidden = true;
  say("Key forgotten.");
});

if (state.key) run(showSessions);
