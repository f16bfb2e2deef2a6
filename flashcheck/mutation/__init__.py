"""Mutation testing of the production Triton kernels: break them mechanically, count what the suite misses.

`python -m flashcheck.mutants` parses every `@triton.jit` function of the production kernel modules
(`kernels/softmax.py`, `kernels/attention.py`, the shared loads/stores of `kernels/_common.py`) with
`ast`, applies one mutation operator at one place (the source text of that node is replaced, the rest
of the file is kept byte for byte, so a mutant's diff is one line), and runs the family's ci suite
against each mutant, one at a time, in a subprocess:

    CI=true pytest <family test files> --family F -k "<specs whose code the mutant changes>" -x
           --no-save-fixtures -p flashcheck.mutation.probe -p flashcheck.plugin.killrun

with FLASHCHECK_MUTANT naming the mutated source: `flashcheck.mutation.probe`, loaded as a pytest
plugin, installs an import hook before anything imports `flashcheck.kernels`, so
`flashcheck.kernels.<module>` is the mutated file (Triton reads the kernels' source from it too).
Hypothesis's shrink phase is skipped (flashcheck/plugin/killrun.py's switch, the suite-in-a-subprocess
runner the kill matrix uses too): only "is it caught" matters.

Outcome per mutant: killed (the catching test, the property, the exception), survived, timed out,
crashed (the pytest process died), or equivalent-candidate: a survivor whose outputs are bit
identical to the original kernel's on a fixed probe set (run in the same subprocess after the
suite passed). Candidates are triaged by hand in the report, never counted as killed.

Results go to a JSON store (one record per mutant, keyed by the mutated source's hash, so runs
add up and `--resume` skips what is done) and `--report` writes reports/records/mutants.md.

Beside the generated mutants, `between_launches` lists hand-written ones of what a launch leaves for
the next (split-KV's arrival counters and per-stream workspace), which only a GPU run selects.

One role per module: `operators` (the mutation operators), `generate` (targets, mutants, selection),
`probe` (inside the subprocess: the import hook and the equivalence probe), `runner` (one mutant's
suite run, the store), `report` (the Markdown), `cli` (the command line; `flashcheck/mutants.py`
keeps `python -m flashcheck.mutants` working).
"""
