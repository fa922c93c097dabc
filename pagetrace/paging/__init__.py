"""Paging arithmetic, no torch: block tables, the cache layouts, launch plans, a token's lookup."""
