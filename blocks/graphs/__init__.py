"""A named graph's spec: read (``specs``), its JMESPath expressions (``expressions``) and its
mappings checked against its blocks' schemas (``schemas``)."""
