"""Review: reports, diagnostics and figures for team meetings."""
