"""Files in and out: Replicate's files API, output files, and the store that keeps their bytes.

``store``: the byte store protocol (a local directory, or S3-compatible object storage);
``records``: the ``files`` table (who owns a file, what it is, when it goes); ``links``: the
signed URLs that serve a file's bytes without a token.
"""
