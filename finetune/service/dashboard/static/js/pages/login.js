// Sign in: the key goes in a POST body to /v1/dashboard/session, which answers with an HttpOnly,
// SameSite=Strict cookie. The key never enters a URL, local storage or any script-readable place.
import { api, h } from "../util.js";

export async function render(main, _params, _signal, { onSignedIn }) {
  const key = h("input", { id: "key", name: "key", type: "password", autocomplete: "off", required: true, spellcheck: "false" });
  const error = h("p", { class: "alert", role: "alert", hidden: true });
  const form = h(
    "form",
    { class: "card login", method: "post", action: "/v1/dashboard/session" },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "Paste an API key. ", h("code", {}, "finetune keys create --tenant NAME"), " makes one."),
    h("div", { class: "field" }, h("label", { for: "key" }, "API key"), key),
    error,
    h("button", { type: "submit", class: "primary" }, "Sign in"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    error.hidden = true;
    try {
      await api("/v1/dashboard/session", { method: "POST", body: { key: key.value.trim() } });
      key.value = "";
      await onSignedIn();
      location.hash = "#/jobs";
    } catch (e) {
      error.textContent = e.status === 401 ? "That key is not valid (or was revoked)." : e.message;
      error.hidden = false;
      key.focus();
    }
  });
  main.append(form);
  key.focus();
}
