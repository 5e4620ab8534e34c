// Data preview of an uploaded file, before any job: every problem with its line, the counts, a token-length
// histogram, the records as the model sees them (scored tokens highlighted, context dimmed), and the split.
// A file of preference pairs (DPO) shows each pair: its prompt and preferred answer, then the rejected answer.
import { api, fill, fmt, h, qs } from "../util.js";
import { baseModels } from "./newjob.js";

const PAGE = 10;

export function histogram(hist, { width = 520, height = 140 } = {}) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height + 24}`);
  svg.setAttribute("class", "hist");
  svg.setAttribute("role", "img");
  const counts = hist.counts || [];
  const edges = hist.edges || [];
  const peak = Math.max(1, ...counts);
  const bw = width / Math.max(1, counts.length);
  const desc = counts.map((c, i) => `${edges[i]}–${edges[i + 1]} tokens: ${c}`).join("; ");
  svg.setAttribute("aria-label", `Records by length in tokens. ${desc}`);
  counts.forEach((c, i) => {
    const bh = (c / peak) * height;
    const r = document.createElementNS(ns, "rect");
    r.setAttribute("x", (i * bw + 1).toFixed(1));
    r.setAttribute("y", (height - bh).toFixed(1));
    r.setAttribute("width", Math.max(1, bw - 2).toFixed(1));
    r.setAttribute("height", bh.toFixed(1));
    r.setAttribute("fill", edges[i] >= hist.max_seq_len ? "#d9480f" : "#1f5fbf");
    const t = document.createElementNS(ns, "title");
    t.textContent = `${edges[i]}–${edges[i + 1]} tokens: ${c} records`;
    r.append(t);
    svg.append(r);
  });
  for (const [i, anchor] of [[0, "start"], [counts.length, "end"]]) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", i * bw);
    t.setAttribute("y", height + 16);
    t.setAttribute("font-size", "12");
    t.setAttribute("text-anchor", anchor);
    t.textContent = `${edges[i] ?? 0} tokens`;
    svg.append(t);
  }
  return svg;
}

function tokens(spans) {
  const body = h("div", { class: "tokens" });
  for (const span of spans) {
    if (span.weight > 0) {
      body.append(h("mark", { class: "scored", title: span.weight < 1 ? `scored ×${span.weight}` : "scored" }, span.text));
    } else {
      body.append(h("span", { class: "ctx" }, span.text));
    }
  }
  return body;
}

// Sensitive values found on the record's line: kind, role and place, never the value (the text shows a placeholder
// such as <EMAIL> where it was); `sensitive_data` on a job decides whether they are trained on, replaced or refused.
function sensitiveMarks(found) {
  if (!found || !found.length) return null;
  return h("ul", { class: "sensitive small", "aria-label": "Sensitive values on this line" },
    found.map((f) => h("li", {}, h("span", { class: `badge ${f.role === "assistant" ? "error" : "warn"}` }, f.kind),
      ` in the ${f.role} message ${f.message + 1}${f.field === "content" ? "" : ` (${f.field})`}, characters ${f.start}–${f.end} (masked)`)));
}

export function renderRecord(rec) {
  const body = tokens(rec.spans);
  if (rec.rejected_spans) {  // a preference pair: the preferred answer above, the rejected one below
    body.prepend(h("div", { class: "small muted" }, "Prompt and preferred answer"));
    body.append(h("div", { class: "small muted" }, "Rejected answer"),
      h("div", { class: "rejected" }, rec.rejected_spans.map((s) => h("del", {}, s.text))));
  }
  return h("article", { class: "record", "aria-label": `${rec.rejected_spans ? "Pair" : "Record"} ${rec.record}, line ${rec.line}` },
    h("div", { class: "row small muted" },
      h("strong", {}, `line ${rec.line}`), `record ${rec.record}`,
      h("span", { class: `badge ${rec.split === "validation" ? "warn" : ""}` }, rec.split),
      `${fmt.int(rec.tokens)} tokens, ${fmt.int(rec.target_tokens)} scored`,
      rec.truncated_tokens ? h("span", { class: "badge warn" }, `${rec.truncated_tokens} cut`) : null),
    sensitiveMarks(rec.sensitive),
    body);
}

function problemsTable(title, problems, level) {
  if (!problems.length) return null;
  return h("section", { "aria-label": title },
    h("h2", {}, `${title} (${problems.length})`),
    h("div", { class: "tablewrap" }, h("table", {},
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Line"), h("th", { scope: "col" }, "Code"), h("th", { scope: "col" }, "Problem"))),
      h("tbody", {}, problems.map((p) => h("tr", { class: `lvl-${level}` },
        h("td", { class: "num" }, p.line ?? "file"), h("td", {}, h("code", {}, p.code)), h("td", {}, p.message)))))));
}

export async function render(main, [fileId], signal) {
  const models = await baseModels();
  const file = await api(`/v1/files/${fileId}`);
  const model = h("select", { id: "pv-model" }, h("option", { value: "" }, "no model (estimated tokens)"),
    models.map((m) => h("option", { value: m.id }, m.id)));
  if (models.length) model.value = models[0].id;
  const maxLen = h("input", { id: "pv-len", type: "number", min: 1, value: 1024, inputmode: "numeric" });
  const policy = h("select", { id: "pv-policy" }, ["all", "last", "each"].map((p) => h("option", { value: p }, p)));
  const seed = h("input", { id: "pv-seed", type: "number", min: 0, value: 0, inputmode: "numeric" });
  const out = h("div", { "aria-live": "polite" });
  let offset = 0;

  async function load() {
    out.replaceChildren(h("p", { class: "muted" }, "Reading the file…"));
    const data = await api(`/v1/dashboard/files/${fileId}/preview${qs({
      model: model.value, max_seq_len: maxLen.value, record_policy: policy.value, seed: seed.value, offset, limit: PAGE,
    })}`);
    if (signal.aborted) return;
    const s = data.stats || {};
    const about = data.tokens_exact ? "" : "≈ ";
    const pairs = data.kind === "preference";
    const counted = pairs
      ? [["preference pairs", s.pairs], ["prompts", s.prompts], ["preferred tokens", s.chosen_tokens],
        ["rejected tokens", s.rejected_tokens], ["longest record", s.record_tokens?.max]]
      : [["conversations", s.conversations], ["training records", s.records], ["messages", s.messages],
        ["scored tokens", s.target_tokens], ["context tokens", s.context_tokens], ["longest record", s.record_tokens?.max]];
    const verdict = data.ok
      ? h("p", { class: "good" }, `Usable: ${data.errors.length} errors, ${data.warnings.length} warnings.`)
      : h("p", { class: "alert", role: "alert" }, `Not usable: ${data.errors.length} error(s), first on line ${data.errors[0]?.line ?? "–"}. Fix them and upload again.`);
    const split = data.split || {};
    const pager = h("div", { class: "actions" },
      h("button", { type: "button", disabled: offset === 0, onclick: () => { offset = Math.max(0, offset - PAGE); load(); } }, "Previous records"),
      h("span", { class: "muted" }, `records ${data.records_total ? offset + 1 : 0}–${Math.min(offset + PAGE, data.records_total)} of ${fmt.int(data.records_total)}`),
      h("button", { type: "button", disabled: offset + PAGE >= data.records_total, onclick: () => { offset += PAGE; load(); } }, "Next records"));
    fill(out,
      verdict,
      problemsTable("Errors", data.errors, "error"),
      problemsTable("Warnings", data.warnings, "warn"),
      h("h2", {}, "What the file holds"),
      h("div", { class: "stats" },
        counted.map(([k, v]) => h("div", { class: "stat" }, h("div", { class: "v" }, `${k.includes("token") || k === "longest record" ? about : ""}${fmt.int(v)}`), h("div", { class: "k" }, k)))),
      h("div", { class: "grid2" },
        h("section", { class: "card", "aria-label": "Token lengths" }, h("h2", {}, "Record lengths"),
          histogram(data.histogram || {}),
          h("p", { class: "small muted" }, `${about}tokens per record; bars at or over --max-seq-len ${data.histogram?.max_seq_len} in orange. p50 ${fmt.int(s.record_tokens?.p50)} · p95 ${fmt.int(s.record_tokens?.p95)}`)),
        h("section", { class: "card", "aria-label": "Validation split" }, h("h2", {}, "Validation split"),
          h("dl", { class: "kv" },
            h("dt", {}, "held out"), h("dd", {}, `${fmt.int(split.val_conversations)} conversations (${fmt.fixed((split.val_fraction || 0) * 100, 1)}%)`),
            h("dt", {}, "trained on"), h("dd", {}, `${fmt.int(split.train_conversations)} conversations`),
            h("dt", {}, "why"), h("dd", {}, split.reason || "–"),
            h("dt", {}, "held-out lines"), h("dd", { class: "small" }, (split.val_lines || []).slice(0, 40).join(", ") + ((split.val_lines || []).length > 40 ? ", …" : ""))))),
      h("h2", {}, pairs ? "Pairs as the model reads them" : "Records as the model reads them"),
      h("p", { class: "small muted" }, h("span", { class: "legend-scored" }, "highlighted"), " text is scored (what the model learns); dimmed text is context, read but never scored.",
        data.tokens_exact ? "" : " Choose a model to see the chat template's tokens."),
      pager,
      (data.records || []).map(renderRecord),
    );
  }

  const form = h("form", { class: "row card" },
    h("div", { class: "field" }, h("label", { for: "pv-model" }, "Model (tokenizer and chat template)"), model),
    h("div", { class: "field" }, h("label", { for: "pv-len" }, "Max sequence length"), maxLen),
    h("div", { class: "field" }, h("label", { for: "pv-policy" }, "Scored replies"), policy),
    h("div", { class: "field" }, h("label", { for: "pv-seed" }, "Split seed ", h("span", { class: "hint" }, "the job's seed")), seed),
    h("button", { type: "submit" }, "Refresh"),
    h("a", { class: "button primary", href: `#/new?file=${fileId}` }, "New job with this file"));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); offset = 0; load(); });
  main.append(h("h1", {}, `Data preview: ${file.filename}`), h("p", { class: "muted mono small" }, file.id), form, out);
  await load();
}
