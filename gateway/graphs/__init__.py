"""Graphs of blocks: a seed graph (``output_ptr``) planned and run, and named graphs run on the
same scheduler."""
