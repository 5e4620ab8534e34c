// Usage: the tenant's quotas beside what it uses now; its billed tokens, device time and cost per day and per model,
// the estimate (jobs planned) beside the actual (jobs that ended), and the totals: GET /v1/usage's own numbers,
// grouped by day and by model.
import { api, fmt, h, qs } from "../util.js";

const PERIODS = [["all", "All time", null], ["30", "Last 30 days", 30], ["7", "Last 7 days", 7]];
const PARTS = [
  ["billed_tokens", "Billed tokens", (n) => fmt.int(n)],
  ["device_seconds", "Device hours", (n) => (n === null || n === undefined ? "–" : (n / 3600).toFixed(n < 3600 ? 4 : 2))],
  ["cost", "Cost", null],
];

function money(n, currency) {
  if (n === null || n === undefined) return "–";
  return currency && currency !== "USD" ? `${Number(n).toFixed(n < 1 ? 4 : 2)} ${currency}` : fmt.money(n);
}

// One number, shown formatted and kept exact in data-value (what the tests compare with the API).
function value(n, show, testid) {
  return h("td", { class: "num", "data-value": n === null || n === undefined ? "" : String(n), "data-testid": testid }, show(n));
}

function cells(usage, testid) {
  const out = [];
  for (const [key, , format] of PARTS) {
    const show = format || ((n) => money(n, usage.currency || usage.estimate.currency));
    out.push(value(usage.estimate[key], show, testid && `${testid}-estimate-${key}`));
    out.push(value(usage[key], show, testid && `${testid}-actual-${key}`));
  }
  return out;
}

function table(label, keyName, answer) {
  const head = h("thead", {},
    h("tr", {}, h("th", { scope: "col", rowspan: 2 }, keyName), h("th", { scope: "col", rowspan: 2, class: "num" }, "Jobs"),
      PARTS.map(([, title]) => h("th", { scope: "colgroup", colspan: 2, class: "num" }, title))),
    h("tr", {}, PARTS.map(() => [h("th", { scope: "col", class: "num" }, "estimate"), h("th", { scope: "col", class: "num" }, "actual")])));
  const rows = answer.data.map((g) => h("tr", { dataset: { key: g.key } }, h("th", { scope: "row" }, g.key), h("td", { class: "num" }, fmt.int(g.jobs)), cells(g)));
  const total = h("tr", { class: "total" }, h("th", { scope: "row" }, "Total"), h("td", { class: "num" }, fmt.int(answer.total.jobs)), cells(answer.total));
  return h("div", { class: "tablewrap" }, h("table", { class: "usage", "aria-label": label }, head, h("tbody", {}, rows), h("tfoot", {}, total)));
}

function summary(total) {
  return h("div", { class: "tablewrap" }, h("table", { class: "usage", "aria-label": "Usage totals", "data-testid": "usage-totals" },
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, ""), h("th", { scope: "col", class: "num" }, "Estimate"), h("th", { scope: "col", class: "num" }, "Actual"))),
    h("tbody", {}, PARTS.map(([key, title, format]) => {
      const show = format || ((n) => money(n, total.currency || total.estimate.currency));
      return h("tr", {}, h("th", { scope: "row" }, title),
        value(total.estimate[key], show, `total-estimate-${key}`), value(total[key], show, `total-actual-${key}`));
    }))));
}

// The tenant's quotas beside what it uses now (GET /v1/usage's `quotas`; the operator sets them: `finetune serve
// tenants set`). A quota of null is none.
const QUOTAS = [
  ["running_jobs", "Running jobs", fmt.int, "jobs a worker holds at once; past it, new jobs wait queued"],
  ["queued_jobs", "Queued jobs", fmt.int, "jobs waiting for a worker; past it, creating a job is refused for a while"],
  ["stored_bytes", "Stored files", fmt.bytes, "uploads and results files; past it, an upload is refused"],
  ["monthly_tokens", "Trained tokens this month", fmt.int, "billed tokens of jobs created this UTC month, and what jobs not ended are expected to bill"],
];

function quotaTable(quotas) {
  const rows = QUOTAS.map(([key, title, show, about]) => {
    const q = quotas[key];
    const used = key === "monthly_tokens" ? q.used + q.pending : q.used;
    const note = key === "monthly_tokens" && q.pending ? ` (${fmt.int(q.pending)} expected)` : "";
    const over = q.limit !== null && used >= q.limit;
    return h("tr", { dataset: { key }, class: over ? "at-quota" : null },
      h("th", { scope: "row", title: about }, title),
      h("td", { class: "num", "data-value": String(used), "data-testid": `quota-${key}-used` }, show(used), note),
      h("td", { class: "num", "data-value": q.limit === null ? "" : String(q.limit), "data-testid": `quota-${key}-limit` },
        q.limit === null ? "no quota" : show(q.limit)));
  });
  return h("div", { class: "tablewrap" }, h("table", { class: "usage", "aria-label": "Quotas", "data-testid": "quotas" },
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, ""), h("th", { scope: "col", class: "num" }, "In use"),
      h("th", { scope: "col", class: "num" }, "Quota"))),
    h("tbody", {}, rows)));
}

export async function render(main) {
  const period = h("select", { id: "usage-period" }, PERIODS.map(([v, label]) => h("option", { value: v }, label)));
  const body = h("div", { "aria-live": "polite" });
  // what a billed token is (GET /v1/usage's billing_rule; finetune/rules/billing.py): a tenant reconciles its bill with it
  const rule = h("p", { class: "muted small", "data-testid": "billing-rule" });
  main.append(
    h("div", { class: "row" }, h("h1", {}, "Usage"),
      h("div", { class: "field" }, h("label", { for: "usage-period" }, "Period"), period)),
    h("p", { class: "muted small" },
      "The estimate counts every job planned, the actual every job that ended (a job that did not succeed bills its ",
      "device time only). Costs are at the prices each job was planned at. Jobs count in the period they were created in (UTC days)."),
    rule,
    body,
  );

  async function refresh() {
    const days = PERIODS.find(([v]) => v === period.value)[2];
    const start = days ? Math.floor(Date.now() / 1000) - days * 86400 : null;
    const [byDay, byModel] = await Promise.all([
      api(`/v1/usage${qs({ group_by: "day", start })}`),
      api(`/v1/usage${qs({ group_by: "model", start })}`),
    ]);
    rule.textContent = `Billed tokens: ${byDay.billing_rule}. Each job's report (and its model card) says what it billed.`;
    const quotas = [h("h2", {}, "Quotas"), quotaTable(byDay.quotas)];
    if (!byDay.data.length) {
      body.replaceChildren(...quotas, h("p", { class: "muted" }, "No jobs in this period."), summary(byDay.total));
      return;
    }
    body.replaceChildren(
      ...quotas,
      h("h2", {}, "Totals"), summary(byDay.total),
      h("h2", {}, "Per day"), table("Usage per day", "Day (UTC)", byDay),
      h("h2", {}, "Per model"), table("Usage per model", "Model", byModel),
    );
  }

  period.addEventListener("change", () => refresh().catch((e) => body.replaceChildren(h("p", { class: "alert", role: "alert" }, e.message))));
  await refresh();
}
