// Compare runs: their curves overlaid (validation loss, smoothed training loss) and their settings side by
// side, only the ones that differ unless asked for all.
import { align, COLORS, ema, line, makeChart } from "../chart.js";
import { api, badge, h, settingsSchema } from "../util.js";
import { loadAllJobs } from "./jobs.js";

// Rows: the job's parameters, the plan's settings and numbers (labelled by the server's schema), the report's outcome.
const JOB = [["model", (j) => j.model], ["training_file", (j) => j.training_file],
  ["validation_file", (j) => j.validation_file || "held out"], ["general_data", (j) => j.hyperparameters?.general_data || "none"],
  ["seed", (j) => j.seed], ["suffix", (j) => j.suffix || ""]];
const PLAN = ["method", "epochs", "batch_size", "grad_accum", "effective_batch", "learning_rate", "schedule", "warmup_steps",
  "lora_rank", "lora_alpha", "max_seq_len", "val_fraction", "total_steps", "tokens_processed"];
const REPORT = [["best step", (r) => r?.best_step], ["best validation loss", (r) => r?.best_val_loss], ["diagnosis", (r) => r?.diagnosis?.kind]];

// Row names read as words in a sentence: "suffix", "learning rate", but "LoRA rank" keeps its capitals.
const lower = (label) => (/^[A-Z][a-z]*( |$)/.test(label) ? label[0].toLowerCase() + label.slice(1) : label);

function rowsOf(schema) {
  return [
    ...JOB.map(([key, get]) => [lower(schema.job_parameters[key] || schema.schema.properties[key]?.title || key), (j) => get(j)]),
    ...PLAN.map((key) => [lower(schema.plan_labels[key] || key), (_j, p) => p[key]]),
    ...REPORT.map(([name, get]) => [name, (_j, _p, r) => get(r)]),
  ];
}

function show(v, name) {
  if (v === null || v === undefined) return "–";
  if (name === "seed") return String(v);
  if (typeof v === "number") return Number.isInteger(v) ? v.toLocaleString("en-US") : v.toPrecision(4);
  return String(v);
}

async function picker(main, chosen) {
  const jobs = await loadAllJobs();
  const boxes = jobs.map((j) => h("input", { type: "checkbox", value: j.id, id: `cmp-${j.id}`, checked: chosen.includes(j.id) }));
  const form = h("form", { class: "card", "aria-label": "Pick runs to compare" },
    h("h2", {}, "Pick two or more runs"),
    jobs.map((j, i) => h("div", { class: "row" }, boxes[i], h("label", { for: `cmp-${j.id}`, class: "mono" }, `${j.id} ${j.suffix ? `(${j.suffix})` : ""}`), badge(j.status))),
    h("button", { type: "submit", class: "primary" }, "Compare"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const ids = boxes.filter((b) => b.checked).map((b) => b.value);
    if (ids.length) location.hash = `#/compare/${ids.join(",")}`;
  });
  main.append(form);
}

export async function render(main, [idList]) {
  const ids = [...new Set(idList.split(",").filter(Boolean))].slice(0, COLORS.length);
  main.append(h("h1", {}, "Compare runs"));
  if (ids.length < 2) {
    main.append(h("p", { class: "muted" }, "Choose at least two runs."));
    await picker(main, ids);
    return;
  }
  const runs = await Promise.all(ids.map(async (id) => {
    const [job, curve, run] = await Promise.all([
      api(`/v1/fine_tuning/jobs/${id}`), api(`/v1/dashboard/jobs/${id}/curve?points=400`), api(`/v1/dashboard/jobs/${id}/run`),
    ]);
    return { id, job, curve, plan: run.plan || {}, report: run.report };
  }));

  const legend = h("ul", { class: "row legend", "aria-label": "Runs" }, runs.map((r, i) =>
    h("li", { style: `color:${COLORS[i]}` }, h("a", { href: `#/jobs/${r.id}`, class: "mono" }, r.id), r.job.suffix ? ` (${r.job.suffix})` : "", " ", badge(r.job.status))));
  const valEl = h("div", { class: "chart", "aria-label": "Validation loss of each run" });
  const trainEl = h("div", { class: "chart", "aria-label": "Smoothed training loss of each run" });
  const allBox = h("input", { type: "checkbox", id: "show-all" });
  const tbody = h("tbody");
  main.append(legend,
    h("section", { class: "card" }, h("div", { class: "grid2 charts2" }, valEl, trainEl)),
    h("h2", {}, "Settings"),
    h("div", { class: "chartbar" }, allBox, h("label", { for: "show-all" }, "show settings that are the same too")),
    h("div", { class: "tablewrap" }, h("table", { "aria-label": "Settings side by side" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Setting"), runs.map((r, i) => h("th", { scope: "col", style: `color:${COLORS[i]}` }, r.job.suffix || r.id)))),
      tbody)));

  const val = align(runs.map((r) => ({ x: r.curve.val.step, y: r.curve.val.val_loss })));
  const train = align(runs.map((r) => ({ x: r.curve.train.step, y: ema(r.curve.train.train_loss, 0.6) })));
  makeChart(valEl, { title: "Validation loss", xLabel: "step", yLabel: "loss", data: val, sync: "cmp",
    series: runs.map((r, i) => line(r.job.suffix || r.id, COLORS[i], { points: true })) });
  makeChart(trainEl, { title: "Training loss (smoothed 0.6)", xLabel: "step", yLabel: "loss", data: train, sync: "cmp",
    series: runs.map((r, i) => line(r.job.suffix || r.id, COLORS[i])) });

  const settings = rowsOf(await settingsSchema());
  const rows = settings.map(([name, get]) => {
    const values = runs.map((r) => show(get(r.job, r.plan, r.report), name));
    const same = values.every((v) => v === values[0]);
    return h("tr", { class: same ? "diff-same" : "diff", dataset: { same: String(same) } }, h("th", { scope: "row" }, name), values.map((v) => h("td", { class: "mono" }, v)));
  });
  tbody.replaceChildren(...rows);
  const differing = rows.filter((r) => r.dataset.same === "false").length;
  const none = h("tr", {}, h("td", { colspan: runs.length + 1, class: "muted" }, "These runs have the same settings."));
  if (!differing) tbody.append(none);
  allBox.addEventListener("change", () => {
    for (const r of rows) r.classList.toggle("diff-same", !allBox.checked && r.dataset.same === "true");
  });
  main.append(h("p", { class: "small muted" }, `${differing} of ${settings.length} settings differ.`));
}
