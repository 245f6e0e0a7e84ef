"""Records on disk -> tidy DataFrame -> the comparison tables papers print.

    from augtune.analysis import load_runs, comparison_table
    df = load_runs(["results/pinda-digits"])          # one row per run (+ reference rows)
    table = comparison_table(df, rows="method", cols="dataset", metrics=["knn_acc", "sr_acc"])
    print(table.to_markdown())                         # or .to_latex(), .to_csv()

Reads only `record.json` files: imports neither torch nor ray nor `trainables/` / `search/`.
"""
from augtune.analysis.frame import (
    AnalysisError,
    MixedDatasetsError,
    NoFinishedRunsError,
    NoRecordsError,
    SkippedRecordWarning,
    UnknownColumnError,
    UnknownMetricError,
    completed,
    find_records,
    load_runs,
    metric_columns,
    reference_key_columns,
)
from augtune.analysis.tables import Cell, ComparisonTable, comparison_table

__all__ = [
    "AnalysisError", "Cell", "ComparisonTable", "MixedDatasetsError", "NoFinishedRunsError", "NoRecordsError",
    "SkippedRecordWarning", "UnknownColumnError", "UnknownMetricError", "comparison_table", "completed",
    "find_records", "load_runs", "metric_columns", "reference_key_columns",
]
