"""Quotas per tenant (quotas.py), set by the operator through `finetune serve tenants`: the official openai SDK
against a real `finetune serve` gets 429 past the queued-jobs quota and 403 past stored bytes or monthly tokens, in
OpenAI's shape with the figures; with a running quota of 1, one tenant's second job waits queued while another
tenant's job is claimed and runs; GET /v1/usage shows each quota beside its use. Workers run the stand-in trainer."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
from contextlib import redirect_stderr, redirect_stdout

import openai
import pytest
from fake_service import fake_launcher
from openai import OpenAI
from service_helpers import Server, settings_for
from sqlalchemy import inspect, text

from finetune.commands.cli import main
from finetune.service.storage import quotas
from finetune.service.storage.audit_trail import AuditLog
from finetune.service.storage.store import Store, new_id
from finetune.service.workers.worker import Worker

FAST = {"n_epochs": 1, "max_steps": 1, "val_fraction": 0}


def _tenants(data_dir, *args: str) -> subprocess.CompletedProcess:
    """`finetune serve tenants ARGS --data-dir DATA_DIR`, through the command line's own entry point, in this process
    (seconds faster than a new one; the test of the operator runs one through `python -m finetune`)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(["serve", "tenants", *args, "--data-dir", str(data_dir)])
        except SystemExit as exc:  # argparse's error
            code = exc.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def _set(data_dir, tenant: str, *flags: str) -> None:
    done = _tenants(data_dir, "set", tenant, *flags)
    assert done.returncode == 0, done.stderr


def _client(server: Server, tenant: str) -> OpenAI:
    store = Store(f"sqlite:///{(server.data_dir / 'finetune.db').resolve()}")
    try:
        key = store.create_key(tenant)[1]
    finally:
        store.close()
    return OpenAI(base_url=server.url, api_key=key, max_retries=0)


def _job(client: OpenAI, file_id: str):
    method = {"type": "supervised", "supervised": {"hyperparameters": FAST}}
    return client.fine_tuning.jobs.create(model="toy", training_file=file_id, method=method)


@pytest.fixture(scope="module")
def server(tmp_path_factory, toy_model):
    """API only (no worker): jobs stay queued."""
    s = Server(tmp_path_factory.mktemp("quota") / "data", toy_model, workers=0, fake=True)
    yield s
    s.stop()


def test_past_its_queued_jobs_quota_a_tenant_gets_429_and_lowering_it_loses_nothing(server, tiny_data):
    _set(server.data_dir, "acme", "--max-queued-jobs", "2")
    acme, other = _client(server, "acme"), _client(server, "other")
    f = acme.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    queued = [_job(acme, f.id).id for _ in range(2)]
    with pytest.raises(openai.RateLimitError) as refused:
        _job(acme, f.id)
    answer = refused.value
    assert answer.status_code == 429
    assert answer.body["message"].startswith("tenant acme has 2 queued jobs, its quota is 2")
    assert answer.code == "queued_jobs_quota_exceeded" and answer.type == "rate_limit_exceeded"
    assert int(answer.response.headers["retry-after"]) > 0  # waiting helps: a job leaves the queue when taken
    mine = other.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    assert _job(other, mine.id).status == "queued"  # another tenant is not held back

    _set(server.data_dir, "acme", "--max-queued-jobs", "1")  # lowered below what is queued
    assert sorted(j.id for j in acme.fine_tuning.jobs.list() if j.status == "queued") == sorted(queued)
    with pytest.raises(openai.RateLimitError, match="tenant acme has 2 queued jobs, its quota is 1"):
        _job(acme, f.id)
    assert len(acme.fine_tuning.jobs.list().data) == 2  # the refused creates left no job


def test_past_its_stored_bytes_quota_an_upload_gets_403_and_leaves_nothing(server, tiny_data):
    size = tiny_data.stat().st_size
    _set(server.data_dir, "bytes-co", "--max-stored-bytes", str(size + size // 2))
    client = _client(server, "bytes-co")
    client.files.create(file=("first.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    kept = sorted(p.name for p in (server.data_dir / "files").iterdir())
    with pytest.raises(openai.PermissionDeniedError) as refused:
        client.files.create(file=("second.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    assert refused.value.status_code == 403 and refused.value.code == "stored_bytes_quota_exceeded"
    assert refused.value.body["message"].startswith(
        f"tenant bytes-co stores {size} bytes in files, its quota is {size + size // 2} bytes (max stored bytes): "
        f"second.jsonl ({size} bytes) would make {2 * size}."
    )
    assert "retry-after" not in refused.value.response.headers  # waiting does not help; deleting files does
    assert [f.filename for f in client.files.list()] == ["first.jsonl"]
    assert sorted(p.name for p in (server.data_dir / "files").iterdir()) == kept  # no bytes kept either
    _set(server.data_dir, "bytes-co", "--max-stored-bytes", str(size))  # now full: refused before the body is read
    with pytest.raises(openai.PermissionDeniedError, match=f"stores {size} bytes in files, .* no upload fits"):
        client.files.create(file=("third.jsonl", b"{}\n"), purpose="fine-tune")


def test_past_its_monthly_tokens_a_create_gets_403_until_the_month_turns(server, tiny_data):
    client = _client(server, "tok")
    f = client.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    estimate = quotas.file_token_estimate(server.data_dir / "files" / f.id, FAST | {"epochs": 1})
    assert estimate > 100
    _set(server.data_dir, "tok", "--max-monthly-tokens", str(estimate + 10))
    first = _job(client, f.id)  # fits; its estimate is held until it is planned
    with pytest.raises(openai.PermissionDeniedError) as refused:
        _job(client, f.id)
    answer = refused.value
    assert answer.status_code == 403 and answer.code == "monthly_tokens_quota_exceeded"
    assert answer.body["message"].startswith(f"tenant tok has {estimate} trained tokens this month (")
    assert f"0 billed, {estimate} expected from jobs not ended), its quota is {estimate + 10}" in answer.body["message"]
    assert f"this job would train about {estimate} more (estimated from tiny.jsonl)" in answer.body["message"]
    _, end = quotas.month_bounds(time.time())
    assert 0 < int(answer.response.headers["retry-after"]) <= end - time.time() + 2  # the month's end
    client.fine_tuning.jobs.cancel(first.id)  # a cancelled job bills nothing: its place is free again
    assert _job(client, f.id).status == "queued"


def test_get_v1_usage_shows_each_quota_beside_its_use(server, tiny_data):
    client = _client(server, "seen")
    f = client.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    _job(client, f.id)
    _set(server.data_dir, "*", "--max-running-jobs", "4", "--max-stored-bytes", "1GiB")  # the default of all
    _set(server.data_dir, "seen", "--max-queued-jobs", "5")
    answer = client.get("/usage", cast_to=object)
    assert answer["total"]["jobs"] == 1  # the usage, as before
    start, end = quotas.month_bounds(time.time())
    assert answer["quotas"] == {
        "running_jobs": {"used": 0, "limit": 4},
        "queued_jobs": {"used": 1, "limit": 5},
        "stored_bytes": {"used": tiny_data.stat().st_size, "limit": 2**30},
        "monthly_tokens": {"used": 0, "pending": 0, "limit": None, "period_start": start, "period_end": end},
    }
    _tenants(server.data_dir, "unset", "*")


# ---------------------------------------------------------------------------------------------- the running quota


def _queue(store: Store, settings, data, tenant: str) -> str:
    file_id = new_id("file")
    (settings.files_dir / file_id).write_bytes(data.read_bytes())
    store.add_file(tenant, file_id, data.name, "fine-tune", data.stat().st_size)
    values = dict(model="toy", model_location=settings.models["toy"], training_file=file_id, seed=1,
                  method={"type": "supervised"}, run_settings={"max_steps": 1, "val_fraction": 0})  # fmt: skip
    return store.create_job(tenant, values)["id"]


def _until(what, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_at_its_running_quota_a_tenants_job_waits_queued_while_another_tenants_runs(
    tmp_path, toy_model, tiny_data, monkeypatch
):
    """Two workers (the real Worker, validation and plan; trainers that wait until stopped); tenant a may run one job
    at a time. a's second job, older than b's, stays queued while the second worker claims b's and runs it; once a's
    first ends, a's second runs to the end."""
    monkeypatch.setenv("FAKE_TRAINER_MODE", "wait")
    settings = settings_for(tmp_path / "d", toy_model, heartbeat_seconds=0.1)
    settings.make_dirs()
    store = Store(settings.database_url)
    store.migrate()
    quotas.set_quotas(store.engine, "a", {"max_running_jobs": 1})
    first, second = _queue(store, settings, tiny_data, "a"), _queue(store, settings, tiny_data, "a")
    other = _queue(store, settings, tiny_data, "b")  # the newest of the three
    workers = [threading.Thread(target=Worker(settings, store, launcher=fake_launcher()).run_once) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        _until(lambda: store.get_job("a", first)["status"] == "running")
        _until(lambda: store.get_job("b", other)["status"] == "running")  # the second worker took b's job
        assert store.get_job("a", second)["status"] == "queued" and store.get_job("a", second)["claim_token"] is None
    finally:
        for tenant, job in (("a", first), ("b", other)):
            store.transition(tenant, job, "cancel")
        for worker in workers:
            worker.join(timeout=60)
    monkeypatch.setenv("FAKE_TRAINER_MODE", "ok")
    assert Worker(settings, store, launcher=fake_launcher()).run_once()  # a's place is free: its second job runs
    assert store.get_job("a", second)["status"] == "succeeded"
    store.close()


def _add_job(store: Store, tenant: str) -> str:
    values = dict(model="toy", model_location="/m", training_file=new_id("file"), seed=1,
                  method={"type": "supervised"}, run_settings={})  # fmt: skip
    return store.create_job(tenant, values)["id"]


@pytest.mark.parametrize("who", ["a", "*"])
def test_the_claim_skips_a_tenant_at_its_running_quota(store, who):
    """On SQLite and PostgreSQL: the quota (the tenant's own, or the default's) set after the jobs were queued."""
    a1, a2, b1 = _add_job(store, "a"), _add_job(store, "a"), _add_job(store, "b")
    quotas.set_quotas(store.engine, who, {"max_running_jobs": 1})
    if who == "*":
        quotas.set_quotas(store.engine, "b", {"max_running_jobs": 2})
    first = store.claim("w1", 30)
    assert first.job["id"] == a1
    assert store.claim("w2", 30).job["id"] == b1  # not a2, the older one: a is at its quota
    assert store.claim("w3", 30) is None  # a2 waits, queued
    assert store.get_job("a", a2)["status"] == "queued" and store.get_job("a", a2)["claim_token"] is None
    store.transition("a", a1, "cancel")  # a's first job ends: its place is free
    store.release(a1, first.token)
    assert store.claim("w3", 30).job["id"] == a2


def test_workers_claiming_at_once_cannot_both_take_a_tenants_last_running_place(store):
    for _ in range(6):
        _add_job(store, "a")
    quotas.set_quotas(store.engine, "a", {"max_running_jobs": 1})
    claims = []
    threads = [threading.Thread(target=lambda n=n: claims.append(store.claim(f"w{n}", 30))) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(claim is not None for claim in claims) == 1


def test_two_creates_at_once_cannot_both_take_the_last_queued_place(store):
    quotas.set_quotas(store.engine, "a", {"max_queued_jobs": 3})
    made, refused = [], []

    def create() -> None:
        values = dict(model="toy", model_location="/m", training_file="file-x", seed=1,
                      method={"type": "supervised"}, run_settings={})  # fmt: skip
        try:
            made.append(store.create_job("a", values, admit=quotas.admit_job("a", None, "x.jsonl"))["id"])
        except Exception as exc:  # the APIError of the quota
            refused.append(getattr(exc, "status", exc))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 3 and refused == [429] * 5
    assert len(store.all_jobs("a")) == 3


# ---------------------------------------------------------------------------------------------- the operator


def test_the_operator_sets_lists_and_unsets_quotas(tmp_path):
    data = tmp_path / "data"
    done = _tenants(data, "set", "acme", "--max-running-jobs", "2", "--max-queued-jobs", "3",
                    "--max-stored-bytes", "10MiB", "--max-monthly-tokens", "5M")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "quotas of tenant 'acme': max_running_jobs 2, max_queued_jobs 3, max_stored_bytes 10485760, "
        "max_monthly_tokens 5000000"
    )
    _set(data, "*", "--max-queued-jobs", "10")
    _set(data, "acme", "--max-queued-jobs", "none")  # its own value goes: the default's holds
    assert _tenants(data, "unset", "acme", "--max-stored-bytes").returncode == 0  # the same
    listed = json.loads(_tenants(data, "list", "--json").stdout)
    assert listed["default"]["max_queued_jobs"] == 10
    acme = next(t for t in listed["data"] if t["tenant"] == "acme")
    assert acme["own"] == {"max_running_jobs": 2, "max_queued_jobs": None, "max_stored_bytes": None,
                           "max_monthly_tokens": 5_000_000}  # fmt: skip
    assert acme["quotas"]["queued_jobs"] == {"used": 0, "limit": 10}
    assert acme["quotas"]["stored_bytes"] == {"used": 0, "limit": None}
    command = [sys.executable, "-m", "finetune", "serve", "tenants", "list", "--data-dir", str(data)]
    table = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    assert table[0].split()[:3] == ["tenant", "running", "jobs"]
    assert table[2].split() == ["acme", "0/2", "0/10", "(*)", "0/-", "0+0/5000000"]

    bad = _tenants(data, "set", "acme", "--max-running-jobs", "0")
    assert bad.returncode == 1 and bad.stderr.startswith("error: --max-running-jobs must be at least 1")
    bad = _tenants(data, "set", "acme", "--max-queued-jobs", "many")
    assert bad.returncode == 2 and "expected a whole number" in bad.stderr and "Traceback" not in bad.stderr
    assert _tenants(data, "unset", "acme").returncode == 0  # every own value: the row goes
    engine = Store(f"sqlite:///{(data / 'finetune.db').resolve()}").engine
    assert "acme" not in quotas.all_quotas(engine)
    changes = [(r["action"], r["tenant"]) for r in AuditLog(engine).records() if r["action"].startswith("quota.")]
    assert changes == [
        ("quota.set", "acme"),
        ("quota.set", "*"),
        ("quota.set", "acme"),
        ("quota.unset", "acme"),
        ("quota.unset", "acme"),
    ]  # the refused sets wrote nothing


@pytest.mark.parametrize(
    "args, said",
    [
        (["set", "acme", "--max-stored-bytes", "9" * 30], "at most 9223372036854775807, or none"),
        (["set", "acme", "--max-queued-jobs", "5G"], "at most 2147483647, or none"),
        (["set", "acme'; DROP TABLE jobs; --", "--max-queued-jobs", "3"], "a tenant's name is 1-64 letters"),
        (["set", 'a"b', "--max-queued-jobs", "3"], "a tenant's name is 1-64 letters"),
        (["set", "x" * 65, "--max-queued-jobs", "3"], "a tenant's name is 1-64 letters"),
        (["set", ".hidden", "--max-queued-jobs", "3"], "a tenant's name is 1-64 letters"),
    ],
)
def test_quotas_and_names_the_database_cannot_keep_are_one_line_errors(tmp_path, args, said):
    """Issue 42: a huge --max-stored-bytes ended `tenants set` in a SQLAlchemy traceback, and any name was taken,
    quotes and semicolons included: each is one line now, exit 2 (a flag's error), and nothing is written."""
    data = tmp_path / "data"
    assert _tenants(data, "set", "*", "--max-queued-jobs", "9").returncode == 0  # the database exists
    done = _tenants(data, *args)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()[-1]) < 300
    engine = Store(f"sqlite:///{(data / 'finetune.db').resolve()}").engine
    assert set(quotas.all_quotas(engine)) == {"*"}


def test_a_new_tenant_s_name_is_checked_where_a_key_is_made(tmp_path, capsys):
    """`finetune keys create --tenant NAME` takes the same names as `tenants set` (tenant_names.py)."""
    data = str(tmp_path / "data")
    with pytest.raises(SystemExit) as refused:
        main(["keys", "create", "--tenant", "a b;c", "--data-dir", data])
    assert refused.value.code == 2 and "a tenant's name is 1-64 letters" in capsys.readouterr().err
    assert main(["keys", "create", "--tenant", "team-7.eu", "--data-dir", data]) == 0


def test_a_version_4_database_gains_the_quota_tables(store):
    with store.engine.begin() as conn:  # as a database made before version 8 looks
        conn.execute(text("DROP TABLE job_token_holds"))
        conn.execute(text("DROP TABLE tenant_quotas"))
        conn.execute(text("UPDATE schema_version SET version = 4"))
    store.engine.dispose()
    assert store.migrate() == 4
    assert {"tenant_quotas", "job_token_holds"} <= set(inspect(store.engine).get_table_names())
    quotas.set_quotas(store.engine, "a", {"max_queued_jobs": 1})
    assert quotas.all_quotas(store.engine)["a"]["max_queued_jobs"] == 1
