// The jobs list, live: the public jobs list plus one progress call for all rows, polled while any job runs.
// Rows are updated in place, so focus, selection and scroll survive each refresh.
import { api, badge, fmt, h, poll, qs, sparkline, TERMINAL } from "../util.js";

const MAX_JOBS = 500;

export async function loadAllJobs() {
  const jobs = [];
  let after = null;
  while (jobs.length < MAX_JOBS) {
    const page = await api(`/v1/fine_tuning/jobs${qs({ limit: 100, after })}`);
    jobs.push(...page.data);
    if (!page.has_more || !page.data.length) break;
    after = page.data[page.data.length - 1].id;
  }
  return jobs;
}

export async function loadProgress(ids) {
  if (!ids.length) return {};
  const out = {};
  for (let i = 0; i < ids.length; i += 100) {
    const res = await api(`/v1/dashboard/progress${qs({ job_id: ids.slice(i, i + 100) })}`);
    Object.assign(out, res.data);
  }
  return out;
}

const COLUMNS = [
  ["", ""], ["Job", ""], ["Status", ""], ["Step", "num"], ["Epoch", "num hide-phone"], ["ETA", "num"],
  ["Tokens/s", "num hide-phone"], ["Loss", "hide-phone"], ["Tokens", "num hide-phone"], ["Cost", "num hide-phone"],
];

export async function render(main, _params, signal) {
  const selected = new Set();
  const compareBtn = h("button", { type: "button", disabled: true }, "Compare selected");
  compareBtn.addEventListener("click", () => { location.hash = `#/compare/${[...selected].join(",")}`; });
  const tbody = h("tbody");
  const empty = h("p", { class: "muted", hidden: true }, "No jobs yet. ", h("a", { href: "#/new" }, "Start one"), ".");
  const updated = h("p", { class: "muted small", "aria-live": "off" });
  const usage = h("p", { class: "small", id: "usage" });
  main.append(
    h("div", { class: "row" }, h("h1", {}, "Jobs"), h("a", { class: "button primary", href: "#/new" }, "New job"), compareBtn),
    h("div", { class: "tablewrap" },
      h("table", { "aria-label": "Fine-tuning jobs" },
        h("thead", {}, h("tr", {}, COLUMNS.map(([t, c]) => h("th", { class: c, scope: "col" }, t || h("span", { class: "sr" }, "Select"))))),
        tbody)),
    empty, usage, updated,
  );
  const rows = new Map();
  let anyActive = true;

  const syncCompare = () => {
    compareBtn.disabled = selected.size < 2;
    compareBtn.textContent = selected.size >= 2 ? `Compare ${selected.size} runs` : "Compare selected";
  };

  function rowFor(job) {
    if (rows.has(job.id)) return rows.get(job.id);
    const box = h("input", { type: "checkbox", "aria-label": `Select ${job.id} to compare` });
    box.addEventListener("change", () => { box.checked ? selected.add(job.id) : selected.delete(job.id); syncCompare(); });
    const cells = {
      name: h("td"), status: h("td"), step: h("td", { class: "num" }), epoch: h("td", { class: "num hide-phone" }),
      eta: h("td", { class: "num" }), tps: h("td", { class: "num hide-phone" }), spark: h("td", { class: "hide-phone" }),
      tokens: h("td", { class: "num hide-phone" }), cost: h("td", { class: "num hide-phone" }),
    };
    const tr = h("tr", { dataset: { job: job.id } }, h("td", {}, box), Object.values(cells));
    const row = { tr, cells, sig: "" };
    rows.set(job.id, row);
    return row;
  }

  async function refresh() {
    const jobs = await loadAllJobs();
    const progress = await loadProgress(jobs.map((j) => j.id));
    anyActive = jobs.some((j) => !TERMINAL.has(j.status));
    empty.hidden = jobs.length > 0;
    const order = [];
    for (const job of jobs) {
      const row = rowFor(job);
      const p = progress[job.id] || {};
      const sig = JSON.stringify([job.status, p]);
      if (sig !== row.sig) {
        row.sig = sig;
        const c = row.cells;
        c.name.replaceChildren(
          h("a", { href: `#/jobs/${job.id}`, class: "mono" }, job.id),
          job.suffix || job.user_provided_suffix ? h("div", { class: "small muted" }, job.suffix || job.user_provided_suffix) : null,
        );
        c.status.replaceChildren(badge(job.status));
        c.step.textContent = p.total_steps ? `${fmt.int(p.step || 0)} / ${fmt.int(p.total_steps)}` : "–";
        c.epoch.textContent = p.epoch !== null && p.epoch !== undefined ? `${fmt.fixed(p.epoch, 2)}${p.epochs ? ` / ${p.epochs}` : ""}` : "–";
        c.eta.textContent = job.status === "running" ? fmt.duration(p.eta_s) : job.status === "succeeded" ? "done" : "–";
        c.tps.textContent = p.tokens_per_s ? fmt.int(p.tokens_per_s) : "–";
        c.spark.replaceChildren(sparkline(p.spark || [], { label: `${job.id} training loss` }));
        c.tokens.textContent = fmt.int(job.trained_tokens ?? p.tokens);
        c.cost.textContent = fmt.money(p.cost);
      }
      order.push(row.tr);
    }
    tbody.replaceChildren(...order);
    const use = await api("/v1/usage");
    usage.textContent = `Trained tokens, all jobs: ${fmt.int(use.total_trained_tokens)}` +
      (use.total_cost !== null && use.total_cost !== undefined ? ` · cost ${fmt.money(use.total_cost)}` : "");
    updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
  }

  await refresh();
  let last = Date.now();
  poll(signal, async () => {
    if (anyActive || Date.now() - last > 15000) {
      last = Date.now();
      await refresh();
    }
  }, 2000, false);
}
