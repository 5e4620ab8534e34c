// Audit: the tenant's own audit trail (GET /v1/audit), newest first, a page at a time: every upload, job, cancel,
// download, delete, key and sign-in, who did it (the key's id, never the key), from where, and how it ended.
import { api, fmt, h, qs } from "../util.js";

const PAGE = 50;
const COLUMNS = [["#", "num"], ["Time", ""], ["Action", ""], ["Object", ""], ["Outcome", ""], ["Key", "hide-phone"], ["From", "hide-phone"]];

function row(r) {
  const outcome = r.status ? `${r.outcome} (${r.status})` : r.outcome;
  return h("tr", { dataset: { seq: String(r.seq), action: r.action } },
    h("td", { class: "num" }, r.seq),
    h("td", {}, fmt.time(r.created_at)),
    h("td", { class: "mono" }, r.action),
    h("td", { class: "mono" }, r.object_id || "–"),
    h("td", {}, h("span", { class: `badge ${r.outcome === "ok" ? "succeeded" : r.outcome === "refused" ? "warn" : "failed"}` }, outcome)),
    h("td", { class: "mono hide-phone" }, r.key_id || "–"),
    h("td", { class: "hide-phone" }, `${r.source} · ${r.via}`));
}

export async function render(main) {
  const tbody = h("tbody");
  const more = h("button", { type: "button", hidden: true }, "Older records");
  const status = h("p", { class: "muted small", role: "status" });
  let after = null;

  async function load() {
    more.disabled = true;
    const page = await api(`/v1/audit${qs({ limit: PAGE, after })}`);
    tbody.append(...page.data.map(row));
    if (page.data.length) after = page.data[page.data.length - 1].id;
    more.hidden = !page.has_more;
    more.disabled = false;
    const shown = tbody.children.length;
    status.textContent = shown ? `${shown} record${shown === 1 ? "" : "s"} shown.` : "No records yet.";
  }

  more.addEventListener("click", () => load().catch((e) => { status.textContent = e.message; }));
  main.append(
    h("h1", {}, "Audit trail"),
    h("p", { class: "muted small" },
      "Every change and every download made with your keys, through the API or this dashboard, and the keys made or ",
      "revoked for you: one record each, kept as they were written. A key is shown by its id only."),
    h("div", { class: "tablewrap" }, h("table", { "aria-label": "Audit records" },
      h("thead", {}, h("tr", {}, COLUMNS.map(([t, c]) => h("th", { scope: "col", class: c }, t)))),
      tbody)),
    h("div", { class: "actions" }, more), status,
  );
  await load();
}
