// New job: pick or upload a file, edit settings, watch the plan follow every edit (POST /v1/fine_tuning/plan),
// confirm, start (POST /v1/fine_tuning/jobs). The same body is offered as a curl command and as Python.
import { api, copy, fmt, h } from "../util.js";
import { listFiles, uploadForm } from "./files.js";

export async function baseModels() {
  const page = await api("/v1/models");
  return page.data.filter((m) => !m.id.startsWith("ft:"));
}

// Hyperparameters the form offers: [key, label, hint, kind]. Empty = "auto".
const HYPER = [
  ["n_epochs", "Epochs", "passes over the data", "int"],
  ["batch_size", "Batch size", "records per step", "int"],
  ["learning_rate_multiplier", "Learning rate multiplier", "× the Auto learning rate", "float"],
  ["lora_rank", "LoRA rank", "adapter size", "int"],
  ["beta", "Beta", "preference tuning only: how far from the starting model", "float"],
];
const PREFERENCE_ONLY = new Set(["beta"]);

function autoInput(id, kind) {
  return h("input", { id, type: "text", inputmode: kind === "int" ? "numeric" : "decimal", placeholder: "auto", autocomplete: "off" });
}

// Method choices: supervised LoRA / full, or preference tuning (DPO) of a LoRA adapter / every weight.
export function jobBody(v) {
  const dpo = (v.method || "").startsWith("dpo");
  const hyper = {};
  for (const [key, , , kind] of HYPER) {
    const raw = (v[key] || "").trim();
    if (raw && raw !== "auto" && (dpo || !PREFERENCE_ONLY.has(key))) hyper[key] = kind === "int" ? Number.parseInt(raw, 10) : Number(raw);
  }
  const weights = dpo ? v.method.replace(/^dpo-?/, "") || "lora" : v.method;
  if (weights && weights !== "lora") hyper.method = weights;
  const body = { model: v.model, training_file: v.training_file };
  if (v.validation_file) body.validation_file = v.validation_file;
  if (v.suffix) body.suffix = v.suffix;
  if (v.seed !== "" && v.seed !== undefined) body.seed = Number.parseInt(v.seed, 10);
  body.method = dpo ? { type: "dpo", dpo: { hyperparameters: hyper } } : { type: "supervised", supervised: { hyperparameters: hyper } };
  return body;
}

export function asCurl(body) {
  const json = JSON.stringify(body, null, 2).replaceAll("'", "'\\''");
  return `curl -sS ${location.origin}/v1/fine_tuning/jobs \\\n  -H "Authorization: Bearer $FINETUNE_API_KEY" \\\n  -H "Content-Type: application/json" \\\n  -d '${json}'`;
}

function py(value) {
  return JSON.stringify(value, null, 4).replaceAll("null", "None").replaceAll("true", "True").replaceAll("false", "False");
}

export function asPython(body) {
  const args = Object.entries(body).map(([k, v]) => `    ${k}=${py(v).replaceAll("\n", "\n    ")},`).join("\n");
  return `import os\nfrom openai import OpenAI\n\nclient = OpenAI(base_url="${location.origin}/v1", api_key=os.environ["FINETUNE_API_KEY"])\njob = client.fine_tuning.jobs.create(\n${args}\n)\nprint(job.id, job.status)`;
}

const PLAN_ROWS = [
  ["epochs", "Epochs"], ["batch_size", "Batch size"], ["grad_accum", "Gradient accumulation"], ["effective_batch", "Effective batch"],
  ["learning_rate", "Learning rate"], ["beta", "Beta (DPO)"], ["lora_rank", "LoRA rank"], ["lora_alpha", "LoRA alpha"],
  ["lora_train_head", "LoRA trains the output layer"], ["warmup_steps", "Warmup steps"],
  ["val_fraction", "Validation share"], ["eval_every", "Evaluate every"], ["save_every", "Checkpoint every"],
  ["gradient_checkpointing", "Gradient checkpointing"], ["shard", "Sharding"], ["schedule", "Schedule"], ["max_seq_len", "Max sequence length"],
];

const FROM_FORM = { epochs: "n_epochs", batch_size: "batch_size", learning_rate: "learning_rate_multiplier", lora_rank: "lora_rank", beta: "beta" };
const DERIVED = { effective_batch: "batch × accumulation × devices", lora_alpha: "2 × rank" };

function why(key, plan, given) {
  const auto = plan.auto || {};
  if (auto[key]) return h("span", {}, h("span", { class: "badge" }, "Auto"), " ", auto[key]);
  if (given && FROM_FORM[key] && given[FROM_FORM[key]] !== undefined) return "your setting";
  if (DERIVED[key]) return DERIVED[key];
  return given ? "default" : "fixed (not Auto)";
}

// `given`: the hyperparameters the user typed (null on a run's page, where the plan is already frozen)
export function planView(plan, given = null) {
  const mem = plan.memory || {};
  const cost = plan.cost || {};
  const about = plan.tokens_exact ? "" : "≈ ";
  const time = cost.seconds;
  const money = cost.token_cost ?? null;
  const stats = [
    ["steps", fmt.int(plan.total_steps), `${fmt.int(plan.steps_per_epoch)} per epoch`],
    ["tokens processed", `${about}${fmt.int(plan.tokens_processed)}`, "billed"],
    ["time", time ? (time < 1 ? "< 1 s" : `≈ ${fmt.duration(time)}`) : "–", cost.device ? `on ${cost.devices || 1} × ${cost.device}${cost.device_assumed ? " (assumed)" : ""}` : ""],
    ["memory", mem.total ? fmt.bytes(mem.total) : "–", mem.device ? `${mem.fits_device === false ? "does NOT fit" : "per device"} ${mem.device}` : ""],
    ["cost", money !== null ? fmt.money(money + (cost.time_cost || 0)) : cost.time_cost ? fmt.money(cost.time_cost) : "–", "tokens + device time"],
  ];
  return h("div", { class: "plan", "data-testid": "plan" },
    h("div", { class: "stats" }, stats.map(([k, v, sub]) => h("div", { class: "stat" }, h("div", { class: "v" }, v), h("div", { class: "k" }, k), h("div", { class: "k" }, sub)))),
    (plan.warnings || []).map((w) => h("p", { class: "note" }, h("strong", {}, `${w.code}: `), w.message)),
    h("div", { class: "tablewrap" }, h("table", { "aria-label": "Resolved settings" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Setting"), h("th", { scope: "col", class: "num" }, "Value"), h("th", { scope: "col" }, "Why"))),
      h("tbody", {}, PLAN_ROWS.filter(([k]) => plan[k] !== undefined && plan[k] !== null).map(([k, label]) =>
        h("tr", {}, h("td", {}, label), h("td", { class: "num mono" }, typeof plan[k] === "number" ? fmt.num(plan[k], 4).replace(/\.?0+$/, "") : String(plan[k])),
          h("td", { class: "reason" }, why(k, plan, given)))))),
    ),
  );
}

export async function render(main, [presetFile], signal) {
  const [models, files] = await Promise.all([baseModels(), listFiles()]);
  const el = {
    model: h("select", { id: "nj-model", required: true }, models.map((m) => h("option", { value: m.id }, m.id))),
    training_file: h("select", { id: "nj-train", required: true }, h("option", { value: "" }, "choose a file"), files.map((f) => h("option", { value: f.id }, `${f.filename} (${f.id})`))),
    validation_file: h("select", { id: "nj-val" }, h("option", { value: "" }, "none: hold out part of the training file"), files.map((f) => h("option", { value: f.id }, `${f.filename} (${f.id})`))),
    suffix: h("input", { id: "nj-suffix", type: "text", maxlength: 64, placeholder: "e.g. support-v1", autocomplete: "off" }),
    seed: h("input", { id: "nj-seed", type: "text", inputmode: "numeric", placeholder: "random", autocomplete: "off" }),
    method: h("select", { id: "nj-method" },
      h("option", { value: "lora" }, "LoRA adapter"), h("option", { value: "full" }, "full fine-tuning"),
      h("option", { value: "dpo" }, "preference tuning (DPO), LoRA adapter"), h("option", { value: "dpo-full" }, "preference tuning (DPO), full")),
  };
  for (const [key, , , kind] of HYPER) el[key] = autoInput(`nj-${key}`, kind);
  if (presetFile) el.training_file.value = presetFile;
  else if (files.length) el.training_file.value = files[0].id;

  const values = () => Object.fromEntries(Object.entries(el).map(([k, e]) => [k, e.value]));
  const planBox = h("div", { "aria-live": "polite", id: "plan" }, h("p", { class: "muted" }, "Choose a file to see the plan."));
  const curl = h("pre", { "aria-label": "curl command" });
  const python = h("pre", { "aria-label": "Python code" });
  const startBtn = h("button", { type: "submit", class: "primary", disabled: true }, "Review and start…");
  const previewLink = h("a", { href: "#/files" }, "Preview this file");
  let lastPlan = null;
  let seq = 0;

  async function replan() {
    const v = values();
    const body = jobBody(v);
    curl.textContent = asCurl(body);
    python.textContent = asPython(body);
    previewLink.href = v.training_file ? `#/files/${v.training_file}` : "#/files";
    if (!v.training_file || !v.model) return;
    const mine = ++seq;
    planBox.setAttribute("aria-busy", "true");
    try {
      const plan = await api("/v1/fine_tuning/plan", { method: "POST", body });
      if (mine !== seq || signal.aborted) return;
      lastPlan = plan;
      planBox.replaceChildren(planView(plan, body.method[body.method.type].hyperparameters));
      startBtn.disabled = false;
    } catch (e) {
      if (mine !== seq) return;
      lastPlan = null;
      startBtn.disabled = true;
      planBox.replaceChildren(h("p", { class: "alert", role: "alert" }, e.message));
    } finally {
      planBox.removeAttribute("aria-busy");
    }
  }
  let timer = null;
  const schedule = () => { clearTimeout(timer); timer = setTimeout(replan, 250); };

  const dialog = h("dialog", { "aria-labelledby": "confirm-title" });
  const form = h("form", { class: "card", "aria-label": "Job settings" },
    h("h2", {}, "Data"),
    h("div", { class: "field" }, h("label", { for: "nj-train" }, "Training file"), el.training_file, h("div", { class: "small" }, previewLink)),
    h("div", { class: "field" }, h("label", { for: "nj-val" }, "Validation file"), el.validation_file),
    h("h2", {}, "Model"),
    h("div", { class: "field" }, h("label", { for: "nj-model" }, "Base model"), el.model),
    h("div", { class: "field" }, h("label", { for: "nj-method" }, "Method"), el.method),
    h("div", { class: "field" }, h("label", { for: "nj-suffix" }, "Suffix ", h("span", { class: "hint" }, "goes into the model's name")), el.suffix),
    h("h2", {}, "Hyperparameters ", h("span", { class: "hint muted small" }, "(empty = Auto)")),
    HYPER.map(([key, label, hint]) => h("div", { class: "field" }, h("label", { for: `nj-${key}` }, label, h("span", { class: "hint" }, ` ${hint}`)), el[key])),
    h("div", { class: "field" }, h("label", { for: "nj-seed" }, "Seed"), el.seed),
    startBtn,
  );
  form.addEventListener("input", schedule);
  form.addEventListener("change", schedule);
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (!lastPlan) return;
    const body = jobBody(values());
    const start = h("button", { type: "button", class: "primary", autofocus: true }, "Start training");
    const err = h("p", { class: "alert", role: "alert", hidden: true });
    dialog.replaceChildren(
      h("h2", { id: "confirm-title" }, "Start this job?"),
      h("dl", { class: "kv" },
        h("dt", {}, "model"), h("dd", {}, body.model),
        h("dt", {}, "training file"), h("dd", { class: "mono" }, body.training_file),
        h("dt", {}, "steps"), h("dd", {}, fmt.int(lastPlan.total_steps)),
        h("dt", {}, "epochs"), h("dd", {}, String(lastPlan.epochs)),
        h("dt", {}, "tokens processed"), h("dd", {}, fmt.int(lastPlan.tokens_processed)),
        h("dt", {}, "estimated time"), h("dd", {}, lastPlan.cost?.seconds ? fmt.duration(lastPlan.cost.seconds) : "–"),
        h("dt", {}, "warnings"), h("dd", {}, String((lastPlan.warnings || []).length))),
      err,
      h("div", { class: "actions" }, start, h("button", { type: "button", onclick: () => dialog.close() }, "Back to settings")));
    start.addEventListener("click", async () => {
      start.disabled = true;
      try {
        const job = await api("/v1/fine_tuning/jobs", { method: "POST", body });
        dialog.close();
        location.hash = `#/jobs/${job.id}`;
      } catch (e) {
        err.textContent = e.message;
        err.hidden = false;
        start.disabled = false;
      }
    });
    dialog.showModal();
  });

  const addFile = (file) => {
    for (const sel of [el.training_file, el.validation_file]) sel.append(h("option", { value: file.id }, `${file.filename} (${file.id})`));
    el.training_file.value = file.id;
    schedule();
  };
  main.append(
    h("h1", {}, "New job"),
    h("div", { class: "card" }, uploadForm(addFile)),
    h("div", { class: "grid2" },
      form,
      h("section", { "aria-label": "Plan" },
        h("h2", {}, "The plan"),
        h("p", { class: "small muted" }, "Follows every change. Auto values show the reason they were chosen."),
        planBox,
        h("h2", {}, "The same job elsewhere"),
        h("div", { class: "actions" },
          h("button", { type: "button", onclick: () => copy(curl.textContent, "Command line") }, "Copy as command line"),
          h("button", { type: "button", onclick: () => copy(python.textContent, "Python") }, "Copy as Python")),
        h("details", {}, h("summary", {}, "Show the command line"), curl),
        h("details", {}, h("summary", {}, "Show the Python"), python))),
    dialog,
  );
  await replan();
}
