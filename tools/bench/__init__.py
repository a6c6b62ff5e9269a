"""The evaluation harness: workloads, baselines, the runner behind `sarpctl bench`."""
