"""The suite's own quality tools: the GPU lane (gpu_lane) and its compute-sanitizer sweep
(memcheck_sweep), the kill matrix of the known-bad zoo (kill_matrix), and the index of the
committed records under reports/records/ (records)."""
