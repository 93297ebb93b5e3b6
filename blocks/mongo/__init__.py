"""MongoDB-style documents over a JSONB column: filters (``filters``) and updates (``updates``),
translated to SQL text with bind parameters; nothing here touches a database."""
