// The dashboard's router: each page is a module with `render(main, params, signal)`. The URL hash holds the
// page, so a reload shows the same page; everything on it is read again from the API.
import { api, h } from "./util.js";
import * as login from "./pages/login.js";
import * as jobs from "./pages/jobs.js";
import * as newjob from "./pages/newjob.js";
import * as files from "./pages/files.js";
import * as preview from "./pages/preview.js";
import * as run from "./pages/run.js";
import * as compare from "./pages/compare.js";
import * as usage from "./pages/usage.js";
import * as audit from "./pages/audit.js";

const routes = [
  [/^#\/login$/, login, "Sign in"],
  [/^#\/jobs$/, jobs, "Jobs"],
  [/^#\/new(?:\?file=([\w-]+))?$/, newjob, "New job"],
  [/^#\/files$/, files, "Files"],
  [/^#\/files\/([\w-]+)$/, preview, "Data preview"],
  [/^#\/jobs\/([\w-]+)$/, run, "Run"],
  [/^#\/compare\/([\w,-]+)$/, compare, "Compare runs"],
  [/^#\/usage$/, usage, "Usage"],
  [/^#\/audit$/, audit, "Audit trail"],
];

let controller = null;
let session = null;

async function whoami() {
  try {
    session = await api("/v1/dashboard/session");
  } catch {
    session = null;
  }
  document.getElementById("nav").hidden = !session;
  document.getElementById("who").hidden = !session;
  document.getElementById("tenant").textContent = session ? `tenant ${session.tenant}` : "";
  return session;
}

async function route() {
  if (controller) controller.abort();
  controller = new AbortController();
  const hash = location.hash || "#/jobs";
  const main = document.getElementById("main");
  if (hash !== "#/login" && !session && !(await whoami())) {
    location.hash = "#/login";
    return;
  }
  for (const a of document.querySelectorAll("nav a")) {
    const here = hash === a.getAttribute("href") || (a.getAttribute("href") === "#/jobs" && /^#\/(jobs\/|compare)/.test(hash));
    if (here) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  for (const [re, page, title] of routes) {
    const m = hash.match(re);
    if (!m) continue;
    document.title = `${title} · finetune`;
    main.replaceChildren();
    try {
      await page.render(main, m.slice(1), controller.signal, { session, onSignedIn: whoami });
    } catch (e) {
      main.replaceChildren(h("h1", {}, title), h("p", { class: "alert", role: "alert" }, e.message));
    }
    const heading = main.querySelector("h1");
    if (heading) {
      heading.tabIndex = -1;
      heading.focus({ preventScroll: true });
    }
    return;
  }
  location.hash = "#/jobs";
}

document.getElementById("signout").addEventListener("click", async () => {
  await api("/v1/dashboard/session", { method: "DELETE" }).catch(() => {});
  session = null;
  await whoami();
  location.hash = "#/login";
});

window.addEventListener("hashchange", route);
whoami().then(route);
