// Files: upload a training file (multipart POST /v1/files, as the SDK does), list the tenant's files,
// open a file's data preview or start a job from it.
import { api, fmt, h } from "../util.js";

export async function upload(file) {
  const form = new FormData();
  form.append("purpose", "fine-tune");
  form.append("file", file, file.name);
  return api("/v1/files", { method: "POST", form });
}

export function uploadForm(onUploaded) {
  const input = h("input", { type: "file", id: "upload", name: "file", accept: ".jsonl,.json,application/jsonl" });
  const status = h("p", { role: "status", class: "muted small" });
  const button = h("button", { type: "submit", class: "primary" }, "Upload");
  const form = h("form", { class: "row" }, h("div", { class: "field" }, h("label", { for: "upload" }, "Training data (JSONL)"), input), button, status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (!input.files.length) { status.textContent = "Choose a file first."; return; }
    button.disabled = true;
    status.textContent = `Uploading ${input.files[0].name}…`;
    try {
      const file = await upload(input.files[0]);
      status.textContent = `Uploaded ${file.filename} as ${file.id}.`;
      input.value = "";
      await onUploaded(file);
    } catch (e) {
      status.textContent = `Upload failed: ${e.message}`;
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

export async function listFiles() {
  const page = await api("/v1/files?purpose=fine-tune&limit=1000");
  return page.data.filter((f) => f.purpose === "fine-tune");
}

export async function render(main) {
  const tbody = h("tbody");
  async function refresh() {
    const files = await listFiles();
    tbody.replaceChildren(
      ...files.map((f) =>
        h("tr", {},
          h("td", {}, h("a", { href: `#/files/${f.id}`, class: "mono" }, f.id)),
          h("td", {}, f.filename),
          h("td", { class: "num" }, fmt.bytes(f.bytes)),
          h("td", { class: "hide-phone" }, fmt.time(f.created_at)),
          h("td", {},
            h("a", { href: `#/files/${f.id}` }, "Preview"), " · ",
            h("a", { href: `#/new?file=${f.id}` }, "New job"), " · ",
            h("button", { type: "button", class: "link", "aria-label": `Delete ${f.filename}`, onclick: async () => {
              if (!confirm(`Delete ${f.filename}?`)) return;
              try {
                await api(`/v1/files/${f.id}`, { method: "DELETE" });
              } catch (e) {  // a job still needs it: the answer names the jobs
                alert(`${f.filename} was not deleted: ${e.message}`);
                return;
              }
              await refresh();
            } }, "Delete"))),
      ),
    );
    if (!files.length) tbody.append(h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No files yet: upload one above.")));
  }
  main.append(
    h("h1", {}, "Files"),
    h("div", { class: "card" }, uploadForm(async (file) => { location.hash = `#/files/${file.id}`; })),
    h("h2", {}, "Your files"),
    h("div", { class: "tablewrap" }, h("table", { "aria-label": "Uploaded files" },
      h("thead", {}, h("tr", {}, ["File", "Name", "Size", "Uploaded", "Actions"].map((t) => h("th", { scope: "col", class: t === "Size" ? "num" : t === "Uploaded" ? "hide-phone" : "" }, t)))),
      tbody)),
  );
  await refresh();
}
