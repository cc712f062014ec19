"""Tools the test suite uses that are commands too (see ``import_graph``)."""
