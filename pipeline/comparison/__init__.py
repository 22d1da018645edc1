"""stage=compare's report: a language's runs side by side (pipeline/comparison/report.py); the
stage module pipeline/stages/compare.py finds the runs and reads their outputs."""
