"""Benchmarks and one-off probes (`python -m flashcheck.reports.bench.<module>`): kernel speed against
torch (attention, attention_features, launch, softmax, attention_ceiling), the long rows' accuracy
(softmax_accuracy), compiled resources (kernel_resources, cluster_probe) and the oracle's speed and
agreement (oracle, oracle_agreement). They write the records under reports/records/."""
