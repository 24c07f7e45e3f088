"""One-off studies: the measurements that decided a default or answered one question, kept with their results.

Each script here is run as ``python -m benchmarks.studies.<name>`` from the repository root and writes its report to
``benchmarks/studies/results/`` (or ``$GPVI_BENCH_OUT``); the references it reads (NUTS runs, stored fits) stay in
``benchmarks/results/``. ``benchmarks/README.md`` lists every script, kept or study, in one table.
"""
