"""The report: the paper's figures and tables from a run directory's records, as one HTML page."""
