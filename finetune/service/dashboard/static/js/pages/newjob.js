// New job: pick or upload a file, edit settings, watch the plan follow every edit (POST /v1/fine_tuning/plan),
// confirm, start (POST /v1/fine_tuning/jobs). The same body is offered as a curl command and as Python.
import { api, copy, fmt, h, inDashboardTerms, settingsSchema } from "../util.js";
import { listFiles, uploadForm } from "./files.js";

// A preview loads no model: the base answers self-replay's prompts when the job starts (docs/retention.md).
const pendingNote = (pending) => (pending && pending.prompts
  ? ` (tokens at most: the base answers ${pending.prompts} prompts when the job starts${pending.estimated_s != null ? `, about ${fmt.duration(pending.estimated_s)}` : ""})`
  : "");

export async function baseModels() {
  const page = await api("/v1/models");
  return page.data.filter((m) => !m.id.startsWith("ft:"));
}

// The form's fields come from the server's schema (RunConfig's declarations): the common ones first, every other
// hyperparameter an API caller may set under "More settings". Empty = the default ("auto" where Auto chooses).
// A hyperparameter whose value is an uploaded file's id (x-finetune.file: general_data) is a select of the
// caller's files, in the Data section.
const COMMON = ["n_epochs", "batch_size", "learning_rate_multiplier", "lora_rank", "beta"];
const BY_METHOD = "method";  // chosen with the Method select (LoRA / full, supervised / DPO)
const NO_FILE = { general_data: "none: the base model answers general requests itself" };

const isFile = (prop) => Boolean((prop["x-finetune"] || {}).file);

function fieldsOf(schema) {
  const props = schema.schema.properties;
  const keys = Object.keys(props).filter((k) => k !== BY_METHOD);
  const files = keys.filter((k) => isFile(props[k]));
  const settings = keys.filter((k) => !isFile(props[k]));
  const common = COMMON.filter((k) => props[k]);
  return { props, common, files, more: settings.filter((k) => !COMMON.includes(k)) };
}

const fileOption = (f) => h("option", { value: f.id }, `${f.filename} (${f.id})`);

function fileSelect(key, files) {
  return h("select", { id: `nj-${key}` }, h("option", { value: "" }, NO_FILE[key] || "none"), files.map(fileOption));
}

function inputFor(key, prop) {
  const id = `nj-${key}`;
  const meta = prop["x-finetune"] || {};
  if (prop.enum) {
    return h("select", { id }, h("option", { value: "" }, `default (${prop.default})`), prop.enum.map((v) => h("option", { value: v }, v)));
  }
  const kinds = [].concat(prop.type);
  if (kinds.includes("boolean")) {
    const fallback = meta.auto ? "auto" : prop.default ? "on" : "off";
    return h("select", { id }, h("option", { value: "" }, `default (${fallback})`), h("option", { value: "on" }, "on"), h("option", { value: "off" }, "off"));
  }
  const numeric = kinds.includes("integer") || kinds.includes("number");
  const placeholder = meta.auto ? String(prop.default ?? "auto") : prop.default === null || prop.default === undefined ? "none" : String(prop.default);
  return h("input", { id, type: "text", inputmode: numeric ? "decimal" : "text", placeholder, autocomplete: "off" });
}

function parseValue(raw, prop) {
  const kinds = [].concat(prop.type);
  if (raw === "auto" || (prop.examples || []).includes(raw)) return raw; // a word a number setting takes ("off")
  if (kinds.includes("boolean")) return raw === "on";
  if (kinds.includes("integer")) return Number.parseInt(raw, 10);
  if (kinds.includes("number")) return Number(raw);
  return raw;
}

// Method choices: supervised LoRA / full, or preference tuning (DPO) of a LoRA adapter / every weight.
export function jobBody(v, schema) {
  const dpo = (v.method || "").startsWith("dpo");
  const weights = dpo ? v.method.replace(/^dpo-?/, "") || "lora" : v.method;
  const hyper = {};
  for (const [key, prop] of Object.entries(schema.schema.properties)) {
    const raw = (v[key] || "").trim();
    const when = (prop["x-finetune"] || {}).when;
    if (!raw || key === BY_METHOD || (when === "dpo" && !dpo) || (when === "lora" && weights !== "lora")) continue;
    if (raw === "auto" && key === "learning_rate_multiplier") continue;
    hyper[key] = parseValue(raw, prop);
  }
  if (weights && weights !== "lora") hyper.method = weights;
  const body = { model: v.model, training_file: v.training_file };
  if (v.validation_file) body.validation_file = v.validation_file;
  if (v.suffix) body.suffix = v.suffix;
  if (v.seed !== "" && v.seed !== undefined) body.seed = Number.parseInt(v.seed, 10);
  body.method = dpo ? { type: "dpo", dpo: { hyperparameters: hyper } } : { type: "supervised", supervised: { hyperparameters: hyper } };
  return body;
}

// The label is the setting's name alone (what a screen reader announces); its help goes beside it.
function settingField(key, prop, input) {
  const help = prop.description ? h("div", { class: "hint small muted", id: `nj-${key}-help` }, prop.description) : null;
  if (help) input.setAttribute("aria-describedby", help.id);
  return h("div", { class: "field" }, h("label", { for: `nj-${key}` }, prop.title), input, help);
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

// The plan's rows (plan.json keys, labelled by the schema), in this order.
const PLAN_ROWS = [
  "epochs", "batch_size", "grad_accum", "effective_batch", "learning_rate", "beta", "lora_rank", "lora_alpha",
  "lora_train_head", "warmup_steps", "val_fraction", "eval_every", "save_every", "gradient_checkpointing", "shard",
  "schedule", "max_seq_len", "general_val",
];
const DERIVED = { effective_batch: "batch × accumulation × devices", lora_alpha: "2 × rank" };

function why(key, plan, given, schema) {
  const auto = plan.auto || {};
  if (auto[key]) return h("span", {}, h("span", { class: "badge" }, "Auto"), " ", inDashboardTerms(auto[key], schema));
  const fromForm = Object.entries(schema.schema.properties).find(([, p]) => (p["x-finetune"] || {}).plan_key === key)?.[0];
  if (given && ((fromForm && given[fromForm] !== undefined) || (key === "learning_rate" && given.learning_rate_multiplier !== undefined))) {
    return "your setting";
  }
  if (DERIVED[key]) return DERIVED[key];
  return given ? "default" : "fixed (not Auto)";
}

function label(key, schema) {
  return schema.plan_labels[key] || (key === "val_fraction" ? schema.schema.properties.val_fraction?.title : null) || key;
}

// `given`: the hyperparameters the user typed (null on a run's page, where the plan is already frozen)
export function planView(plan, given = null, schema = null) {
  const mem = plan.memory || {};
  const cost = plan.cost || {};
  const about = plan.tokens_exact ? "" : "≈ ";
  const time = cost.seconds;
  const money = cost.token_cost ?? null;
  const device = cost.device ? `on ${cost.devices || 1} × ${cost.device}${cost.device_assumed ? " (assumed)" : ""}` : "";
  const stats = [
    ["steps", fmt.int(plan.total_steps), `${fmt.int(plan.steps_per_epoch)} per epoch`],
    ["tokens processed", `${about}${fmt.int(plan.tokens_processed)}`, "billed"],
    ...(plan.replay_added ? [["replay", fmt.int(plan.replay_added.rows), `general rows, ${fmt.int(plan.replay_added.tokens_processed)} tokens: not billed${pendingNote(plan.replay_added.pending)}`]] : []),
    ["time", time ? (time < 1 ? "< 1 s" : `≈ ${fmt.duration(time)}`) : "–", device],
    ["memory", mem.total ? fmt.bytes(mem.total) : "–", mem.device ? `${mem.fits_device === false ? "does NOT fit" : "per device"} ${mem.device}` : ""],
    ["cost", money !== null ? fmt.money(money + (cost.time_cost || 0)) : cost.time_cost ? fmt.money(cost.time_cost) : "–", "tokens + device time"],
  ];
  return h("div", { class: "plan", "data-testid": "plan" },
    h("div", { class: "stats" }, stats.map(([k, v, sub]) => h("div", { class: "stat" }, h("div", { class: "v" }, v), h("div", { class: "k" }, k), h("div", { class: "k" }, sub)))),
    (plan.warnings || []).map((w) => h("p", { class: "note" }, h("strong", {}, `${w.code}: `), inDashboardTerms(w.message, schema))),
    h("div", { class: "tablewrap" }, h("table", { "aria-label": "Resolved settings" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Setting"), h("th", { scope: "col", class: "num" }, "Value"), h("th", { scope: "col" }, "Why"))),
      h("tbody", {}, PLAN_ROWS.filter((k) => plan[k] !== undefined && plan[k] !== null).map((k) =>
        h("tr", {}, h("td", {}, schema ? label(k, schema) : k), h("td", { class: "num mono" }, typeof plan[k] === "number" ? fmt.num(plan[k], 4).replace(/\.?0+$/, "") : String(plan[k])),
          h("td", { class: "reason" }, schema ? why(k, plan, given, schema) : ""))))),
    ),
  );
}

export async function render(main, [presetFile], signal) {
  const [models, files, schema] = await Promise.all([baseModels(), listFiles(), settingsSchema()]);
  const { props, common, files: fileKeys, more } = fieldsOf(schema);
  const el = {
    model: h("select", { id: "nj-model", required: true }, models.map((m) => h("option", { value: m.id }, m.id))),
    training_file: h("select", { id: "nj-train", required: true }, h("option", { value: "" }, "choose a file"), files.map(fileOption)),
    validation_file: h("select", { id: "nj-val" }, h("option", { value: "" }, "none: hold out part of the training file"), files.map(fileOption)),
    suffix: h("input", { id: "nj-suffix", type: "text", maxlength: 64, placeholder: "e.g. support-v1", autocomplete: "off" }),
    seed: h("input", { id: "nj-seed", type: "text", inputmode: "numeric", placeholder: "random", autocomplete: "off" }),
    method: h("select", { id: "nj-method" },
      h("option", { value: "lora" }, "LoRA adapter"), h("option", { value: "full" }, "full fine-tuning"),
      h("option", { value: "dpo" }, "preference tuning (DPO), LoRA adapter"), h("option", { value: "dpo-full" }, "preference tuning (DPO), full")),
  };
  for (const key of [...common, ...more]) el[key] = inputFor(key, props[key]);
  for (const key of fileKeys) el[key] = fileSelect(key, files);
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
    const body = jobBody(v, schema);
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
      planBox.replaceChildren(planView(plan, body.method[body.method.type].hyperparameters, schema));
      startBtn.disabled = false;
    } catch (e) {
      if (mine !== seq) return;
      lastPlan = null;
      startBtn.disabled = true;
      planBox.replaceChildren(h("p", { class: "alert", role: "alert" }, inDashboardTerms(e.message, schema)));
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
    fileKeys.map((key) => settingField(key, props[key], el[key])),
    h("h2", {}, "Model"),
    h("div", { class: "field" }, h("label", { for: "nj-model" }, "Base model"), el.model),
    h("div", { class: "field" }, h("label", { for: "nj-method" }, "Method"), el.method),
    h("div", { class: "field" }, h("label", { for: "nj-suffix" }, "Suffix ", h("span", { class: "hint" }, "goes into the model's name")), el.suffix),
    h("h2", {}, "Hyperparameters ", h("span", { class: "hint muted small" }, "(empty = Auto)")),
    common.map((key) => settingField(key, props[key], el[key])),
    h("details", { class: "more-settings" }, h("summary", {}, "More settings"),
      more.map((key) => settingField(key, props[key], el[key]))),
    h("div", { class: "field" }, h("label", { for: "nj-seed" }, "Seed"), el.seed),
    startBtn,
  );
  form.addEventListener("input", schedule);
  form.addEventListener("change", schedule);
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (!lastPlan) return;
    const body = jobBody(values(), schema);
    const hyper = body.method[body.method.type].hyperparameters;
    const start = h("button", { type: "button", class: "primary", autofocus: true }, "Start training");
    const err = h("p", { class: "alert", role: "alert", hidden: true });
    dialog.replaceChildren(
      h("h2", { id: "confirm-title" }, "Start this job?"),
      h("dl", { class: "kv" },
        h("dt", {}, "model"), h("dd", {}, body.model),
        h("dt", {}, "training file"), h("dd", { class: "mono" }, body.training_file),
        fileKeys.filter((k) => hyper[k]).map((k) => [h("dt", {}, props[k].title.toLowerCase()), h("dd", { class: "mono" }, hyper[k])]),
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
        err.replaceChildren(...inDashboardTerms(e.message, schema));
        err.hidden = false;
        start.disabled = false;
      }
    });
    dialog.showModal();
  });

  const addFile = (file) => {
    for (const sel of [el.training_file, el.validation_file, ...fileKeys.map((k) => el[k])]) sel.append(fileOption(file));
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
