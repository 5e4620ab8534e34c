// A run's page: progress, loss / learning-rate / gradient-norm charts, checkpoints (best badged, pick one by
// clicking the curve), the report's diagnosis, the Evaluate card (evaluate.js) and the retention check it (or
// `finetune eval RUN --retention`) wrote, the events log following live, the frozen settings, and cancel / pause / resume.
// Everything is polled from the public API while the job is not finished.
import { align, ema, line, makeChart } from "../chart.js";
import { api, badge, fill, fmt, h, inDashboardTerms, poll, qs, settingsSchema, TERMINAL } from "../util.js";
import { evaluationCard } from "./evaluate.js";
import { planView } from "./newjob.js";

const EVENTS_PAGE = 50;
const RETENTION_MEASURES = [["accuracy", "accuracy"], ["rule_pass_rate", "rule pass-rate"], ["choice_accuracy", "multiple-choice accuracy"],
  ["instruction_following", "instruction following"], ["instructions_kept", "instructions kept"], ["team_voice", "general answers in the team's voice"]];

const pct = (x) => `${Math.round(100 * x)}%`;
const points = (x) => { const v = Math.round(100 * x); return `${v > 0 ? "+" : ""}${v}`; };

// The retention check's numbers, its verdict in plain words and, when it flags a drop, the usual remedies.
function retentionView(r, schema) {
  const rows = RETENTION_MEASURES.filter(([k]) => r[k] && r[k].n).map(([k, name]) => {
    const m = r[k];
    const c = m.change;
    return h("tr", { dataset: { measure: k }, class: m.dropped || m.rose ? "dropped" : "" },
      h("th", { scope: "row" }, name),
      h("td", { class: "num" }, String(m.n)),
      h("td", { class: "num" }, `${pct(m.base.rate)} (${pct(m.base.low)}–${pct(m.base.high)})`),
      h("td", { class: "num" }, `${pct(m.tuned.rate)} (${pct(m.tuned.low)}–${pct(m.tuned.high)})`),
      h("td", { class: "num" }, `${points(c.value)} (${points(c.low)} to ${points(c.high)})`, m.dropped ? h("strong", {}, " drop") : m.rose ? h("strong", {}, " rise") : ""));
  });
  const set = r.general_set || {};
  return [
    h("h2", {}, "Retention"),
    h("p", { class: "small muted" }, `The base and the tuned model on ${set.prompts ?? "–"} general prompts, ${set.requests ?? 0} requests for longer answers with instructions on their form and ${set.choices ?? "–"} multiple-choice questions never trained on (the evaluation's retention check). 95% intervals; the change in percentage points.`),
    h("div", { class: "tablewrap" }, h("table", { id: "retention" },
      h("thead", {}, h("tr", {}, ["", "Prompts", "Base", "Tuned", "Change"].map((t, i) => h("th", { scope: "col", class: i ? "num" : "" }, t)))),
      h("tbody", {}, rows))),
    h("p", { class: "small" }, `Mean KL(tuned ‖ base) per token on the base's own answers: ${fmt.num(r.kl?.mean_per_token, 3)} nats.`),
    h("p", { class: r.flag ? "alert" : "good", "data-testid": "retention-verdict" }, r.message || ""),
    r.flag && r.remedies?.length ? [h("p", {}, h("strong", {}, "Usual remedies:")), h("ul", {}, r.remedies.map((x) => h("li", {}, inDashboardTerms(x, schema))))] : "",
  ];
}

// The forgetting curve: general_val_loss at each evaluation, from the starting model's value at step 0; null without it.
const GENERAL_COLOR = "#0b7285";
function forgettingSeries(c, mode, vx) {
  const y = c.val.general_val_loss;
  if (!y) return null;
  const base = c.val.general_val_loss_base;
  return base === null || base === undefined ? { x: vx, y } : { x: [...xOf(c, mode, [0]), ...vx], y: [base, ...y] };
}

function xOf(curve, mode, steps) {
  if (mode === "step") return steps;
  const spe = curve.steps_per_epoch;
  return steps.map((s) => (spe ? +(s / spe).toFixed(4) : s));
}

// What the run cost against what its plan estimated: tokens at the server's price, device time at its hourly price.
function costVersusEstimate(report, plan) {
  const planned = (plan && plan.cost) || {};
  const actual = (report.cost ?? 0) + (report.time_cost ?? 0);
  const estimate = (planned.token_cost ?? 0) + (planned.time_cost ?? 0);
  if (report.cost == null && report.time_cost == null) return "no price set on this server";
  return `${fmt.money(actual)} (estimated ${fmt.money(estimate)})`;
}

// The files its hyperparameters name by id (general_data: its own general conversations), as the job shows them.
function namedFiles(job, schema) {
  return Object.entries(schema.schema.properties)
    .filter(([key, prop]) => (prop["x-finetune"] || {}).file && job.hyperparameters?.[key])
    .map(([key, prop]) => [h("dt", {}, prop.title.toLowerCase()), h("dd", { class: "mono" }, job.hyperparameters[key])]);
}

export async function render(main, [jobId], signal) {
  const schema = await settingsSchema();  // settings named by their form fields' labels (util.js inDashboardTerms)
  let job = await api(`/v1/fine_tuning/jobs/${jobId}`);
  const state = { xMode: "step", smoothing: 0.6, raw: true, picked: null, curve: null, checkpoints: [], best: null, gguf: null };

  // ---- header and actions
  const statusEl = h("span");
  const actions = {
    cancel: h("button", { type: "button", class: "danger" }, "Cancel"),
    pause: h("button", { type: "button" }, "Pause"),
    resume: h("button", { type: "button" }, "Resume"),
  };
  const actionMsg = h("span", { role: "status", class: "muted small" });
  for (const [name, btn] of Object.entries(actions)) {
    btn.addEventListener("click", async () => {
      if (name === "cancel" && !confirm(`Cancel ${jobId}? A cancelled job cannot be resumed.`)) return;
      btn.disabled = true;
      try {
        job = await api(`/v1/fine_tuning/jobs/${jobId}/${name}`, { method: "POST" });
        actionMsg.textContent = `${name} requested: the job is now ${job.status}.`;
      } catch (e) {
        actionMsg.textContent = e.message;
      }
      showJob();
    });
  }
  const stats = h("div", { class: "stats", "aria-live": "off" });
  const errorBox = h("div");
  const diagnosis = h("section", { class: "card", "aria-label": "Diagnosis" });
  const retention = h("section", { class: "card", "aria-label": "Retention", hidden: true });
  const evaluate = evaluationCard(jobId, schema, signal, async () => showRun(await api(`/v1/dashboard/jobs/${jobId}/run`)));

  // ---- charts
  const lossEl = h("div", { class: "chart", "aria-label": "Training and validation loss" });
  const lrEl = h("div", { class: "chart", "aria-label": "Learning rate" });
  const gradEl = h("div", { class: "chart", "aria-label": "Gradient norm" });
  const chartNote = h("p", { class: "small muted" });
  const smoothing = h("input", { id: "smooth", type: "range", min: 0, max: 0.98, step: 0.02, value: state.smoothing });
  const smoothOut = h("output", { for: "smooth" }, String(state.smoothing));
  const rawBox = h("input", { id: "raw", type: "checkbox", checked: true });
  const xStep = h("input", { type: "radio", name: "xmode", id: "x-step", value: "step", checked: true });
  const xEpoch = h("input", { type: "radio", name: "xmode", id: "x-epoch", value: "epoch" });
  const controls = h("div", { class: "chartbar", role: "group", "aria-label": "Chart options" },
    h("span", {}, "x axis:"), xStep, h("label", { for: "x-step" }, "steps"), xEpoch, h("label", { for: "x-epoch" }, "epochs"),
    h("label", { for: "smooth" }, "smoothing"), smoothing, smoothOut,
    rawBox, h("label", { for: "raw" }, "raw line (faint)"));
  let charts = [];

  // ---- checkpoints, events, settings
  const ckBody = h("tbody");
  const finalLink = h("p");
  const evBody = h("tbody");
  const follow = h("input", { type: "checkbox", id: "follow", checked: true });
  const levelSel = h("select", { id: "ev-level" }, ["all", "info", "warn", "error"].map((l) => h("option", { value: l }, l)));
  const olderBtn = h("button", { type: "button" }, "Load older events");
  const settingsBox = h("section", { "aria-label": "Frozen settings" });

  main.append(
    h("div", { class: "row" }, h("h1", {}, `Run ${jobId}`), statusEl),
    h("p", { class: "muted small mono" }, job.suffix ? `suffix ${job.suffix} · ` : "", `model ${job.model} · file ${job.training_file}`),
    h("div", { class: "actions" }, actions.pause, actions.resume, actions.cancel,
      h("a", { class: "button", href: `#/compare/${jobId}` }, "Compare with…"), actionMsg),
    errorBox, stats,
    h("section", { class: "card", "aria-label": "Curves" }, h("h2", {}, "Curves"), controls, lossEl, chartNote,
      h("div", { class: "grid2 charts2" }, lrEl, gradEl)),
    diagnosis, evaluate.el, retention,
    h("section", { "aria-label": "Checkpoints" }, h("h2", {}, "Checkpoints"),
      h("p", { class: "small muted" }, "Click a point on the loss curve to pick the nearest checkpoint."),
      h("div", { class: "tablewrap" }, h("table", { id: "checkpoints" },
        h("thead", {}, h("tr", {}, ["Step", "Train loss", "Val loss", "", "Weights"].map((t, i) => h("th", { scope: "col", class: i < 3 ? (i ? "num" : "") : "" }, t)))),
        ckBody)), finalLink),
    h("section", { "aria-label": "Events" }, h("h2", {}, "Events"),
      h("div", { class: "chartbar" }, follow, h("label", { for: "follow" }, "follow live"), h("label", { for: "ev-level" }, "level"), levelSel),
      h("div", { class: "events", tabindex: 0, "aria-label": "Events log, newest first" },
        h("table", {}, h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Time"), h("th", { scope: "col" }, "Level"), h("th", { scope: "col" }, "Message"))), evBody)),
      olderBtn),
    h("h2", {}, "Settings (frozen at start)"), settingsBox,
  );

  function showJob() {
    statusEl.replaceChildren(badge(job.status));
    const st = job.status;
    actions.cancel.disabled = TERMINAL.has(st);
    actions.pause.disabled = !["validating_files", "queued", "running"].includes(st);
    actions.resume.disabled = st !== "paused";
    errorBox.replaceChildren(job.error && job.error.message ? h("p", { class: "alert", role: "alert" }, h("strong", {}, `${job.error.code || "error"}: `), inDashboardTerms(job.error.message, schema)) : "");
  }

  // ---- charts
  function marks() {
    const c = state.curve;
    if (!c) return [];
    const toX = (s) => xOf(c, state.xMode, [s])[0];
    const out = c.checkpoints.map((s) => ({ x: toX(s), color: "#868e96", width: 1, dash: [4, 4] }));
    if (state.best !== null && state.best !== undefined) out.push({ x: toX(state.best), color: "#2b8a3e", width: 2, dash: [] });
    if (state.picked !== null) out.push({ x: toX(state.picked), color: "#f59f00", width: 2, dash: [] });
    return out;
  }

  function drawCharts() {
    const c = state.curve;
    if (!c || !c.train.step.length) {
      chartNote.textContent = "No steps logged yet: the curve appears with the first step.";
      return;
    }
    charts.forEach((p) => { p.disconnect(); p.destroy(); });
    charts = [];
    const xLabel = state.xMode === "step" ? "step" : "epoch";
    const tx = xOf(c, state.xMode, c.train.step);
    const vx = xOf(c, state.xMode, c.val.step);
    const general = forgettingSeries(c, state.xMode, vx);  // the forgetting curve (general_val), when the run has it
    const loss = align([
      { x: tx, y: c.train.train_loss },
      { x: tx, y: ema(c.train.train_loss, state.smoothing) },
      { x: vx, y: c.val.val_loss },
      ...(general ? [general] : []),
    ]);
    const lossChart = makeChart(lossEl, {
      title: "Loss", xLabel, yLabel: "loss", data: loss, sync: jobId, marks,
      series: [
        { ...line("train (raw)", "#1f5fbf", { faint: true }), show: state.raw },
        line(state.smoothing ? `train (smoothed ${state.smoothing})` : "train", "#1f5fbf"),
        line("validation", "#d9480f", { points: true }),
        ...(general ? [line("general answers (forgetting)", GENERAL_COLOR, { points: true, dash: [6, 3] })] : []),
      ],
    });
    lossChart.over.addEventListener("click", () => {
      const idx = lossChart.cursor.idx;
      if (idx === null || idx === undefined) return;
      const x = lossChart.data[0][idx];
      const step = state.xMode === "step" ? x : Math.round(x * (c.steps_per_epoch || 1));
      pickNearest(step, true);
    });
    charts.push(lossChart);
    charts.push(makeChart(lrEl, { title: "Learning rate", xLabel, yLabel: "learning rate", height: 180, sync: jobId, marks,
      data: [tx, c.train.learning_rate], series: [line("learning rate", "#7048e8")] }));
    charts.push(makeChart(gradEl, { title: "Gradient norm", xLabel, yLabel: "norm", height: 180, sync: jobId, marks,
      data: [tx, c.train.grad_norm], series: [line("grad norm", "#2b8a3e")] }));
    chartNote.textContent = `${fmt.int(c.steps_logged)} steps logged${c.total_steps ? ` of ${fmt.int(c.total_steps)}` : ""}` +
      (c.downsampled ? `; drawn from ${fmt.int(c.points)} points (lowest and highest loss of each stretch kept)` : "") +
      `. Dashed grey: checkpoints; green: best step${state.best ? ` (${state.best})` : ""}; orange: picked checkpoint.` +
      (general ? " Teal, dashed: the loss on general prompts answered by the base model, never trained on (from the base's own value at step 0): rising means the model drifts from what it knew." : "");
  }
  const redraw = () => drawCharts();
  smoothing.addEventListener("input", () => { state.smoothing = Number(smoothing.value); smoothOut.textContent = smoothing.value; redraw(); });
  rawBox.addEventListener("change", () => { state.raw = rawBox.checked; redraw(); });
  for (const r of [xStep, xEpoch]) r.addEventListener("change", () => { state.xMode = r.value; redraw(); });

  // ---- checkpoints
  function pickNearest(step, fromChart) {
    if (!state.checkpoints.length) return;
    const nearest = state.checkpoints.reduce((a, b) => (Math.abs(b.step_number - step) < Math.abs(a.step_number - step) ? b : a));
    state.picked = nearest.step_number;
    showCheckpoints();
    charts.forEach((p) => p.redraw(false));
    const row = ckBody.querySelector(`tr[data-step="${nearest.step_number}"]`);
    if (row && fromChart) {
      row.scrollIntoView({ block: "nearest" });
      row.querySelector("a")?.focus({ preventScroll: true });
    }
  }

  function showCheckpoints() {
    const rows = state.checkpoints.map((ck) => {
      const m = ck.metrics || {};
      const isBest = ck.step_number === state.best;
      const tr = h("tr", { dataset: { step: ck.step_number }, class: ck.step_number === state.picked ? "selected" : "", "aria-selected": ck.step_number === state.picked ? "true" : "false" },
        h("td", {}, h("button", { type: "button", class: "link", "aria-label": `Pick checkpoint at step ${ck.step_number}`, onclick: () => pickNearest(ck.step_number, false) }, String(ck.step_number))),
        h("td", { class: "num" }, fmt.num(m.train_loss, 4)),
        h("td", { class: "num" }, fmt.num(m.valid_loss ?? m.full_valid_loss, 4)),
        h("td", {}, isBest ? h("span", { class: "badge best" }, "best") : ""),
        h("td", {}, h("a", { href: `/v1/dashboard/jobs/${jobId}/download${qs({ checkpoint: ck.id })}`, download: "" }, `Download ${ck.step_number}`),
          ...ggufLink({ checkpoint: ck.id }, `GGUF ${ck.step_number}`, `Step ${ck.step_number} as one GGUF file (llama.cpp, Ollama, LM Studio)`)));
      return tr;
    });
    ckBody.replaceChildren(...rows);
    if (!rows.length) ckBody.append(h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No checkpoint yet.")));
    const gguf = state.gguf;
    finalLink.replaceChildren(job.status === "succeeded"
      ? h("span", {}, h("a", { class: "button primary", href: `/v1/dashboard/jobs/${jobId}/download`, download: "" },
        `Download the final ${job.hyperparameters?.method === "full" ? "model" : "adapter"}`),
        gguf?.supported ? " " : "",
        gguf?.supported ? h("a", { class: "button", href: `/v1/dashboard/jobs/${jobId}/download${qs({ format: "gguf" })}`, download: "",
          title: "The merged model as one GGUF file (f16) for llama.cpp, Ollama and LM Studio; the first download converts it" },
        "Download as GGUF") : "",
        h("span", { class: "muted small" }, ` ${job.fine_tuned_model || ""}`),
        gguf && !gguf.supported ? h("span", { class: "muted small", "data-testid": "gguf-reason" }, ` No GGUF: ${gguf.reason}`) : "")
      : "");
  }

  // the checkpoint as one .gguf file, beside its folder, when the model's architecture and tokenizer allow it
  function ggufLink(query, text, title) {
    if (!state.gguf?.supported) return [];
    return [" · ", h("a", { href: `/v1/dashboard/jobs/${jobId}/download${qs({ ...query, format: "gguf" })}`, download: "", title }, text)];
  }

  async function loadCheckpoints() {
    const all = [];
    let after = null;
    for (let i = 0; i < 20; i++) {
      const page = await api(`/v1/fine_tuning/jobs/${jobId}/checkpoints${qs({ limit: 100, after })}`);
      all.push(...page.data);
      if (!page.has_more || !page.data.length) break;
      after = page.data[page.data.length - 1].id;
    }
    state.checkpoints = all.sort((a, b) => a.step_number - b.step_number);
    showCheckpoints();
  }

  // ---- events: newest first; new ones are merged on top, older pages appended on demand
  const seen = new Map();
  let oldest = null;
  let hasOlder = false;
  function eventRow(ev) {
    return h("tr", { class: `lvl-${ev.level}`, dataset: { level: ev.level } },
      h("td", { class: "small" }, fmt.clock(ev.created_at)), h("td", {}, h("span", { class: `badge ${ev.level}` }, ev.level)), h("td", {}, inDashboardTerms(ev.message, schema)));
  }
  function filterEvents() {
    for (const tr of evBody.children) tr.hidden = levelSel.value !== "all" && tr.dataset.level !== levelSel.value;
  }
  async function newEvents() {
    const fresh = [];
    let after = null;
    for (let i = 0; i < 20; i++) {
      const page = await api(`/v1/fine_tuning/jobs/${jobId}/events${qs({ limit: EVENTS_PAGE, after })}`);
      const unseen = page.data.filter((e) => !seen.has(e.id));
      fresh.push(...unseen);
      if (oldest === null) { hasOlder = page.has_more; break; }
      if (unseen.length < page.data.length || !page.has_more) break;
      after = page.data[page.data.length - 1].id;
    }
    if (!fresh.length) return;
    const rows = fresh.map((e) => { const tr = eventRow(e); seen.set(e.id, tr); return tr; });
    if (oldest === null) oldest = fresh[fresh.length - 1].id;
    evBody.prepend(...rows);
    filterEvents();
    olderBtn.hidden = !hasOlder;
    if (follow.checked) evBody.closest(".events").scrollTop = 0;
  }
  olderBtn.addEventListener("click", async () => {
    const page = await api(`/v1/fine_tuning/jobs/${jobId}/events${qs({ limit: EVENTS_PAGE, after: oldest })}`);
    const rows = page.data.filter((e) => !seen.has(e.id)).map((e) => { const tr = eventRow(e); seen.set(e.id, tr); return tr; });
    evBody.append(...rows);
    if (page.data.length) oldest = page.data[page.data.length - 1].id;
    hasOlder = page.has_more;
    olderBtn.hidden = !hasOlder;
    filterEvents();
  });
  levelSel.addEventListener("change", filterEvents);

  // ---- report and settings
  function showRun(run) {
    const report = run.report;
    if (report && report.diagnosis) {
      const d = report.diagnosis;
      diagnosis.replaceChildren(h("h2", {}, "Diagnosis"),
        h("p", { class: d.kind === "good_fit" ? "good" : "note" }, h("strong", {}, `${d.kind.replaceAll("_", " ")}: `), inDashboardTerms(d.message, schema)),
        h("p", {}, h("strong", {}, "Next step: "), d.next_step ? inDashboardTerms(d.next_step, schema) : "–"),
        report.forgetting ? h("p", { "data-testid": "forgetting" }, h("strong", {}, "General answers: "), report.forgetting.message) : "",
        h("dl", { class: "kv small" },
          h("dt", {}, "best step"), h("dd", {}, `${report.best_step ?? "–"} (validation loss ${fmt.num(report.best_val_loss, 4)})`),
          h("dt", {}, "tokens processed"), h("dd", {}, `${fmt.int(report.tokens_processed)} of ${fmt.int(report.tokens_planned)} planned`),
          h("dt", {}, "time"), h("dd", { "data-testid": "time-vs-estimate" },
            `${fmt.duration(report.wall_time_s)} (estimated ${fmt.duration(report.estimated_time_s)})`),
          h("dt", {}, "cost"), h("dd", { "data-testid": "cost-vs-estimate" }, costVersusEstimate(report, run.plan))),
        h("p", { class: "small muted" }, inDashboardTerms(report.reminder || "", schema)));
    } else {
      diagnosis.replaceChildren(h("h2", {}, "Diagnosis"), h("p", { class: "muted" }, TERMINAL.has(job.status)
        ? "This run has no report." : "The report reads the curves when the run ends; until then, watch the validation loss."));
    }
    evaluate.show(job, run);
    retention.hidden = !run.retention;
    fill(retention, run.retention ? retentionView(run.retention, schema) : []);
    if (run.plan) {
      settingsBox.replaceChildren(
        h("dl", { class: "kv" }, h("dt", {}, "base model"), h("dd", {}, job.model), h("dt", {}, "training file"), h("dd", { class: "mono" }, job.training_file),
          h("dt", {}, "validation file"), h("dd", { class: "mono" }, job.validation_file || "held out from the training file"),
          namedFiles(job, schema), h("dt", {}, "seed"), h("dd", {}, String(job.seed)),
          h("dt", {}, "method"), h("dd", {}, run.plan.method)),
        planView(run.plan, null, schema));
    } else {
      settingsBox.replaceChildren(h("p", { class: "muted" }, "The settings are frozen once the job is planned."),
        h("pre", {}, JSON.stringify(job.hyperparameters, null, 2)));
    }
  }

  async function refresh() {
    job = await api(`/v1/fine_tuning/jobs/${jobId}`);
    showJob();
    const [curve, prog, run] = await Promise.all([
      api(`/v1/dashboard/jobs/${jobId}/curve?points=800`),
      api(`/v1/dashboard/progress${qs({ job_id: jobId })}`),
      api(`/v1/dashboard/jobs/${jobId}/run`),
    ]);
    const p = prog.data[jobId] || {};
    state.gguf = run.gguf;
    const changed = !state.curve || curve.steps_logged !== state.curve.steps_logged || curve.checkpoints.length !== state.curve.checkpoints.length || curve.best_step !== state.best;
    state.curve = curve;
    state.best = curve.best_step;
    stats.replaceChildren(...[
      ["step", p.total_steps ? `${fmt.int(p.step)} / ${fmt.int(p.total_steps)}` : "–"],
      ["epoch", p.epoch !== null && p.epoch !== undefined ? `${fmt.fixed(p.epoch, 2)}${p.epochs ? ` / ${p.epochs}` : ""}` : "–"],
      ["ETA", job.status === "running" ? fmt.duration(p.eta_s) : "–"],
      ["tokens/s", p.tokens_per_s ? fmt.int(p.tokens_per_s) : "–"],
      ["train loss", fmt.num(p.train_loss, 4)],
      ["val loss", fmt.num(p.val_loss, 4)],
      ["best step", curve.best_step ?? "–"],
      ["tokens", fmt.int(job.trained_tokens ?? p.tokens)],
      ["cost", fmt.money(p.cost)],
    ].map(([k, v]) => h("div", { class: "stat" }, h("div", { class: "v" }, String(v)), h("div", { class: "k" }, k))));
    if (changed) drawCharts();
    await loadCheckpoints();
    await newEvents();
    showRun(run);
  }

  showJob();
  await refresh();
  let finished = TERMINAL.has(job.status);
  poll(signal, async () => {
    if (finished) return;
    await refresh();
    finished = TERMINAL.has(job.status);
  }, 2000, false);
  signal.addEventListener("abort", () => charts.forEach((p) => { p.disconnect(); p.destroy(); }));
}
