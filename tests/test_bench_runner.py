"""The benchmark runner's local paths (in-process and joblib's process pool) give the same results."""

from __future__ import annotations

from benchmarks.runner import Job, run_jobs


def _square(x: int) -> dict:
    if x < 0:
        raise ValueError("negative")
    return {"y": x * x}


def test_in_process_and_joblib_agree_and_failures_are_reported():
    jobs = [Job(_square, {"x": i}, name=f"sq{i}") for i in (1, 2, -1)]
    local = run_jobs(jobs)
    pooled = run_jobs(jobs, n_jobs=2)
    threaded = run_jobs(jobs, n_jobs=2, backend="threading")
    for res in (local, pooled, threaded):
        assert [r.get("y") for r in res] == [1, 4, None]
        assert res[2]["error"].startswith("ValueError") and res[0]["error"] == ""
        assert [r["job"] for r in res] == ["sq1", "sq2", "sq-1"] and res[1]["x"] == 2


def test_environment_selects_backend_and_workers(monkeypatch):
    monkeypatch.setenv("GPVI_JOBLIB_BACKEND", "threading")
    monkeypatch.setenv("GPVI_N_JOBS", "2")
    res = run_jobs([Job(_square, {"x": i}) for i in range(3)])
    assert [r["y"] for r in res] == [0, 1, 4]


def test_markdown_tables_become_csv(tmp_path):
    import csv

    from benchmarks._common import markdown_tables, write_csv_tables

    md = ("# Title\n\ntext\n\n## Speed\n\n| S | ratio | note |\n|---|---:|---|\n| 1 | **2.18** | a \\| b |\n"
          "| 8 | 1.70 | |\nafter\n\n| x |\n|---|\n| 3 |\n")
    tables = markdown_tables(md)
    assert [t[0] for t in tables] == ["Speed", "Speed"]
    assert tables[0][1] == ["S", "ratio", "note"] and tables[0][2] == [["1", "2.18", "a | b"], ["8", "1.70", ""]]
    paths = write_csv_tables("demo", md, out=tmp_path)
    assert [p.name for p in paths] == ["demo_1_speed.csv", "demo_2_speed.csv"]
    with paths[0].open() as fh:
        assert list(csv.reader(fh)) == [["S", "ratio", "note"], ["1", "2.18", "a | b"], ["8", "1.70", ""]]
