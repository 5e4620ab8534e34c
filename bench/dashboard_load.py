"""How heavy the dashboard's polling is with 50 jobs of 10,000 steps each (in-process, no browser, no network).

    python bench/dashboard_load.py [--jobs 50] [--steps 10000]

Times what the jobs page asks for every 2 s (the jobs list + progress for every job) cold (first read of
every run folder) and warm (nothing changed), and what a run page asks for (the down-sampled curve), with the
size of each answer. Numbers depend on the machine and its load: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient

from finetune.service.dashboard.app import create_app
from finetune.service.options import ServiceOptions

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train.jsonl"


def _write_run(run: Path, steps: int) -> None:
    run.mkdir(parents=True)
    lines = []
    for step in range(1, steps + 1):
        row = {
            "step": step,
            "epoch": step / 1000,
            "learning_rate": 1e-4,
            "train_loss": 2 - step / steps,
            "grad_norm": 1.0,
        }
        row |= {"target_tokens": 300, "tokens_per_s": 5000.0}
        if step % 100 == 0:
            row["val_loss"] = 1.5 - step / 2 / steps
        lines.append(json.dumps(row) + "\n")
    (run / "metrics.jsonl").write_text("".join(lines))
    plan = {"total_steps": steps, "steps_per_epoch": 1000, "epochs": steps // 1000, "tokens_processed": 10**8}
    (run / "plan.json").write_text(json.dumps(plan))


def _timed(call, repeat: int = 5) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        response = call()
        times.append(time.perf_counter() - start)
        size = len(response.content)
        assert response.status_code == 200, response.text
    return statistics.median(times), size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(ServiceOptions(data_dir=Path(tmp), models={"toy": "unused"}))
        key = app.state.store.create_key("bench")[1]
        client = TestClient(app, headers={"Authorization": f"Bearer {key}"})
        upload = client.post(
            "/v1/files", data={"purpose": "fine-tune"}, files={"file": ("t.jsonl", EXAMPLE.read_bytes())}
        )
        file_id = upload.json()["id"]
        ids = []
        for _ in range(args.jobs):
            job = client.post("/v1/fine_tuning/jobs", json={"model": "toy", "training_file": file_id}).json()
            ids.append(job["id"])
            _write_run(app.state.options.runs_dir / job["id"], args.steps)

        def jobs_page():
            client.get("/v1/fine_tuning/jobs", params={"limit": 100})
            return client.get("/v1/dashboard/progress", params={"job_id": ids})

        cold, _ = _timed(jobs_page, repeat=1)
        warm, size = _timed(jobs_page)
        curve, curve_size = _timed(lambda: client.get(f"/v1/dashboard/jobs/{ids[0]}/curve", params={"points": 800}))
        print(f"{args.jobs} jobs x {args.steps:,} steps")
        print(f"jobs page poll (list + progress): cold {cold * 1000:.0f} ms, warm {warm * 1000:.0f} ms, {size:,} bytes")
        print(f"run page curve (points=800):       {curve * 1000:.0f} ms, {curve_size:,} bytes")


if __name__ == "__main__":
    main()
