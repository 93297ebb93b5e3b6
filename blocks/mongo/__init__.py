"""MongoDB-style documents over a JSONB column, translated to SQL text with bind parameters;
nothing here touches a database. Filters: :mod:`~blocks.mongo.filters` (the entry), read into
conditions by :mod:`~blocks.mongo.filter_ast` and compiled by :mod:`~blocks.mongo.filter_sql`;
updates: :mod:`~blocks.mongo.updates`; what both share: :mod:`~blocks.mongo.common`."""
