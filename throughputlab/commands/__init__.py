"""Click commands, one thin module per family; the library does the work."""
