"""The dashboard in a real browser against a real server: what a user does, in the order a user does it.

Sign in, upload the bundled examples, see a bad file's problem with its line, read the live plan, start a toy
job, watch its curve gain points, open its checkpoints, compare two runs, then sign in as another tenant and
see none of it. The tests share one server and run in file order (later ones use the jobs earlier ones made).
"""

from __future__ import annotations

import io
import json
import re
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

expect = pytest.importorskip("playwright.sync_api").expect

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
JOB_TIMEOUT_S = 240

pytestmark = pytest.mark.timeout(600)
shared: dict = {}


def _small_file(tmp_path: Path, lines: int = 30) -> Path:
    path = tmp_path / "small.jsonl"
    path.write_text("".join((EXAMPLES / "train.jsonl").read_text().splitlines(keepends=True)[:lines]))
    return path


def _api(service, path: str, body: dict | None = None, tenant: str = "alice") -> dict:
    request = urllib.request.Request(
        service.base + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {service.keys[tenant]}", "Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _wait_status(service, job_id: str, statuses: set[str]) -> dict:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        job = _api(service, f"/v1/fine_tuning/jobs/{job_id}")
        if job["status"] in statuses:
            return job
        time.sleep(0.5)
    raise AssertionError(f"{job_id} still {job['status']} after {JOB_TIMEOUT_S} s")


def _shoot(page, screenshots, name: str) -> None:
    if screenshots is not None:
        page.wait_for_timeout(300)  # let charts finish their first paint
        page.screenshot(path=str(screenshots / f"{name}.png"), full_page=name == "new-job")


def _sign_in(page, service, tenant: str) -> None:
    page.goto(service.base + "/#/login")
    page.get_by_label("API key").fill(service.keys[tenant])
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Jobs").wait_for()


@pytest.fixture(scope="module")
def alice(browser, service):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors: {errors}"


def _new_job_with_small_file(page, tmp_path) -> None:
    """Open New job and upload a small training file there (the form selects it)."""
    page.get_by_role("navigation").get_by_role("link", name="New job").click()
    page.set_input_files("#upload", str(_small_file(tmp_path)))
    page.get_by_role("button", name="Upload").click()
    page.get_by_text("Uploaded small.jsonl").wait_for()


def test_sign_in_keeps_the_key_in_an_httponly_cookie(alice, service):
    page = alice
    page.goto(service.base + "/")
    page.get_by_role("heading", name="Sign in").wait_for()
    page.get_by_label("API key").fill("ftk-000000000000-not-a-real-key")
    page.get_by_role("button", name="Sign in").click()
    assert "not valid" in page.get_by_role("alert").inner_text()

    page.get_by_label("API key").fill("")
    page.keyboard.type(service.keys["alice"])  # the key field keeps focus after the error
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Jobs").wait_for()
    assert page.locator("#tenant").inner_text() == "tenant alice"
    (cookie,) = [c for c in page.context.cookies() if c["name"] == "finetune_key"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert service.keys["alice"] not in page.url
    assert page.evaluate("document.cookie") == ""  # no script can read the key


def test_upload_the_examples_and_preview_them(alice, service, screenshots):
    page = alice
    page.get_by_role("navigation").get_by_role("link", name="Files").click()
    page.set_input_files("#upload", str(EXAMPLES / "train.jsonl"))
    page.get_by_role("button", name="Upload").click()
    page.get_by_role("heading", name="Data preview: train.jsonl").wait_for()
    page.get_by_text("Usable: 0 errors").wait_for(timeout=60_000)
    stats = page.locator(".stats").inner_text()
    assert "360" in stats and "conversations" in stats
    # the records as the toy model's chat template renders them: replies scored, the prompt dimmed
    first = page.locator("article.record").first
    assert "<|im_start|>user" in first.locator(".ctx").first.inner_text()
    assert first.locator("mark.scored").count() >= 1
    assert page.locator("svg.hist rect").count() > 3
    held_out = page.get_by_text(re.compile(r"\d+ conversations \(\d")).first.inner_text()
    assert held_out.startswith("30 conversations")
    shared["examples_file"] = page.locator("main p.mono").inner_text()
    _shoot(page, screenshots, "preview")


def test_a_bad_file_shows_its_problem_and_line(alice, service, tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = (EXAMPLES / "train.jsonl").read_text().splitlines()[0]
    bad.write_text(good + "\n" + '{"messages": [{"role": "user", "content": "hi"}]\n' + good + "\n")
    page = alice
    page.goto(service.base + "/#/files")
    page.set_input_files("#upload", str(bad))
    page.get_by_role("button", name="Upload").click()
    page.get_by_role("heading", name="Data preview: bad.jsonl").wait_for()
    alert = page.get_by_role("alert")
    alert.wait_for(timeout=60_000)
    assert "Not usable" in alert.inner_text() and "line 2" in alert.inner_text()
    row = page.locator("section[aria-label=Errors] tbody tr").first
    assert row.locator("td").first.inner_text() == "2"


def test_live_plan_start_a_job_and_watch_it(alice, service, tmp_path, screenshots):
    page = alice
    _new_job_with_small_file(page, tmp_path)
    plan = page.locator("[data-testid=plan]")
    plan.wait_for(timeout=60_000)

    page.get_by_label("Batch size").fill("2")
    page.get_by_label("Epochs").fill("1")
    page.get_by_label("Suffix").fill("first")
    steps = plan.locator(".stat .v").first
    expect(steps).to_have_text("12")
    assert "12 per epoch" in plan.locator(".stat").first.inner_text()  # 24 training records (6 held out) / batch 2
    page.get_by_label("Epochs").fill("2")
    expect(steps).to_have_text("24")
    page.get_by_label("Epochs").fill("1")  # one epoch keeps the test short
    expect(steps).to_have_text("12")
    epochs_row = plan.locator("tr", has_text="Epochs")
    assert "your setting" in epochs_row.inner_text()
    assert "Auto" in plan.locator("tr", has_text="Learning rate").inner_text()  # every Auto value has its reason
    python = page.locator("pre[aria-label='Python code']").text_content()
    assert "client.fine_tuning.jobs.create(" in python and '"n_epochs": 1' in python
    curl = page.locator("pre[aria-label='curl command']").text_content()
    assert "/v1/fine_tuning/jobs" in curl and "$FINETUNE_API_KEY" in curl and service.keys["alice"] not in curl
    _shoot(page, screenshots, "new-job")

    page.get_by_role("button", name="Review and start").click()
    dialog = page.get_by_role("dialog")
    assert "12" in dialog.inner_text()
    dialog.get_by_role("button", name="Start training").click()
    page.wait_for_url(re.compile(r"#/jobs/ftjob-"))
    job_id = page.url.rsplit("/", 1)[1]
    shared["first"] = job_id
    small_file = _api(service, f"/v1/fine_tuning/jobs/{job_id}")["training_file"]
    # the second run for the comparison, started now so the second worker trains it alongside
    hyper = {"n_epochs": 1, "batch_size": 2, "lora_rank": 16}
    second = _api(
        service,
        "/v1/fine_tuning/jobs",
        {
            "model": "toy",
            "training_file": small_file,
            "suffix": "rank16",
            "method": {"type": "supervised", "supervised": {"hyperparameters": hyper}},
        },
    )
    shared["second"] = second["id"]

    # the curve gains points while the page stays open (no reload)
    seen: set[int] = set()
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        note = page.locator("section[aria-label=Curves] p.small").inner_text()
        found = re.match(r"([\d,]+) steps logged", note)
        seen.add(int(found.group(1).replace(",", "")) if found else 0)
        if page.locator("h1 + span .badge").inner_text() in ("succeeded", "failed", "cancelled"):
            break
        page.wait_for_timeout(400)
    assert page.locator("h1 + span .badge").inner_text() == "succeeded"
    expect(page.locator("section[aria-label=Curves] p.small")).to_have_text(re.compile(r"^12 steps logged"))
    assert len(seen) >= 2 and max(seen) <= 12, seen
    assert page.locator("section[aria-label=Curves] canvas").count() == 3  # loss, learning rate, gradient norm

    # the report's diagnosis in plain words, the frozen settings, the events with levels
    diagnosis = page.locator("section[aria-label=Diagnosis]")
    diagnosis.get_by_text("Next step:").wait_for()
    assert page.locator("section[aria-label='Frozen settings'] [data-testid=plan]").count() == 1
    events = page.locator("section[aria-label=Events] tbody")  # refreshed by its own poll: may trail the badge
    expect(events).to_contain_text(re.compile("successfully completed|succeeded"), timeout=30_000)
    _shoot(page, screenshots, "run")


def test_checkpoints_best_badge_pick_and_download(alice, service):
    page = alice
    job_id = shared["first"]
    page.goto(f"{service.base}/#/jobs/{job_id}")
    table = page.locator("#checkpoints tbody")
    table.locator("tr").first.wait_for()
    rows = table.locator("tr")
    assert rows.count() >= 2
    best = table.locator("tr", has=page.locator(".badge.best"))
    assert best.count() == 1
    best_step = best.get_attribute("data-step")
    report_best = page.locator("section[aria-label=Diagnosis] dd").first.inner_text()
    assert report_best.startswith(best_step)

    # click the loss curve near its left end: the nearest checkpoint is picked
    over = page.locator("section[aria-label=Curves] .u-over").first
    box = over.bounding_box()
    over.click(position={"x": 3, "y": box["height"] / 2})
    picked = table.locator("tr.selected")
    picked.wait_for()
    steps = sorted(int(s) for s in table.locator("tr").evaluate_all("rows => rows.map(r => r.dataset.step)"))
    assert picked.get_attribute("data-step") == str(steps[0])

    link = best.get_by_role("link", name=f"Download {best_step}", exact=True)
    response = page.request.get(service.base + link.get_attribute("href"))
    assert response.status == 200 and response.headers["content-type"] == "application/zip"
    names = zipfile.ZipFile(io.BytesIO(response.body())).namelist()
    assert "adapter_model.safetensors" in names and "optimizer.pt" not in names
    final = page.request.get(f"{service.base}/v1/dashboard/jobs/{job_id}/download")
    assert "adapter_config.json" in zipfile.ZipFile(io.BytesIO(final.body())).namelist()

    # beside each folder, the same weights merged into one GGUF file (the toy is a Llama: supported)
    gguf = best.get_by_role("link", name=f"GGUF {best_step}", exact=True)
    response = page.request.get(service.base + gguf.get_attribute("href"))
    assert response.status == 200 and response.body()[:4] == b"GGUF"
    assert page.get_by_role("link", name="Download as GGUF").count() == 1


def test_the_run_page_shows_a_retention_check_and_its_flag(alice, service, retention_report):
    page = alice
    job_id = shared["first"]
    path = service.data_dir / "runs" / job_id / "retention.json"
    report = retention_report(dropped=True)
    path.write_text(json.dumps(report))  # as `finetune eval RUN --retention` leaves it in the run folder
    try:
        page.goto(f"{service.base}/#/jobs/{job_id}")
        page.reload()  # the same address as the last test's: read the run again
        section = page.locator("section[aria-label=Retention]")
        expect(section).to_be_visible()
        expect(section.locator("#retention tbody tr")).to_have_count(3)
        expect(section.locator("tr[data-measure=accuracy]")).to_contain_text("drop")
        expect(section.get_by_test_id("retention-verdict")).to_have_text(report["message"])
        expect(section.locator("li")).to_have_count(len(report["remedies"]))
    finally:
        path.unlink()
    page.reload()
    page.locator("section[aria-label=Diagnosis]").get_by_text("Next step:").wait_for()
    expect(page.locator("section[aria-label=Retention]")).to_be_hidden()


def test_evaluate_from_the_run_page_shows_its_estimate_then_the_retention_check(alice, service):
    """The Evaluate button: its estimate before it starts, its progress, then the retention check a worker ran
    (`finetune eval RUN --retention` on the toy, a run without a test set), as the API answers it."""
    page = alice
    job_id = shared["first"]
    page.goto(f"{service.base}/#/jobs/{job_id}")
    page.reload()
    diagnosis = page.locator("section[aria-label=Diagnosis]")
    diagnosis.get_by_text("Next step:").wait_for()
    assert "finetune eval" not in diagnosis.inner_text()  # a command a dashboard user cannot run
    assert "the Evaluate button on this run's page" in diagnosis.inner_text()
    card = page.locator("section[aria-label=Evaluation]")
    expect(card.get_by_test_id("evaluate-estimate")).to_contain_text("Estimated time:")
    expect(page.locator("section[aria-label=Retention]")).to_be_hidden()
    card.get_by_test_id("evaluate").click()
    expect(card.get_by_role("status")).to_contain_text(re.compile("Evaluation started|Waiting for a worker|Running"))
    retention = page.locator("section[aria-label=Retention]")
    expect(retention).to_be_visible(timeout=JOB_TIMEOUT_S * 1000)
    expect(card.locator(".badge")).to_have_text("succeeded")
    expect(card.get_by_role("status")).to_contain_text("Evaluated")
    newest = _api(service, f"/v1/fine_tuning/jobs/{job_id}/evaluations")["data"][0]
    assert newest["status"] == "succeeded" and newest["test"] is False  # the run has no test set
    expect(retention.get_by_test_id("retention-verdict")).to_have_text(newest["results"]["retention"]["message"])


def test_jobs_list_and_compare_two_runs(alice, service, screenshots):
    _wait_status(service, shared["second"], {"succeeded"})
    page = alice
    page.goto(service.base + "/#/jobs")
    for job_id in (shared["first"], shared["second"]):
        row = page.locator(f"tr[data-job='{job_id}']")
        row.wait_for()
        row.locator(".badge.succeeded").wait_for()
        assert "12 / 12" in row.inner_text()
        assert row.locator("svg.spark polyline").count() == 1
    _shoot(page, screenshots, "jobs")
    page.get_by_label(f"Select {shared['first']} to compare").check()
    page.get_by_label(f"Select {shared['second']} to compare").check()
    page.get_by_role("button", name="Compare 2 runs").click()
    page.get_by_role("heading", name="Compare runs").wait_for()
    settings = page.get_by_role("table", name="Settings side by side")
    settings.locator("tbody tr.diff").first.wait_for()
    visible = [r for r in settings.locator("tbody tr").all() if r.is_visible()]
    names = [r.locator("th").text_content().strip() for r in visible]
    assert "LoRA rank" in names and "suffix" in names  # what differs
    assert "model" not in names and "epochs" not in names and "batch size" not in names  # what is the same stays hidden
    assert page.locator(".chart canvas").count() == 2
    _shoot(page, screenshots, "compare")


def test_advice_names_the_fields_label_and_links_to_it(alice, tmp_path):
    """A plan's advice in the dashboard names each setting by its field's label (never a command-line flag), and
    the name is a link that opens and focuses the field."""
    page = alice
    page.get_by_role("navigation").get_by_role("link", name="New job").click()
    page.set_input_files("#upload", str(_small_file(tmp_path, lines=24)))
    page.get_by_role("button", name="Upload").click()
    page.get_by_text("Uploaded small.jsonl").wait_for()
    note = page.locator("[data-testid=plan] p.note", has_text="small_validation_set")
    expect(note).to_contain_text("“Validation share”", timeout=60_000)
    assert "--" not in page.locator("#plan").inner_text()
    note.locator("a.setting-ref", has_text="Validation share").click()
    field = page.locator("#nj-val_fraction")
    expect(field).to_be_focused()
    assert field.is_visible()  # "More settings" opened to show it


def test_general_conversations_are_a_select_of_files_sent_as_their_id(alice, tmp_path):
    """The New job form offers the caller's files as its own general conversations for self-replay, once, in the
    Data section: the plan and the job get hyperparameters.general_data, the file's id; without replay the plan
    says why in the fields' labels."""
    page = alice
    _new_job_with_small_file(page, tmp_path)
    general = page.get_by_label("General conversations")
    expect(general).to_have_value("")
    assert "none: the base model answers general requests itself" in general.inner_text()
    assert page.locator("#nj-general_data").count() == 1 and general.is_visible()  # not again in "More settings"
    file_id = page.locator("#nj-train").input_value()
    assert file_id in general.inner_text()  # the file just uploaded is offered too

    def sends_it(response) -> bool:
        return response.url.endswith("/v1/fine_tuning/plan") and file_id in (response.request.post_data or "")

    with page.expect_response(sends_it, timeout=60_000) as planned:
        general.select_option(file_id)
    assert planned.value.ok, planned.value.text()
    sent = json.loads(planned.value.request.post_data)["method"]["supervised"]["hyperparameters"]
    assert sent["general_data"] == file_id
    assert planned.value.json()["general_data"] == file_id
    expect(page.locator("pre[aria-label='curl command']")).to_contain_text(f'"general_data": "{file_id}"')

    page.locator("details.more-settings").evaluate("details => { details.open = true; }")  # open, whatever it was
    page.get_by_label("Self-replay").fill("off")
    alert = page.locator("#plan [role=alert]")
    expect(alert).to_contain_text("“General conversations” is mixed in by replay", timeout=60_000)
    assert "--" not in alert.inner_text()
    page.get_by_label("Self-replay").fill("")  # the form as the next test expects it
    general.select_option("")


def test_the_usage_page_shows_the_apis_numbers_per_day_and_model(alice, service, screenshots):
    page = alice
    page.get_by_role("navigation").get_by_role("link", name="Usage").click()
    page.get_by_role("heading", name="Usage").wait_for()
    totals = page.get_by_role("table", name="Usage totals")
    totals.wait_for()
    answer = _api(service, "/v1/usage?group_by=day")
    total = answer["total"]
    assert total["jobs"] == 2 and total["billed_tokens"] > 0 and total["cost"] > 0  # both runs ended, prices set
    for part, numbers in (("actual", total), ("estimate", total["estimate"])):
        for key in ("billed_tokens", "device_seconds", "cost"):
            shown = totals.locator(f"[data-testid=total-{part}-{key}]").get_attribute("data-value")
            assert float(shown) == numbers[key], (part, key)  # the API's own number, not a sum of its own
    assert totals.locator("[data-testid=total-actual-billed_tokens]").inner_text() == f"{total['billed_tokens']:,}"
    quotas = page.get_by_role("table", name="Quotas")  # beside the usage: what alice uses now, and no quota set
    for key, q in answer["quotas"].items():
        used = q["used"] + q.get("pending", 0)
        assert quotas.locator(f"[data-testid=quota-{key}-used]").get_attribute("data-value") == str(used), key
        assert quotas.locator(f"[data-testid=quota-{key}-limit]").inner_text() == "no quota", key
    per_day = page.get_by_role("table", name="Usage per day")
    assert [r.get_attribute("data-key") for r in per_day.locator("tbody tr").all()] == [
        g["key"] for g in answer["data"]
    ]
    by_model = _api(service, "/v1/usage?group_by=model")
    per_model = page.get_by_role("table", name="Usage per model")
    assert [r.get_attribute("data-key") for r in per_model.locator("tbody tr").all()] == ["toy"]
    assert by_model["data"][0]["billed_tokens"] == total["billed_tokens"]
    assert per_model.locator("tfoot th").text_content() == "Total"
    rule = page.locator("[data-testid=billing-rule]")  # what a billed token is, as the API says it (issue 47)
    assert answer["billing_rule"] in rule.inner_text() and "not billed: the rows the base model" in rule.inner_text()
    _shoot(page, screenshots, "usage")


def test_the_audit_page_lists_the_tenants_own_records_newest_first(alice, service):
    page = alice
    page.get_by_role("navigation").get_by_role("link", name="Audit").click()
    page.get_by_role("heading", name="Audit trail").wait_for()
    rows = page.get_by_role("table", name="Audit records").locator("tbody tr")
    rows.first.wait_for()
    shown = [r.get_attribute("data-seq") for r in rows.all()]
    # the page's first page is the API's own records up to the newest the page saw (the module's shared service may
    # record more while the page loads)
    answer = _api(service, "/v1/audit?limit=100")
    expected = [str(r["seq"]) for r in answer["data"] if r["seq"] <= int(shown[0])][:50]
    assert shown == expected
    actions = {r.get_attribute("data-action") for r in rows.all()}
    assert {"session.sign_in", "file.upload", "job.create"} <= actions
    assert {r["tenant"] for r in answer["data"]} == {"alice"}
    assert service.keys["alice"].split("-", 2)[2] not in page.content()  # a key is shown by its id only


def test_a_preference_job_plans_with_dpo_and_its_beta(alice, service, tmp_path):
    """The new-job page also starts preference tuning: a pairs file plans as DPO, with Auto's beta and its reason."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join((EXAMPLES / "prefs.jsonl").read_text().splitlines(keepends=True)[:40]))
    page = alice
    page.get_by_role("navigation").get_by_role("link", name="New job").click()
    page.set_input_files("#upload", str(pairs))
    page.get_by_role("button", name="Upload").click()
    page.get_by_text("Uploaded pairs.jsonl").wait_for()
    alert = page.locator("#plan [role=alert]")
    expect(alert).to_contain_text('method type "dpo"', timeout=60_000)  # supervised: refused, in the page's terms
    assert "--" not in alert.inner_text()  # never a command-line flag in the dashboard
    page.get_by_label("Method").select_option("dpo")
    plan = page.locator("[data-testid=plan]")
    beta = plan.locator("tr", has_text="Beta")
    expect(beta).to_contain_text("0.1", timeout=60_000)
    assert "Auto" in beta.inner_text()
    python = page.locator("pre[aria-label='Python code']").text_content()
    assert '"type": "dpo"' in python and '"dpo": {' in python
    page.get_by_label("Beta").fill("0.2")
    expect(beta).to_contain_text("your setting")
    expect(page.locator("pre[aria-label='curl command']")).to_contain_text('"beta": 0.2')
    page.get_by_label("Method").select_option("lora")  # back to supervised: beta is not sent
    expect(page.locator("pre[aria-label='curl command']")).not_to_contain_text("beta")


def test_phone_width_has_no_sideways_scroll(browser, service, screenshots):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    _sign_in(page, service, "alice")
    page.locator("tbody tr").first.wait_for()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.goto(f"{service.base}/#/jobs/{shared['first']}")
    page.locator("section[aria-label=Curves] canvas").first.wait_for()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    _shoot(page, screenshots, "phone-run")
    context.close()


def test_another_tenant_sees_none_of_it(alice, browser, service):
    alice.get_by_role("button", name="Sign out").click()
    alice.get_by_role("heading", name="Sign in").wait_for()
    context = browser.new_context()
    page = context.new_page()
    _sign_in(page, service, "bob")
    page.get_by_text("No jobs yet").wait_for()
    assert page.locator("tbody tr").count() == 0
    page.goto(service.base + "/#/files")
    page.get_by_text("No files yet").wait_for()
    page.goto(f"{service.base}/#/jobs/{shared['first']}")
    assert "No fine-tuning job found" in page.get_by_role("alert").inner_text()
    for path in (
        f"/v1/dashboard/jobs/{shared['first']}/curve",
        f"/v1/dashboard/jobs/{shared['first']}/download",
        f"/v1/dashboard/jobs/{shared['first']}/download?format=gguf",
        f"/v1/dashboard/files/{shared['examples_file']}/preview",
    ):
        assert page.request.get(service.base + path).status == 404, path
    progress = page.request.get(f"{service.base}/v1/dashboard/progress?job_id={shared['first']}").json()
    assert progress["data"] == {}
    context.close()
