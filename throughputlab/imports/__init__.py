"""Bring your own numbers: results of other benchmark tools and RL run logs, read into
throughputlab's records.

- ``vllm_bench``: ``vllm bench serve`` result JSON (one run, several, a ``vllm bench sweep
  serve`` folder) and ``vllm bench throughput --output-json``, into a Profile;
- ``guidellm``: GuideLLM's ``benchmarks.json`` report, into a Profile;
- ``runlog``: veRL's file logger, TRL's ``trainer_state.json`` or a CSV of phase times, into a
  RunLog with per-phase medians and spreads;
- ``common``: the model and GPU an import is for, field reading with one-line errors, and the
  Profile that points from any source go into.

Each importer records what its source measured and nothing else: one sample per source run
with that run's real totals, None (or an empty list) for what the source does not report, and
the source files and the unmeasured quantities in ``Profile.notes``. No torch, no engine.
"""
