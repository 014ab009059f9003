"""What a run leaves behind: record files (JSONL, CSV, Excel), the HTML report, the
notebook export, Model Explorer node data, the precision advice and culprit bundles, and
the view state every one of them and the widget are drawn from."""
