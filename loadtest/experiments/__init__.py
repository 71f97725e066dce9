"""One-off measurements of past issues, kept runnable (`python -m loadtest.experiments.NAME --help`) next to their
results in loadtest/results/; loadtest/README.md says what each measured. Not part of `python -m loadtest`."""
