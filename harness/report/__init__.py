"""What a run leaves behind and how runs are compared: goodput accounting, results rows, tables, plots."""
