"""`python -m flashcheck.mutants`: mutation testing's command line, kept under its documented name.
The code is the subpackage `flashcheck/mutation/` (its docstring says what each module does)."""
from flashcheck.mutation.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
