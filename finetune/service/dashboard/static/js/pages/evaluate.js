// The run page's Evaluate card: what an evaluation of this job runs (the retention check, and the run's test set when
// it has one) with its time estimate before it starts; then its progress (elapsed against the estimate), then the
// test set's scores and answers; the retention numbers appear in the Retention card below. The work runs on a worker
// (POST /v1/fine_tuning/jobs/{id}/evaluations, docs/service.md "Evaluations"); this page only starts it and polls it.
import { api, badge, fill, fmt, h, inDashboardTerms, poll } from "../util.js";

const SCORES = [["token_f1", "token F1"], ["rouge_l", "ROUGE-L"], ["exact_match", "exact match"]];
const WAITING = new Set(["queued", "running"]);

function elapsedText(ev) {
  const est = ev.estimate_seconds;
  if (ev.status === "queued") return `Waiting for a worker (estimated ${fmt.duration(est)} once it starts).`;
  const spent = Math.max(0, Date.now() / 1000 - (ev.started_at || ev.created_at));
  return `Running: ${fmt.duration(spent)} so far of an estimated ${fmt.duration(est)}.`;
}

function scoresTable(test) {
  const summary = test?.summary || {};
  const models = Object.keys(summary);
  if (!models.length) return "";
  const rows = SCORES.filter(([k]) => models.some((m) => summary[m][k] !== undefined)).map(([k, name]) =>
    h("tr", { dataset: { score: k } }, h("th", { scope: "row" }, name),
      models.map((m) => h("td", { class: "num" }, fmt.fixed(summary[m][k], 3)))));
  return [
    h("p", { class: "small muted" }, `The run's test set: ${test.examples ?? "–"} held-out conversations, each model's answer scored against the team's reply. Overlap rewards the team's wording, not correctness: read the answers.`),
    h("div", { class: "tablewrap" }, h("table", { id: "test-scores" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, ""), models.map((m) => h("th", { scope: "col", class: "num" }, m)))),
      h("tbody", {}, rows))),
  ];
}

// Answers the team would sign (docs/answers.md): invented specifics, recited training replies and distinct answers,
// for each model and the team's own replies, with 95% intervals; the verdict and, when flagged, the usual remedies.
const SIGNED = [["invented", "invents a specific"], ["recited", "recites a training reply"], ["distinct", "distinct answers"]];
const pct = (x) => `${Math.round(100 * x)}%`;

function signedCell(key, x) {
  if (!x) return "n/a";
  return `${key === "distinct" ? `${x.count}/${x.n}` : pct(x.rate)} (${pct(x.low)}–${pct(x.high)})`;
}

function groundingView(g, schema) {
  if (!g || !g.models) return "";
  const models = Object.keys(g.models);
  const rows = SIGNED.map(([k, name]) => h("tr", { dataset: { measure: k } }, h("th", { scope: "row" }, name),
    models.map((m) => h("td", { class: "num" }, signedCell(k, g.models[m][k])))));
  return [
    h("h3", {}, "Answers the team would sign"),
    h("p", { class: "small muted" }, `On ${g.answers} held-out prompts: an answer invents a specific when it states an identifier, amount, date, time, card ending, phone number, e-mail address, URL or tracking code its conversation never gave; it recites when it is a training reply, equal or nearly so. 95% intervals.`),
    h("div", { class: "tablewrap" }, h("table", { id: "grounding" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, ""), models.map((m) => h("th", { scope: "col", class: "num" }, m === "reference" ? "team's replies" : m)))),
      h("tbody", {}, rows))),
    h("p", { class: g.flag ? "alert" : "good", "data-testid": "grounding-verdict" }, g.message || ""),
    g.flag && g.remedies?.length ? [h("p", {}, h("strong", {}, "Usual remedies:")), h("ul", {}, g.remedies.map((x) => h("li", {}, inDashboardTerms(x, schema))))] : "",
  ];
}

function answersView(answers) {
  const shown = [...(answers?.best || []).map((x) => ["best", x]), ...(answers?.worst || []).map((x) => ["worst", x])];
  if (!shown.length) return "";
  return h("details", { "data-testid": "test-answers" }, h("summary", {}, `Answers (${shown.length}: the best and the worst by token F1)`),
    shown.map(([kind, x]) => h("div", { class: "record" },
      h("p", { class: "small muted" }, `${kind} · line ${x.line} · token F1 ${fmt.fixed(x.token_f1, 2)}`),
      h("dl", { class: "kv small" },
        h("dt", {}, "prompt"), h("dd", {}, x.prompt),
        h("dt", {}, "team's reply"), h("dd", {}, x.reference),
        h("dt", {}, "tuned"), h("dd", {}, x.answer),
        h("dt", {}, "base"), h("dd", {}, x.base)))));
}

// evaluationCard(jobId, schema, signal, reload) -> { el, show(job, run) }; `reload()` fetches the run page's data
// again (the Retention card) once an evaluation ends.
export function evaluationCard(jobId, schema, signal, reload) {
  const el = h("section", { class: "card", "aria-label": "Evaluation", hidden: true });
  const status = h("p", { role: "status", "aria-live": "polite", class: "small" });
  const button = h("button", { type: "button", class: "primary", "data-testid": "evaluate" }, "Evaluate");
  let offer = null;
  let current = null;  // the newest evaluation as the API answers it
  let answers = null;
  let polling = false;

  function what() {
    if (!offer || !offer.available) return "";
    const parts = [];
    const work = offer.estimate?.work || {};
    if (offer.retention) parts.push(`the retention check (${work.retention?.prompts ?? "the"} general prompts and ${work.retention?.questions ?? ""} multiple-choice questions, the base beside the tuned model)`);
    if (offer.test) parts.push(`the run's test set (${work.test?.conversations ?? "its"} held-out conversations)`);
    return `Runs ${parts.join(" and ")} on a worker.`;
  }

  function draw() {
    const ev = current;
    const busy = ev && WAITING.has(ev.status);
    button.disabled = !offer?.available || busy;
    button.textContent = ev && !busy ? "Evaluate again" : "Evaluate";
    const estimate = offer?.estimate;
    fill(el,
      h("h2", {}, "Evaluation"),
      offer && !offer.available ? h("p", { class: "muted" }, offer.reason) : "",
      offer?.available ? h("p", {}, what(), " ",
        h("strong", { "data-testid": "evaluate-estimate" }, estimate ? `Estimated time: ${fmt.duration(estimate.seconds)}` : "No time estimate (the run's plan does not know the model's size)"),
        estimate ? h("span", { class: "small muted" }, ` (${estimate.how})`) : "") : "",
      h("div", { class: "actions" }, button, ev ? [" ", badge(ev.status)] : ""),
      status,
      ev?.status === "failed" && ev.error ? h("p", { class: "alert", role: "alert" }, inDashboardTerms(ev.error.message, schema)) : "",
      ev?.status === "succeeded" && ev.results?.test ? scoresTable(ev.results.test) : "",
      ev?.status === "succeeded" && ev.results?.test ? groundingView(ev.results.test.grounding, schema) : "",
      ev?.status === "succeeded" ? answersView(answers) : "",
      ev?.status === "succeeded" && ev.results?.retention ? h("p", { class: "small muted" }, "The retention check's numbers are in the Retention card below.") : "");
    status.textContent = busy ? elapsedText(ev) : ev?.status === "succeeded"
      ? `Evaluated ${fmt.time(ev.finished_at)} in ${fmt.duration(ev.finished_at - (ev.started_at || ev.created_at))} (estimated ${fmt.duration(ev.estimate_seconds)}).` : "";
  }

  function follow() {
    if (polling) return;
    polling = true;
    poll(signal, async () => {
      if (!current || !WAITING.has(current.status)) return;
      current = await api(`/v1/fine_tuning/jobs/${jobId}/evaluations/${current.id}`);
      draw();
      if (!WAITING.has(current.status)) await reload();
    }, 2000, false);
  }

  button.addEventListener("click", async () => {
    if (!offer?.available) return;
    button.disabled = true;
    try {
      current = await api(`/v1/fine_tuning/jobs/${jobId}/evaluations`, { method: "POST", body: { retention: offer.retention, test: offer.test } });
      status.textContent = "Evaluation started.";
    } catch (e) {
      status.textContent = inDashboardTerms(e.message, schema).map((x) => (typeof x === "string" ? x : x.textContent)).join("");
    }
    draw();
    follow();
  });

  function show(job, run) {
    offer = run.evaluation || null;
    answers = run.test_answers || null;
    el.hidden = job.status !== "succeeded" && !offer?.latest;
    const latest = offer?.latest || null;
    if (latest && (!current || latest.id !== current.id || !WAITING.has(current.status))) current = latest;
    draw();
    if (current && WAITING.has(current.status)) follow();
  }

  return { el, show };
}
