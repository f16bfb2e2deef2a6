"""The stability report (`flashcheck report`, `python -m flashcheck.reports`): every kernel against
the correctly rounded oracle on shared adversarial inputs, per dtype and class, with torch's
softmax and SDPA's backends as baselines; its command line (cli.py), measuring (run.py and one
module per family), statistics, tables, plots, document and atomic output folder."""
