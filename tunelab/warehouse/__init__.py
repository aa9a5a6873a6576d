"""tunelab's DuckDB warehouse: schema migrations, bundle loader, version parsing, A/B comparison.

The warehouse is one DuckDB file. Result bundles (see ``tunelab.core.bundle``) are written by
trials first and loaded later, transactionally and idempotently, by ``warehouse.loader``.
Schema lives in ``tunelab/warehouse/schema/NNN_*.sql`` (applied by ``warehouse.migrate``), the
questions people ask in ``tunelab/warehouse/queries/*.sql`` (run them with ``warehouse.query``).
"""

__all__: list[str] = []
