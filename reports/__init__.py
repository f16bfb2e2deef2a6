"""The reports: flashcheck's top layer (it may import the engine, never the reverse), in rooms.

- `stability/` (`flashcheck.reports.stability`): the stability report a user runs,
  `python -m flashcheck.reports` (exactly `flashcheck report`).
- `bench/` (`flashcheck.reports.bench`): the GPU benchmarks and one-off probes behind the records
  attention_bench.md, softmax_bench.md and oracle_agreement.md.
- `quality/` (`flashcheck.reports.quality`): the suite's own quality tools: the GPU lane and its
  memcheck sweep, the kill matrix, and the index of the records.
- `records/`: the committed records (data, not a package; not shipped in the wheel), indexed by
  `records/README.md`.
"""
from __future__ import annotations

from flashcheck import HOME

#: The committed records (reports/records/ of a checkout; absent from an installed wheel).
RECORDS = HOME / "reports" / "records"
