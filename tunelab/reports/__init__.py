"""Readers: tables, markdown and plots made from the warehouse (DuckDB) or from result bundles.

``report`` builds comparison tables and markdown, ``plots`` the PNG figures, ``evidence`` the report of
exported Parquet files. Nothing here runs a trial; the sweep and compare flows call these to write their
reports, and the CLI calls them directly.
"""
