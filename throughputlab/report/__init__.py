"""HTML output: one self-contained offline file (plotly's JavaScript inlined, all text escaped)."""
